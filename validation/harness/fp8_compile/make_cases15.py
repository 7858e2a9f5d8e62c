"""Turn the issue-15 device results (validation/measured_libraries/_raw_issue15/results_*.json) into one
folder per case: case.toml (validation/cases format plus what ghsim cannot express yet), result.json, trace.

    python3 validation/harness/fp8_compile/make_cases15.py TRACE_ROOT

TRACE_ROOT holds c1/ c2/ c3/ c4/ (the traces_*.tar of each device call, unpacked). Where a case ran in
two calls, the later run is the case (it also recorded the forward+backward peak); the other run's
step times stay in result.json under other_runs. The kernel summary is recomputed from the trace
(GPU busy = union of kernel intervals over the CPU-side ProfilerStep#2 range).
"""
from __future__ import annotations

import json
import lzma
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "measured_libraries"
MODEL = {
    "3b": ("llama-3.2-3b-shape", 3072, 8192, 28, 24, 8, 128),
    "1b": ("llama-3.2-1b-shape", 2048, 8192, 16, 32, 8, 64),
}
SOFT = ("torch 2.11.0+cu130, CUDA 13.0, cuDNN 9.19.0, driver 580.159.04, triton 3.6.0, transformers 5.17.0, "
        "peft 0.21.0, torchao 0.18.0 (carried wheel)")
METHOD = ("validation/harness/fp8_compile/step15.py (one process per case, run by batch15.py): HF LlamaForCausalLM "
          "from LlamaConfig, random weights, random tokens, labels=input_ids (HF loss), sdpa attention; full "
          "fine-tuning: fp32 params + torch.autocast(bf16) + torch.optim.AdamW() (foreach); step = forward + backward "
          "+ optimizer.step() + zero_grad(set_to_none) + torch.cuda.synchronize(), host perf_counter; 3 warm-up steps "
          "(4 when compiled), median of 6 timed; HBM peaks = max over the timed steps of torch.cuda.max_memory_"
          "allocated/reserved (reset at each step start); peak_fwd_bwd = the allocated peak read right after "
          "loss.backward(); one step traced with torch.profiler (CPU + CUDA, schedule wait 1 / warmup 1 / active 1), "
          "xz-compressed")
CALL_ORDER = {"c1": 1, "c2": 2, "c3": 3, "c4": 4, "c4b": 5, "c5": 6}


def kernel_summary(trace_file: Path):
    ev = json.load(lzma.open(trace_file))["traceEvents"]
    steps = [e for e in ev if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#")]
    kern = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "kernel"]
    iv = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in kern)
    busy, cs, ce = 0.0, None, None
    for s, e in iv:
        if ce is None or s > ce:
            busy += (ce - cs) if ce is not None else 0.0
            cs, ce = s, e
        else:
            ce = max(ce, e)
    busy += (ce - cs) if ce is not None else 0.0
    wall = sum(e["dur"] for e in steps)
    return {"kernels": len(kern), "kernel_us": sum(e.get("dur", 0) for e in kern), "gpu_busy_us": busy,
            "step_wall_us": wall, "gpu_utilization": busy / wall if wall else None,
            "fp8_gemm_kernels": sum(1 for e in kern if "f8" in e["name"].lower() or "fp8" in e["name"].lower()
                                    or "e4m3" in e["name"].lower()),
            "triton_kernels": sum(1 for e in kern if e["name"].startswith("triton_"))}


def load_runs():
    runs = {}
    for f in sorted((ROOT / "_raw_issue15").glob("results_*.json")):
        call = re.match(r"results_\w+?_(c\d+b?)\.json", f.name).group(1)
        for r in json.loads(f.read_text()):
            if "tiny" in r["name"]:
                continue  # smoke test of each code path only
            r["_call"] = call
            runs.setdefault(r["name"], []).append(r)
    return runs


def plan_for(sp, r):
    p = {"gpus": 1, "gpus_per_node": 1, "precision": "fp8" if sp["fp8"] != "none" else "bf16", "recompute": "none",
         "micro_batch": sp["mb"], "seq": sp["seq"], "grad_accum": 1, "lora_rank": 16 if sp["lora"] else 0,
         "offload": [], "zero": 0, "optimizer": "adamw", "optimizer_impl": "foreach", "framework": "torch-amp"}
    if sp["lora"]:
        p["lora_targets"] = list(sp["lora"])  # peft's target_modules, as run
    if sp["compile"] == "reduce-overhead":
        p["cuda_graphs"] = True
    notes = []
    if sp["compile"] != "none":
        how = "torch.compile(model)" if sp["compile"] == "default" else 'torch.compile(model, mode="reduce-overhead")'
        notes.append(f"{how} of the "
                     "whole LlamaForCausalLM (loss inside); optimizer not compiled; first step (compilation) "
                     f"{r.get('first_step_s', 0):.0f} s; ghsim has no compile option yet")
    if sp["compile"] == "reduce-overhead":
        notes.append("CUDA graphs (cudagraph trees): torch.compiler.cudagraph_mark_step_begin() before each step; "
                     "max_memory_allocated is far below the other compiled runs while reserved is higher: the graph "
                     "pool's memory is not all counted as allocated")
    if sp["fp8"] != "none":
        notes.append(f"torchao 0.18 convert_to_float8_training(Float8LinearConfig.from_recipe_name('{sp['fp8']}')) on "
                     f"all {r.get('fp8_linears')} decoder-layer nn.Linear; lm_head (tied to the embedding) stays bf16 "
                     "(torchtitan's filter); master weights fp32, autocast bf16 for the rest; "
                     + ("tensorwise: dynamic per-tensor scales, e4m3 forward / e5m2 gradients, cuBLAS"
                        if sp["fp8"] == "tensorwise" else
                        "rowwise: dynamic per-row scales (power of two), e4m3 for all operands, CUTLASS rowwise GEMM"))
    if sp["lora"]:
        notes.append(f"peft {r.get('peft')} LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="
                     f"{sp['lora']}): {r.get('n_trainable')} trainable params, adapters {r.get('adapter_dtypes')} "
                     "(peft autocast_adapter_dtype), frozen base bf16, autocast bf16 (lora_targets as run)")
    if sp["norm"] == "torch":
        p["fused_norm"] = True
        notes.append(f"all {r.get('norms_swapped')} LlamaRMSNorm replaced by torch.nn.RMSNorm (same eps and weight)")
    return p, notes


