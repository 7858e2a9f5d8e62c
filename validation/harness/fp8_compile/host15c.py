"""Issue-15 third round (one device call): what torchao's eager float8 training costs the host.

    python3 validation/harness/fp8_compile/host15c.py --out $OUT/host15c.json [--budget-s 420] [--cases aotw3b,...]

* layers: a tiny Hugging Face Llama (LlamaForCausalLM from a LlamaConfig: vocab 1024, seq 256, micro-batch 1,
  head dim 64) built as the measured cases build theirs (fp32 parameters, forward + HF loss under
  torch.autocast(bf16), torch.optim.AdamW() foreach, sdpa), in bf16 and converted with torchao 0.18's
  convert_to_float8_training (tensorwise, rowwise; lm_head filtered out), at 2 and 8 decoder layers
  (hidden 256) and 8 layers at hidden 1024. The GPU work of these shapes is a few microseconds a kernel, so
  the host is the bottleneck: host seconds per phase (perf_counter around forward, loss.backward(),
  optimizer.step(); torch.cuda.synchronize() before each step; median of 20 steps after 5 warm-ups), the
  step's wall time with a synchronize (median), the wall time of 10 steps issued back to back (one
  synchronize at the end), and from one profiled step the CUDA launch calls per phase (as microbench2's
  framework_overhead counts them), the kernel time per phase, and the CPU ops with the most self time.
  Differences between depths give the host seconds and kernels per decoder layer.
* reference: microbench2's framework_overhead rows (bf16-amp, fp8) on this host, the figures ghsim's
  calibration holds (hardware_profiles/calibration/h100.json), so hosts can be compared.
* real (--real 3b:tensorwise,rowwise,bf16): the same phase timing on the cases' own model (step15.py's
  build_model), 3 warm-up and 5 timed steps: whether those steps are host-bound.
* cases: the held-out eager float8 cases and their bf16 baselines re-run with step15.py (no trace), on
  this host, as a second measurement (they stay held out: nothing is fitted to them).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

# the repository's harness (this script may run from a copy outside it: the device call's carry folder)
HARNESS = Path(os.environ.get("HARNESS", Path(__file__).resolve().parents[1]))
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx",
                "cudaMemcpyAsync", "cudaMemsetAsync", "cudaLaunchCooperativeKernel")
CONFIGS = [(256, 512, 2), (256, 512, 8), (1024, 2048, 8)]  # hidden, intermediate, layers
RECIPES = ("bf16", "tensorwise", "rowwise")
CASES = {  # key -> (model, micro-batch, fp8 recipe), as batch15.py names them
    "aotw3b": ("3b", 1, "tensorwise"), "aorw1b": ("1b", 4, "rowwise"), "aorw3b": ("3b", 1, "rowwise"),
    "eager3b": ("3b", 1, "none"), "aotw1b": ("1b", 4, "tensorwise"), "eager1b": ("1b", 4, "none")}
START = time.time()


def tiny_model(h, inter, layers, recipe):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=1024, hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=h // 64, num_key_value_heads=max(1, h // 128), head_dim=64,
                      max_position_embeddings=2048, tie_word_embeddings=True, use_cache=False,
                      attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).cuda()
    if recipe != "bf16":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                                   module_filter_fn=lambda m, fqn: fqn != "lm_head")
    return model


def profile_phases(phases):
    """Launch calls per phase (backward: the step's total less forward and optimizer, as the autograd
    engine launches from its own thread), kernel microseconds per phase, top CPU ops by self time."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        phases()
        torch.cuda.synchronize()
    events = list(prof.events())
    spans = {e.name: (e.time_range.start, e.time_range.end) for e in events if e.name in ("fwd", "bwd", "opt")}
    launches = {k: 0 for k in spans}
    total = 0
    for e in events:
        if e.name.startswith(LAUNCH_CALLS):
            total += 1
            for k, (s, en) in spans.items():
                if s <= e.time_range.start <= en:
                    launches[k] += 1
    launches["bwd"] = total - launches.get("fwd", 0) - launches.get("opt", 0)
    kern = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")]
    gpu_us = sum(e.device_time_total for e in kern if not e.name.startswith(("Memcpy", "Memset")))
    top = sorted(prof.key_averages(), key=lambda a: -a.self_cpu_time_total)[:30]
    return {"launches": launches, "launches_total": total, "gpu_kernel_us": gpu_us,
            "top_self_cpu": [(a.key[:80], a.count, round(a.self_cpu_time_total, 1)) for a in top]}


def phase_timer(model, opt, ids):
    """One training step as the cases run it (HF loss under autocast): host seconds of forward, backward,
    optimizer (microbench2's step_phases)."""
    sys.path.insert(0, str(HARNESS))
    from microbench2 import step_phases

    def forward():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return model(input_ids=ids, labels=ids).loss
    return lambda: step_phases(opt, forward)


def timed(phases, warm, steps):
    """Median host seconds per phase and step wall time (synchronize before and after each step)."""
    for _ in range(warm):
        phases()
    samples, walls = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        w0 = time.perf_counter()
        samples.append(phases())
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - w0)
    return {**{f"{p}_host_s": statistics.median(s[i] for s in samples) for i, p in enumerate(("fwd", "bwd", "opt"))},
            "step_wall_s": statistics.median(walls), "samples": samples, "walls": walls}


