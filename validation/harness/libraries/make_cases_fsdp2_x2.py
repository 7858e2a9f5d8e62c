"""The two-rank FSDP2 + CPUOffloadPolicy runs (issue 14) as library cases, from the one-rank cases' files.

    python3 validation/harness/libraries/make_cases_fsdp2_x2.py [TRACE_DIR]

Raw results: validation/measured_libraries/_raw/fsdp2_x2/ (rank 0 and rank 1 JSON per case), taken
2026-11-27 on a lent 2 x H200 machine (32 vCPUs, one socket, Intel Xeon) with
`torchrun --standalone --nproc_per_node 2 validation/harness/libraries/lib_step.py --spec ...` (2 warm-up, 3
timed steps; torchrun's OMP_NUM_THREADS=1: torch.get_num_threads() = 1 on each rank). The 3B run's profiled
step outlived the call's time limit, so its figures come from the JSON lib_step writes before profiling
(`.json.partial`) and it has no trace. Host peak is per node: the two ranks' VmHWM added.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from make_cases import TRACE, _copy_trace

LIB = Path(__file__).resolve().parents[2] / "measured_libraries"
RAW = LIB / "_raw" / "fsdp2_x2"
CASES = {"llama1b-ckpt-mb4-s2048": "h100-fsdp2-cpuoffload-llama1b-ckpt-mb4-s2048",
         "llama3b-ckpt-mb2-s2048": "h100-fsdp2-cpuoffload-llama3b-ckpt-mb2-s2048"}
HOST = ('"cpu.cores" = { value = 32, source = "measured machine: 32 vCPUs (os.cpu_count, lscpu: 1 socket, 1 thread '
        'per core, Intel Xeon) of the lent 2 x H200 machine" }')


def rank_results(stem: str) -> list[dict]:
    out = []
    for rank in ("", ".rank1"):
        path = next(p for p in (RAW / f"{stem}{rank}.json", RAW / f"{stem}{rank}.json.partial") if p.exists())
        out.append(json.loads(path.read_text()))
    return out


def measured_ranks(ranks: list[dict]) -> dict:
    """A several-rank case's [measured]: rank 0's step times, the larger rank's HBM peaks, host memory per node."""
    r0 = ranks[0]
    times = r0["step_times_s"]
    return {
        "step_time_s": r0["step_time_s"],
        "step_time_s_min": min(times), "step_time_s_max": max(times),
        "peak_allocated_bytes": max(r["peak_allocated_bytes"] for r in ranks),
        "peak_reserved_bytes": max(r["peak_reserved_bytes"] for r in ranks),
        "tokens_per_s": len(ranks) * r0["spec"]["mb"] * r0["spec"]["seq"] / r0["step_time_s"],
        "host_peak_rss_bytes": sum(r["host_after_steps"]["VmHWM"] for r in ranks),
        "pinned_host_bytes_torch_allocator": sum(r["host_memory_stats"]["allocated_bytes.peak"] for r in ranks),
        "torch_num_threads": r0["torch_threads"], "cpu_affinity_cores": r0["affinity"],
    }


def case_toml(template: str, name: str, ranks: list[dict], trace: str | None) -> str:
    r0 = ranks[0]
    measured = measured_ranks(ranks)
    head, rest = template.split("[model]", 1)
    model, rest = rest.split("[plan]", 1)
    plan, rest = rest.split("[measured]", 1)
    head = re.sub(r'name = "[^"]*"', f'name = "{name}"', head, count=1)
    head = head.replace('hardware = "h100-sxm"', 'hardware = "h200-sxm"').replace('date = "2026-11-24"', 'date = "2026-11-27"')
    head = re.sub(r'gpu = "[^"]*"', f'gpu = "{r0["gpu"]} x 2"', head)
    head = re.sub(r'software = "[^"]*"', f'software = "torch {r0["torch"]}, CUDA {r0["cuda"]}, transformers {r0["transformers"]}"', head)
    head = head.replace("FSDP2 fully_shard", "FSDP2 fully_shard on 2 GPUs (torchrun, one rank each)", 1)
    head = re.sub(r'method = "[^"]*"', 'method = ' + json.dumps(
        "validation/harness/libraries/lib_step.py under torchrun --nproc_per_node 2 (make_cases_fsdp2_x2.py): "
        "as the one-rank case, 2 warm-up and 3 timed steps; the step time is rank 0's median; HBM peak the larger "
        "rank's; host peak the two ranks' VmHWM added (per node)"), head)
    head = head.replace("torch.get_num_threads()=16", "torch.get_num_threads()=1 (torchrun's OMP_NUM_THREADS=1)")
    if trace:
        head = re.sub(r'trace = "[^"]*"', f'trace = "{trace}"', head)
    else:
        head = re.sub(r'trace = "[^"]*"\n', "", head)
    plan = plan.replace("gpus = 1\ngpus_per_node = 1", "gpus = 2\ngpus_per_node = 2")
    plan = plan.rstrip("\n") + "\ncpu_threads = 1  # torchrun's OMP_NUM_THREADS=1 per rank (measured: torch.get_num_threads() = 1)\n\n"
    lines = ["[measured]"] + [f"{k} = {v!r}" for k, v in measured.items()]
    return head + "[model]" + model + "[plan]" + plan + "\n".join(lines) + "\n\n[hardware_overrides]\n" + HOST + "\n"


def main() -> None:
    trace_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else RAW
    for shape, template_case in CASES.items():
        name = f"h200x2-fsdp2-cpuoffload-{shape}"
        ranks = rank_results(name)
        folder = LIB / name
        folder.mkdir(exist_ok=True)
        trace = TRACE if _copy_trace(ranks[0], trace_dir, folder) else None
        template = (LIB / template_case / "case.toml").read_text()
        (folder / "case.toml").write_text(case_toml(template, name, ranks, trace))
        (folder / "result.json").write_text(json.dumps(ranks, indent=1, default=str) + "\n")
        print(f"wrote {folder}")


if __name__ == "__main__":
    main()