def write_case(r, others, trace_root: Path):
    sp = r["spec"]
    name = r["name"]
    d = ROOT / name
    d.mkdir(parents=True, exist_ok=True)
    mname, h, i, L, nh, kv, hd = MODEL[sp["model"]]
    plan, notes = plan_for(sp, r)
    desc = {"none": "eager", "default": "torch.compile", "reduce-overhead": "torch.compile reduce-overhead"}[sp["compile"]]
    if sp["fp8"] != "none":
        desc = f"torchao float8 {sp['fp8']}, " + desc
    if sp["lora"]:
        desc = f"peft LoRA r16 on {','.join(t.replace('_proj', '') for t in sp['lora'])}, " + desc
    if sp["norm"] == "torch":
        desc = "torch.nn.RMSNorm, " + desc
    desc = f"HF Llama {desc}, {mname}, mb{sp['mb']} seq{sp['seq']}, no recompute"
    trace = trace_root / r["_call"].rstrip("b") / f"{name}.trace.json.xz"
    lines = ["[case]", f"name = {json.dumps(name)}", f"description = {json.dumps(desc)}", 'hardware = "h100-sxm"',
             'date = "2026-11-24"', f"gpu = {json.dumps(r.get('gpu'))}", f"software = {json.dumps(SOFT)}",
             f"method = {json.dumps(METHOD)}"]
    if trace.exists():
        lines.append('trace = "trace.pt.trace.json.xz"')
    lines += [f"plan_notes = {json.dumps(' | '.join(notes))}", "", "[model]", f"name = {json.dumps(mname)}",
              f"source = {json.dumps('synthetic, HF LlamaConfig with the ' + mname + ' (Llama-3.2) dimensions, random weights')}",
              f"hidden_size = {h}", f"intermediate_size = {i}", f"num_layers = {L}", f"num_attention_heads = {nh}",
              f"num_kv_heads = {kv}", f"head_dim = {hd}", "vocab_size = 128256", "tie_embeddings = true",
              "max_seq_len = 2048", "", "[plan]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in plan.items()]
    st = r["step_times_s"]
    lines += ["", "[measured]", f"step_time_s = {r['step_time_s']}", f"step_time_s_min = {min(st)}",
              f"step_time_s_max = {max(st)}", f"peak_allocated_bytes = {r['peak_allocated_bytes']}",
              f"peak_reserved_bytes = {r['peak_reserved_bytes']}"]
    if r.get("peak_fwd_bwd_allocated_bytes"):
        lines.append(f"peak_fwd_bwd_allocated_bytes = {r['peak_fwd_bwd_allocated_bytes']}")
    lines += [f"tokens_per_s = {r['tokens_per_s']}", f"first_step_s = {r['first_step_s']}"]
    if trace.exists():
        ks = kernel_summary(trace)
        r["kernel_summary_trace"] = ks
        lines += [f"gpu_utilization = {ks['gpu_utilization']:.4f}", f"kernels_per_step = {ks['kernels']}"]
        shutil.copy(trace, d / "trace.pt.trace.json.xz")  # one over 2 MB at xz -6 was recompressed (xz -9e) beforehand
    lines += ["", "[hardware_overrides]",
              '"cpu.cores" = { value = 16, source = "measured machine: 16 vCPUs (os.cpu_count) in a Firecracker VM" }', ""]
    (d / "case.toml").write_text("\n".join(lines))
    r.pop("kernel_summary", None)  # computed on the device with the GPU annotation counted twice: see kernel_summary_trace
    r["other_runs"] = [{"call": o["_call"], "step_time_s": o.get("step_time_s"), "step_times_s": o.get("step_times_s"),
                        "peak_allocated_bytes": o.get("peak_allocated_bytes"), "first_step_s": o.get("first_step_s"),
                        "ok": o.get("ok"), "error": o.get("error")} for o in others]
    (d / "result.json").write_text(json.dumps(r, indent=1, default=str))
    return r


def main():
    trace_root = Path(sys.argv[1])
    n = 0
    for name, rs in sorted(load_runs().items()):
        ok = sorted([r for r in rs if r.get("ok")], key=lambda r: CALL_ORDER[r["_call"]])
        if not ok:
            print("no finished run:", name, [r.get("error") for r in rs])
            continue
        main_run = ok[-1]
        write_case(main_run, [r for r in rs if r is not main_run], trace_root)
        n += 1
    print(n, "cases")


if __name__ == "__main__":
    main()
