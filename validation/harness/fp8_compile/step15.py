"""One training-step case, run the way the libraries run it (issue 15, part 1).

    python3 validation/harness/fp8_compile/step15.py --spec '<json>' --out DIR

Spec keys: name, model (3b | 1b | tiny), mb, seq, compile (none | default | reduce-overhead),
fp8 (none | tensorwise | rowwise: torchao.float8.convert_to_float8_training), lora (list of
target module names for peft LoRA r16, alpha 32, dropout 0; empty = full fine-tuning),
norm (hf | torch: swap every LlamaRMSNorm for torch.nn.RMSNorm), warmup, steps, profile.

Model: Hugging Face LlamaForCausalLM from a LlamaConfig (random weights, no download), sdpa
attention, tied embeddings (Llama-3.2 configs). Precision as ghsim's default plan (torch-amp):
full fine-tuning keeps fp32 parameters and runs forward + loss under torch.autocast(bfloat16),
torch.optim.AdamW with no flags (foreach on CUDA). LoRA: frozen base built in bf16 (as ghsim's
LoRA plan), peft adapters (peft keeps them fp32: autocast_adapter_dtype=True), autocast bf16.
FP8 (torchao): every nn.Linear in the decoder layers converted; lm_head stays bf16 (torchtitan's
filter; it is tied to the embedding here).
Step = forward with labels (HF loss) + backward + optimizer.step() + zero_grad(set_to_none),
then torch.cuda.synchronize(); host perf_counter; the first step (compilation) is timed alone
(first_step_s); median of `steps` timed steps after `warmup` warm-up steps. HBM peaks:
max_memory_allocated/reserved over the timed steps (reset after warm-up) and over all steps
(reset after init). Then 3 steps under torch.profiler with schedule(wait=1, warmup=1, active=1):
the trace holds ProfilerStep#2 (CPU + CUDA activity), xz -6 compressed.

Writes DIR/<name>.json and DIR/<name>.trace.json.xz.
"""
from __future__ import annotations

import argparse
import json
import lzma
import os
import statistics
import sys
import time
import traceback

# the same HF Llama shapes and construction as the offload cases (issue 14): one definition
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "libraries"))
from lib_step import build_model as _lib_build_model  # noqa: E402


def build_model(spec, torch, dtype, dev):
    """HF LlamaForCausalLM from a LlamaConfig (random weights), no gradient checkpointing."""
    return _lib_build_model(dict(spec, ckpt=False), torch, dtype, dev)[0]


def swap_norms(model, torch):
    """Replace HF LlamaRMSNorm by torch.nn.RMSNorm (same eps, same weight)."""
    n = 0
    for parent in list(model.modules()):
        for cname, child in list(parent.named_children()):
            if type(child).__name__ == "LlamaRMSNorm":
                w = child.weight
                new = torch.nn.RMSNorm(w.shape[0], eps=child.variance_epsilon, device=w.device, dtype=w.dtype)
                with torch.no_grad():
                    new.weight.copy_(w)
                setattr(parent, cname, new)
                n += 1
    return n


def kernel_summary(trace_path):
    """Kernel count/time of the profiled step, GPU busy fraction (union of kernel intervals / step wall)."""
    with open(trace_path) as f:
        tr = json.load(f)
    ev = tr.get("traceEvents", [])
    steps = [e for e in ev if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    kern = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "kernel"]
    by = {}
    for e in kern:
        d = by.setdefault(e["name"], [0, 0.0])
        d[0] += 1
        d[1] += e.get("dur", 0)
    iv = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in kern)
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in iv:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    wall = sum(e.get("dur", 0) for e in steps)
    top = sorted(by.items(), key=lambda kv: -kv[1][1])[:60]
    return {"profiler_steps": [e["name"] for e in steps], "profiled_step_wall_us": wall,
            "kernels": len(kern), "kernel_time_us": sum(v[1] for v in by.values()),
            "gpu_busy_us": busy, "gpu_utilization": (busy / wall) if wall else None,
            "memcpy_memset": sum(1 for e in ev if e.get("ph") == "X" and e.get("cat") in ("gpu_memcpy", "gpu_memset")),
            "top_kernels": [{"name": k[:300], "count": v[0], "us": round(v[1], 1)} for k, v in top]}


