"""`ghsim plan`'s engine: enumerate plans, prune by memory, simulate survivors, rank.

    groups of candidates (space) ──> memory floor per group, estimate per plan
        (memory_estimate: prunes only what provably cannot fit)
    ──> survivors screened on all cores, most promising first (best_first, order;
        screen: small simulations, extrapolated)
    ──> the best few by the objective simulated in full, until no screened plan
        could still beat them ──> SearchResult (ranked, with every verdict counted)

Every candidate gets a verdict (pruned, rejected by the simulator, does not fit,
feasible), so n_evaluated is the size of the space searched. Op costs repeat
across plans, so the calibration handed to the simulator remembers its table
lookups (memo_calibration); it lives as long as one search, in its workers.
"""

from __future__ import annotations

import itertools
import math
import os
import signal
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

from ghsim.cost.calibration import Calibration, load_calibration
from ghsim.errors import GhsimError
from ghsim.hardware import Hardware
from ghsim.model import ModelSpec
from ghsim.plan import Plan
from ghsim.search.best_first import screen_best_first
from ghsim.search.memory_estimate import MARGIN, estimate_memory, may_fit, memory_states
from ghsim.search.memory_order import recompute_rank
from ghsim.search.objective import Objective, score
from ghsim.search.screen import Evaluation, Status, compute_bound, compute_class, evaluate, flops_lower_bound
from ghsim.search.space import Group, SearchSpace, groups
from ghsim.simulate import check_fit_to_model, check_simulable


@dataclass(frozen=True)
class PrunedGroup:
    """A group of candidates the memory floor rules out as a whole (or a time limit left unjudged)."""

    base: Plan
    size: int
    reason: str
    status: Status = Status.PRUNED  # or UNEXPLORED: the time limit came before the group's turn


@dataclass(frozen=True)
class SearchResult:
    model: ModelSpec
    hardware: Hardware
    base: Plan  # what the user gave: gpus, seq, global batch, LoRA rank, software
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
        """Candidates with a verdict (all but those a time limit left unexplored)."""
        return self.n_candidates - self.count(Status.UNEXPLORED)

    @property
    def n_feasible(self) -> int:
        return len(self.ranked)

    def count(self, status: Status) -> int:
        n = sum(1 for e in self.evaluations if e.status == status)
        return n + sum(g.size for g in self.pruned_groups if g.status == status)

    @property
    def best(self) -> Evaluation | None:
        return self.ranked[0] if self.ranked else None

    def score(self, e: Evaluation) -> tuple[float, float]:
        return score(e, self.objective, self.price_per_gpu_hour, self.hardware)



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
           price_per_gpu_hour: float | None = None, top: int = 5, jobs: int = 1,
           progress: Progress | None = None, time_limit: float = 0.0) -> SearchResult:
    """Search `space` around `base` (which holds gpus, seq, global batch, LoRA rank).

    `time_limit` (seconds, 0: none) bounds the whole search: once reached, what is not yet
    judged is reported as unexplored (with its bound where one is known)."""
    t0 = time.perf_counter()
    check_simulable(model)
    deadline = t0 + time_limit if time_limit > 0 else math.inf
    price = hw.price_per_gpu_hour if price_per_gpu_hour is None else price_per_gpu_hour
    if objective == Objective.COST and not price > 0:
        raise GhsimError(f"{hw.name} has no price_per_gpu_hour_usd: give --price for --objective cost")
    cal = memo_calibration(calibration or load_calibration(hw.calibration))
    all_groups = list(groups(space, base))
    n_candidates = sum(g.size for g in all_groups)
    tick = _Ticker(progress, n_candidates)

    if time_limit > 0:
        # pruning may take at most this share of the limit, every layout in turn, so that
        # a large space leaves screening time and a sample of every layout
        all_groups = _by_layout_in_turn(all_groups)
    with _Runner(model, hw, cal, jobs) as runner:
        # several GPUs, no time limit: every survivor's class bound will be asked for, so the
        # workers start on them while this process prunes
        early = runner.prefetch_bounds if time_limit <= 0 and base.gpus > 1 and runner.jobs > 1 else None
        pruned_groups, survivors, pruned_plans = _prune(model, hw, all_groups, tick, t0 + PRUNE_SHARE * time_limit
                                                        if time_limit > 0 else math.inf, early)
        survivors, rejected = _valid(model, hw, survivors, tick)
        pruned_plans += rejected
        survivors, same = _collapse_ignored(runner, survivors, tick, deadline)
        pruned_plans += same
        # CUDA graphs only shorten kernel launches: a plan without them is never faster and
        # holds the same memory, so it is simulated only where its twin with them cannot run
        alive = _plans(survivors)
        has_twin = [not p.cuda_graphs and p.with_(cuda_graphs=True) in alive for p, _ in survivors]
        primary = [s for s, t in zip(survivors, has_twin) if not t]
        twins = [s for s, t in zip(survivors, has_twin) if t]
        screened = screen_best_first(runner, primary, objective, top, tick, deadline)
        verdict = {e.plan: e for e in screened}
        again = []
        for p, est in twins:
            twin = verdict[p.with_(cuda_graphs=True)]
            if twin.status == Status.UNEXPLORED:
                pruned_plans.append(replace(twin, plan=p))
            elif twin.status == Status.REJECTED:
                again.append((p, est))
            else:
                pruned_plans.append(_graphs_twin(p, est, twin))
        tick.add(len(twins) - len(again))
        screened += screen_best_first(runner, again, objective, top, tick, deadline)
        final, n_full = _confirm(runner, screened, objective, price, hw, top)
    feasible = sorted((e for e in final if e.feasible), key=lambda e: score(e, objective, price, hw))
    tick.done()
    return SearchResult(model, hw, base, objective, price, tuple(feasible), tuple(pruned_plans + final),
                        tuple(pruned_groups), n_candidates, time.perf_counter() - t0, n_full)


