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
LLAMA2_13B = dict(name="llama-2-13b", source="https://huggingface.co/meta-llama/Llama-2-13b-hf/blob/main/config.json (shape only, random weights)",
                  hidden_size=5120, intermediate_size=13824, num_layers=40, num_attention_heads=40,
                  num_kv_heads=40, head_dim=128, vocab_size=32000, max_seq_len=4096)
# small MoE: Llama-style attention (h 1024, 16 heads / 8 kv), 16 layers, 8 SwiGLU experts of width 2816, top-2
MOE_1B = dict(name="moe-1.2b-8e-top2", source="synthetic Mixtral-style MoE (8 experts, top-2) at h 1024, random weights",
              hidden_size=1024, intermediate_size=2816, num_layers=16, num_attention_heads=16,
              num_kv_heads=8, head_dim=64, vocab_size=32000, max_seq_len=4096,
              moe=dict(num_experts=8, experts_per_token=2, expert_intermediate_size=2816))

PARALLEL_MODES = ("tp", "pp", "ep")  # run by parallel_step.py; ddp/fsdp/single by train_step.py


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


def h200x2_par_cases():
    """Tensor, pipeline and expert parallelism on 2 GPUs (issue 7's scripts, run where 2 GPUs allow)."""
    hw = "h200-sxm"
    L = LLAMA_1B
    pp_manual = dict(pp_impl="manual")
    return [
        C("h200x2-llama1b-tp2-bf16-mb4-s2048", L, hw, "1.1B tensor parallel 2 (DTensor: Colwise q,k,v,gate,up; Rowwise o,down; vocab-parallel embedding, LM head and loss), bf16 AMP, mb4 seq2048 (same tokens on both ranks)",
          micro_batch=4, mode="tp", gpus=2),
        C("h200x2-llama1b-pp2-1f1b-mb2x8-s2048", L, hw, "1.1B 2-stage pipeline (11+11 layers), torch.distributed.pipelining Schedule1F1B, 8 micro-batches of 2 x 2048 tokens, bf16 AMP",
          micro_batch=2, mode="pp", pp_microbatches=8, gpus=2,
          fallback=C("h200x2-llama1b-pp2-manual1f1b-mb2x8-s2048", L, hw, "1.1B 2-stage pipeline, explicit 1F1B with batch_isend_irecv (torch.distributed.pipelining failed), 8 micro-batches of 2 x 2048, bf16 AMP",
                     micro_batch=2, mode="pp", pp_microbatches=8, **pp_manual)),
        C("h200x2-moe1b-ep2-bf16-mb4-s2048", MOE_1B, hw, "MoE 1.2B (16 layers, h 1024, 8 experts top-2, expert width 2816), experts over 2 ranks (4 each), all_to_all_single dispatch/combine, DDP for the rest, bf16 AMP, mb4 seq2048 per rank",
          micro_batch=4, mode="ep", gpus=2),
        C("h200x2-llama1b-tp2-sp-bf16-mb4-s2048", L, hw, "1.1B tensor parallel 2 with sequence parallelism (SequenceParallel norms, all-gather before / reduce-scatter after attention and MLP), bf16 AMP, mb4 seq2048",
          micro_batch=4, mode="tp", sequence_parallel=True, gpus=2),
        C("h200x2-llama3b-tp2-bf16-mb2-s4096", LLAMA_3B, hw, "3.6B (Llama-3.2-3B shape, untied) tensor parallel 2, bf16 AMP, mb2 seq4096 (compare with the 2-GPU DDP/FSDP 3B cases)",
          micro_batch=2, seq=4096, mode="tp", gpus=2),
        C("h200x2-llama1b-pp2-manual1f1b-mb2x8-s2048", L, hw, "1.1B 2-stage pipeline, explicit 1F1B with batch_isend_irecv (compare with Schedule1F1B), 8 micro-batches of 2 x 2048, bf16 AMP",
          micro_batch=2, mode="pp", pp_microbatches=8, gpus=2, **pp_manual),
    ]


