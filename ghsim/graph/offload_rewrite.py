"""Rewriting an op graph: find each layer's forward and backward runs, insert ops before and
after existing ones, add dependencies, and rebuild the graph (offload, unified memory)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ghsim.graph.ops import Op, OpGraph

FWD, BWD = "fwd", "bwd"


@dataclass(frozen=True)
class Run:
    """Consecutive ops of one micro-batch, one layer (-1: embedding or loss), one direction."""

    first: int
    last: int
    mb: int
    layer: int
    direction: str  # FWD | BWD


def find_runs(graph: OpGraph) -> list[Run]:
    runs: list[Run] = []
    start = None
    key = None
    for i, op in enumerate(graph.ops):
        direction = FWD if op.phase == "fwd" else BWD if op.phase in ("bwd", "recompute") else None
        k = (graph.microbatch[i], graph.layer[i], direction) if direction else None
        if k != key:
            if key is not None:
                runs.append(Run(start, i - 1, key[0], key[1], key[2]))
            start, key = i, k
    if key is not None:
        runs.append(Run(start, len(graph.ops) - 1, key[0], key[1], key[2]))
    return runs


@dataclass(eq=False)
class New:
    """An op to insert; deps are old indices (int) or other New ops placed before it."""

    op: Op
    deps: list = field(default_factory=list)
    layer: int = -1
    mb: int = 0
    index: int = -1


class Rewriter:
    """Insert ops before/after existing ones and add dependencies, then rebuild the graph."""

    def __init__(self, graph: OpGraph):
        self.old = graph
        self.before: dict[int, list[New]] = defaultdict(list)
        self.after: dict[int, list[New]] = defaultdict(list)
        self.extra_deps: dict[int, list[New]] = defaultdict(list)
        self.tail: list[New] = []
        self.mapping: list[int] = []  # after build(): new index of each old op

    def insert_before(self, i: int, new: New) -> New:
        self.before[i].append(new)
        return new

    def insert_after(self, i: int, new: New) -> New:
        self.after[i].append(new)
        return new

    def append(self, new: New) -> New:
        self.tail.append(new)
        return new

    def add_dep(self, i: int, new: New) -> None:
        self.extra_deps[i].append(new)

    def build(self) -> OpGraph:
        old, g = self.old, OpGraph()
        n = len(old.ops)
        # where every old op lands: shifted by the insertions before it (one pass over the
        # insertion points, not over the ops: graphs have tens of thousands of ops)
        mapping = [0] * n
        placed: list[tuple[int, New]] = []
        prev = offset = 0
        for p in sorted(set(self.before) | set(self.after)):
            mapping[prev:p] = range(prev + offset, p + offset)
            for k, new in enumerate(self.before.get(p, ())):
                new.index = p + offset + k
                placed.append((new.index, new))
            offset += len(self.before.get(p, ()))
            mapping[p] = p + offset
            for k, new in enumerate(self.after.get(p, ())):
                new.index = p + offset + 1 + k
                placed.append((new.index, new))
            offset += len(self.after.get(p, ()))
            prev = p + 1
        mapping[prev:n] = range(prev + offset, n + offset)
        total = n + offset + len(self.tail)
        for k, new in enumerate(self.tail):
            new.index = n + offset + k
            placed.append((new.index, new))

        def ref(d, at: int) -> int:
            i = d.index if isinstance(d, New) else mapping[d]
            if not 0 <= i < at:
                name = d.op.name if isinstance(d, New) else old.ops[d].name
                raise ValueError(f"{name} is used before it is placed")
            return i

        g.ops, g.deps = [None] * total, [()] * total  # type: ignore[list-item]
        g.layer, g.microbatch = [-1] * total, [0] * total
        at = mapping.__getitem__
        for i in range(n):
            j = mapping[i]
            g.ops[j], g.layer[j], g.microbatch[j] = old.ops[i], old.layer[i], old.microbatch[i]
            deps = old.deps[i]
            g.deps[j] = tuple(map(at, deps)) if deps else ()
        for i, extra in self.extra_deps.items():
            j = mapping[i]
            g.deps[j] = tuple(sorted(set(g.deps[j]) | {ref(d, j) for d in extra}))
        for j, new in placed:
            g.ops[j], g.layer[j], g.microbatch[j] = new.op, new.layer, new.mb
            g.deps[j] = tuple(sorted({ref(d, j) for d in new.deps}))
        self.mapping = mapping
        return g
