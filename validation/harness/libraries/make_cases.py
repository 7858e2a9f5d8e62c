"""Turn the device results (validation/measured_libraries/_raw/results_*.json) into one folder per case:
case.toml (validation/cases format, plus what ghsim cannot express), result.json, trace.

    python3 validation/harness/libraries/make_cases.py TRACE_DIR
"""
from __future__ import annotations

import gzip
import json
import lzma
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "measured_libraries"
MODEL = {
    "3b": ("llama-3.2-3b-shape", 3072, 8192, 28, 24, 8, 128),
    "1b": ("llama-3.2-1b-shape", 2048, 8192, 16, 32, 8, 64),
    "8b": ("llama-3.1-8b-shape", 4096, 14336, 32, 32, 8, 128),  # untied embeddings (lib_step.MODELS)
}
SOFT = "torch 2.11.0+cu130, CUDA 13.0, driver 580.159.04, transformers 5.17.0, deepspeed 0.19.8 (pure-Python wheel, DS_BUILD_OPS=0; CPUAdam/FusedAdam JIT-built on the device, AVX-512 host)"
METHOD = ("validation/harness/libraries/lib_step.py (one process per case, run by batch.py): HF LlamaForCausalLM "
          "from LlamaConfig, random weights, random tokens, labels=input_ids (HF loss); step = forward + backward + "
          "optimizer step (+zero_grad) + torch.cuda.synchronize(), host perf_counter; 3 warm-up steps, median of 5 "
          "timed; HBM peaks from torch.cuda.max_memory_allocated/reserved after reset_peak_memory_stats (after init); "
          "host peak = /proc/self/status VmHWM of the training process (children listed in result.json); pinned = "
          "torch.cuda.host_memory_stats allocated_bytes.peak (torch's caching host allocator only); one step traced "
          "with torch.profiler (CPU + CUDA)")


def tq(s):
    return json.dumps(s)


