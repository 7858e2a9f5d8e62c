"""How fast an AdamW implementation runs on a host's CPU: a roofline of two measured figures.

CPU AdamW speed depends on the implementation far more than on the core count
(validation/measured_libraries/README.md: 0.9 to 5.2 G params/s on the same 16
threads), so each implementation carries its own measured curve:

- its throughput by thread count on the reference host (the compute side: how
  well it vectorises and parallelises), and
- the host-memory bytes one update streams, effectively (the bandwidth side).

On another host, or with fewer cores per GPU, the rate is the smaller of the
curve at that thread count and the host's streaming bandwidth share over those
bytes. Both scale with the model's tensor sizes: each implementation's rate at
16 threads by elements per tensor, relative to the size its thread curve was
measured at (torch's for-each and for-loop passes run 0.7x-1.3x that rate
across 1M-64M-element tensors). Figures:
hardware_profiles/calibration/cpu_optimizers.toml, each sourced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ghsim.errors import GhsimError
from ghsim.tomlio import read_toml, repo_root, sourced
from ghsim.plan import CpuOptimizer


# Bytes one fp32 AdamW update must stream (read param, grad, m, v; write param, m, v): what a
# profile's bandwidth-derived adamw_params_per_s counts per parameter.
ADAMW_STREAM_BYTES = 28
TABLE = repo_root() / "hardware_profiles" / "calibration" / "cpu_optimizers.toml"


def _log2_interpolate(xs: tuple[float, ...], ys: tuple[float, ...], x: float) -> float:
    """ys at x, interpolated in log2(x) between ascending xs (callers handle the ends)."""
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x <= x1:
            return y0 + (math.log2(x) - math.log2(x0)) / (math.log2(x1) - math.log2(x0)) * (y1 - y0)
    raise AssertionError("unreachable: x lies within ascending xs")


@dataclass(frozen=True)
class CpuOptimizerCurve:
    impl: CpuOptimizer
    threads: tuple[int, ...]  # ascending
    params_per_s: tuple[float, ...]  # measured at those thread counts on the reference host
    bytes_per_param: float
    # the rate at 16 threads by elements per tensor (ascending), and the tensor size the thread
    # curve was measured at: a model's tensors are priced relative to it
    elements: tuple[float, ...] = ()
    rate_by_elements: tuple[float, ...] = ()
    curve_elements: float = 0.0

    def measured_rate(self, threads: int) -> float:
        """The curve at `threads`: interpolated in log2(threads); below the first point
        proportional to threads; above the last, linear in threads (the roof caps it)."""
        ts, rs = self.threads, self.params_per_s
        if threads <= ts[0]:
            return rs[0] * threads / ts[0]
        if threads >= ts[-1]:
            return rs[-1] * threads / ts[-1]
        return _log2_interpolate(ts, rs, threads)

    def rate(self, threads: int, stream_bandwidth: float) -> float:
        """params/s with `threads` threads on a host that streams `stream_bandwidth` bytes/s to them."""
        return min(self.measured_rate(threads), stream_bandwidth / self.bytes_per_param)

    def _at_elements(self, n: float) -> float:
        es, rs = self.elements, self.rate_by_elements
        return rs[0] if n <= es[0] else rs[-1] if n >= es[-1] else _log2_interpolate(es, rs, n)

    def size_factor(self, tensors: tuple[float, ...]) -> float:
        """How much faster than the curve this implementation steps a model whose tensors are
        `tensors` ((elements, count) pairs, flattened): the parameter-weighted harmonic mean of its
        rate at each size over its rate at the curve's size. DeepSpeedCPUAdam steps flat partitions:
        its largest measured size. 1.0 without tensors (the curve's own size) or measurements."""
        if not self.elements or not self.curve_elements or not tensors:
            return 1.0
        ref = self._at_elements(self.curve_elements)
        if self.impl == CpuOptimizer.DEEPSPEED:
            return self.rate_by_elements[-1] / ref
        pairs = list(zip(tensors[::2], tensors[1::2]))
        params = sum(n * c for n, c in pairs)
        if params <= 0:
            return 1.0
        return params / sum(n * c * ref / self._at_elements(n) for n, c in pairs)


@dataclass(frozen=True)
class ReferenceHost:
    stream_bandwidth: float  # bytes/s all of its threads stream
    stream_bandwidth_per_thread: float
    foreach_norm_bandwidth: float


@lru_cache(maxsize=1)
def cpu_optimizer_table() -> tuple[ReferenceHost, dict[CpuOptimizer, CpuOptimizerCurve]]:
    where = str(TABLE)
    d = read_toml(TABLE)
    ref = d.get("reference_host", {})
    host = ReferenceHost(*(sourced(ref, k, where) for k in (
        "stream_bandwidth", "stream_bandwidth_per_thread", "foreach_norm_bandwidth")))
    curves = {}
    for name, t in d.get("implementations", {}).items():
        impl = CpuOptimizer(name)
        points = t["params_per_s_by_threads"]["value"]
        if not points or any(len(p) != 2 or p[0] < 1 or p[1] <= 0 for p in points):
            raise GhsimError(f"{where} [{name}]: params_per_s_by_threads must be [threads, rate] pairs")
        points = sorted(points)
        sizes = sorted(t.get("params_per_s_by_tensor_elements", {}).get("value", []))
        if any(len(p) != 2 or p[0] < 1 or p[1] <= 0 for p in sizes):
            raise GhsimError(f"{where} [{name}]: params_per_s_by_tensor_elements must be [elements, rate] pairs")
        curves[impl] = CpuOptimizerCurve(impl, tuple(int(p[0]) for p in points), tuple(float(p[1]) for p in points),
                                         sourced(t, "bytes_per_param", f"{where} [{name}]"),
                                         tuple(float(p[0]) for p in sizes), tuple(float(p[1]) for p in sizes),
                                         sourced(t, "curve_tensor_elements", f"{where} [{name}]") if sizes else 0.0)
    missing = set(CpuOptimizer) - {CpuOptimizer.AUTO} - set(curves)
    if missing:
        raise GhsimError(f"{where}: no measurement for {', '.join(sorted(missing))}")
    return host, curves


def cpu_optimizer_rate(impl: CpuOptimizer, threads: int, stream_bandwidth: float, tensors: tuple[float, ...] = ()
                       ) -> float:
    """AdamW params/s of `impl` on `threads` threads that stream at most `stream_bandwidth` bytes/s,
    over a model's `tensors` ((elements, count) pairs, flattened; empty: at the curve's own size).
    The tensor sizes scale the curve and its streaming roof alike (bytes_per_param is effective:
    derived from the same host's 16-thread rate, whose tensor size the factor is relative to)."""
    curve = curve_of(impl)
    return curve.rate(max(1, threads), stream_bandwidth) * curve.size_factor(tensors)


def curve_of(impl: CpuOptimizer) -> CpuOptimizerCurve:
    return cpu_optimizer_table()[1][impl]


def foreach_norm_bandwidth() -> float:
    """Bytes/s torch's _foreach_norm reads CPU gradients at (the reference host's)."""
    return cpu_optimizer_table()[0].foreach_norm_bandwidth


def per_thread_bandwidth() -> float:
    """Streaming bytes/s one thread draws (the reference host's; profiles do not give it)."""
    return cpu_optimizer_table()[0].stream_bandwidth_per_thread
