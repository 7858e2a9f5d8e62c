"""Issue 15, session 6 (one device call): torchao's eager float8 host cost and the eager float8 cases,
interleaved with their bf16 baselines on one host, so the host speed is the same for both sides.

    HARNESS=<repo>/validation/harness python3 interleave15.py --out $OUT/interleave15.json [--budget-s 300]

* host (the calibration microbenchmark): host15c.py's tiny Hugging Face Llama (vocab 1024, seq 256, micro-batch
  1, hidden 256, head dim 64) at 2 and 8 decoder layers, built once per depth; torchao 0.18's
  convert_to_float8_training (tensorwise, rowwise; lm_head filtered out) is applied to the same model and its
  Float8Linear modules kept, so each of bf16 / tensorwise / rowwise is the same model with its nn.Linear modules
  swapped (Float8Linear.from_float shares the weight Parameter: same weights, same optimizer). `reps` rounds,
  each timing every (depth, recipe) in a rotated order: host15c.timed (host perf_counter per phase; call 1:
  blocks of 3 warm-up and 10 timed steps, 5 rounds; call 2: one step per visit, no warm-up, 40 rounds); launches per phase from one profiled step per (depth, recipe)
  (host15c.profile_phases). Per round: per decoder layer (8 less 2 layers) host seconds per launch and the
  float8 / bf16 ratios, so each round gives one ratio and the rounds give its spread.
* reference: microbench2's framework_overhead bf16-amp and fp8 rows on this host (the figures ghsim's calibration
  holds came from another call's host).
* cases (held out, nothing fitted to them): the step15.py model of each case (HF Llama-3.2 1B shape at
  micro-batch 4, 3B at micro-batch 1, seq 2048, fp32 parameters, autocast bf16, HF loss, AdamW foreach) built
  once per size, its linears swapped as above; `reps` rounds of bf16 / tensorwise / rowwise in rotated order,
  each block `warm` warm-up steps after a swap (3 in the first round) and `steps` timed steps (call 1: 1 and 5,
  4 rounds; call 2: 0 and 1, 12 rounds: the recipe changes every step) as step15.py times them (synchronize,
  perf_counter around forward+loss, backward, optimizer step, zero_grad, synchronize), with the host time of
  each phase. The ratio fp8 / bf16 per round (against the bf16 block of the same round) and its spread.
* fresh (if time is left): the same six cases by step15.py, one fresh process each, in the order bf16, fp8, ...
  (host15c.run_cases), as the case files were measured.
* machine: lscpu, CPU MHz lines, load average, nvidia-smi clocks, at the start and the end.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HARNESS = Path(os.environ.get("HARNESS", Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(HARNESS))
sys.path.insert(0, str(HARNESS / "fp8_compile"))
import host15c  # noqa: E402  (tiny model, phase timing, launch counting: one definition)

START = time.time()
RECIPES = host15c.RECIPES  # the same model with its linears swapped per recipe
CASE_MODELS = (("1b", 4), ("3b", 1))
FRESH = ["eager1b", "aotw1b", "aorw1b", "eager3b", "aotw3b", "aorw3b"]  # host15c.CASES keys


def machine():
    def sh(cmd):
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=20).stdout
        except Exception as e:  # noqa: BLE001
            return repr(e)
    return {"date": sh("date -u"), "loadavg": sh("cat /proc/loadavg"), "mhz": sh("grep MHz /proc/cpuinfo | sort | uniq -c"),
            "lscpu": sh("lscpu"), "gpu_clocks": sh("nvidia-smi --query-gpu=clocks.sm,clocks.mem,clocks.max.sm,"
                                                    "power.draw,temperature.gpu,pstate --format=csv")}


def swappable(model, recipes=RECIPES[1:]):
    """recipe -> {fqn: module}: the model's own nn.Linear modules (lm_head kept bf16) and, per float8 recipe,
    the Float8Linear modules convert_to_float8_training makes of them (sharing their weights)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    sets = {"bf16": {n: model.get_submodule(n) for n in names}}
    for r in recipes:
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(r),
                                   module_filter_fn=lambda m, fqn: fqn != "lm_head")
        sets[r] = {n: model.get_submodule(n) for n in names}
        install(model, sets["bf16"])
    return sets


def install(model, mods):
    for n, m in mods.items():
        parent, _, leaf = n.rpartition(".")
        setattr(model.get_submodule(parent), leaf, m)


def rotated(items, k):
    k %= len(items)
    return list(items[k:]) + list(items[:k])


def tiny_models() -> dict:
    """depth -> (model, recipe -> its linears, one timed step): host15c's tiny HF Llama at 2 and 8 layers."""
    models = {}
    for layers in (2, 8):
        torch.manual_seed(0)
        model = host15c.tiny_model(256, 512, layers, "bf16")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1)
        phases = host15c.phase_timer(model, opt, torch.randint(0, 1024, (1, 256), device="cuda"))
        models[layers] = (model, swappable(model), phases)
    return models


def header(script: str) -> dict:
    """The versions, GPU and machine state a result file starts with."""
    import torchao
    import transformers
    return {"torch": torch.__version__, "torchao": torchao.__version__, "transformers": transformers.__version__,
            "gpu": torch.cuda.get_device_name(0), "cpus": os.cpu_count(), "script": script, "machine_start": machine()}


