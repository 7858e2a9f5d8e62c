"""How fast an AdamW implementation runs on a host's CPU: a roofline of two measured figures.

CPU AdamW speed depends on the implementation far more than on the core count
(validation/measured_libraries/README.md: 0.9 to 5.2 G params/s on the same 16
threads), so each implementation carries its own measured curve:

- its throughput by thread count on the reference host (the compute side: how
  well it vectorises and parallelises), and
- the host-memory bytes one update streams, effectively (the bandwidth side).

On another host, or with fewer cores per GPU, the rate is the smaller of the
curve at that thread count and the host's streaming bandwidth share over those
bytes. Both scale with the model's tensor sizes: each implementation's rate by
elements per tensor, relative to the size its thread curve was measured at
(torch's for-each and for-loop passes run 0.7x-2.2x that rate across
1M-400M-element tensors), at 16 threads or, where measured, at several thread
counts (the for-loop's fresh temporaries fault their pages in on one thread as
on sixteen, so its size profile differs by thread count).

torch's optimizers over DTensors (FSDP2's sharded parameters) also pay DTensor's
dispatch per tensor, a fixed host time besides the per-element rate. Figures:
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
# the thread count of the reference host's rates by tensor size where a table gives one row (its all 16)
REFERENCE_THREADS = 16
TABLE = repo_root() / "hardware_profiles" / "calibration" / "cpu_optimizers.toml"


def _log2_interpolate(xs: tuple[float, ...], ys: tuple[float, ...], x: float) -> float:
    """ys at x, interpolated in log2(x) between ascending xs (callers handle the ends)."""
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x <= x1:
            return y0 + (math.log2(x) - math.log2(x0)) / (math.log2(x1) - math.log2(x0)) * (y1 - y0)
    raise AssertionError("unreachable: x lies within ascending xs")


def _log2_between(xs: tuple[float, ...], ys: tuple[float, ...], x: float) -> float:
    """ys at x, interpolated in log2(x) between ascending xs, held flat beyond the ends."""
    return ys[0] if x <= xs[0] else ys[-1] if x >= xs[-1] else _log2_interpolate(xs, ys, x)


@dataclass(frozen=True)
class SizeRow:
    """An implementation's rate by elements per tensor (ascending), measured at `threads` threads."""
    threads: int
    elements: tuple[float, ...]
    rates: tuple[float, ...]

    def at(self, n: float) -> float:
        return _log2_between(self.elements, self.rates, n)


@dataclass(frozen=True)
class CpuOptimizerCurve:
    impl: CpuOptimizer
    threads: tuple[int, ...]  # ascending
    params_per_s: tuple[float, ...]  # measured at those thread counts on the reference host
    bytes_per_param: float
    # the rate by elements per tensor at one or more thread counts (ascending threads), and the
    # tensor size the thread curve was measured at: a model's tensors are priced relative to it
    size_rows: tuple[SizeRow, ...] = ()
    curve_elements: float = 0.0
    # seconds of DTensor dispatch per tensor, by thread count ((threads, s) ascending): what the
    # same step over DTensors takes beyond plain tensors
    dtensor_s_per_tensor: tuple[tuple[float, float], ...] = ()

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

    def size_factor(self, tensors: tuple[float, ...], threads: int = 0) -> float:
        """How much faster than the curve this implementation steps a model whose tensors are
        `tensors` ((elements, count) pairs, flattened) on `threads` threads: the parameter-weighted
        harmonic mean of its rate at each size over its rate at the curve's size, per measured
        thread count, interpolated in log2(threads) between them (the nearest beyond them; 0: the
        most threads measured). DeepSpeedCPUAdam steps flat partitions: its largest measured size.
        1.0 without tensors (the curve's own size) or measurements."""
        if not self.size_rows or not self.curve_elements or not tensors:
            return 1.0
        if self.impl == CpuOptimizer.DEEPSPEED:
            row = self.size_rows[-1]
            return row.rates[-1] / row.at(self.curve_elements)
        pairs = list(zip(tensors[::2], tensors[1::2]))
        params = sum(n * c for n, c in pairs)
        if params <= 0:
            return 1.0

        def factor(row: SizeRow) -> float:
            ref = row.at(self.curve_elements)
            return params / sum(n * c * ref / row.at(n) for n, c in pairs)
        rows = self.size_rows
        return _log2_between(tuple(row.threads for row in rows), tuple(factor(row) for row in rows),
                             threads or rows[-1].threads)

    def dispatch_seconds_per_param(self, tensors: tuple[float, ...], threads: int) -> float:
        """DTensor dispatch spread over the parameters of `tensors`: per tensor, as measured at
        `threads` (interpolated in log2(threads)), times the tensors over their parameters.
        0 without tensors or a measurement."""
        pairs = list(zip(tensors[::2], tensors[1::2]))
        params = sum(n * c for n, c in pairs)
        if not self.dtensor_s_per_tensor or params <= 0:
            return 0.0
        return _log2_between(*zip(*self.dtensor_s_per_tensor), max(1, threads)) * sum(c for _, c in pairs) / params


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
        rows = _size_rows(t, f"{where} [{name}]")
        dispatch = sorted(t.get("dtensor_s_per_tensor_by_threads", {}).get("value", []))
        if any(len(p) != 2 or p[0] < 1 or p[1] < 0 for p in dispatch):
            raise GhsimError(f"{where} [{name}]: dtensor_s_per_tensor_by_threads must be [threads, seconds] pairs")
        curves[impl] = CpuOptimizerCurve(impl, tuple(int(p[0]) for p in points), tuple(float(p[1]) for p in points),
                                         sourced(t, "bytes_per_param", f"{where} [{name}]"), rows,
                                         sourced(t, "curve_tensor_elements", f"{where} [{name}]") if rows else 0.0,
                                         tuple((float(a), float(b)) for a, b in dispatch))
    missing = set(CpuOptimizer) - {CpuOptimizer.AUTO} - set(curves)
    if missing:
        raise GhsimError(f"{where}: no measurement for {', '.join(sorted(missing))}")
    return host, curves