PRUNE_SHARE = 0.5  # of a time limit, for memory pruning at most


def _by_layout_in_turn(all_groups: list[Group]) -> list[Group]:
    """The groups, one of each layout (tp, pp, ep) in turn."""
    by_layout: dict[tuple[int, int, int], list[Group]] = {}
    for g in all_groups:
        by_layout.setdefault((g.base.tp, g.base.pp, g.base.ep), []).append(g)
    return [g for turn in itertools.zip_longest(*by_layout.values()) for g in turn if g is not None]


def _prune(model: ModelSpec, hw: Hardware, all_groups: Iterable[Group], tick: "_Ticker", deadline: float = math.inf,
           found: Callable[[list[Plan]], None] | None = None):
    """Memory pruning: a group's floor (what none of its members avoids) first, then each
    member, walking micro-batches upwards and stopping at the first that cannot fit. Groups
    not reached by the deadline are left unexplored, whole. `found` is told each group's
    survivors as they are known (one plan per recompute and micro-batch: their CUDA-graph
    variants are of its compute class)."""
    pruned_groups: list[PrunedGroup] = []
    pruned: list[Evaluation] = []
    survivors: list[tuple[Plan, Any]] = []
    cap = hw.hbm.capacity_bytes
    for g in all_groups:
        for um in g.unified_memory:
            base = g.base.with_(unified_memory=um)
            sub_size = g.size // len(g.unified_memory)
            if time.perf_counter() > deadline:
                pruned_groups.append(PrunedGroup(base, sub_size, TIME_LIMIT_REASON, Status.UNEXPLORED))
                tick.add(sub_size)
                continue
            floor_plan = base.with_(micro_batch=g.micro_batches[0], recompute=min(g.recomputes, key=recompute_rank))
            states = memory_states(model, hw, base)  # shared by the group's members
            floor = estimate_memory(model, hw, floor_plan, states)
            if not may_fit(replace(floor, hbm_bytes=floor.floor_bytes), hw, base):
                reason = _why(floor, hw, base, floor=True)
                pruned_groups.append(PrunedGroup(base, sub_size, reason))
                tick.add(sub_size)
                continue
            kept: list[Plan] = []
            for rc in g.recomputes:
                for i, mb in enumerate(g.micro_batches):
                    plan = base.with_(recompute=rc, micro_batch=mb)
                    est = floor if plan == floor_plan else estimate_memory(model, hw, plan, states)
                    if not may_fit(est, hw, plan):
                        # activations only grow with the micro-batch: the larger ones cannot fit either
                        why = _why(est, hw, plan)
                        for m in g.micro_batches[i:]:
                            for cg in g.cuda_graphs:
                                pruned.append(Evaluation(plan.with_(micro_batch=m, cuda_graphs=cg), Status.PRUNED,
                                                         why, est.hbm_bytes))
                        tick.add((len(g.micro_batches) - i) * len(g.cuda_graphs))
                        break
                    if um and est.hbm_bytes <= cap * (1 - MARGIN):
                        # it fits in HBM: unified memory would change nothing (the plan without it is searched)
                        for cg in g.cuda_graphs:
                            pruned.append(Evaluation(plan.with_(cuda_graphs=cg), Status.PRUNED,
                                                     "fits in HBM without unified memory", est.hbm_bytes))
                        tick.add(len(g.cuda_graphs))
                        continue
                    survivors += [(plan.with_(cuda_graphs=cg), est) for cg in g.cuda_graphs]
                    kept.append(plan)
            if found and kept:
                found(kept)
    return pruned_groups, survivors, pruned


