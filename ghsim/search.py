"""`ghsim plan`'s engine: enumerate plans, prune by memory, simulate survivors, rank.

    groups of candidates (search_space) ──> memory floor per group, estimate per plan
        (memory_estimate: prunes only what provably cannot fit)
    ──> survivors screened on all cores (search_screen: small simulations, extrapolated)
    ──> the best few by the objective simulated in full, until no screened plan
        could still beat them ──> SearchResult (ranked, with every verdict counted)

Every candidate gets a verdict (pruned, rejected by the simulator, does not fit,
feasible), so n_evaluated is the size of the space searched. Op costs repeat
across plans, so the calibration handed to the simulator remembers its table
lookups (memo_calibration); it lives as long as one search, in its workers.
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Callable, Iterable

from ghsim.cost.calibration import Calibration, load_calibration
from ghsim.errors import GhsimError
from ghsim.hardware import Hardware
from ghsim.memory_estimate import MARGIN, estimate_memory, may_fit
from ghsim.model import ModelSpec
from ghsim.plan import Plan
from ghsim.search_screen import Evaluation, Status, evaluate
from ghsim.search_space import Group, SearchSpace, groups

SCREEN_TOLERANCE = 0.02  # screened times are within 1% (tests); confirm anything this close to the best


class Objective(str, Enum):
    TIME = "time"  # step time
    COST = "cost"  # dollars per million tokens
    MEMORY = "memory"  # HBM headroom

    @classmethod
    def parse(cls, value: str) -> "Objective":
        try:
            return cls(value)
        except ValueError:
            raise GhsimError(f"unknown objective {value!r} (choose from {', '.join(o.value for o in cls)})") from None


@dataclass(frozen=True)
class PrunedGroup:
    """A group of candidates the memory floor rules out as a whole."""

    base: Plan
    size: int
    reason: str


@dataclass(frozen=True)
class SearchResult:
    model: ModelSpec
    hardware: Hardware
    objective: Objective
    price_per_gpu_hour: float
    ranked: tuple[Evaluation, ...]  # feasible plans, best first
    evaluations: tuple[Evaluation, ...]  # every plan judged one by one
    pruned_groups: tuple[PrunedGroup, ...]
    n_candidates: int
    elapsed_s: float
    n_simulations: int  # full simulations run (screening runs a few small ones per plan instead)

    @property
    def n_evaluated(self) -> int:
        return self.n_candidates

    @property
    def n_feasible(self) -> int:
        return len(self.ranked)

    def count(self, status: Status) -> int:
        n = sum(1 for e in self.evaluations if e.status == status)
        return n + (sum(g.size for g in self.pruned_groups) if status == Status.PRUNED else 0)

    @property
    def best(self) -> Evaluation | None:
        return self.ranked[0] if self.ranked else None

    def score(self, e: Evaluation) -> tuple[float, float]:
        return score(e, self.objective, self.price_per_gpu_hour, self.hardware)


def score(e: Evaluation, objective: Objective, price: float, hw: Hardware) -> tuple[float, float]:
    """Sort key, smaller is better; ties broken by step time."""
    if objective == Objective.MEMORY:
        return (e.hbm_peak_bytes, e.step_time_s)
    if objective == Objective.COST:
        return (e.usd_per_mtok(price), e.step_time_s)
    return (e.step_time_s, e.hbm_peak_bytes)


# --- op costs remembered across plans -------------------------------------------------
class MemoTable:
    """A calibration lookup table that remembers its answers (keyed by the op's shape features)."""

    def __init__(self, table: Any):
        self.table = table
        self.memo: dict[tuple, float] = {}

    def __getattr__(self, name: str) -> Any:  # features, values, ...: the table's own
        return getattr(self.table, name)

    def query(self, x: tuple[float, ...], neighbours: int = 4) -> float:
        key = (tuple(x), neighbours)
        v = self.memo.get(key)
        if v is None:
            v = self.memo[key] = self.table.query(x, neighbours)
        return v


def memo_calibration(cal: Calibration) -> Calibration:
    """The same calibration, its per-shape lookups remembered for the life of one search."""
    return replace(cal, gemm={k: MemoTable(v) for k, v in cal.gemm.items()},
                   attention_fwd={k: MemoTable(v) for k, v in cal.attention_fwd.items()},
                   attention_bwd={k: MemoTable(v) for k, v in cal.attention_bwd.items()})


# --- the search ---------------------------------------------------------------------
Progress = Callable[[int, int], None]  # (candidates judged so far, all candidates)


def search(model: ModelSpec, hw: Hardware, base: Plan, space: SearchSpace,
           objective: Objective = Objective.TIME, calibration: Calibration | None = None,
           price_per_gpu_hour: float | None = None, top: int = 10, jobs: int = 1,
           progress: Progress | None = None) -> SearchResult:
    """Search `space` around `base` (which holds gpus, seq, global batch, LoRA rank)."""
    t0 = time.perf_counter()
    price = hw.price_per_gpu_hour if price_per_gpu_hour is None else price_per_gpu_hour
    if objective == Objective.COST and not price > 0:
        raise GhsimError(f"{hw.name} has no price_per_gpu_hour_usd: give --price for --objective cost")
    cal = memo_calibration(calibration or load_calibration(hw.calibration))
    all_groups = list(groups(space, base))
    n_candidates = sum(g.size for g in all_groups)
    tick = _Ticker(progress, n_candidates)

    pruned_groups, survivors, pruned_plans = _prune(model, hw, all_groups, tick)
    with _Runner(model, hw, cal, jobs) as runner:
        screened = runner.evaluate([(p, e) for p, e in survivors], tick)
        final, n_full = _confirm(runner, screened, objective, price, hw, top)
    feasible = sorted((e for e in final if e.feasible), key=lambda e: score(e, objective, price, hw))
    tick.done()
    return SearchResult(model, hw, objective, price, tuple(feasible), tuple(pruned_plans + final),
                        tuple(pruned_groups), n_candidates, time.perf_counter() - t0, n_full)


def _prune(model: ModelSpec, hw: Hardware, all_groups: Iterable[Group], tick: "_Ticker"):
    """Memory pruning: a group's floor (what none of its members avoids) first, then each
    member, walking micro-batches upwards and stopping at the first that cannot fit."""
    pruned_groups: list[PrunedGroup] = []
    pruned: list[Evaluation] = []
    survivors: list[tuple[Plan, Any]] = []
    cap = hw.hbm.capacity_bytes
    for g in all_groups:
        for um in g.unified_memory:
            base = g.base.with_(unified_memory=um)
            sub_size = g.size // len(g.unified_memory)
            floor = estimate_memory(model, hw, base.with_(micro_batch=g.micro_batches[0]))
            if not may_fit(replace(floor, hbm_bytes=floor.floor_bytes), hw, base):
                reason = _why(floor, hw, base, floor=True)
                pruned_groups.append(PrunedGroup(base, sub_size, reason))
                tick.add(sub_size)
                continue
            for rc in g.recomputes:
                for i, mb in enumerate(g.micro_batches):
                    plan = base.with_(recompute=rc, micro_batch=mb)
                    est = estimate_memory(model, hw, plan)
                    if not may_fit(est, hw, plan):
                        # activations only grow with the micro-batch: the larger ones cannot fit either
                        for m in g.micro_batches[i:]:
                            for cg in g.cuda_graphs:
                                pruned.append(Evaluation(plan.with_(micro_batch=m, cuda_graphs=cg), Status.PRUNED,
                                                         _why(est, hw, plan), est.hbm_bytes))
                        tick.add((len(g.micro_batches) - i) * len(g.cuda_graphs))
                        break
                    for cg in g.cuda_graphs:
                        p = plan.with_(cuda_graphs=cg)
                        if um and est.hbm_bytes <= cap * (1 - MARGIN):
                            # it fits in HBM: unified memory would change nothing (the plan without it is searched)
                            pruned.append(Evaluation(p, Status.PRUNED, "fits in HBM without unified memory",
                                                     est.hbm_bytes))
                            tick.add(1)
                        else:
                            survivors.append((p, est))
    return pruned_groups, survivors, pruned


def _why(est, hw: Hardware, plan: Plan, floor: bool = False) -> str:
    if floor and not plan.unified_memory and est.floor_bytes > hw.hbm.capacity_bytes * (1 + MARGIN):
        return est.explain_floor(hw.hbm.capacity_bytes)
    if plan.unified_memory:
        return (f"needs {est.hbm_bytes / 1e9:.0f} GB per GPU and {est.host_bytes / 1e9:.0f} GB host per node: "
                f"more than HBM and host memory together")
    if est.hbm_bytes > hw.hbm.capacity_bytes * (1 + MARGIN):
        return est.explain(hw.hbm.capacity_bytes)
    return f"needs {est.host_bytes / 1e9:.0f} GB host memory per node > {hw.host.capacity_bytes / 1e9:.0f} GB"


def _confirm(runner: "_Runner", screened: list[Evaluation], objective: Objective, price: float, hw: Hardware,
             top: int) -> tuple[list[Evaluation], int]:
    """Simulate in full the best `top` plans, and any screened plan that might still beat
    the best confirmed one, until the ranking's head is exact."""
    by_plan = {e.plan: e for e in screened}
    n_full = sum(1 for e in screened if e.exact)
    key = lambda e: score(e, objective, price, hw)  # noqa: E731
    while True:
        feasible = sorted((e for e in by_plan.values() if e.feasible), key=key)
        head = feasible[:top]
        todo = [e.plan for e in head if not e.exact]
        exact = [e for e in feasible if e.exact]
        if exact and objective != Objective.MEMORY:
            bar = key(exact[0])[0] * (1 + SCREEN_TOLERANCE)
            todo += [e.plan for e in feasible[top:] if not e.exact and key(e)[0] < bar]
        if not todo:
            return list(by_plan.values()), n_full
        for e in runner.evaluate([(p, None) for p in todo], None, exact=True):
            by_plan[e.plan] = replace(e, est_hbm_bytes=by_plan[e.plan].est_hbm_bytes)
            n_full += 1


class _Ticker:
    def __init__(self, progress: Progress | None, total: int):
        self.progress, self.total, self.n = progress, total, 0

    def add(self, n: int) -> None:
        self.n += n
        if self.progress:
            self.progress(self.n, self.total)

    def done(self) -> None:
        if self.progress:
            self.progress(self.total, self.total)


# --- running evaluations on all cores ------------------------------------------------------
_WORKER: dict[str, Any] = {}  # one search's (model, hardware, calibration) in a pool worker process


def _init_worker(model: ModelSpec, hw: Hardware, cal: Calibration) -> None:
    _WORKER.update(model=model, hw=hw, cal=cal)


def _evaluate_chunk(chunk: list[tuple[Plan, Any]], exact: bool) -> list[Evaluation]:
    w = _WORKER
    return [evaluate(w["model"], w["hw"], p, w["cal"], est, exact=exact) for p, est in chunk]


class _Runner:
    """Evaluates plans in this process (jobs=1) or a pool of `jobs` worker processes."""

    def __init__(self, model: ModelSpec, hw: Hardware, cal: Calibration, jobs: int):
        self.model, self.hw, self.cal = model, hw, cal
        self.jobs = max(1, jobs)
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> "_Runner":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def _get_pool(self) -> ProcessPoolExecutor:
        if self.pool is None:
            import multiprocessing

            # fork: workers inherit the loaded model, profiles and calibration at no cost
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            self.pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context(method),
                                            initializer=_init_worker, initargs=(self.model, self.hw, self.cal))
        return self.pool

    def evaluate(self, items: list[tuple[Plan, Any]], tick: _Ticker | None, exact: bool = False) -> list[Evaluation]:
        if not items:
            return []
        if self.jobs == 1 or len(items) < 4:
            out = []
            for p, est in items:
                out.append(evaluate(self.model, self.hw, p, self.cal, est, exact=exact))
                if tick:
                    tick.add(1)
            return out
        size = max(1, min(32, math.ceil(len(items) / (self.jobs * 8))))
        chunks = [items[i:i + size] for i in range(0, len(items), size)]
        pool = self._get_pool()
        futures = {pool.submit(_evaluate_chunk, c, exact): i for i, c in enumerate(chunks)}
        results: list[list[Evaluation]] = [[] for _ in chunks]
        for f in as_completed(futures):
            results[futures[f]] = f.result()
            if tick:
                tick.add(len(results[futures[f]]))
        return [e for chunk in results for e in chunk]


def default_jobs() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
