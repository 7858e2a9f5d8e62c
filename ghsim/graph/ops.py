"""Op: one unit of work in a training step, with its cost inputs and memory effects.

Builders append ops in the order the host program issues them; the cost model
fills in `duration`; the engine schedules them; the memory model replays their
allocations in issue order (as PyTorch's caching allocator sees them).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# Kernel categories shared with the trace summarizer (ghsim.traces) so that
# measured and predicted breakdowns compare key by key.
KERNEL_CATEGORIES = (
    "gemm",
    "attention",
    "elementwise",
    "norm_reduction",
    "optimizer",
    "communication",
    "other",
)
COPY = "memcpy"  # host<->device copies (copy engines)
CPU = "cpu"  # host compute: CPU optimizer, data loading, casts on the host

# Kinds of work the cost model knows how to price.
GEMM = "gemm"
ATTN_FWD = "attn_fwd"
ATTN_BWD = "attn_bwd"
MEMBOUND = "membound"  # bytes over achieved HBM bandwidth
OPT_GPU = "opt_gpu"  # AdamW on the GPU (params/s)
OPT_CPU = "opt_cpu"  # AdamW on the CPU (params/s)
H2D = "h2d"
D2H = "d2h"
HOST_WORK = "host_work"  # fixed CPU seconds (data loading)
COLLECTIVE = "collective"


@dataclass(slots=True)
class Op:
    name: str
    category: str  # one of KERNEL_CATEGORIES, COPY or CPU
    kind: str  # how the cost model prices it (GEMM, MEMBOUND, ...)
    resource: str  # "gpu", "h2d", "d2h", "cpu", "comm", ...
    deps: tuple[int, ...] = ()
    # work
    flops: float = 0.0
    bytes: float = 0.0
    dtype: str = "bf16"
    variant: str = ""  # which measured curve prices it: membound op name, optimizer impl
    shape: tuple[int, ...] = ()  # GEMM (m, n, k); attention (batch, heads, kv_heads, seq, head_dim)
    kernels: int = 1  # GPU kernels launched (each costs the host a launch)
    pinned: bool = True  # host copies: pinned or pageable buffer
    params: float = 0.0  # optimizer ops: parameters updated
    seconds: float = 0.0  # HOST_WORK: fixed time
    host_waits: bool = False
    # memory effects, bytes, applied when the op is issued
    hbm_alloc: float = 0.0  # stays allocated after the op
    hbm_free: float = 0.0  # released after the op
    hbm_transient: float = 0.0  # workspace alive only during the op
    host_alloc: float = 0.0
    host_free: float = 0.0
    mem_tag: str = ""  # what a host/offload allocation is
    hbm_by_tag: dict[str, float] | None = None  # net HBM change by breakdown category
    # where it sits in the step
    layer: int = -1
    phase: str = ""  # fwd | bwd | recompute | opt | data | loss
    microbatch: int = 0
    duration: float = 0.0  # filled by the cost model

    def change_hbm(self, tag: str, nbytes: float) -> "Op":
        """Allocate (nbytes > 0) or free (< 0) HBM under a breakdown category, after the op.

        The tag dict is copied, not mutated: replicated layer ops share it.
        """
        tags = dict(self.hbm_by_tag or {})
        tags[tag] = tags.get(tag, 0.0) + nbytes
        self.hbm_by_tag = tags
        if nbytes >= 0:
            self.hbm_alloc += nbytes
        else:
            self.hbm_free -= nbytes
        return self

    def shifted(self, offset: int, **changes) -> "Op":
        """A copy whose dependency indices are moved by `offset` (for replicated layers)."""
        return replace(self, deps=tuple(d + offset for d in self.deps), **changes)


@dataclass
class OpGraph:
    """Ops in issue order. `add` returns the new op's index for later deps."""

    ops: list[Op] = field(default_factory=list)

    def add(self, op: Op) -> int:
        for d in op.deps:
            if not 0 <= d < len(self.ops):
                raise ValueError(f"op {op.name} depends on {d}, which is not issued before it")
        self.ops.append(op)
        return len(self.ops) - 1

    def extend(self, template: list[Op], **changes) -> tuple[int, int]:
        """Append a template whose deps index into itself (0-based), with `changes` applied.

        Deps below zero in the template refer to ops before it: -1 is the op
        just before the template. Returns the [first, last] index appended.
        """
        base = len(self.ops)
        for op in template:
            self.ops.append(op.shifted(base, **changes))
        return base, len(self.ops) - 1

    def __len__(self) -> int:
        return len(self.ops)

    @property
    def last(self) -> int:
        return len(self.ops) - 1