TIME_LIMIT_REASON = "not judged within the time limit"

# Settings that only matter in some code paths of the simulator (e.g. the offload
# split on one GPU but not yet on several), with the value their twin takes.
PROBED = {"offload_ratio": 1.0, "offload_schedule": "auto"}


def _collapse_ignored(runner: "_Runner", survivors: list[tuple[Plan, Any]], tick: "_Ticker",
                      deadline: float = math.inf):
    """Plans that differ from a twin only in a setting the simulator ignores for this search.

    For each probed setting, one plan with another value and its twin are simulated;
    bit-identical reports mean the simulator does not model the setting here (an
    unmodelled field changes nothing; a modelled one cannot give the same floats), so
    the other plans with it are not simulated again but reported as their twin.
    """
    plans = {p for p, _ in survivors}
    same: list[Evaluation] = []
    for field, default in PROBED.items():
        if time.perf_counter() > deadline:  # (a saving only: without it the plans are screened one by one)
            break
        canon = lambda p: p.with_(**{field: type(getattr(p, field))(default)})  # noqa: E731
        pair = next(((p, canon(p)) for p, _ in survivors if p != canon(p) and canon(p) in plans), None)
        if pair is None:
            continue
        a, b = runner.evaluate([(pair[0], None), (pair[1], None)], None)
        if (a.status, a.step_time_s, a.hbm_peak_bytes, a.host_peak_bytes) != \
                (b.status, b.step_time_s, b.hbm_peak_bytes, b.host_peak_bytes) or a.status == Status.REJECTED:
            continue
        keep = []
        for p, est in survivors:
            twin = canon(p)
            if p != twin and twin in plans:
                same.append(Evaluation(p, Status.SAME, f"simulates as {twin.flags()} ({field} is not modelled "
                                       f"for this plan)", est.hbm_bytes if est else math.nan))
            else:
                keep.append((p, est))
        survivors = keep
        plans = {p for p, _ in survivors}
    tick.add(len(same))
    return survivors, same


def _plans(items: list[tuple[Plan, Any]]) -> set[Plan]:
    return {p for p, _ in items}


def _graphs_twin(p: Plan, est: Any, twin: Evaluation) -> Evaluation:
    est_bytes = est.hbm_bytes if est else math.nan
    if twin.status == Status.NO_FIT:
        return Evaluation(p, Status.NO_FIT, f"same memory as with --cuda-graphs: {twin.reason}", est_bytes)
    return Evaluation(p, Status.BOUNDED, "never faster than the same plan with --cuda-graphs "
                      "(graphs only shorten kernel launches; same memory)", est_bytes)


def _valid(model: ModelSpec, hw: Hardware, survivors: list[tuple[Plan, Any]], tick: "_Ticker"):
    """Plans the simulator refuses before any work (its own up-front checks), set apart."""
    ok, rejected = [], []
    for p, est in survivors:
        try:
            check_fit_to_model(model, hw, p)
            ok.append((p, est))
        except GhsimError as e:
            rejected.append(Evaluation(p, Status.REJECTED, str(e), est.hbm_bytes if est else math.nan))
    tick.add(len(rejected))
    return ok, rejected


