"""The order in which best-first screening takes plans: seeds, then neighbours of good plans."""

from __future__ import annotations

import heapq
import math
import operator
from dataclasses import fields
from typing import Callable

from ghsim.plan import Plan
from ghsim.search.space import LAYOUT, SEARCHED


class Order:
    """The order in which screening takes the pending plans: in turn the next to explore
    (seeds by tier first, then the rest, each by its lower bound, the plans needing less memory
    first among equals: if they do not fit, neither do the rest) and the next to exploit
    (neighbours of the feasible plans found, by the value of the best such neighbour).

    Two queues, not one: a bound sorts below any simulated value, so in one queue every
    seed would come before every neighbour, and seeds alone can outnumber what a time
    limit lets the search simulate (284 for llama-70b on 16 H100s, ~290 judged in 7 s).
    """

    def __init__(self, keys: list[float], seed_tiers: dict[int, int], memory_order: list[tuple]):
        self.pending = set(range(len(keys)))
        rest = len(SEED_TIERS)
        # heap entries end (memory order, plan); explore's begin with (tier, bound), exploit's with a value
        self.rank = {j: ((seed_tiers.get(j, rest), keys[j]), memory_order[j]) for j in self.pending}
        self.explore = [(*self.rank[j], j) for j in self.pending]
        heapq.heapify(self.explore)
        self.exploit: list[tuple] = []
        self.nearest: dict[int, float] = {}  # plan -> value of its best feasible neighbour so far

    def near(self, j: int, value: float) -> None:
        """Plan j is one move from a feasible plan of this value."""
        if j in self.pending and value < self.nearest.get(j, math.inf):
            self.nearest[j] = value
            heapq.heappush(self.exploit, (value, self.rank[j][1], j))

    def inherit_seed(self, j: int, others: list[int]) -> None:
        """Seed j did not fit: its combination is represented by the `others` (its neighbours
        needing less memory) instead, at its tier, each by its own bound."""
        tier = self.rank[j][0][0]
        for q in others:
            (q_tier, key), memory = self.rank[q]
            if q in self.pending and tier < q_tier:
                self.rank[q] = ((tier, key), memory)
                heapq.heappush(self.explore, (*self.rank[q], q))  # (its old entry is popped later, unpending)

    def take(self, k: int, bar: float) -> list[int]:
        """The next k pending plans, alternately from each queue (they stay pending: the
        caller settles them, or puts them back); a neighbour only of a plan within `bar`
        (the top plans' value): exploiting around mediocre plans spends what exploring
        would use better. Entries of plans no longer pending, or whose neighbour value has
        since improved, are stale and dropped."""
        got: list[int] = []
        while len(got) < k:
            exploit_turn = len(got) % 2 == 0 or not self.explore
            if self.exploit and self.exploit[0][0] <= bar and exploit_turn:
                value, _, j = heapq.heappop(self.exploit)
                fresh = value == self.nearest[j]
            elif self.explore:
                j, fresh = heapq.heappop(self.explore)[-1], True
            else:
                break
            if fresh and j in self.pending and j not in got:
                got.append(j)
        return got

    def put_back(self, plans: list[int]) -> None:
        for j in plans:
            heapq.heappush(self.explore, (*self.rank[j], j))
            if j in self.nearest:
                heapq.heappush(self.exploit, (self.nearest[j], self.rank[j][1], j))


# Each layout has seeds of its own, so a time-limited search reaches them all. Seed tiers,
# by the choices a seed stands for: first each precision and layout, then each ZeRO stage
# and offload set of those.
SEED_TIERS = (("precision", *LAYOUT), ("precision", *LAYOUT, "zero", "offload"))
# A move changes one searched choice, or the micro-batch and recompute together: a larger
# micro-batch often fits only with more recompute, and under ZeRO-3 or offload fewer
# micro-batches move less, so the best plan can lie past a slow plan of single moves
# (llama-2-70b on 8 H200: micro-batch 1 -> 8 with full recompute, 20.5 -> 16.7 s/step).
# And the same plan on another layout (with its sequence parallelism and interleave): a good
# plan's settings tend to be good on the layout beside it, whose seeds may lie several moves
# away (llama-2-70b on 8 H200: 16.41 s/step at tp 2, micro-batch 8 -> tp 1 -> micro-batch 4,
# 16.29 s, the exhaustive best, which the 7 s default missed without this move).
MOVES = tuple((d,) for d in SEARCHED if d not in LAYOUT) + (("micro_batch", "recompute"),) + ((
    *LAYOUT, "sequence_parallel", "pp_interleave"),)


def seed_tiers(plans: list[Plan], keys: list[float], memory_order: list[tuple],
               roomy: list[bool] | None = None) -> dict[int, int]:
    """Where best-first screening starts: plan index -> its tier in SEED_TIERS, for the plan
    of each combination with the lowest bound and the least memory, among those the memory
    estimate leaves room (`roomy`) if any: a seed that does not fit leads nowhere, since only
    feasible plans have their neighbours explored. Every layout is looked at early; seeing one
    plan of a layout lets its neighbours lead to the layout's best."""
    tiers: dict[int, int] = {}
    seen: set[tuple] = set()
    roomy = roomy or [True] * len(plans)
    for j in sorted(range(len(plans)), key=lambda j: (not roomy[j], keys[j], memory_order[j])):
        for tier, dims in enumerate(SEED_TIERS):
            combination = (tier, *(getattr(plans[j], d) for d in dims))
            if combination not in seen:
                seen.add(combination)
                tiers.setdefault(j, tier)
    return tiers


def neighbours(plan: Plan, index: dict[Plan, int], tables: dict[tuple, dict]) -> list[int]:
    """Survivors one move away from `plan` (by index); `tables` holds, per move, the
    survivors grouped by everything the move leaves alone (built on first use, per search)."""
    out = []
    for move in MOVES:
        rest, values = _getters(move)
        if move not in tables:
            # keyed by the hash of the other fields (an int, not a tuple per plan: a large search
            # has 10^5 survivors); a collision could only add a neighbour to explore, never a verdict
            table: dict[int, dict[tuple, int]] = {}
            for p, j in index.items():
                table.setdefault(hash(rest(p)), {})[values(p)] = j
            tables[move] = table
        mine = values(plan)
        out += [j for v, j in tables[move].get(hash(rest(plan)), {}).items() if v != mine]
    return out


_PLAN_FIELDS = tuple(f.name for f in fields(Plan))


def _getters(dims: tuple[str, ...]) -> tuple[Callable[[Plan], tuple], Callable[[Plan], tuple]]:
    """(the plan's other fields, its values of `dims`), each as a tuple: a move's table keys."""
    rest = [f for f in _PLAN_FIELDS if f not in dims]
    return _tuple_getter(rest), _tuple_getter(list(dims))


def _tuple_getter(names: list[str]) -> Callable[[Plan], tuple]:
    get = operator.attrgetter(*names)
    return get if len(names) > 1 else (lambda p: (get(p),))