def h200x4_cases():
    """Issue 7 on 4 GPUs (not yet run: the 4-GPU kind is withheld)."""
    hw = "h200-sxm"
    fs = dict(mode="fsdp", zero=3, framework="fsdp-mixed", gpus=4)
    return [
        C("h200x4-llama2-7b-fsdp-zero3-mb1-s4096", LLAMA2_7B, hw, "Llama-2-7B FSDP FULL_SHARD on 4 GPUs, MixedPrecision bf16, no recompute, mb1 seq4096 per GPU", micro_batch=1, seq=4096, **fs,
          fallback=C("h200x4-llama2-7b-fsdp-zero3-sel-mb1-s4096", LLAMA2_7B, hw, "Llama-2-7B FSDP FULL_SHARD on 4 GPUs, selective recompute (no-recompute OOMed), mb1 seq4096", micro_batch=1, seq=4096, recompute="selective", **fs)),
        C("h200x4-llama2-7b-fsdp-zero3-full-mb2-s4096", LLAMA2_7B, hw, "Llama-2-7B FSDP FULL_SHARD on 4 GPUs, full recompute, mb2 seq4096 per GPU", micro_batch=2, seq=4096, recompute="full", **fs),
        C("h200x4-llama3-8b-tp4-bf16-mb1-s4096", LLAMA3_8B, hw, "Llama-3-8B tensor parallel 4 (DTensor plan as the 2-GPU case), bf16 AMP, mb1 seq4096", micro_batch=1, seq=4096, mode="tp", gpus=4),
        C("h200x4-llama3-8b-tp4-sp-bf16-mb1-s4096", LLAMA3_8B, hw, "Llama-3-8B tensor parallel 4 + sequence parallel, bf16 AMP, mb1 seq4096", micro_batch=1, seq=4096, mode="tp", sequence_parallel=True, gpus=4),
        C("h200x4-llama2-7b-pp4-1f1b-mb1x8-s4096", LLAMA2_7B, hw, "Llama-2-7B 4-stage pipeline (8 layers each), Schedule1F1B, 8 micro-batches of 1 x 4096, bf16 AMP", micro_batch=1, seq=4096, mode="pp", pp_microbatches=8, gpus=4,
          fallback=C("h200x4-llama2-7b-pp4-manual1f1b-mb1x8-s4096", LLAMA2_7B, hw, "Llama-2-7B 4-stage pipeline, explicit 1F1B (pipelining failed), 8 x 1 x 4096", micro_batch=1, seq=4096, mode="pp", pp_microbatches=8, pp_impl="manual")),
        C("h200x4-llama2-7b-pp2-1f1b-mb1x8-s4096", LLAMA2_7B, hw, "Llama-2-7B 2-stage pipeline on 2 of the 4 GPUs, Schedule1F1B, 8 micro-batches of 1 x 4096, bf16 AMP", micro_batch=1, seq=4096, mode="pp", pp_microbatches=8, gpus=2),
        C("h200x4-moe1b-ep4-bf16-mb4-s2048", MOE_1B, hw, "MoE 1.2B, experts over 4 ranks (2 each), all_to_all_single, DDP for the rest, mb4 seq2048 per rank", micro_batch=4, mode="ep", gpus=4),
        C("h200x4-llama1b-tp4-bf16-mb4-s2048", LLAMA_1B, hw, "1.1B tensor parallel 4, bf16 AMP, mb4 seq2048 (TP scaling next to the 2-GPU case)", micro_batch=4, mode="tp", gpus=4),
    ]