def run_host(res, reps, block, warm, save):
    out = res.setdefault("host", {"rounds": [], "launches": {}, "block": block, "warm": warm})
    models = tiny_models()
    for layers, (model, sets, phases) in models.items():  # launch counts: one profiled step each
        for r in RECIPES:
            install(model, sets[r])
            host15c.timed(phases, 3, 1)
            p = host15c.profile_phases(phases)
            out["launches"][f"{r}-L{layers}"] = {"launches": p["launches"], "gpu_kernel_us": p["gpu_kernel_us"],
                                                  "top_self_cpu": p["top_self_cpu"][:12]}
    for rep in range(reps):
        rows = {}
        for layers, r in rotated([(L, r) for L in (2, 8) for r in RECIPES], rep):
            model, sets, phases = models[layers]
            install(model, sets[r])
            rows[f"{r}-L{layers}"] = host15c.timed(phases, warm, block)
        out["rounds"].append({"t_s": time.time() - START, "rows": rows})
        if rep % 10 == 0 or rep == reps - 1:
            save()
            print("host round", rep, {k: round(v["fwd_host_s"] * 1e3, 2) for k, v in rows.items()}, flush=True)
    del models
    gc.collect()
    torch.cuda.empty_cache()


def case_step(model, opt, ids):
    """step15.py's eager step, with the host seconds of each phase."""
    t0 = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t3 = time.perf_counter()
    loss.detach().float().clone()
    return t1 - t0, t2 - t1, t3 - t2


def run_cases(res, reps, steps, warm, budget_s, save):
    from step15 import build_model
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda", 0)
    out = res.setdefault("cases", {})
    for size, mb in CASE_MODELS:
        if time.time() - START > budget_s:
            out[size] = {"error": "skipped: call time budget"}
            continue
        t_init = time.perf_counter()
        g = torch.Generator(device="cuda").manual_seed(0)
        ids = torch.randint(0, 128256, (mb, 2048), device=dev, generator=g)
        model = build_model({"model": size, "mb": mb, "seq": 2048}, torch, torch.float32, dev)
        sets = swappable(model)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, betas=(0.9, 0.95),
                                weight_decay=0.1)
        rec = out[size] = {"mb": mb, "init_s": time.perf_counter() - t_init, "rounds": [],
                           "fp8_linears": {r: sum(type(m).__name__ == "Float8Linear" for m in s.values())
                                           for r, s in sets.items()}}
        for rep in range(reps):
            if time.time() - START > budget_s:
                rec["stopped"] = f"call time budget after {rep} rounds"
                break
            blocks = {}
            for r in rotated(RECIPES, rep):
                install(model, sets[r])
                walls, host = [], []
                torch.cuda.reset_peak_memory_stats()
                skip = 3 if rep == 0 else warm
                for i in range(skip + steps):
                    torch.cuda.synchronize()
                    w0 = time.perf_counter()
                    ph = case_step(model, opt, ids)
                    torch.cuda.synchronize()
                    if i >= skip:
                        walls.append(time.perf_counter() - w0)
                        host.append(ph)
                blocks[r] = {"step_s": statistics.median(walls), "walls": walls,
                             "host_s": [statistics.median(h[j] for h in host) for j in range(3)],
                             "peak_allocated_bytes": torch.cuda.max_memory_allocated()}
            rec["rounds"].append({"t_s": time.time() - START, "order": rotated(RECIPES, rep), "blocks": blocks})
            save()
            if steps > 1 or rep % 4 == 0:
                print(size, "round", rep, {r: round(b["step_s"], 4) for r, b in blocks.items()}, flush=True)
        del model, opt, sets
        gc.collect()
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=300)
    # call 1 ran the defaults (blocks of 10 / 5 steps); call 2 alternated every step (block 1, warm 0)
    ap.add_argument("--host-reps", type=int, default=5)
    ap.add_argument("--host-block", type=int, default=10)
    ap.add_argument("--host-warm", type=int, default=3)
    ap.add_argument("--case-reps", type=int, default=4)
    ap.add_argument("--case-steps", type=int, default=5)
    ap.add_argument("--case-warm", type=int, default=1)
    ap.add_argument("--parts", default="host,reference,cases,fresh")
    a = ap.parse_args()
    res = header(__doc__)
    host15c.START = START

    def save():
        Path(a.out).write_text(json.dumps(res, indent=1, default=str))
    parts = a.parts.split(",")
    steps = {"host": lambda: run_host(res, a.host_reps, a.host_block, a.host_warm, save),
             "reference": lambda: host15c.run_reference(res),
             "cases": lambda: run_cases(res, a.case_reps, a.case_steps, a.case_warm, a.budget_s - 40, save),
             "fresh": lambda: host15c.run_cases(res.setdefault("fresh", {}), FRESH, a.budget_s)}
    for name in parts:
        try:
            steps[name]()
        except Exception:  # noqa: BLE001
            import traceback
            res.setdefault("errors", []).append(f"{name}: {traceback.format_exc()[-1500:]}")
            print("failed", name, traceback.format_exc()[-600:], flush=True)
        res.setdefault("parts_done_s", []).append((name, time.time() - START))
        save()
    res["machine_end"] = machine()
    res["wall_s"] = time.time() - START
    save()


if __name__ == "__main__":
    main()
