"""Screen the surviving plans best-first, with branch and bound: once `top` plans are known,
a plan whose lower bound is worse than all of them cannot enter the ranking and is not
simulated.

Bounds: time (and cost, time times a constant here) by the step's FLOPs at peak rate
(free), by the compute kernels of the plan's class (screen.compute_bound, once per class
for all its ZeRO, offload and unified-memory members, when the walk reaches a class of
several plans, or for every class at the start, on all cores, when there is no time limit: on several GPUs the pipeline of the class's priced op templates, bubbles
included, no graph built; on one GPU two small simulations) and, for a multi-GPU plan, by
its last micro-batch and those in the middle of the step (step_floors.step_time_floor, inside the
evaluation, before its memory); the HBM peak by the memory estimate. Order (order.Order):
in turn a plan to explore (seeds first: one per precision and layout, then one per ZeRO
stage and offload set of each) and a neighbour (one move away) of the best plans found, so
that with a time limit the simulations go where the good plans are. Past the deadline the
rest is unexplored.
"""

from __future__ import annotations

import math
import operator
import time
from typing import TYPE_CHECKING, Any

from ghsim.plan import Plan
from ghsim.search.memory_estimate import MARGIN
from ghsim.search.memory_order import NoFit, memory_order, needs_less_hbm
from ghsim.search.objective import Objective
from ghsim.search.order import Order, neighbours, seed_tiers
from ghsim.search.screen import Evaluation, Status, compute_class

if TYPE_CHECKING:  # the runner and the ticker belong to the search that calls this
    from ghsim.search.core import _Runner, _Ticker

BOUND_WORTH = 4  # one GPU: compute class bounds (small simulations) for classes of at least this many plans
SCREEN_TOLERANCE = 0.01  # screened times lie within 1% of the full simulation (tests/test_search_screen.py)


def screen_best_first(runner: _Runner, survivors: list[tuple[Plan, Any]], objective: Objective, top: int,
                      tick: _Ticker, deadline: float = math.inf) -> list[Evaluation]:
    """A verdict for every survivor (see the module's docstring); past `deadline` the rest
    is unexplored."""
    return _BestFirst(runner, survivors, objective, top, tick).run(deadline)


