"""Run a named set of step15.py cases, one fresh process each, inside one device call (issue 15).

    python3 validation/harness/fp8_compile/batch15.py --set 3b [--only k1,k2] [--budget-s 500] [--tag c2]

Results: $OUT/results_<set>_<tag>.json; traces (xz) in $OUT/traces_<set>_<tag>.tar;
logs in $OUT/logs_<set>_<tag>.tar.xz. A case that runs out of memory is retried once at half the
micro-batch.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "libraries"))
from batch import read_result  # noqa: E402  (the offload cases' reader: one definition)

HERE = Path(__file__).resolve().parent
ALL7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# key -> (name part, spec fields); profile chosen so that at most ~10 traces exist in all
VARIANTS = {
    "eager": ("hf-eager", {}),
    "compile": ("compile-default", {"compile": "default"}),
    "ro": ("compile-reduce-overhead", {"compile": "reduce-overhead"}),
    "aotwc": ("ao-tensorwise-compile", {"fp8": "tensorwise", "compile": "default"}),
    "aotw": ("ao-tensorwise-eager", {"fp8": "tensorwise"}),
    "aorwc": ("ao-rowwise-compile", {"fp8": "rowwise", "compile": "default"}),
    "aorw": ("ao-rowwise-eager", {"fp8": "rowwise"}),
    "qv": ("peft-qv", {"lora": ["q_proj", "v_proj"]}),
    "qkvo": ("peft-qkvo", {"lora": ["q_proj", "k_proj", "v_proj", "o_proj"]}),
    "all7": ("peft-all7", {"lora": ALL7}),
    "norm": ("hf-torchrmsnorm-eager", {"norm": "torch"}),
    "normc": ("hf-torchrmsnorm-compile", {"norm": "torch", "compile": "default"}),
}
PROFILE = {"3b": {"eager", "compile", "aotwc", "aorwc", "aotw", "qv", "ro"}, "1b": {"eager", "compile", "aotwc"},
           "tiny": {"eager", "aotwc"}}
ORDER = ["eager", "compile", "aotwc", "aotw", "aorwc", "aorw", "qv", "qkvo", "all7", "norm", "ro", "normc"]


def spec_for(model, key, mb, seq):
    part, extra = VARIANTS[key]
    compiled = extra.get("compile", "none") != "none"
    s = {"name": f"h100-{part}-llama{model}-mb{mb}-s{seq}", "key": key, "model": model, "mb": mb, "seq": seq,
         "compile": "none", "fp8": "none", "lora": [], "norm": "hf",
         "warmup": 4 if compiled else 3, "steps": 6, "profile": key in PROFILE.get(model, set())}
    s.update(extra)
    if model == "tiny":
        s.update(warmup=3 if compiled else 2, steps=2)
    return s


def sets():
    return {
        "smoke": [spec_for("tiny", k, 2, 512) for k in ("eager", "aotwc", "aorw", "ro", "qv", "norm")],
        "1b": [spec_for("1b", k, 4, 2048) for k in ORDER],
        "3b": [spec_for("3b", k, 1, 2048) for k in ORDER],
        # 4096 tokens a step for the 3B shape (mb1 is 2048); no traces (the ~10-trace budget is spent)
        "3bmb2": [dict(spec_for("3b", k, 2, 2048), profile=False) for k in ORDER],
    }


def run_case(spec, work, timeout):
    log = work / (spec["name"] + ".log")
    with open(log, "w") as lf:
        try:
            subprocess.run([sys.executable, str(HERE / "step15.py"), "--spec", json.dumps(spec), "--out", str(work)],
                           stdout=lf, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    return read_result(work, spec), log


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--budget-s", type=float, default=500)
    ap.add_argument("--case-timeout-s", type=float, default=300)
    ap.add_argument("--tag", default="c")
    a = ap.parse_args()
    t_start = time.time()
    cases = sets()[a.set]
    if a.only:
        keep = a.only.split(",")
        cases = sorted([c for c in cases if c["key"] in keep], key=lambda c: keep.index(c["key"]))
    out = Path(os.environ.get("OUT", "/tmp/out"))
    work = Path("/tmp/cases15")
    work.mkdir(parents=True, exist_ok=True)
    results, logs, queue = [], [], list(cases)
    tag = f"{a.set}_{a.tag}"
    while queue:
        spec = queue.pop(0)
        left = a.budget_s - (time.time() - t_start)
        if left < 40:
            results.append({"name": spec["name"], "spec": spec, "ok": False, "error": "skipped: call time budget"})
            continue
        print(f"== {spec['name']} (left {left:.0f}s)", flush=True)
        t0 = time.time()
        r, log = run_case(spec, work, min(a.case_timeout_s, left - 8))
        r["case_wall_s"] = time.time() - t0
        logs.append(log)
        tail = log.read_text()[-1500:]
        if not r.get("ok") and "out of memory" in (str(r.get("error")) + tail).lower() and spec["mb"] > 1:
            s2 = dict(spec, mb=spec["mb"] // 2, name=spec["name"].replace(f"-mb{spec['mb']}-", f"-mb{spec['mb'] // 2}-"))
            queue.insert(0, s2)
            r["retried_as"] = s2["name"]
        results.append(r)
        print(f"   -> ok={r.get('ok')} step={r.get('step_time_s')} first={r.get('first_step_s')} "
              f"peakA={(r.get('peak_allocated_bytes') or 0) / 2**30:.2f}G fb={(r.get('peak_fwd_bwd_allocated_bytes') or 0) / 2**30:.2f}G wall={r['case_wall_s']:.0f}s "
              f"err={str(r.get('error'))[:300]}", flush=True)
        if not r.get("ok"):
            print(tail[-800:], flush=True)
        (out / f"results_{tag}.json").write_text(json.dumps(results, indent=1, default=str))
    traces = [work / (r["name"] + ".trace.json.xz") for r in results]
    traces = [p for p in traces if p.exists()]
    if traces:
        with tarfile.open(out / f"traces_{tag}.tar", "w") as tf:
            for p in traces:
                tf.add(p, arcname=p.name)
    with tarfile.open(out / f"logs_{tag}.tar.xz", "w:xz") as tf:
        for p in logs:
            tf.add(p, arcname=p.name)
    print("\nSUMMARY", tag)
    for r in results:
        ks = r.get("kernel_summary") or {}
        print(f"{r['name']:52s} ok={r.get('ok')!s:5s} step={r.get('step_time_s') or 0:.4f}s "
              f"first={r.get('first_step_s') or 0:.1f}s peakA={(r.get('peak_allocated_bytes') or 0) / 2**30:.2f}G "
              f"peakR={(r.get('peak_reserved_bytes') or 0) / 2**30:.2f}G kern={ks.get('kernels')} "
              f"{str(r.get('error') or '')[:100]}")


if __name__ == "__main__":
    main()