def _size_rows(t: dict, where: str) -> tuple[SizeRow, ...]:
    """An implementation's rates by tensor size: `params_per_s_by_tensor_elements` ([elements, rate]
    pairs at the reference host's 16 threads), or `..._by_threads` ([threads, [[elements, rate], ...]])
    where several thread counts were measured."""
    by_threads = t.get("params_per_s_by_tensor_elements_by_threads", {}).get("value")
    if by_threads is None:
        sizes = t.get("params_per_s_by_tensor_elements", {}).get("value", [])
        by_threads = [[REFERENCE_THREADS, sizes]] if sizes else []
    rows = []
    for entry in by_threads:
        ok = isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list) and entry[0] >= 1
        pairs = sorted(entry[1]) if ok else []
        if not pairs or any(len(p) != 2 or p[0] < 1 or p[1] <= 0 for p in pairs):
            raise GhsimError(f"{where}: tensor-size rates must be [elements, rate] pairs (by threads: "
                             "[threads, [[elements, rate], ...]])")
        rows.append(SizeRow(int(entry[0]), tuple(float(p[0]) for p in pairs), tuple(float(p[1]) for p in pairs)))
    return tuple(sorted(rows, key=lambda r: r.threads))


def cpu_optimizer_rate(impl: CpuOptimizer, threads: int, stream_bandwidth: float, tensors: tuple[float, ...] = ()
                       ) -> float:
    """AdamW params/s of `impl` on `threads` threads that stream at most `stream_bandwidth` bytes/s,
    over a model's `tensors` ((elements, count) pairs, flattened; empty: at the curve's own size).
    The tensor sizes scale the curve and its streaming roof alike (bytes_per_param is effective:
    derived from the same host's 16-thread rate, whose tensor size the factor is relative to)."""
    curve = curve_of(impl)
    return curve.rate(max(1, threads), stream_bandwidth) * curve.size_factor(tensors, max(1, threads))


def curve_of(impl: CpuOptimizer) -> CpuOptimizerCurve:
    return cpu_optimizer_table()[1][impl]


def foreach_norm_bandwidth() -> float:
    """Bytes/s torch's _foreach_norm reads CPU gradients at (the reference host's)."""
    return cpu_optimizer_table()[0].foreach_norm_bandwidth


def per_thread_bandwidth() -> float:
    """Streaming bytes/s one thread draws (the reference host's; profiles do not give it)."""
    return cpu_optimizer_table()[0].stream_bandwidth_per_thread
