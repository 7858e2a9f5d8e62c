"""Run a list of lib_step.py cases, each in its own process, inside one device call.

    python3 validation/harness/libraries/batch.py --set NAME [--budget-s 540] [--tiny]

Results land in $OUT/results_<set>.json, traces in $OUT/traces_<set>.tar.gz,
logs in $OUT/logs_<set>.tar.gz. A case that OOMs is retried once with half the micro-batch.
A case with "nproc" > 1 runs under DeepSpeed's launcher (mode ds: `deepspeed --num_gpus N`, as DeepSpeed's
docs launch it) or torchrun (fsdp2); its ranks' own results come back under "ranks". A case whose "min_s"
(seconds it needs) exceeds the time left is skipped rather than cut off; "max_s" caps a case's time (its
profiled step is dropped first), leaving the rest to the cases after it.
"""
from __future__ import annotations

import argparse
import signal
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

OFF_PIN = {"device": "cpu", "pin_memory": True}
OFF_NOPIN = {"device": "cpu", "pin_memory": False}


def ds(stage, **kw):
    z = {"stage": stage, "contiguous_gradients": True}
    z.update(kw)
    return z


def ds_cases(model, ckpt, mb, seq=2048, tag="", gpu="h100"):
    base = f"{gpu}-ds-{{}}-llama{model}-{'ckpt' if ckpt else 'nockpt'}-mb{mb}-s{seq}{tag}"
    mk = lambda n, z: {"name": base.format(n), "mode": "ds", "model": model, "ckpt": ckpt, "mb": mb, "seq": seq,
                       "ds": z}
    return {
        "z2off": mk("z2-offopt-pin", ds(2, offload_optimizer=OFF_PIN)),
        "z2offnp": mk("z2-offopt-nopin", ds(2, offload_optimizer=OFF_NOPIN)),
        "z3off": mk("z3-offopt", ds(3, offload_optimizer=OFF_PIN)),
        "z3offp": mk("z3-offparam-offopt", ds(3, offload_optimizer=OFF_PIN, offload_param=OFF_PIN)),
        "z3super": mk("z3-superoffload", ds(3, offload_optimizer=dict(OFF_PIN, super_offload=True))),
        "z3super90": mk("z3-superoffload-r0.9-c0.9",
                        ds(3, offload_optimizer=dict(OFF_PIN, super_offload=True, ratio=0.9,
                                                     cpuadam_cores_perc=0.9))),
        "z0": mk("z0", ds(0)),
        "z1": mk("z1", ds(1)),
        "z2": mk("z2", ds(2)),
        "z3": mk("z3", ds(3)),
    }


def other_cases(model, ckpt, mb, seq=2048, gpu="h100"):
    base = f"{gpu}-{{}}-llama{model}-{'ckpt' if ckpt else 'nockpt'}-mb{mb}-s{seq}"
    return {
        "fsdp2off": {"name": base.format("fsdp2-cpuoffload"), "mode": "fsdp2", "model": model, "ckpt": ckpt,
                     "mb": mb, "seq": seq, "impl": "default"},
        "plainforeach": {"name": base.format("plain-cpuadamw-foreach"), "mode": "plain", "model": model,
                         "ckpt": ckpt, "mb": mb, "seq": seq, "impl": "foreach"},
        "plainfused": {"name": base.format("plain-cpuadamw-fused"), "mode": "plain", "model": model,
                       "ckpt": ckpt, "mb": mb, "seq": seq, "impl": "fused"},
    }


def ds_x2_cases(gpu: str) -> list[dict]:
    """ZeRO-3 + offload_optimizer on 2 GPUs under the deepspeed launcher: a tiny smoke of the same path, then
    the Llama-3.2-3B shape (as the one-GPU case) and the Llama-3.1-8B shape (untied embeddings)."""
    z = ds(3, offload_optimizer=OFF_PIN)
    mk = lambda model, mb, seq, **kw: dict({
        "name": f"{gpu}-ds-z3-offopt-llama{model}-ckpt-mb{mb}-s{seq}", "mode": "ds", "model": model, "ckpt": True,
        "mb": mb, "seq": seq, "ds": z, "nproc": 2, "warmup": 2, "steps": 3}, **kw)
    return [mk("tiny", 2, 512, profile=False, min_s=20), mk("3b", 2, 2048, min_s=100, max_s=130), mk("8b", 2, 2048, min_s=120)]


def gpu_tag(nproc: int) -> str:
    """h100 / h200 (x N) from the first GPU's name, for case names decided on the machine."""
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True).stdout
    except OSError:
        name = ""
    tag = "h200" if "H200" in name else "h100"
    return f"{tag}x{nproc}" if nproc > 1 else tag


def sets(tiny=False):
    if tiny:
        d = ds_cases("tiny", True, 2, 512)
        o = other_cases("tiny", True, 2, 512)
        return {"smoke": [d["z2off"], d["z3super"], d["z3offp"], d["z2"], o["fsdp2off"], o["plainfused"]]}
    d3 = ds_cases("3b", True, 2)
    o3 = other_cases("3b", True, 2)
    d1 = ds_cases("1b", True, 4)
    o1 = other_cases("1b", True, 4)
    d3n = ds_cases("3b", False, 1)
    h3, ho3 = ds_cases("3b", True, 2, gpu="h200"), other_cases("3b", True, 2, gpu="h200")
    return {
        # the same 3B plans on an H200 machine (its own host), held out like the rest
        "h200": [h3["z2off"], h3["z3off"], h3["z2"], h3["z3"], ho3["plainfused"], h3["z3super"]],
        "a": [d3[k] for k in ("z2off", "z3off", "z3offp", "z3super", "z2offnp", "z2", "z3")],
        "b": [d3["z2offnp"], d3["z2"], d3["z3"], o3["fsdp2off"], o3["plainfused"]],
        "c": [o3["plainforeach"], d1["z2off"], d1["z3super"], d1["z2"], d3["z0"], d3["z1"]],
        "ds2": ds_x2_cases(gpu_tag(2)),
        "d": [d3["z3super90"], d3n["z2off"], d3n["z3off"], o1["fsdp2off"], o1["plainfused"], d3n["z3super"],
              d1["z3off"]],
    }