def plan_for(r):
    sp = r["spec"]
    mode = sp["mode"]
    p = {"gpus": 1, "gpus_per_node": 1, "precision": "bf16", "recompute": "full" if sp.get("ckpt") else "none",
         "micro_batch": sp["mb"], "seq": sp["seq"], "grad_accum": 1, "lora_rank": 0}
    notes = []
    if mode == "ds":
        z = sp["ds"]
        oo, op = z.get("offload_optimizer"), z.get("offload_param")
        offload = []
        if op:
            offload.append("params")
        if oo:
            offload += ["grads", "optimizer"]
        p.update(offload=offload, zero=z["stage"], optimizer="adamw",
                 optimizer_impl="cpu" if oo else "fused", framework="deepspeed", grad_clip=True)
        if oo:
            p["cpu_optimizer"] = "deepspeed-cpuadam"
            p["offload_pinned"] = bool(oo.get("pin_memory", True))
            if oo.get("super_offload"):
                p["offload_schedule"] = "superoffload"
                p["offload_ratio"] = float(oo.get("ratio", 1.0))
                p["cpu_cores_share"] = float(oo.get("cpuadam_cores_perc", 0.8))
            else:
                p["offload_schedule"] = "overlapped"
        eff = r.get("ds_zero_config_effective") or {}
        notes.append(f"DeepSpeed ran {r.get('ds_optimizer')} with {r.get('ds_inner_optimizer')}; "
                     f"overlap_comm={eff.get('overlap_comm')}, reduce_bucket_size={eff.get('reduce_bucket_size')}, "
                     f"sub_group_size={eff.get('sub_group_size')}, prefetch_bucket_size={eff.get('prefetch_bucket_size')}, "
                     f"param_persistence_threshold={eff.get('param_persistence_threshold')}, gradient_clipping=1.0")
        if oo:
            notes.append(f"CPU optimizer: DeepSpeedCPUAdam on torch's {r.get('torch_threads')} OpenMP threads")
        if oo and oo.get("super_offload"):
            eo = eff.get("offload_optimizer") or {}
            notes.append(f"SuperOffload: ratio={eo.get('ratio')}, cpuadam_cores_perc={eo.get('cpuadam_cores_perc')}: "
                         f"DeepSpeed pinned the training process to {r.get('affinity_after_init')} of 16 cores and "
                         "ran DeepSpeedCPUAdam in a spawned worker process on the rest (cpu_cores_share); ghsim "
                         "cannot express the second process's host memory")
        if not oo:
            notes.append("optimizer is DeepSpeed FusedAdam on the GPU (ghsim 'fused' is the nearest)")
    elif mode == "fsdp2":
        p.update(offload=["params", "grads", "optimizer"], zero=3, optimizer="adamw", optimizer_impl="cpu",
                 framework="fsdp-mixed", offload_pinned=True, cpu_optimizer="torch-forloop", grad_clip=True)
        notes.append("FSDP2 fully_shard per decoder layer + root, MixedPrecisionPolicy(param bf16, reduce fp32), "
                     "CPUOffloadPolicy(pin_memory=True); torch.optim.AdamW() with no foreach/fused flag on CPU "
                     "DTensors = torch's single-tensor for-loop implementation; clip_grad_norm_(1.0); "
                     f"torch.get_num_threads()={r.get('torch_threads')}; ghsim cannot express FSDP2's fp32 sharded "
                     "gradients on the host")
    else:
        impl = sp.get("impl")
        # bf16 working weights on the GPU and fp32 masters with the optimizer: the precision
        # semantics ghsim calls "deepspeed", run with the plain loop's sync schedule
        p.update(offload=["grads", "optimizer"], zero=0, optimizer="adamw", optimizer_impl="cpu",
                 framework="deepspeed", offload_schedule="sync", offload_pinned=True, cpu_optimizer=f"torch-{impl}")
        notes.append(f"plain loop: bf16 weights on the GPU (no autocast), fp32 master weights pinned on the CPU, "
                     f"torch.optim.AdamW({impl}=True) on CPU with {r.get('torch_threads')} threads; per-tensor "
                     "bf16 grad D2H into fp32 pinned (non_blocking) + sync, grads freed, CPU step, per-tensor fp32 "
                     "-> bf16 H2D; no overlap (ghsim: deepspeed precision semantics, sync offload schedule)")
    if sp.get("ckpt"):
        notes.append("recompute: HF gradient_checkpointing_enable(use_reentrant=False), one checkpoint per decoder layer")
    return p, notes


TRACE = "trace.pt.trace.json.xz"


def _copy_trace(r, trace_dir: Path, d: Path) -> bool:
    """The device's gzip trace, recompressed with xz (a third smaller; ghsim reads both) into the
    case folder; a trace already there from an earlier run is kept."""
    t = trace_dir / f"{r['name']}.trace.json.gz"
    if r.get("trace") and t.exists():
        with gzip.open(t) as src, lzma.open(d / TRACE, "wb", preset=6) as dst:
            shutil.copyfileobj(src, dst)
    return (d / TRACE).exists()


