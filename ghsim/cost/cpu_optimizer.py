"""How fast an AdamW implementation runs on a host's CPU: a roofline of two measured figures.

CPU AdamW speed depends on the implementation far more than on the core count
(validation/measured_libraries/README.md: 0.9 to 5.2 G params/s on the same 16
threads), so each implementation carries its own measured curve:

- its throughput by thread count on the reference host (the compute side: how
  well it vectorises and parallelises), and
- the host-memory bytes one update streams, effectively (the bandwidth side).

On another host, or with fewer cores per GPU, the rate is the smaller of the
curve at that thread count and the host's streaming bandwidth share over those
bytes. Figures: hardware_profiles/calibration/cpu_optimizers.toml, each sourced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ghsim.errors import GhsimError
from ghsim.tomlio import read_toml, repo_root, sourced
from ghsim.plan import CpuOptimizer


# Bytes one fp32 AdamW update must stream (read param, grad, m, v; write param, m, v): what a
# profile's bandwidth-derived adamw_params_per_s counts per parameter.
ADAMW_STREAM_BYTES = 28
TABLE = repo_root() / "hardware_profiles" / "calibration" / "cpu_optimizers.toml"


@dataclass(frozen=True)
class CpuOptimizerCurve:
    impl: CpuOptimizer
    threads: tuple[int, ...]  # ascending
    params_per_s: tuple[float, ...]  # measured at those thread counts on the reference host
    bytes_per_param: float

    def measured_rate(self, threads: int) -> float:
        """The curve at `threads`: interpolated in log2(threads); below the first point
        proportional to threads; above the last, linear in threads (the roof caps it)."""
        ts, rs = self.threads, self.params_per_s
        if threads <= ts[0]:
            return rs[0] * threads / ts[0]
        if threads >= ts[-1]:
            return rs[-1] * threads / ts[-1]
        for (t0, r0), (t1, r1) in zip(zip(ts, rs), zip(ts[1:], rs[1:])):
            if t0 <= threads <= t1:
                w = (math.log2(threads) - math.log2(t0)) / (math.log2(t1) - math.log2(t0))
                return r0 + w * (r1 - r0)
        raise AssertionError("unreachable: thread counts are ascending")

    def rate(self, threads: int, stream_bandwidth: float) -> float:
        """params/s with `threads` threads on a host that streams `stream_bandwidth` bytes/s to them."""
        return min(self.measured_rate(threads), stream_bandwidth / self.bytes_per_param)


@dataclass(frozen=True)
class ReferenceHost:
    stream_bandwidth: float  # bytes/s all of its threads stream
    stream_bandwidth_per_thread: float


@lru_cache(maxsize=1)
def cpu_optimizer_table() -> tuple[ReferenceHost, dict[CpuOptimizer, CpuOptimizerCurve]]:
    where = str(TABLE)
    d = read_toml(TABLE)
    ref = d.get("reference_host", {})
    host = ReferenceHost(sourced(ref, "stream_bandwidth", where), sourced(ref, "stream_bandwidth_per_thread", where))
    curves = {}
    for name, t in d.get("implementations", {}).items():
        impl = CpuOptimizer(name)
        points = t["params_per_s_by_threads"]["value"]
        if not points or any(len(p) != 2 or p[0] < 1 or p[1] <= 0 for p in points):
            raise GhsimError(f"{where} [{name}]: params_per_s_by_threads must be [threads, rate] pairs")
        points = sorted(points)
        curves[impl] = CpuOptimizerCurve(impl, tuple(int(p[0]) for p in points), tuple(float(p[1]) for p in points),
                                         sourced(t, "bytes_per_param", f"{where} [{name}]"))
    missing = set(CpuOptimizer) - {CpuOptimizer.AUTO} - set(curves)
    if missing:
        raise GhsimError(f"{where}: no measurement for {', '.join(sorted(missing))}")
    return host, curves


def cpu_optimizer_rate(impl: CpuOptimizer, threads: int, stream_bandwidth: float) -> float:
    """AdamW params/s of `impl` on `threads` threads that stream at most `stream_bandwidth` bytes/s."""
    return curve_of(impl).rate(max(1, threads), stream_bandwidth)


def curve_of(impl: CpuOptimizer) -> CpuOptimizerCurve:
    return cpu_optimizer_table()[1][impl]


def per_thread_bandwidth() -> float:
    """Streaming bytes/s one thread draws (the reference host's; profiles do not give it)."""
    return cpu_optimizer_table()[0].stream_bandwidth_per_thread