def h200x8_cases():
    """Issue 7 on 8 GPUs (not yet run: the 8-GPU kind is withheld)."""
    hw = "h200-sxm"
    fs = dict(mode="fsdp", zero=3, framework="fsdp-mixed", gpus=8)
    return [
        C("h200x8-llama2-13b-fsdp-zero3-mb1-s4096", LLAMA2_13B, hw, "Llama-2-13B FSDP FULL_SHARD on 8 GPUs, MixedPrecision bf16, no recompute, mb1 seq4096 per GPU", micro_batch=1, seq=4096, **fs,
          fallback=C("h200x8-llama2-13b-fsdp-zero3-sel-mb1-s4096", LLAMA2_13B, hw, "Llama-2-13B FSDP FULL_SHARD on 8 GPUs, selective recompute (no-recompute OOMed), mb1 seq4096", micro_batch=1, seq=4096, recompute="selective", **fs)),
        C("h200x8-llama2-13b-fsdp-zero3-full-mb2-s4096", LLAMA2_13B, hw, "Llama-2-13B FSDP FULL_SHARD on 8 GPUs, full recompute, mb2 seq4096 per GPU", micro_batch=2, seq=4096, recompute="full", **fs),
        C("h200x8-llama2-7b-fsdp-zero3-mb1-s4096", LLAMA2_7B, hw, "Llama-2-7B FSDP FULL_SHARD on 8 GPUs, no recompute, mb1 seq4096 (scaling next to the 4-GPU case)", micro_batch=1, seq=4096, **fs),
        C("h200x8-llama3-8b-tp8-bf16-mb1-s4096", LLAMA3_8B, hw, "Llama-3-8B tensor parallel 8 (8 kv heads, one per rank), bf16 AMP, mb1 seq4096", micro_batch=1, seq=4096, mode="tp", gpus=8),
        C("h200x8-llama3-8b-tp8-sp-bf16-mb1-s4096", LLAMA3_8B, hw, "Llama-3-8B tensor parallel 8 + sequence parallel, bf16 AMP, mb1 seq4096", micro_batch=1, seq=4096, mode="tp", sequence_parallel=True, gpus=8),
        C("h200x8-llama2-13b-pp8-1f1b-mb1x16-s4096", LLAMA2_13B, hw, "Llama-2-13B 8-stage pipeline (5 layers each), Schedule1F1B, 16 micro-batches of 1 x 4096, bf16 AMP", micro_batch=1, seq=4096, mode="pp", pp_microbatches=16, gpus=8,
          fallback=C("h200x8-llama2-13b-pp8-manual1f1b-mb1x16-s4096", LLAMA2_13B, hw, "Llama-2-13B 8-stage pipeline, explicit 1F1B (pipelining failed), 16 x 1 x 4096", micro_batch=1, seq=4096, mode="pp", pp_microbatches=16, pp_impl="manual")),
        C("h200x8-moe1b-ep8-bf16-mb4-s2048", MOE_1B, hw, "MoE 1.2B, one expert per rank over 8 ranks, all_to_all_single, DDP for the rest, mb4 seq2048 per rank", micro_batch=4, mode="ep", gpus=8),
    ]


def _profile_one(lst):
    for s in lst:
        s["profile_active"] = 1
        if s.get("fallback"):
            s["fallback"]["profile_active"] = 1
    return lst


MACHINES = {"h100": h100_cases, "h200": lambda: _one_step_traces(h200_cases()),
            "h200x2": lambda: _one_step_traces(h200x2_cases()),
            "h200x2-par": lambda: _profile_one(h200x2_par_cases()),
            "h200x4": lambda: _profile_one(h200x4_cases()),
            "h200x8": lambda: _profile_one(h200x8_cases())}


def run_one(spec, out, tiny, deadline, log):
    spec = copy.deepcopy(spec)
    fallback = spec.pop("fallback", None)
    gpus = spec.pop("gpus", 1)
    remaining = deadline - time.time()
    # a torchrun'd parallel case needs about a minute (start, NCCL, warm-up, steps, profile, export)
    if remaining < (60 if spec.get("mode") in PARALLEL_MODES else 45):
        log(f"SKIP {spec['name']}: {remaining:.0f}s left")
        return False
    env = dict(os.environ)
    env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    if tiny:
        env["CUDA_VISIBLE_DEVICES"] = ""
    script = "train_step.py"
    if spec.get("mode") in PARALLEL_MODES:
        script = "parallel_step.py"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}"]
    elif gpus > 1 and not tiny:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}"]
    elif spec.get("mode") in ("ddp", "fsdp") and tiny:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"] if gpus == 1 else \
              [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}"]
    else:
        cmd = [sys.executable]
    cmd += [str(HERE / script), "--spec", json.dumps(spec), "--out", str(out),
            "--deadline", str(deadline - 5)]
    if tiny:
        cmd.append("--tiny")
        if script == "parallel_step.py":
            cmd.append("--check")
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
    log(table(specs, Path(a.out)))


def table(specs, out: Path) -> str:
    """A short table of the cases of this list found under `out` (fallbacks included)."""
    import tomllib
    rows = [f"{'case':<48} {'step ms':>8} {'min-max':>13} {'peak GB':>8} {'util':>6} {'tok/s':>8}"]
    for s in specs:
        for c in (s, s.get("fallback")):
            if not c:
                continue
            f = out / c["name"] / "case.toml"
            if not f.exists():
                rows.append(f"{c['name']:<48} {'-':>8}")
                continue
            m = tomllib.loads(f.read_text())["measured"]
            rows.append(f"{c['name']:<48} {m['step_time_s']*1e3:8.1f} {m['step_time_s_min']*1e3:6.1f}-{m['step_time_s_max']*1e3:6.1f}"
                        f" {m['peak_allocated_bytes']/1e9:8.2f} {m['gpu_utilization']:6.3f} {m['tokens_per_s']:8.0f}")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