def write_case(r, trace_dir: Path):
    name = r["name"]
    profile = "h200-sxm" if "H200" in str(r.get("gpu", "")) else "h100-sxm"
    sp = r["spec"]
    d = ROOT / name
    d.mkdir(parents=True, exist_ok=True)
    mname, h, i, L, nh, kv, hd = MODEL[sp["model"]]
    plan, notes = plan_for(r)
    trace = _copy_trace(r, trace_dir, d)
    lines = ["[case]", f"name = {tq(name)}"]
    desc = {"ds": "DeepSpeed ZeRO-{} {}".format(sp.get("ds", {}).get("stage"),
                                                json.dumps({k: v for k, v in sp.get("ds", {}).items()
                                                            if k.startswith("offload")})),
            "fsdp2": "FSDP2 fully_shard + CPUOffloadPolicy, CPU AdamW (for-loop default)",
            "plain": f"plain PyTorch offload loop, CPU AdamW {sp.get('impl')}"}[sp["mode"]]
    full = desc + ", " + mname + ", mb" + str(sp["mb"]) + " seq" + str(sp["seq"]) + ", " + ("grad ckpt" if sp.get("ckpt") else "no ckpt")
    lines += [f"description = {tq(full)}",
              f'hardware = "{profile}"', 'date = "2026-11-24"', f"gpu = {tq(r.get('gpu', 'NVIDIA H100 80GB HBM3'))}",
              f"software = {tq(SOFT)}", f"method = {tq(METHOD)}"]
    if trace:
        lines.append(f'trace = "{TRACE}"')
    elif r.get("trace"):
        r["trace_lost"] = True  # recorded on the device, but the call's trace archive exceeded 16 MiB
    lines.append(f"plan_notes = {tq(' | '.join(notes))}")
    if not r.get("ok"):
        lines.append(f"status = {tq('failed: ' + str(r.get('error'))[:400])}")
    lines += ["", "[model]", f"name = {tq(mname)}", f"source = {tq('synthetic, HF LlamaConfig with the ' + mname + ' (Llama-3.2) dimensions, random weights')}",
              f"hidden_size = {h}", f"intermediate_size = {i}", f"num_layers = {L}", f"num_attention_heads = {nh}",
              f"num_kv_heads = {kv}", f"head_dim = {hd}", "vocab_size = 128256", "tie_embeddings = true",
              "max_seq_len = 2048", "", "[plan]"]
    for k, v in plan.items():
        lines.append(f"{k} = {json.dumps(v)}")
    if r.get("ok"):
        st = r["step_times_s"]
        hms = r.get("host_memory_stats") or {}
        kids = r.get("children") if isinstance(r.get("children"), list) else []
        lines += ["", "[measured]", f"step_time_s = {r['step_time_s']}", f"step_time_s_min = {min(st)}",
                  f"step_time_s_max = {max(st)}", f"peak_allocated_bytes = {r['peak_allocated_bytes']}",
                  f"peak_reserved_bytes = {r['peak_reserved_bytes']}", f"tokens_per_s = {r['tokens_per_s']}",
                  f"host_peak_rss_bytes = {r['host']['VmHWM']}"]
        if kids:
            lines.append(f"host_peak_rss_children_bytes = {sum(k.get('VmHWM', 0) for k in kids)}")
        if isinstance(hms, dict) and "allocated_bytes.peak" in hms:
            lines.append(f"pinned_host_bytes_torch_allocator = {hms['allocated_bytes.peak']}")
        lines.append(f"torch_num_threads = {r.get('torch_threads')}")
        lines.append(f"cpu_affinity_cores = {r.get('affinity_after_init')}")
    lines += ["", "[hardware_overrides]",
              '"cpu.cores" = { value = 16, source = "measured machine: 16 vCPUs (os.cpu_count) in a Firecracker VM, Intel Xeon with AVX-512 and AMX" }']
    if profile == "h100-sxm":  # the host microbenchmark ran on the H100 machine; the H200 machine's host
        # bandwidth comes from its calibration's CPU AdamW row (validate/cases.case_hardware)
        lines.append('"cpu.adamw_params_per_s" = { value = 4.675e9, source = "derived from the measured machine\'s host streaming bandwidth: 130.9 GB/s (_raw/microbench_host.json, torch add on 16 threads) / 28 B per fp32 AdamW update" }')
    lines.append("")
    (d / "case.toml").write_text("\n".join(lines))
    (d / "result.json").write_text(json.dumps(r, indent=1, default=str))

    return r


def main():
    trace_dir = Path(sys.argv[1])
    rows = []
    for f in sorted((ROOT / "_raw").glob("results_*.json")):
        if f.stem == "results_smoke":
            continue  # each code path on a tiny model: smoke tests only
        for r in json.loads(f.read_text()):
            if not r.get("ok") and r.get("error", "").startswith(("timeout", "skipped")):
                continue  # re-run later in another call
            rows.append(write_case(r, trace_dir))
    print(len(rows), "cases")


if __name__ == "__main__":
    main()
