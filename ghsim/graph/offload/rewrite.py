"""Rewriting an op graph: find each layer's forward and backward runs, insert ops before and
after existing ones, add dependencies, and rebuild the graph (offload, unified memory)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from ghsim.graph.ops import Op, OpGraph, Phase

FWD, BWD = Phase.FWD, Phase.BWD  # a run's direction: the phase of its ops


class Run(NamedTuple):
    """Consecutive ops of one micro-batch, one layer (-1: embedding or loss), one direction.
    A NamedTuple, as Op (graph/ops.py): a frozen dataclass's __init__ is 4x slower, and a plan
    search finds hundreds of thousands of runs."""

    first: int
    last: int
    mb: int
    layer: int
    direction: str  # FWD | BWD


_DIRECTIONS = (None, FWD, BWD)
_DIRECTION_CODE = {Phase.FWD: 1, Phase.BWD: 2, Phase.RECOMPUTE: 2}  # by phase (Phase members hash as their values)


def find_runs(graph: OpGraph) -> list[Run]:
    """The graph's runs, in order (ops of no direction belong to none). Boundaries found with
    numpy: graphs have tens of thousands of ops, and the plan search rewrites hundreds of graphs."""
    n = len(graph.ops)
    if not n:
        return []
    mb, layer = np.array(graph.microbatch), np.array(graph.layer)
    direction = np.fromiter(map(_DIRECTION_CODE.get, map(attrgetter("phase"), graph.ops), repeat(0)), np.int8, n)
    changes = (mb[1:] != mb[:-1]) | (layer[1:] != layer[:-1]) | (direction[1:] != direction[:-1])
    firsts = [0, *(np.flatnonzero(changes) + 1).tolist()]
    direction = direction.tolist()
    lasts = [f - 1 for f in firsts[1:]] + [n - 1]
    return [Run(first, last, graph.microbatch[first], graph.layer[first], _DIRECTIONS[direction[first]])
            for first, last in zip(firsts, lasts) if direction[first]]


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
        mapping, placed, moves = self._placements(n)
        total = n + len(placed)

        def ref(d, at: int) -> int:
            i = d.index if isinstance(d, New) else mapping[d]
            if not 0 <= i < at:
                name = d.op.name if isinstance(d, New) else old.ops[d].name
                raise ValueError(f"{name} is used before it is placed")
            return i

        g.ops, g.deps = [None] * total, [()] * total  # type: ignore[list-item]
        g.layer, g.microbatch = [-1] * total, [0] * total
        deps = _remapped(old.deps, mapping)
        # the old ops keep their order: each stretch between insertions moves as one slice
        for lo, hi, to in moves:
            g.ops[to:to + hi - lo], g.deps[to:to + hi - lo] = old.ops[lo:hi], deps[lo:hi]
            g.layer[to:to + hi - lo], g.microbatch[to:to + hi - lo] = old.layer[lo:hi], old.microbatch[lo:hi]
        for i, extra in self.extra_deps.items():
            j = mapping[i]
            g.deps[j] = tuple(sorted(set(g.deps[j]) | {ref(d, j) for d in extra}))
        for j, new in placed:
            g.ops[j], g.layer[j], g.microbatch[j] = new.op, new.layer, new.mb
            g.deps[j] = tuple(sorted({ref(d, j) for d in new.deps}))
        self.mapping = mapping
        return g

    def _placements(self, n: int) -> tuple[list[int], list[tuple[int, New]], list[tuple[int, int, int]]]:
        """Where every old op lands (shifted by the insertions before it), where each new op goes
        (setting its index), and the stretches of old ops that move together (old [lo, hi) to
        new `to`). One pass over the insertion points, not over the ops."""
        mapping = [0] * n
        placed: list[tuple[int, New]] = []
        moves: list[tuple[int, int, int]] = []
        prev = offset = 0
        for p in sorted(set(self.before) | set(self.after)):
            before, after = self.before.get(p, ()), self.after.get(p, ())
            if before:
                moves.append((prev, p, prev + offset))
                mapping[prev:p] = range(prev + offset, p + offset)
                for k, new in enumerate(before):
                    new.index = p + offset + k
                    placed.append((new.index, new))
                offset += len(before)
                prev = p
            if after:
                moves.append((prev, p + 1, prev + offset))
                mapping[prev:p + 1] = range(prev + offset, p + 1 + offset)
                for k, new in enumerate(after):
                    new.index = p + offset + 1 + k
                    placed.append((new.index, new))
                offset += len(after)
                prev = p + 1
        moves.append((prev, n, prev + offset))
        mapping[prev:n] = range(prev + offset, n + offset)
        for k, new in enumerate(self.tail):
            new.index = n + offset + k
            placed.append((new.index, new))
        return mapping, placed, moves


def _remapped(deps: list[tuple[int, ...]], mapping: list[int]) -> list[tuple[int, ...]]:
    """Each op's deps through `mapping`. Most ops wait for none or one (a layer's ops in a row):
    those are told apart first, which halves the cost of this loop over every op of the graph."""
    at = mapping.__getitem__
    out: list[tuple[int, ...]] = []
    add = out.append
    for d in deps:
        if not d:
            add(d)
        elif len(d) == 1:
            add((at(d[0]),))
        else:
            add(tuple(map(at, d)))
    return out
