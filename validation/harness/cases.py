"""The measured cases, per machine kind, and a runner with a wall-clock budget.

    python3 validation/harness/cases.py --machine h100 --budget 300 [--tiny]

Each case runs in its own process (torchrun for multi-GPU) with a timeout so a
hang or OOM costs only that case; a case whose spec has "fallback" runs the
fallback spec when it fails (e.g. OOM).  Cases are run in list order
(priority order) and skipped once the budget is spent.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# ----------------------------------------------------------------------------- models
LLAMA_1B = dict(name="llama-1.1b-tinyllama-shape", source="synthetic, TinyLlama-1.1B shape, random weights",
                hidden_size=2048, intermediate_size=5632, num_layers=22, num_attention_heads=32,
                num_kv_heads=4, head_dim=64, vocab_size=32000, max_seq_len=4096)
LLAMA_350M = dict(name="llama-370m", source="synthetic ~370M Llama-style, random weights",
                  hidden_size=1024, intermediate_size=2816, num_layers=24, num_attention_heads=16,
                  num_kv_heads=16, head_dim=64, vocab_size=32000, max_seq_len=4096)
LLAMA2_7B = dict(name="llama-2-7b", source="https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json (shape only, random weights)",
                 hidden_size=4096, intermediate_size=11008, num_layers=32, num_attention_heads=32,
                 num_kv_heads=32, head_dim=128, vocab_size=32000, max_seq_len=4096)
LLAMA3_8B = dict(name="llama-3-8b", source="https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json (shape only, random weights)",
                 hidden_size=4096, intermediate_size=14336, num_layers=32, num_attention_heads=32,
                 num_kv_heads=8, head_dim=128, vocab_size=128256, max_seq_len=8192)
LLAMA_3B = dict(name="llama-3.2-3b-untied", source="https://huggingface.co/meta-llama/Llama-3.2-3B/blob/main/config.json (shape; embeddings untied here; random weights)",
                hidden_size=3072, intermediate_size=8192, num_layers=28, num_attention_heads=24,
                num_kv_heads=8, head_dim=128, vocab_size=128256, max_seq_len=8192)


def C(name, model, hw, desc, **kw):
    d = dict(name=name, model=model, hardware=hw, description=desc)
    d.update(kw)
    return d


def h100_cases():
    hw = "h100-sxm"
    L = LLAMA_1B
    return [
        C("h100-llama1b-bf16-mb4-s2048", L, hw, "1.1B (TinyLlama shape) bf16 AMP, mb4 seq2048, no recompute", micro_batch=4),
        C("h100-llama1b-bf16-mb1-s2048", L, hw, "1.1B bf16 AMP, mb1 seq2048, no recompute", micro_batch=1),
        C("h100-llama1b-bf16-mb8-s2048", L, hw, "1.1B bf16 AMP, mb8 seq2048, no recompute", micro_batch=8,
          fallback=C("h100-llama1b-bf16-mb8-s2048-sel", L, hw, "1.1B bf16 AMP, mb8 seq2048, selective recompute (no-recompute OOMed)", micro_batch=8, recompute="selective")),
        C("h100-llama1b-bf16-mb4-s2048-full", L, hw, "1.1B bf16 AMP, mb4 seq2048, full recompute (checkpoint per layer)", micro_batch=4, recompute="full"),
        C("h100-llama1b-bf16-mb4-s2048-sel", L, hw, "1.1B bf16 AMP, mb4 seq2048, selective recompute (attention core)", micro_batch=4, recompute="selective"),
        C("h100-llama1b-fp8-mb4-s2048", L, hw, "1.1B fp8 (torch._scaled_mm e4m3 fwd / e5m2 grads, per-tensor dynamic scales) in decoder projections, rest bf16 AMP, mb4 seq2048", micro_batch=4, precision="fp8"),
        C("h100-llama370m-tf32-mb2-s2048", LLAMA_350M, hw, "370M fp32 params, TF32 matmuls, mb2 seq2048", micro_batch=2, precision="tf32"),
        C("h100-llama370m-fp32-mb2-s2048", LLAMA_350M, hw, "370M pure fp32 (allow_tf32=False), mb2 seq2048", micro_batch=2, precision="fp32"),
        C("h100-llama2-7b-lora16-bf16-mb1-s2048", LLAMA2_7B, hw, "Llama-2-7B shape, LoRA r16 on q,k,v,o,gate,up,down; frozen base in bf16; bf16 AMP; mb1 seq2048", micro_batch=1, lora_rank=16),
        C("h100-llama2-7b-lora16-bf16-mb1-s4096", LLAMA2_7B, hw, "Llama-2-7B shape, LoRA r16, frozen bf16 base, bf16 AMP, mb1 seq4096", micro_batch=1, seq=4096, lora_rank=16,
          fallback=C("h100-llama2-7b-lora16-bf16-mb1-s4096-full", LLAMA2_7B, hw, "Llama-2-7B shape LoRA r16, mb1 seq4096, full recompute (no-recompute OOMed)", micro_batch=1, seq=4096, lora_rank=16, recompute="full")),
        C("h100-llama1b-bf16-mb4-s2048-optoffload", L, hw, "1.1B bf16 AMP, mb4 seq2048, optimizer+grads offloaded: grads D2H to pinned fp32, CPU AdamW, params H2D (no overlap)", micro_batch=4, offload=["optimizer", "grads"], optimizer_impl="cpu"),
        C("h100-llama1b-bf16-mb2-s2048-actoffload", L, hw, "1.1B bf16 AMP, mb2 seq2048, activation offload via torch.autograd.graph.save_on_cpu(pin_memory=True)", micro_batch=2, offload=["activations"]),
    ]


def h200_cases():
    hw = "h200-sxm"
    L = LLAMA_1B
    return [
        C("h200-llama2-7b-bf16-mb1-s4096-full", LLAMA2_7B, hw, "Llama-2-7B shape full training, bf16 AMP, fp32 params+grads+AdamW states (~108 GB), fused AdamW, full recompute, mb1 seq4096", micro_batch=1, seq=4096, recompute="full", optimizer_impl="fused", warmup=3, steps=8),
        C("h200-llama3-8b-lora16-bf16-mb1-s4096", LLAMA3_8B, hw, "Llama-3-8B shape, LoRA r16 on q,k,v,o,gate,up,down; frozen bf16 base; bf16 AMP; mb1 seq4096", micro_batch=1, seq=4096, lora_rank=16),
        C("h200-llama3b-bf16-mb2-s4096", LLAMA_3B, hw, "Llama-3.2-3B shape (untied, 3.6B params) bf16 AMP, mb2 seq4096, no recompute", micro_batch=2, seq=4096,
          fallback=C("h200-llama3b-bf16-mb2-s2048", LLAMA_3B, hw, "Llama-3.2-3B shape (untied) bf16 AMP, mb2 seq2048, no recompute (seq4096 OOMed)", micro_batch=2, seq=2048)),
        C("h200-llama1b-bf16-mb4-s2048", L, hw, "mirror of h100-llama1b-bf16-mb4-s2048", micro_batch=4),
        C("h200-llama1b-bf16-mb8-s2048", L, hw, "mirror of h100-llama1b-bf16-mb8-s2048", micro_batch=8),
        C("h200-llama1b-fp8-mb4-s2048", L, hw, "mirror of h100-llama1b-fp8-mb4-s2048", micro_batch=4, precision="fp8"),
        C("h200-llama1b-fsdp-cpuoffload-mb4-s2048", L, hw, "1.1B, FSDP FULL_SHARD on 1 GPU with CPUOffload(offload_params=True), MixedPrecision bf16, CPU AdamW on fp32 flat params, mb4 seq2048",
          micro_batch=4, mode="fsdp", fsdp_cpu_offload=True, zero=3, offload=["params", "grads", "optimizer"], framework="fsdp-mixed", optimizer_impl="cpu", precision="bf16"),
        C("h200-llama2-7b-lora16-bf16-mb1-s4096", LLAMA2_7B, hw, "mirror of h100-llama2-7b-lora16-bf16-mb1-s4096", micro_batch=1, seq=4096, lora_rank=16),
        C("h200-llama370m-tf32-mb2-s2048", LLAMA_350M, hw, "mirror of h100-llama370m-tf32-mb2-s2048", micro_batch=2, precision="tf32"),
        C("h200-llama1b-bf16-mb4-s2048-optoffload", L, hw, "mirror of h100-llama1b-bf16-mb4-s2048-optoffload", micro_batch=4, offload=["optimizer", "grads"], optimizer_impl="cpu"),
        C("h200-llama1b-bf16-mb2-s2048-actoffload", L, hw, "mirror of h100-llama1b-bf16-mb2-s2048-actoffload", micro_batch=2, offload=["activations"]),
        C("h200-llama1b-bf16-mb4-s2048-full", L, hw, "mirror of h100-llama1b-bf16-mb4-s2048-full", micro_batch=4, recompute="full"),
    ]


TWO_STEP_TRACES = {"h200-llama1b-bf16-mb4-s2048", "h200-llama1b-fp8-mb4-s2048", "h200-llama2-7b-lora16-bf16-mb1-s4096"}


def _one_step_traces(lst):
    """Keep validation/ small: large-model / mirror cases on H200 profile 1 step."""
    for s in lst:
        if s["name"] not in TWO_STEP_TRACES:
            s["profile_active"] = 1
        if s.get("fallback"):
            s["fallback"]["profile_active"] = 1
    return lst


def h200x2_cases():
    hw = "h200-sxm"
    return [
        C("h200x2-llama1b-ddp-bf16-mb4-s2048", LLAMA_1B, hw, "1.1B DDP on 2 GPUs, bf16 AMP, fp32 grads all-reduced (25 MB buckets), mb4 seq2048 per GPU", micro_batch=4, mode="ddp", gpus=2),
        C("h200x2-llama3b-fsdp-zero3-mb2-s4096", LLAMA_3B, hw, "3.6B FSDP FULL_SHARD (ZeRO-3) on 2 GPUs, MixedPrecision bf16 params/reduce, mb2 seq4096 per GPU", micro_batch=2, seq=4096, mode="fsdp", zero=3, framework="fsdp-mixed", gpus=2),
        C("h200x2-llama3b-fsdp-zero2-mb2-s4096", LLAMA_3B, hw, "3.6B FSDP SHARD_GRAD_OP (ZeRO-2) on 2 GPUs, MixedPrecision bf16 params/reduce, mb2 seq4096 per GPU", micro_batch=2, seq=4096, mode="fsdp", zero=2, framework="fsdp-mixed", gpus=2),
        C("h200x2-llama1b-fsdp-zero3-mb4-s2048", LLAMA_1B, hw, "1.1B FSDP FULL_SHARD (ZeRO-3) on 2 GPUs, MixedPrecision bf16 params/reduce, mb4 seq2048 per GPU (compare with the DDP case)", micro_batch=4, mode="fsdp", zero=3, framework="fsdp-mixed", gpus=2),
        C("h200x2-llama3b-ddp-bf16-mb2-s4096", LLAMA_3B, hw, "3.6B DDP on 2 GPUs, bf16 AMP, fp32 params/grads/AdamW replicated, fp32 all-reduce, mb2 seq4096 per GPU (compare with the FSDP cases)", micro_batch=2, seq=4096, mode="ddp", gpus=2),
    ]


MACHINES = {"h100": h100_cases, "h200": lambda: _one_step_traces(h200_cases()),
            "h200x2": lambda: _one_step_traces(h200x2_cases())}


def run_one(spec, out, tiny, deadline, log):
    spec = copy.deepcopy(spec)
    fallback = spec.pop("fallback", None)
    gpus = spec.pop("gpus", 1)
    remaining = deadline - time.time()
    if remaining < 45:
        log(f"SKIP {spec['name']}: {remaining:.0f}s left")
        return False
    env = dict(os.environ)
    if tiny:
        env["CUDA_VISIBLE_DEVICES"] = ""
    if gpus > 1 and not tiny:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}"]
    elif spec.get("mode") in ("ddp", "fsdp") and tiny:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"] if gpus == 1 else \
              [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}"]
    else:
        cmd = [sys.executable]
    cmd += [str(HERE / "train_step.py"), "--spec", json.dumps(spec), "--out", str(out),
            "--deadline", str(deadline - 5)]
    if tiny:
        cmd.append("--tiny")
    t0 = time.time()
    log(f"RUN {spec['name']} ({remaining:.0f}s left)")
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=max(30, min(remaining - 10, 170)))
        ok = p.returncode == 0
        tail = (p.stdout[-1500:] + "\n" + p.stderr[-6000:]) if not ok else p.stdout[-600:]
    except subprocess.TimeoutExpired as e:
        ok, tail = False, f"TIMEOUT {e}"
    log(f"{'OK' if ok else 'FAIL'} {spec['name']} in {time.time()-t0:.0f}s\n{tail}")
    if not ok:
        (Path(out) / "_failed").mkdir(parents=True, exist_ok=True)
        (Path(out) / "_failed" / f"{spec['name']}.log").write_text(tail)
        if fallback is not None:
            fallback.setdefault("gpus", gpus)
            return run_one(fallback, out, tiny, deadline, log)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--machine", required=True, choices=list(MACHINES))
    ap.add_argument("--budget", type=float, default=300)
    ap.add_argument("--out", default=str(HERE.parent / "cases"))
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated case names")
    a = ap.parse_args()
    deadline = time.time() + a.budget
    logf = open(Path(a.out).parent / f"cases-{a.machine}.log", "a") if not a.tiny else None

    def log(msg):
        print(msg, flush=True)
        if logf:
            logf.write(msg + "\n")
            logf.flush()

    specs = MACHINES[a.machine]()
    if a.only:
        keep = set(a.only.split(","))
        specs = [s for s in specs if s["name"] in keep]
    n_ok = 0
    for s in specs:
        n_ok += bool(run_one(s, a.out, a.tiny, deadline, log))
    log(f"DONE {a.machine}: {n_ok}/{len(specs)} cases ok")


if __name__ == "__main__":
    main()