def run_layers(res, configs=CONFIGS, save=lambda: None):
    rows = res.setdefault("layers", [])
    for h, inter, layers in configs:
        for recipe in RECIPES:
            torch.manual_seed(0)
            model = tiny_model(h, inter, layers, recipe)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1)
            phases = phase_timer(model, opt, torch.randint(0, 1024, (1, 256), device="cuda"))
            t = timed(phases, 5, 20)
            b0 = time.perf_counter()
            for _ in range(10):
                phases()
            torch.cuda.synchronize()
            back_to_back = (time.perf_counter() - b0) / 10
            row = {"hidden": h, "intermediate": inter, "layers": layers, "recipe": recipe,
                   **{k: v for k, v in t.items() if k not in ("samples", "walls")},
                   "back_to_back_step_s": back_to_back, **profile_phases(phases)}
            rows.append(row)
            save()  # a call cut short keeps the rows so far
            print("layers", {k: v for k, v in row.items() if k != "top_self_cpu"}, flush=True)
            del model, opt
            torch.cuda.empty_cache()


def run_real(res, model_name, recipes, budget_s):
    """Host seconds per phase of the cases' own model (HF Llama at the 1B/3B shape, seq 2048), as step15.py
    builds it: is the step host-bound, and what does the host spend per launch there."""
    sys.path.insert(0, str(HARNESS / "fp8_compile"))
    from step15 import build_model
    rows = res.setdefault("real", [])
    mb = {"3b": 1, "1b": 4}[model_name]
    for recipe in recipes:
        if time.time() - START > budget_s:
            rows.append({"model": model_name, "recipe": recipe, "error": "skipped: call time budget"})
            continue
        t0 = time.time()
        model = build_model({"model": model_name, "seq": 2048, "mb": mb}, torch, torch.float32, torch.device("cuda", 0))
        if recipe != "bf16":
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
            convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                                       module_filter_fn=lambda m, fqn: fqn != "lm_head")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1)
        ids = torch.randint(0, 128256, (mb, 2048), device="cuda")
        row = {"model": model_name, "mb": mb, "recipe": recipe, **timed(phase_timer(model, opt, ids), 3, 5),
               "wall_s": time.time() - t0}
        rows.append(row)
        print("real", row, flush=True)
        del model, opt
        torch.cuda.empty_cache()


def run_reference(res):
    """microbench2's framework_overhead rows for bf16-amp and fp8 (our harness model) on this host."""
    sys.path.insert(0, str(HARNESS))
    import microbench as mb
    import microbench2 as mb2
    mb.CUDA, mb.DEV = True, "cuda"
    every = mb2.overhead_variants
    mb2.overhead_variants = lambda tiny: [v for v in every(tiny) if v[0] in ("bf16-amp", "fp8")]

    class Always:
        def ok(self, *a):
            return True
    mb2.run_overhead(res, Always(), False)


def run_cases(res, keys, budget_s):
    out = res.setdefault("cases", [])
    work = Path("/tmp/cases15c")
    work.mkdir(parents=True, exist_ok=True)
    for key in keys:
        left = budget_s - (time.time() - START)
        if left < 45:
            out.append({"key": key, "ok": False, "error": "skipped: call time budget"})
            continue
        model, mb, fp8 = CASES[key]
        name = f"h100-{'hf-eager' if fp8 == 'none' else f'ao-{fp8}-eager'}-llama{model}-mb{mb}-s2048"
        spec = {"name": name, "key": key, "model": model, "mb": mb, "seq": 2048, "compile": "none", "fp8": fp8,
                "lora": [], "norm": "hf", "warmup": 3, "steps": 6, "profile": False}
        t0 = time.time()
        try:
            subprocess.run([sys.executable, str(HARNESS / "fp8_compile" / "step15.py"), "--spec", json.dumps(spec), "--out", str(work)],
                           timeout=left - 5, capture_output=True)
        except subprocess.TimeoutExpired:
            pass
        f = work / f"{name}.json"
        r = json.loads(f.read_text()) if f.exists() else {"ok": False, "error": "no result"}
        keep = ("ok", "error", "step_time_s", "step_times_s", "first_step_s", "peak_allocated_bytes", "init_s")
        out.append({"key": key, "name": name, "wall_s": time.time() - t0, **{k: r.get(k) for k in keep}})
        print("case", out[-1], flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--real", default="", help="e.g. 3b:tensorwise,rowwise,bf16: phase host times of the cases' model")
    ap.add_argument("--configs", default=",".join("x".join(map(str, c)) for c in CONFIGS),
                    help="hidden x intermediate x layers of the tiny models, comma-separated")
    a = ap.parse_args()
    configs = [tuple(int(v) for v in c.split("x")) for c in a.configs.split(",") if c]
    import torchao
    import transformers
    res = {"torch": torch.__version__, "torchao": torchao.__version__, "transformers": transformers.__version__,
           "gpu": torch.cuda.get_device_name(0), "cpus": os.cpu_count(), "script": __doc__}
    try:
        res["cpu_model"] = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    def save():
        Path(a.out).write_text(json.dumps(res, indent=1, default=str))
    parts = [lambda r: run_layers(r, configs, save), run_reference] if configs else []
    if a.real:
        name, recipes = a.real.split(":")
        parts.insert(0, lambda r: run_real(r, name, recipes.split(","), a.budget_s))
    for part in parts:
        try:
            part(res)
        except Exception as e:  # noqa: BLE001
            import traceback
            res.setdefault("errors", []).append(traceback.format_exc()[-1500:])
            print("failed", e, flush=True)
        res.setdefault("parts_done_s", []).append(time.time() - START)
        save()
    run_cases(res, [k for k in a.cases.split(",") if k], a.budget_s)
    res["wall_s"] = time.time() - START
    Path(a.out).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