def _why(est, hw: Hardware, plan: Plan, floor: bool = False) -> str:
    slack = 1 + MARGIN
    if floor and not plan.unified_memory and est.floor_bytes > hw.hbm.capacity_bytes * slack:
        return est.explain_floor(hw.hbm.capacity_bytes)
    if est.host_bytes > hw.host.capacity_bytes * slack:
        return (f"needs {est.host_bytes / 1e9:.0f} GB of host memory per node for what it offloads "
                f"> {hw.host.capacity_bytes / 1e9:.0f} GB")
    if plan.unified_memory:
        return (f"needs {est.hbm_bytes / 1e9:.0f} GB per GPU and {est.host_bytes / 1e9:.0f} GB host per node: "
                f"more than HBM and host memory together")
    return est.explain(hw.hbm.capacity_bytes)


def _confirm(runner: "_Runner", screened: list[Evaluation], objective: Objective, price: float, hw: Hardware,
             top: int) -> tuple[list[Evaluation], int]:
    """Simulate the whole model for the best `top` plans, and for any screened plan whose
    screened score still beats the best confirmed one, until the ranking's head is exact."""
    by_plan = {e.plan: e for e in screened}
    n_full = 0
    key = lambda e: score(e, objective, price, hw)  # noqa: E731
    while True:
        feasible = sorted((e for e in by_plan.values() if e.feasible), key=key)
        todo = [e.plan for e in feasible[:top] if not e.exact]
        exact = [e for e in feasible if e.exact]
        if exact:
            todo += [e.plan for e in feasible[top:] if not e.exact and key(e) < key(exact[0])]
        if not todo:
            return list(by_plan.values()), n_full
        for e in runner.evaluate([(p, None) for p in todo], None, level="confirm"):
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
    # Ctrl-C reaches the whole process group: the parent stops the workers, they need not react;
    # and the parent stops them with SIGTERM, whose handler (the CLI's, inherited by fork) is not theirs
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _WORKER.update(model=model, hw=hw, cal=cal)


def _evaluate_chunk(chunk: list[tuple[Plan, Any]], level: str, bar: float) -> list[Evaluation]:
    w = _WORKER
    return [evaluate(w["model"], w["hw"], p, w["cal"], est, level, bar) for p, est in chunk]


def _bound_chunk(chunk: list[Plan]) -> list[float]:
    w = _WORKER
    return [compute_bound(w["model"], w["hw"], p, w["cal"]) for p in chunk]


