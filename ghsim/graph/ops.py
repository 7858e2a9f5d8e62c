"""Op: one unit of work in a training step, with its cost inputs and memory effects.

Builders append ops in the order the host program issues them; ops are immutable
values (a builder that changes one makes a changed copy with evolve() or with_hbm()),
so replicated layers can share op objects safely. The cost model prices
an op from its work (a fixed-time op, HOST_WORK, carries its `seconds`); the engine
schedules priced ops; the memory model replays their allocations in issue order (as
PyTorch's caching allocator sees them).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence
from enum import StrEnum

class Category(StrEnum):
    """Where an op's time goes in the breakdown. The seven kernel categories are shared with the
    trace summarizer (ghsim.traces) so that measured and predicted breakdowns compare key by key."""

    GEMM = "gemm"
    ATTENTION = "attention"
    ELEMENTWISE = "elementwise"
    NORM_REDUCTION = "norm_reduction"
    OPTIMIZER = "optimizer"
    COMMUNICATION = "communication"
    OTHER = "other"
    MEMCPY = "memcpy"  # host<->device copies (copy engines)
    CPU = "cpu"  # host compute: CPU optimizer, data loading, casts on the host
    UM = "um"  # a unified-memory stall on the compute stream (pages migrating in; not a kernel)


KERNEL_CATEGORIES = (
    Category.GEMM,
    Category.ATTENTION,
    Category.ELEMENTWISE,
    Category.NORM_REDUCTION,
    Category.OPTIMIZER,
    Category.COMMUNICATION,
    Category.OTHER,
)


class Kind(StrEnum):
    """How the cost model prices an op."""

    GEMM = "gemm"
    ATTN_FWD = "attn_fwd"
    ATTN_BWD = "attn_bwd"
    MEMBOUND = "membound"  # bytes over achieved HBM bandwidth
    OPT_GPU = "opt_gpu"  # AdamW on the GPU (params/s)
    OPT_CPU = "opt_cpu"  # AdamW on the CPU (params/s)
    H2D = "h2d"
    D2H = "d2h"
    HOST_WORK = "host_work"  # fixed CPU seconds (data loading)
    CPU_MEM = "cpu_mem"  # bytes streamed by host cores (casts, gradient accumulation on the CPU)
    UM_MIGRATE = "um_migrate"  # unified-memory pages brought to the GPU on demand (bytes)
    COLLECTIVE = "collective"


class Resource(StrEnum):
    """The stream or server an op runs on (the engine's resources by name)."""

    GPU = "gpu"  # the compute stream
    H2D = "h2d"  # copy engine, host to device
    D2H = "d2h"  # copy engine, device to host
    CPU = "cpu"  # host cores doing optimizer, cast or data work
    LOADER = "loader"  # data-loader worker pool
    TP = "tp"  # tensor-parallel communication stream
    DP = "dp"  # data-parallel communication stream
    EP = "ep"  # expert-parallel communication stream
    PP = "pp"  # pipeline point-to-point link
    MEM = "mem"  # memory markers: no time, only allocations and frees
    HOST = "host"  # the training thread's own Python work (DeepSpeed's ZeRO-3 module hooks)


class Phase(StrEnum):
    """The part of the step an op belongs to."""

    NONE = ""
    FWD = "fwd"
    BWD = "bwd"
    RECOMPUTE = "recompute"  # a checkpointed forward run again inside backward
    OPT = "opt"
    DATA = "data"  # loading and copying the batch


class Collective(StrEnum):
    """What a communication op does (its Op.variant); cost/links.py prices each."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND = "send"


# Module-level names for code that spells them K.GEMM, K.COPY, ... (not yet converted to the enums).
# Per-op hot paths may bind members to module names too: in Python 3.11 reading a member off its
# enum class costs ~0.2 us (EnumType.__getattr__ routes class attribute reads through a Python hook).
COPY, CPU, UM = Category.MEMCPY, Category.CPU, Category.UM
GEMM, ATTN_FWD, ATTN_BWD, MEMBOUND = Kind.GEMM, Kind.ATTN_FWD, Kind.ATTN_BWD, Kind.MEMBOUND
OPT_GPU, OPT_CPU, H2D, D2H = Kind.OPT_GPU, Kind.OPT_CPU, Kind.H2D, Kind.D2H
HOST_WORK, CPU_MEM, UM_MIGRATE, COLLECTIVE = Kind.HOST_WORK, Kind.CPU_MEM, Kind.UM_MIGRATE, Kind.COLLECTIVE


class Op(NamedTuple):
    """An immutable value. A NamedTuple rather than a frozen dataclass: a plan search builds and
    copies hundreds of thousands of ops, and a frozen dataclass's __init__ (object.__setattr__
    per field) made that 4x slower per op (5.5 vs 1.2 us). Ops are told apart by identity
    (engine.distinct, cost prices each distinct op once), never by value."""

    name: str
    category: Category
    kind: Kind
    resource: str  # a Resource, or a per-stage stream of the pipeline schedule ("gpu0", "dp1", ...)
    deps: tuple[int, ...] = ()
    # work
    flops: float = 0.0
    bytes: float = 0.0
    dtype: str = "bf16"
    variant: str = ""  # which measured curve prices it: membound op name, optimizer impl; a Collective
    # GEMM (m, n, k); attention (batch, heads, kv_heads, seq, head_dim); CPU AdamW: the sizes of
    # the model's tensors it updates, as (elements, count) pairs flattened
    shape: tuple[int, ...] = ()
    kernels: int = 1  # GPU kernels launched (each costs the host a launch)
    pinned: bool = True  # host copies: pinned or pageable buffer
    params: float = 0.0  # optimizer ops: parameters updated
    seconds: float = 0.0  # HOST_WORK: fixed time
    host_waits: bool = False
    # an eager composite whose kernels fall in several categories (RMSNorm: elementwise
    # kernels and a reduction), as (category, share of its time); None: all in `category`
    split: tuple[tuple[Category, float], ...] | None = None
    # memory effects, bytes, applied when the op is issued
    hbm_alloc: float = 0.0  # stays allocated after the op
    hbm_free: float = 0.0  # released after the op
    hbm_transient: float = 0.0  # workspace alive only during the op
    host_alloc: float = 0.0
    host_free: float = 0.0
    host_transient: float = 0.0  # host memory alive only during the op (a CPU op's temporaries)
    mem_tag: str = ""  # what a host/offload allocation or transient is
    hbm_by_tag: dict[str, float] | None = None  # net HBM change by breakdown category
    phase: str = Phase.NONE  # a Phase (pipeline-schedule ops: a graph.pipeline.PipelineSegment)

    def with_hbm(self, tag: str, nbytes: float) -> "Op":
        """A copy that also allocates (nbytes > 0) or frees (< 0) HBM under a breakdown category,
        after the op."""
        return self.evolve(((tag, nbytes),))

    def evolve(self, hbm: Sequence[tuple[str, float]] = (), **fields) -> "Op":
        """A copy with `fields` changed and the HBM changes `hbm` ((tag, bytes) pairs, in order)
        applied as with_hbm() would. The tag dict is never mutated in place: ops share it.

        One copy however many changes (builders make hundreds of thousands of ops in a plan
        search; dataclasses.replace per change made the search 1.5x slower)."""
        if hbm:
            tags = dict(self.hbm_by_tag or {})
            alloc, free = fields.get("hbm_alloc", self.hbm_alloc), fields.get("hbm_free", self.hbm_free)
            for tag, nbytes in hbm:
                tags[tag] = tags.get(tag, 0.0) + nbytes
                if nbytes >= 0:
                    alloc += nbytes
                else:
                    free -= nbytes
            fields.update(hbm_by_tag=tags, hbm_alloc=alloc, hbm_free=free)
        return self._replace(**fields) if fields else self

    def __eq__(self, other: object) -> bool:  # identity: two ops doing the same work are still two ops
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    __hash__ = object.__hash__


class OpGraph:
    """Ops in issue order, with their absolute dependencies and place in the step.

    Replicated layers share their template Op objects (copying thousands of ops
    per step was the simulator's main cost; ops are immutable, so sharing is safe);
    the graph keeps what differs per copy (dependency indices, layer, micro-batch)
    in its own lists. To change an op in place, put a changed copy at its index.
    """

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.deps: list[tuple[int, ...]] = []
        self.layer: list[int] = []
        self.microbatch: list[int] = []

    def add(self, op: Op, layer: int = -1, microbatch: int = 0, deps: tuple[int, ...] | None = None) -> int:
        """Append one op whose deps are absolute indices; returns its index. `deps`, if given,
        replace the op's own: an op shared by several places of the graph stays one object."""
        deps = op.deps if deps is None else deps
        for d in deps:
            if not 0 <= d < len(self.ops):
                raise ValueError(f"op {op.name} depends on {d}, which is not issued before it")
        self.ops.append(op)
        self.deps.append(deps)
        self.layer.append(layer)
        self.microbatch.append(microbatch)
        return len(self.ops) - 1

    def extend(self, template: list[Op], layer: int = -1, microbatch: int = 0) -> tuple[int, int]:
        """Append a template whose deps index into itself (0-based); returns [first, last]."""
        base = len(self.ops)
        n = len(template)
        self.ops.extend(template)
        shift = base.__add__  # (map with a bound method: this runs for every op of every layer)
        self.deps.extend([tuple(map(shift, op.deps)) if op.deps else () for op in template])
        self.layer.extend([layer] * n)
        self.microbatch.extend([microbatch] * n)
        return base, base + n - 1

    def __len__(self) -> int:
        return len(self.ops)

    @property
    def last(self) -> int:
        return len(self.ops) - 1