class _BestFirst:
    """One screening pass: the survivors' bounds and order, and the verdicts so far."""

    def __init__(self, runner: _Runner, survivors: list[tuple[Plan, Any]], objective: Objective, top: int,
                 tick: _Ticker):
        self.runner, self.survivors, self.top, self.tick = runner, survivors, top, tick
        if objective == Objective.MEMORY:
            self.keys = [est.hbm_bytes / (1 + MARGIN) for _, est in survivors]
            self.value = operator.attrgetter("hbm_peak_bytes")
            self.unit, self.scale, self.what = "GB", 1e-9, "HBM"
        else:
            self.keys = [runner.flops_bound(p) for p, _ in survivors]
            self.value = operator.attrgetter("step_time_s")
            self.unit, self.scale, self.what = "s", 1.0, "GPU compute"
        self.index = {p: j for j, (p, _) in enumerate(survivors)}
        self.tables: dict[tuple, dict] = {}  # neighbours' lookup, built on first use
        classes: dict[Plan, Plan] = {}  # one object per class: survivors are many, classes few
        self.cls = [classes.setdefault(c, c) for c in (compute_class(p) for p, _ in survivors)] \
            if self.unit == "s" else []
        self.members: dict[Plan, int] = {}
        for c in self.cls:
            self.members[c] = self.members.get(c, 0) + 1
        memory = [memory_order(p) for p, _ in survivors]
        self.class_bound: dict[Plan, float] = {}
        # several GPUs: a class's bound prices templates (under a millisecond), worth it for any class
        self.bound_worth = 1 if survivors and survivors[0][0].gpus > 1 else BOUND_WORTH
        cap = runner.hw.hbm.capacity_bytes * (1 - MARGIN)
        roomy = [est is None or est.hbm_bytes <= cap for _, est in survivors]
        self.order = Order(self.keys, seed_tiers([p for p, _ in survivors], self.keys, memory, roomy), memory)
        self.pending = self.order.pending
        self.no_fit = NoFit(runner.hw)
        self.full_wave = self.wave = max(8, runner.jobs * 4)
        self.round_s = 0.0  # wall seconds of a round (one plan per worker) in the last wave
        self.out: list[Evaluation] = []
        self.best: list[float] = []  # values of the feasible plans screened so far, ascending

    def run(self, deadline: float) -> list[Evaluation]:
        if deadline == math.inf and self.unit == "s":
            self._all_class_bounds()
        while self.pending:
            top = self.top
            bar = self.best[top - 1] * (1 + SCREEN_TOLERANCE) if len(self.best) >= top else math.inf
            if not self._fit_wave(deadline - time.perf_counter()):
                self._leave_unexplored()
                break
            batch = self._next_batch(bar)
            if batch:
                t = time.perf_counter()
                self._simulate(batch, bar)
                rounds = math.ceil(len(batch) / self.runner.jobs)
                self.round_s = (time.perf_counter() - t) / rounds
        return self.out

    def _fit_wave(self, left_s: float) -> bool:
        """Size the next wave to the time left (a big cluster's plan can take seconds): as many
        rounds as the last wave's pace fits (a full wave until it is known); False when not one."""
        if left_s <= 0 or self.round_s > left_s:
            return False
        if self.round_s and left_s < math.inf:
            self.wave = max(1, min(self.full_wave, int(left_s / self.round_s) * self.runner.jobs))
        return True

    def bound(self, j: int) -> float:
        if self.unit != "s":
            return self.keys[j]
        c = self.cls[j]
        if c not in self.class_bound:  # worth its cost only for a class with several plans
            self.class_bound[c] = (max(self.keys[j], self.runner.bounds([c])[0])
                                   if self.members[c] >= self.bound_worth else self.keys[j])
        return self.class_bound[c]

    def set_aside(self, j: int, status: Status, why: str) -> None:
        p, est = self.survivors[j]
        self.out.append(Evaluation(p, status, why, est.hbm_bytes if est else math.nan))
        self.pending.discard(j)
        self.tick.add(1)

    def _leave_unexplored(self) -> None:
        for j in sorted(self.pending):
            known = self.unit != "s" or self.cls[j] in self.class_bound
            self.set_aside(j, Status.UNEXPLORED, "not simulated within the time limit" + (
                f" (needs at least {self.bound(j) * self.scale:.3g} {self.unit} of {self.what})" if known else ""))

    def _all_class_bounds(self) -> None:
        """Every class's bound, on all cores at once. Without a time limit each is asked for
        anyway (a plan set aside names its class's bound), one at a time in this process while
        the workers wait; the bounds are the same whenever they are computed."""
        first: dict[Plan, float] = {}  # (a class's members share their FLOPs bound: precision, micro-batch, layout)
        for j, c in enumerate(self.cls):
            if c not in first and self.members[c] >= self.bound_worth:
                first[c] = self.keys[j]
        for c, b in zip(first, self.runner.bounds(list(first))):
            self.class_bound[c] = max(first[c], b)

    def _fetch_class_bounds(self, head: list[int], bar: float) -> None:
        """The class bounds this round will ask for, on all cores at once."""
        classes = {self.cls[j]: self.keys[j] for j in head if self.keys[j] <= bar}
        todo = [c for c in classes if c not in self.class_bound and self.members[c] >= self.bound_worth]
        for c, b in zip(todo, self.runner.bounds(todo) if len(todo) > 1 else ()):
            self.class_bound[c] = max(classes[c], b)

    def _next_batch(self, bar: float) -> list[int]:
        """Up to a wave of plans to simulate; those taken on the way that a bound or a plan
        that did not fit rules out get their verdict here."""
        batch: list[int] = []
        head = self.order.take(2 * self.wave, bar)
        if self.unit == "s":
            self._fetch_class_bounds(head, bar)
        k = 0
        while len(batch) < self.wave:
            if k == len(head):
                head += self.order.take(self.wave, bar)  # past the head whose class bounds were fetched
                if k == len(head):
                    break
            j = head[k]
            k += 1
            bigger = self.no_fit.dominates(self.survivors[j][0])
            if self.keys[j] > bar or self.bound(j) > bar:
                self.set_aside(j, Status.BOUNDED, f"needs at least {self.bound(j) * self.scale:.3g} {self.unit} of "
                                                  f"{self.what} > {bar * self.scale:.3g} {self.unit} of the top {self.top}")
            elif bigger:
                self.set_aside(j, Status.NO_FIT, f"needs at least the {bigger}, which does not fit")
            else:
                batch.append(j)
        self.order.put_back(head[k:])  # not reached this round
        return batch

    def _simulate(self, batch: list[int], bar: float) -> None:
        self.pending.difference_update(batch)
        # a time bar lets screening stop a plan after its first small simulations
        evs = self.runner.evaluate([self.survivors[j] for j in batch], self.tick,
                                   bar=bar if self.unit == "s" else math.inf)
        self.out += evs
        for e in evs:
            if e.status == Status.NO_FIT:
                self.no_fit.add(e)
                # a seed that does not fit hands its turn to its neighbours that need less memory
                self.order.inherit_seed(self.index[e.plan], [
                    q for q in neighbours(e.plan, self.index, self.tables)
                    if needs_less_hbm(self.survivors[q][0], e.plan)])
            elif e.feasible:
                for q in neighbours(e.plan, self.index, self.tables):
                    self.order.near(q, self.value(e))
        self.best = sorted(self.best + [self.value(e) for e in evs if e.feasible])