class _Runner:
    """Evaluates plans in this process (jobs=1) or a pool of `jobs` worker processes."""

    def __init__(self, model: ModelSpec, hw: Hardware, cal: Calibration, jobs: int):
        self.model, self.hw, self.cal = model, hw, cal
        self.jobs = max(1, jobs)
        self.pool: ProcessPoolExecutor | None = None
        self._flops: dict[tuple, float] = {}
        # compute-class bounds asked for ahead (prefetch_bounds): queued, in the pool, known
        self._asked: set[Plan] = set()
        self._queued: list[Plan] = []
        self._prefetching: list[tuple[list[Plan], Any]] = []
        self._prefetched: dict[Plan, float] = {}

    def __enter__(self) -> "_Runner":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if self.pool is None:
            return
        if exc_type is not None:
            # interrupted (SIGINT, SIGTERM via the CLI) or failed: stop the workers now rather
            # than wait for their chunks; ProcessPoolExecutor has no public way to name them
            for proc in list((self.pool._processes or {}).values()):
                proc.terminate()
        # (waiting is quick once they are gone: the pool's manager thread sees them die; not
        # waiting races its wake-up pipe against interpreter exit)
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _get_pool(self) -> ProcessPoolExecutor:
        if self.pool is None:
            import multiprocessing

            # fork: workers inherit the loaded model, profiles and calibration at no cost
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            self.pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context(method),
                                            initializer=_init_worker, initargs=(self.model, self.hw, self.cal))
        return self.pool

    def evaluate(self, items: list[tuple[Plan, Any]], tick: _Ticker | None, level: str = "screen",
                 bar: float = math.inf) -> list[Evaluation]:
        if self.jobs == 1 or len(items) < 4:
            out = []
            for p, est in items:
                out.append(evaluate(self.model, self.hw, p, self.cal, est, level, bar))
                if tick:
                    tick.add(1)
            return out
        return self._map(_evaluate_chunk, items, tick, level, bar)

    def flops_bound(self, plan: Plan) -> float:
        """Seconds the step's matrix FLOPs (with recompute) take at the dense peak: free, and a bound."""
        key = (plan.precision, plan.recompute, plan.micro_batch, plan.grad_accum)
        v = self._flops.get(key)
        if v is None:
            v = self._flops[key] = flops_lower_bound(self.model, self.hw, plan)
        return v

    def bounds(self, plans: list[Plan]) -> list[float]:
        """compute_bound of each plan (a compute class), those prefetched included."""
        self._submit_prefetch(flush=True)
        for chunk, future in self._prefetching:
            if future.exception() is None:  # (else those classes are computed below, if asked for)
                self._prefetched.update(zip(chunk, future.result()))
        self._prefetching = []
        todo = [p for p in plans if p not in self._prefetched]
        if self.jobs == 1 or len(todo) < 4:
            got = [compute_bound(self.model, self.hw, p, self.cal) for p in todo]
        else:
            got = self._map(_bound_chunk, todo, None)
        done = dict(zip(todo, got))
        return [done[p] if p in done else self._prefetched[p] for p in plans]

    def prefetch_bounds(self, plans: list[Plan]) -> None:
        """Start the workers on the compute-class bounds of these plans' classes, for bounds()
        to collect: the same numbers, computed while this process does other work. Plans the
        simulator refuses up front (_valid) are left out: their classes may not schedule."""
        for c in map(compute_class, filter(self._simulable, plans)):
            if c not in self._asked:
                self._asked.add(c)
                self._queued.append(c)
        self._submit_prefetch()

    def _simulable(self, plan: Plan) -> bool:
        try:
            check_fit_to_model(self.model, self.hw, plan)
            return True
        except GhsimError:
            return False

    def _submit_prefetch(self, flush: bool = False) -> None:
        while len(self._queued) >= PREFETCH_CHUNK or (flush and self._queued):
            chunk, self._queued = self._queued[:PREFETCH_CHUNK], self._queued[PREFETCH_CHUNK:]
            self._prefetching.append((chunk, self._get_pool().submit(_bound_chunk, chunk)))

    def _map(self, fn: Callable, items: list, tick: _Ticker | None, *args: Any) -> list:
        """fn over chunks of items in the pool, results in the items' order."""
        size = max(1, min(32, math.ceil(len(items) / (self.jobs * 4))))
        chunks = [items[i:i + size] for i in range(0, len(items), size)]
        pool = self._get_pool()
        futures = {pool.submit(fn, c, *args): i for i, c in enumerate(chunks)}
        results: list[list] = [[] for _ in chunks]
        for f in as_completed(futures):
            results[futures[f]] = f.result()
            if tick:
                tick.add(len(results[futures[f]]))
        return [x for chunk in results for x in chunk]


# class bounds per job sent ahead to a worker: a choice, not tuned. One bound takes about 1 ms (median
# 1.0 ms over the 476 classes of exhaustive llama-70b on 8 x h100-sxm, 2-core machine, 2026-11-27), so a
# job of 16 is ~16 ms of work against its 2.3 KB of pickled plans
PREFETCH_CHUNK = 16


def default_jobs() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def usable_jobs(requested: int | None) -> tuple[int, str]:
    """Worker processes for a request (None: every core), at most one per available core,
    with a note when the request was capped; fewer than one is an error."""
    cores = default_jobs()
    if requested is None:
        return cores, ""
    if requested < 1:
        raise GhsimError(f"--jobs must be at least 1 (got {requested})")
    if requested > cores:
        return cores, f"--jobs {requested} capped to the {cores} cores available"
    return requested, ""