def run(spec, res, outdir):
    import torch
    import transformers
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    res.update(torch=torch.__version__, cuda=torch.version.cuda, gpu=torch.cuda.get_device_name(0),
               transformers=transformers.__version__, cudnn=torch.backends.cudnn.version())
    try:
        import triton
        res["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        pass
    mb, seq = spec["mb"], spec["seq"]
    lora = spec.get("lora") or []
    g = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, 128256, (mb, seq), device=dev, generator=g)
    t_init = time.perf_counter()
    model = build_model(spec, torch, torch.bfloat16 if lora else torch.float32, dev)
    if spec.get("norm", "hf") == "torch":
        res["norms_swapped"] = swap_norms(model, torch)
    if spec.get("fp8", "none") != "none":
        import torchao
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        res["torchao"] = torchao.__version__
        cfg = Float8LinearConfig.from_recipe_name(spec["fp8"])
        res["fp8_config"] = repr(cfg)
        convert_to_float8_training(model, config=cfg, module_filter_fn=lambda m, fqn: fqn != "lm_head")
        res["fp8_linears"] = sum(1 for m in model.modules() if type(m).__name__ == "Float8Linear")
    if lora:
        import peft
        from peft import LoraConfig, get_peft_model
        res["peft"] = peft.__version__
        lcfg = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=list(lora), task_type="CAUSAL_LM")
        model = get_peft_model(model, lcfg)
        res["lora_config"] = {"r": 16, "alpha": 32, "dropout": 0.0, "targets": list(lora)}
        res["adapter_dtypes"] = sorted({str(p.dtype) for n, p in model.named_parameters() if p.requires_grad})
    params = [p for p in model.parameters() if p.requires_grad]
    res["n_params"] = sum(p.numel() for p in model.parameters())
    res["n_trainable"] = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1)
    fwd = model
    cmode = spec.get("compile", "none")
    if cmode != "none":
        fwd = torch.compile(model) if cmode == "default" else torch.compile(model, mode=cmode)
    ro = cmode == "reduce-overhead"

    fb_peak = []

    def step():
        if ro:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(input_ids=ids, labels=ids).loss
        loss.backward()
        fb_peak.append(torch.cuda.max_memory_allocated())  # host-side allocator stat: no sync needed
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach().float().clone()

    res["init_s"] = time.perf_counter() - t_init
    res["mem_after_init"] = {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}
    torch.cuda.reset_peak_memory_stats()
    warm, nsteps = spec.get("warmup", 3), spec.get("steps", 5)
    times, losses, step_peaks = [], [], []
    for i in range(warm + nsteps):
        if i == warm:
            res["peak_allocated_warmup_bytes"] = torch.cuda.max_memory_allocated()
            res["peak_reserved_warmup_bytes"] = torch.cuda.max_memory_reserved()
            torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
        if i >= warm:  # per-step peaks: the forward+backward peak (before opt.step) and the whole step's
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if i >= warm:
            step_peaks.append((fb_peak[-1], torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()))
        if i == 0:
            res["first_step_s"] = dt
        losses.append(float(loss))
        if i >= warm:
            times.append(dt)
        print(f"  step {i} {dt:.4f}s loss {losses[-1]:.4f}", flush=True)
    res["step_times_s"] = times
    res["step_time_s"] = statistics.median(times)
    res["losses"] = losses
    res["peak_fwd_bwd_allocated_bytes"] = max(p[0] for p in step_peaks)
    res["peak_allocated_bytes"] = max(p[1] for p in step_peaks)
    res["peak_reserved_bytes"] = max(p[2] for p in step_peaks)
    res["tokens_per_s"] = mb * seq / res["step_time_s"]
    try:
        import torch._dynamo.utils as du
        res["dynamo_counters"] = {k: dict(v) for k, v in du.counters.items() if k in ("stats", "graph_break", "inductor")}
    except Exception:  # noqa: BLE001
        pass
    with open(os.path.join(outdir, spec["name"] + ".json.partial"), "w") as f:
        json.dump(res, f, default=str)
    if spec.get("profile", False):
        from torch.profiler import ProfilerActivity, profile, schedule
        tmp = f"/tmp/{spec['name']}.trace.json"
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     schedule=schedule(wait=1, warmup=1, active=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(tmp)) as prof:
            for _ in range(3):
                t0 = time.perf_counter()
                step()
                torch.cuda.synchronize()
                res.setdefault("profiled_steps_s", []).append(time.perf_counter() - t0)
                prof.step()
        res["kernel_summary"] = kernel_summary(tmp)
        xz = os.path.join(outdir, spec["name"] + ".trace.json.xz")
        with open(tmp, "rb") as fi, lzma.open(xz, "wb", preset=6) as fo:
            fo.write(fi.read())
        res["trace_raw_bytes"] = os.path.getsize(tmp)
        res["trace_xz_bytes"] = os.path.getsize(xz)
        os.remove(tmp)
        res["trace"] = spec["name"] + ".trace.json.xz"
    os.remove(os.path.join(outdir, spec["name"] + ".json.partial"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    spec = json.loads(a.spec)
    os.makedirs(a.out, exist_ok=True)
    res = {"name": spec["name"], "spec": spec, "ok": False}
    try:
        run(spec, res, a.out)
        res["ok"] = True
    except Exception as e:  # noqa: BLE001
        res["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
        res["traceback"] = traceback.format_exc()[-4000:]
        print(res["traceback"], flush=True)
    finally:
        with open(os.path.join(a.out, spec["name"] + ".json"), "w") as f:
            json.dump(res, f, indent=1, default=str)
        print(json.dumps({k: res.get(k) for k in ("name", "ok", "step_time_s", "peak_allocated_bytes", "error")},
                         default=str), flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