def read_result(work: Path, spec: dict) -> dict:
    """What a case process left in `work`: its result, the timed part of one cut off while
    profiling, or a failure naming the log."""
    j, part = work / (spec["name"] + ".json"), work / (spec["name"] + ".json.partial")
    if j.exists():
        return json.loads(j.read_text())
    if part.exists():
        r = json.loads(part.read_text())
        r["ok"] = True
        r["note"] = "timed out after timing, during profiling: no trace"
        return r
    return {"name": spec["name"], "spec": spec, "ok": False, "error": "timeout or crash; see log"}


def read_ranks(work: Path, spec: dict) -> list[dict]:
    """Ranks 1..N-1's own results (host and HBM figures per process) of a several-rank case."""
    out = []
    for rank in range(1, spec.get("nproc", 1)):
        stem = work / f"{spec['name']}.rank{rank}"
        path = next((p for p in (Path(f"{stem}.json"), Path(f"{stem}.json.partial")) if p.exists()), None)
        out.append(json.loads(path.read_text()) if path else {"rank": rank, "error": "no result"})
    return out


def command(spec: dict, work: Path) -> list[str]:
    """How users launch the case: one process, or N ranks under the library's launcher."""
    script = [str(HERE / "lib_step.py"), "--spec", json.dumps(spec), "--out", str(work)]
    n = spec.get("nproc", 1)
    if n == 1:
        return [sys.executable] + script
    if spec["mode"] == "ds":  # the `deepspeed` console script is this module's main
        return [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(n)] + script
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n)] + script


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", required=True)
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--case-timeout-s", type=float, default=240)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    t_start = time.time()
    cases = sets(a.tiny)[a.set]
    if a.only:
        keep = a.only.split(",")
        cases = [c for c in cases if any(k in c["name"] for k in keep)]
    out = Path(os.environ.get("OUT", "/tmp/out"))
    work = Path("/tmp/libcases")
    work.mkdir(parents=True, exist_ok=True)
    results = []
    logs = []
    queue = list(cases)
    while queue:
        spec = queue.pop(0)
        left = a.budget_s - (time.time() - t_start)
        if left < max(45, spec.get("min_s", 0)):
            results.append({"name": spec["name"], "spec": spec, "ok": False, "error": "skipped: call time budget"})
            continue
        log = work / (spec["name"] + ".log")
        print(f"== {spec['name']} (left {left:.0f}s)", flush=True)
        t0 = time.time()
        limit = min(a.case_timeout_s, left - 10, spec.get("max_s", a.case_timeout_s))
        spec = dict(spec, deadline=t0 + limit - 5)
        with open(log, "w") as lf:  # own process group: a launcher's ranks go down with it on a timeout
            proc = subprocess.Popen(command(spec, work), stdout=lf, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        wall = time.time() - t0
        logs.append(log)
        r = read_result(work, spec)
        if spec.get("nproc", 1) > 1:
            r["ranks"] = read_ranks(work, spec)
        r["case_wall_s"] = wall
        tail = log.read_text()[-600:]
        if not r.get("ok") and "out of memory" in (r.get("error", "") + tail).lower() and spec["mb"] > 1:
            s2 = dict(spec, mb=spec["mb"] // 2, name=spec["name"].replace(f"-mb{spec['mb']}-", f"-mb{spec['mb'] // 2}-"))
            queue.insert(0, s2)
            r["retried_as"] = s2["name"]
        results.append(r)
        print(f"   -> ok={r.get('ok')} step={r.get('step_time_s')} peak={r.get('peak_allocated_bytes')} "
              f"rss={r.get('host', {}).get('VmHWM')} wall={wall:.0f}s err={str(r.get('error'))[:200]}", flush=True)
        if not r.get("ok"):
            print(tail, flush=True)
        (out / f"results_{a.set}.json").write_text(json.dumps(results, indent=1, default=str))
    # traces of this call only, split so that each archive stays under the 16 MiB limit on files back
    mine = [work / (r["name"] + ".trace.json.gz") for r in results]
    mine = [p for p in mine if p.exists()]
    part, size, tf = 0, 0, None
    for p in mine:
        if tf is None or size + p.stat().st_size > 14 * 2**20:
            if tf:
                tf.close()
            part += 1
            size = 0
            tf = tarfile.open(out / f"traces_{a.set}_{part}.tar", "w")
        tf.add(p, arcname=p.name)
        size += p.stat().st_size
    if tf:
        tf.close()
    with tarfile.open(out / f"logs_{a.set}.tar.gz", "w:gz") as tf:
        for p in logs:
            tf.add(p, arcname=p.name)
    print("\nSUMMARY")
    for r in results:
        print(f"{r['name']:60s} ok={r.get('ok')!s:5s} step={r.get('step_time_s') or 0:.3f}s "
              f"peakA={(r.get('peak_allocated_bytes') or 0) / 2**30:.1f}G "
              f"peakR={(r.get('peak_reserved_bytes') or 0) / 2**30:.1f}G "
              f"hwm={(r.get('host', {}).get('VmHWM') or 0) / 2**30:.1f}G {str(r.get('error') or '')[:80]}")


if __name__ == "__main__":
    main()
