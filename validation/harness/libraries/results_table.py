"""The offload-library cases against ghsim, as the markdown table and ratios that
validation/measured_libraries/README.md quotes (issue 14).

    python validation/harness/libraries/results_table.py
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from ghsim.graph.offload.setup import sub_group_sizes
from ghsim.graph.step import partition_sizes
from ghsim.validate.cases import DEFAULT_TOLERANCES, case_model, load_case, run_case

ROOT = Path(__file__).resolve().parents[2] / "measured_libraries"
PREFIXES = ("h100-ds-", "h100-fsdp2-", "h100-plain-", "h200-ds-", "h200-plain-", "h200x2-fsdp2-", "h200x2-ds-")
RATIOS = [("ZeRO-3 offload / ZeRO-2 offload", "h100-ds-z3-offopt-llama3b-ckpt-mb2-s2048",
           "h100-ds-z2-offopt-pin-llama3b-ckpt-mb2-s2048"),
          ("SuperOffload / ZeRO-Offload (ZeRO-2)", "h100-ds-z3-superoffload-llama3b-ckpt-mb2-s2048",
           "h100-ds-z2-offopt-pin-llama3b-ckpt-mb2-s2048"),
          ("ZeRO-2 offload / ZeRO-2 no offload", "h100-ds-z2-offopt-pin-llama3b-ckpt-mb2-s2048",
           "h100-ds-z2-llama3b-ckpt-mb2-s2048"),
          # both on H200 machines: 2 ranks on a 32-vCPU host against 1 on a 16-vCPU host
          ("ZeRO-3 offload, 2 GPUs / 1 GPU (3B, per-rank step)", "h200x2-ds-z3-offopt-llama3b-ckpt-mb2-s2048",
           "h200-ds-z3-offopt-llama3b-ckpt-mb2-s2048"),
          ("ZeRO-3 offload on 2 GPUs, 8B / 3B", "h200x2-ds-z3-offopt-llama8b-ckpt-mb2-s2048",
           "h200x2-ds-z3-offopt-llama3b-ckpt-mb2-s2048"),
          ("plain foreach / plain fused", "h100-plain-cpuadamw-foreach-llama3b-ckpt-mb2-s2048",
           "h100-plain-cpuadamw-fused-llama3b-ckpt-mb2-s2048")]


def host_peaks(result) -> tuple[float, float]:
    """Measured host peak and ghsim's (what its offload places on the host plus the processes'
    own memory; 0 without offload). Measured: the training process's VmHWM, plus for SuperOffload
    its CPU-Adam worker's VmHWM less the sub-group it maps while stepping it: the training process's
    fp32 partition and gradient in shared memory, which both VmHWMs count (8 B per parameter:
    _raw/host_memory.json superoffload, the worker's RssShmem above idle, 8.0 GB at 1e9)."""
    m = result.case.measured
    measured = float(m.get("host_peak_rss_bytes", 0))
    worker = float(m.get("host_peak_rss_children_bytes", 0))
    if worker:
        sub_group = json.loads((result.case.folder / "result.json").read_text())["ds_zero_config_effective"][
            "sub_group_size"]
        tensors = partition_sizes(case_model(result.case), result.case.plan, 1)
        measured += worker - 8 * max(sub_group_sizes(tensors, sub_group))
    return measured, result.predicted.get("host_peak_bytes", 0.0)


def main() -> None:
    results = {}
    for folder in sorted(p.parent for p in ROOT.glob("*/case.toml")):
        if folder.name.startswith(PREFIXES) and "[measured]" in (folder / "case.toml").read_text():
            results[folder.name] = run_case(load_case(folder, DEFAULT_TOLERANCES), with_trace=False)
    print("| case | step s measured | predicted | error | HBM GB measured | predicted | error "
          "| host GB measured | predicted | error |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    hosts = []
    for name, r in results.items():
        m, p, e = r.measured, r.predicted, r.errors
        host, host_pred = host_peaks(r)
        host_err = host_pred / host - 1 if host else None
        if host_err is not None and host_pred:
            hosts.append(abs(host_err))
        host_cells = (f"{host / 1e9:.1f} | {host_pred / 1e9:.1f} | " + (f"{host_err:+.1%}" if host_pred else "none predicted")
                      if host else "| | ")
        print(f"| {name} | {m['step_time_s']:.3f} | {p['step_time_s']:.3f} | {e['step_time_rel']:+.1%} | "
              f"{m['peak_memory_bytes'] / 1e9:.2f} | {p['peak_memory_bytes'] / 1e9:.2f} | {e['peak_memory_rel']:+.1%} | "
              f"{host_cells} |")
    steps = [abs(r.errors["step_time_rel"]) for r in results.values()]
    mems = [abs(r.errors["peak_memory_rel"]) for r in results.values()]
    print(f"\n{len(results)} cases: step time median |error| {statistics.median(steps):.1%}, max {max(steps):.1%}; "
          f"HBM median {statistics.median(mems):.1%}, max {max(mems):.1%}; "
          f"within 20%: {sum(s <= 0.20 for s in steps)} of {len(steps)}; host peak (offload cases) median "
          f"{statistics.median(hosts):.1%}, max {max(hosts):.1%}, within 10%: {sum(h <= 0.10 for h in hosts)} of "
          f"{len(hosts)}\n")
    print("| ratio | measured | predicted | error |")
    print("|---|---|---|---|")
    for label, a, b in RATIOS:
        meas = results[a].measured["step_time_s"] / results[b].measured["step_time_s"]
        pred = results[a].predicted["step_time_s"] / results[b].predicted["step_time_s"]
        print(f"| {label} | {meas:.2f} | {pred:.2f} | {pred / meas - 1:+.1%} |")


if __name__ == "__main__":
    main()
