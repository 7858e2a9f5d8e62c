"""What `ghsim plan` prints: the ranked table, why the best plan wins, why its nearest
neighbours lost, what would make an impossible model fit, and the JSON document."""

from __future__ import annotations

import math
import operator
from typing import Any

from ghsim.hardware import GB, Hardware, load_hardware, profile_names, same_gpu_node_kinds
from ghsim.model import ModelSpec
from ghsim.plan import Plan, Recompute
from ghsim.report import intervals
from ghsim.search.core import SearchResult
from ghsim.search.memory_estimate import MARGIN, estimate_memory
from ghsim.search.objective import Objective
from ghsim.search.screen import Evaluation, Status
from ghsim.search.space import LAYOUT, SEARCHED



def reproduce_flags(plan: Plan) -> str:
    """`ghsim simulate` flags for the plan (Plan.flags plus the software it assumes)."""
    flags = plan.flags()
    if "--framework" not in flags:
        flags += f" --framework {plan.framework.value}"
    if "--optimizer-impl" not in flags and plan.optimizer_impl != "foreach":
        flags += f" --optimizer-impl {plan.optimizer_impl}"
    return flags


GIVEN_FLAGS = ("gpus", "seq", "global-batch", "framework", "optimizer-impl", "lora-rank", "gpus-per-node",
               "dataloader-workers", "batch-prep-ms")


def _flag_items(flags: str) -> list[str]:
    return ["--" + part.strip() for part in (" " + flags).split(" --") if part.strip()]


def short_flags(plan: Plan, base: Plan) -> str:
    """The flags of the searched choices (what the user did not give)."""
    items = [f for f in _flag_items(reproduce_flags(plan)) if f[2:].split(" ")[0] not in GIVEN_FLAGS]
    return " ".join(items) or "(defaults)"


def headline(r: SearchResult) -> list[str]:
    hw, b = r.hardware, r.base
    lines = [f"{r.model.name} ({r.model.total_params / 1e9:.1f}B) on {b.gpus} x {hw.name}, seq {b.seq}, "
             f"global batch {b.resolved_global_batch} ({b.tokens_per_step:,} tokens/step)"
             + (f", LoRA rank {b.lora_rank}" if b.lora_rank else "") + f"; objective: {r.objective.value}",
             f"{r.n_candidates:,} candidate plans, {r.n_evaluated:,} judged in {r.elapsed_s:.1f} s: "
             + ", ".join(f"{r.count(s):,} {s.value}" for s in Status if r.count(s))]
    return lines


def cut_short(r: SearchResult) -> str:
    """The line saying a time limit cut the search short, and how many plans it left unjudged."""
    left = r.count(Status.UNEXPLORED)
    return (f"the search was cut short by its time limit after {r.elapsed_s:.1f} s: {left:,} of "
            f"{r.n_candidates:,} plans were not judged; rerun with --time-limit 0 (or more seconds) to judge them all")


def render_table(r: SearchResult, top: int) -> str:
    lines = headline(r)
    left = r.count(Status.UNEXPLORED)
    if left:
        lines.append(cut_short(r))
    if not r.ranked:
        return "\n".join(lines + [""] + no_fit_advice(r))
    price = r.price_per_gpu_hour
    lines += ["", f"{'#':>2} {'step s':>8} {'interval':>11} {'tokens/s':>9} {'MFU':>6} {'HBM GB':>7} {'host GB':>8}"
              f" {'GPU busy':>8}" + (f" {'$/Mtok':>7}" if price else "") + "  plan (flags beyond the given ones)"]
    for i, e in enumerate(r.ranked[:top], 1):
        iv = step_interval(e)
        span = f"{iv[0]:.2f}-{iv[1]:.2f}" if iv else "-"
        lines.append(f"{i:>2} {e.step_time_s:8.2f} {span:>11} {e.tokens_per_s:9,.0f} {e.mfu * 100:5.1f}% "
                     f"{e.hbm_peak_bytes / GB:7.1f} {e.host_peak_bytes / GB:8.1f} {e.gpu_utilization * 100:7.0f}%"
                     + (f" {e.usd_per_mtok(price):7.2f}" if price else "") + f"  {short_flags(e.plan, r.base)}")
    lines += [f"   {line}" for line in ties_text(r, top)]
    best = r.ranked[0]
    lines += ["", "reproduce the best:", f"  ghsim simulate --model {r.model.name} --hardware {r.hardware.name} "
              f"{reproduce_flags(best.plan)}", ""]
    lines += why_best(r)
    return "\n".join(lines)


# --- prediction intervals and ties ---------------------------------------------------------
def step_interval(e: Evaluation) -> tuple[float, float] | None:
    """Where the plan's measured step should lie (report/intervals.py)."""
    return intervals.step_interval(e.step_time_s, e.gpu_utilization)


def _ranked_interval(r: SearchResult, e: Evaluation) -> tuple[tuple[float, float] | None, str, float]:
    """The interval of what the objective ranks by, its unit and scale for the text: the HBM peak
    under the memory objective, else the step time (a plan's cost per token follows its step)."""
    if r.objective == Objective.MEMORY:
        return intervals.peak_interval(e.hbm_peak_bytes), "GB HBM", 1 / GB
    return step_interval(e), "s/step", 1.0


def tie_with_best(r: SearchResult, e: Evaluation) -> str:
    """Why `e` is a tie with the best plan ('' when it is not): their intervals overlap, so the
    measured spread behind the intervals cannot tell which one is really better."""
    best = r.ranked[0]
    if e is best:
        return ""
    a, unit, scale = _ranked_interval(r, best)
    b, _, _ = _ranked_interval(r, e)
    if not intervals.overlap(a, b):
        return ""
    return (f"tie with #1: intervals overlap ({b[0] * scale:.2f}-{b[1] * scale:.2f} vs "
            f"{a[0] * scale:.2f}-{a[1] * scale:.2f} {unit}); the validation cases' measured spread "
            f"cannot tell them apart")


def ties_text(r: SearchResult, top: int) -> list[str]:
    """One line naming the listed plans that tie with #1, and why."""
    tied = [f"#{i}" for i, e in enumerate(r.ranked[:top], 1) if tie_with_best(r, e)]
    if not tied:
        return []
    a, unit, scale = _ranked_interval(r, r.ranked[0])
    return [f"tie: {', '.join(tied)} with #1: their intervals overlap #1's ({a[0] * scale:.2f}-{a[1] * scale:.2f} "
            f"{unit}), so the validation cases' measured spread cannot tell which is faster"
            + (" or leaner" if r.objective == Objective.MEMORY else "")]


# --- explanations -----------------------------------------------------------------------
def _dims(plan: Plan) -> dict[str, Any]:
    return {d: getattr(plan, d) for d in SEARCHED}


def _describe(dim: str, value: Any) -> str:
    v = value.value if hasattr(value, "value") else value
    if dim == "offload":
        return "offload " + (",".join(sorted(v)) if v else "nothing")
    if dim == "zero":
        return f"ZeRO-{v}"
    if dim in LAYOUT:
        return f"{dim} {v}"
    if isinstance(v, bool):
        return f"{dim.replace('_', ' ')} {'on' if v else 'off'}"
    return f"{dim.replace('_', ' ')} {v}"


def neighbours(r: SearchResult, plan: Plan) -> list[tuple[str, Evaluation | None, Any]]:
    """Plans one searched choice away from `plan`: (what differs, its evaluation, or for a
    group pruned whole, (reason, the other value))."""
    groups = {_group_key(g.base, r.base): g.reason for g in r.pruned_groups if g.status == Status.PRUNED}
    mine = _dims(plan)
    searched = operator.attrgetter(*SEARCHED)  # (a big search judges ~10^5 plans: compare tuples)
    my_values = searched(plan)
    out = []
    for e in r.evaluations:
        differs = [k for k, (a, b) in enumerate(zip(my_values, searched(e.plan))) if a != b]
        if len(differs) == 1:
            out.append((SEARCHED[differs[0]], e, ""))
    seen = {e.plan for _, e, _ in out if e}  # every evaluated plan one choice away
    for dim in mine:  # members of groups pruned whole: rebuild the plan, look up its group
        for other in _values_seen(r, dim):
            if other == mine[dim]:
                continue
            p = plan.with_(**{dim: other})
            if p in seen:
                continue
            reason = groups.get(_group_key(p, r.base))
            if reason:
                out.append((dim, None, (reason, other)))
    return out


def _group_key(p: Plan, base: Plan) -> Plan:
    return p.with_(recompute=base.recompute, micro_batch=base.micro_batch, cuda_graphs=base.cuda_graphs)


def _values_seen(r: SearchResult, dim: str) -> list[Any]:
    vals = []
    for g in r.pruned_groups:
        v = getattr(g.base, dim)
        if v not in vals:
            vals.append(v)
    return vals


def why_best(r: SearchResult, limit: int = 6) -> list[str]:
    best = r.ranked[0]
    key = r.score
    lines = [f"why #1 wins ({_metric(r, best)}):"]
    alternatives: dict[str, tuple[str, float]] = {}
    rejected: list[tuple[str, str, float]] = []
    for dim, e, reason in neighbours(r, best.plan):
        if e is not None and e.feasible:
            what = _describe(dim, getattr(e.plan, dim))
            delta = key(e)[0] / key(best)[0] - 1 if key(best)[0] else math.inf
            if what not in alternatives or delta < alternatives[what][1]:
                alternatives[what] = (f"{what}: {_metric(r, e)} ({delta:+.1%})", delta)
        else:
            if e is not None and e.status == Status.SAME:
                continue
            value = reason[1] if e is None else getattr(e.plan, dim)
            why = f"pruned: {reason[0]}" if e is None else f"{e.status.value}: {e.reason}"
            rejected.append((_describe(dim, value), why, _distance(value, getattr(best.plan, dim))))
    for text, _ in sorted(alternatives.values(), key=lambda t: t[1])[:limit]:
        lines.append(f"  instead {text}")
    runner_up = next((e for e in r.ranked[1:] if key(e) != key(best)), None)
    if runner_up is not None:
        lines.append(f"  runner-up #{r.ranked.index(runner_up) + 1}: {short_flags(runner_up.plan, r.base)} "
                     f"({_metric(r, runner_up)})")
    if rejected:
        lines.append("nearest plans that lose for other reasons:")
        shown: set[str] = set()
        # per choice, a memory verdict says more than a plan the simulator cannot run yet
        for what, why, _ in sorted(rejected, key=lambda t: (_DIM_ORDER.get(t[0].split(" ")[0], 99),
                                                            why_rank(t[1]), t[2])):
            dim = what.split(" ")[0]
            if dim in shown:  # the nearest value of each choice says enough
                continue
            shown.add(dim)
            lines.append(f"  {what}: {why}")
            if len(shown) >= limit:
                break
    return lines


def _distance(value: Any, mine: Any) -> float:
    """How far a numeric choice is from the best plan's (a micro-batch of 2 is nearer 1 than 8 is)."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (value, mine))
    return abs(value - mine) if numbers else 0.0


def why_rank(why: str) -> int:
    return 0 if why.startswith(("pruned", "does not fit")) else 1 if why.startswith("cannot") else 2


# the choices that decide most, first
_DIM_ORDER = {d: i for i, d in enumerate(("offload", "ZeRO", "zero", "tp", "pp", "recompute", "precision", "micro",
                                           "unified", "sequence", "ep", "cuda"))}


def _metric(r: SearchResult, e: Evaluation) -> str:
    if r.objective == Objective.COST:
        return f"${e.usd_per_mtok(r.price_per_gpu_hour):.2f}/Mtok, {e.step_time_s:.2f} s/step"
    if r.objective == Objective.MEMORY:
        return f"{e.hbm_peak_bytes / GB:.1f} GB HBM ({(r.hardware.hbm.capacity_bytes - e.hbm_peak_bytes) / GB:.1f} GB " \
               f"headroom), {e.step_time_s:.2f} s/step"
    return f"{e.step_time_s:.2f} s/step, {e.hbm_peak_bytes / GB:.0f} GB HBM"


# --- when nothing fits -------------------------------------------------------------------
def smallest_plan(model: ModelSpec, hw: Hardware, base: Plan) -> Plan:
    """The plan with the least HBM ghsim can express for this model and GPU count."""
    gpus = base.gpus
    return base.with_(zero=3 if gpus > 1 else 0, recompute=Recompute.FULL, micro_batch=1,
                      offload=frozenset({"optimizer", "grads", "params", "activations"}), offload_ratio=1.0)


def no_fit_advice(r: SearchResult) -> list[str]:
    model, hw, base = r.model, r.hardware, r.base
    lines = [f"no plan fits {model.name} on {base.gpus} x {hw.name}."]
    simulated = [e for e in r.evaluations if e.status in (Status.NO_FIT, Status.FEASIBLE)]
    rejected = [e for e in r.evaluations if e.status == Status.REJECTED]
    if rejected and not simulated:
        from collections import Counter

        reason, n = Counter(e.reason for e in rejected).most_common(1)[0]
        if n == len(rejected):  # one layout error, not memory: memory advice would mislead
            return [f"no plan could be simulated for {model.name} on {base.gpus} x {hw.name}: {reason}"]
        lines.append(f"the plans the memory model let through ({len(rejected):,}) the simulator cannot run: {reason}")
    small = smallest_plan(model, hw, base)
    est = estimate_memory(model, hw, small)
    lean = "even the leanest plan (ZeRO-3 where possible, full recompute, everything offloaded, micro-batch 1)"
    if est.hbm_bytes <= hw.hbm.capacity_bytes and est.host_bytes > hw.host.capacity_bytes:
        lines.append(f"{lean} needs {est.hbm_bytes / GB:.0f} GB per GPU but {est.host_bytes / GB:,.0f} GB of host memory "
                     f"per node > {hw.host.capacity_bytes / GB:,.0f} GB.")
    else:
        lines.append(f"{lean} {est.explain(hw.hbm.capacity_bytes)}.")
    lines.append("what would make it fit:")
    for text in _fixes(model, hw, base):
        lines.append(f"  - {text}")
    return lines


def _fits(model: ModelSpec, hw: Hardware, plan: Plan) -> tuple[bool, float]:
    est = estimate_memory(model, hw, plan)
    cap = hw.hbm.capacity_bytes
    lean = smallest_plan(model, hw, plan).with_(offload=frozenset({"optimizer", "grads"}))
    lean_est = estimate_memory(model, hw, lean)
    best = min(est.hbm_bytes, lean_est.hbm_bytes)
    return best <= cap * (1 - MARGIN) and lean_est.host_bytes <= hw.host.capacity_bytes, best


def _fixes(model: ModelSpec, hw: Hardware, base: Plan) -> list[str]:
    out = []
    gpus = base.gpus
    for n in (2 ** i for i in range(1, 13)):
        more = gpus * n
        plan = smallest_plan(model, hw, base.with_(gpus=more, global_batch=max(base.global_batch, more)))
        ok, need = _fits(model, hw, plan.with_(offload=frozenset()))
        if ok:
            out.append(f"more GPUs: {more} x {hw.name} with ZeRO-3 and full recompute need about "
                       f"{need / GB:.0f} GB per GPU, no offload")
            break
    if not base.lora_rank:
        lora = smallest_plan(model, hw, base.with_(lora_rank=16)).with_(offload=frozenset())
        est = estimate_memory(model, hw, lora)
        verdict = "fits" if est.hbm_bytes <= hw.hbm.capacity_bytes * (1 - MARGIN) else "still does not fit"
        out.append(f"LoRA (--lora-rank 16): frozen bf16 weights, about {est.hbm_bytes / GB:.0f} GB per GPU "
                   f"({verdict} in {hw.hbm.capacity_bytes / GB:.0f} GB)")
    small = smallest_plan(model, hw, base)
    est = estimate_memory(model, hw, small)
    if est.host_bytes > hw.host.capacity_bytes:
        out.append(f"nodes with more host memory: offloading needs {est.host_bytes / GB:,.0f} GB per node > "
                   f"{hw.host.capacity_bytes / GB:,.0f} GB")
    out += _other_node_kinds(model, hw, small)
    bigger = []
    for name in profile_names():
        other = load_hardware(name)
        if other.hbm.capacity_bytes > hw.hbm.capacity_bytes:
            e = estimate_memory(model, other, small.with_(offload=frozenset({"optimizer", "grads"})))
            if e.hbm_bytes <= other.hbm.capacity_bytes * (1 - MARGIN):
                bigger.append(f"{name} ({other.hbm.capacity_bytes / GB:.0f} GB)")
    if bigger:
        out.append("a GPU with more HBM, with optimizer offload: " + ", ".join(bigger))
    if not out:
        out.append("nothing ghsim models: a larger cluster than 4096x, or a smaller model")
    return out


def _other_node_kinds(model: ModelSpec, hw: Hardware, small: Plan) -> list[str]:
    """The same GPU in nodes of another size (gh200-96gb: one superchip per node; gh200-96gb-quad: four
    on NVLink, each with its own Grace): what changes, and whether the leanest plan fits there."""
    out = []
    for other in same_gpu_node_kinds(hw):
        if other.gpus_per_node == hw.gpus_per_node:
            continue
        est = estimate_memory(model, other, small.with_(gpus_per_node=0))
        fits = est.hbm_bytes <= other.hbm.capacity_bytes and est.host_bytes <= other.host.capacity_bytes
        out.append(f"--hardware {other.name}: {_node(other)} (here {_node(hw)}), "
                   f"{other.host.capacity_bytes / GB:,.0f} GB of host memory per node: the leanest plan needs "
                   f"{est.hbm_bytes / GB:.0f} GB per GPU and {est.host_bytes / GB:,.0f} GB per node there "
                   f"({'fits' if fits else 'does not fit either'})")
    return out


def _node(hw: Hardware) -> str:
    if hw.gpus_per_node > 1:
        return f"{hw.gpus_per_node} GPUs per node on {hw.gpu_link.kind}"
    return f"one GPU per node, nodes on {hw.network.kind}"


# --- JSON ----------------------------------------------------------------------------------
def evaluation_dict(e: Evaluation, r: SearchResult) -> dict[str, Any]:
    d: dict[str, Any] = {
        "status": e.status.value,
        "flags": reproduce_flags(e.plan),
        "plan": e.plan.to_dict(),
        "reason": e.reason,
    }
    if e.status == Status.FEASIBLE or e.status == Status.NO_FIT:
        d.update({
            "step_time_s": e.step_time_s, "tokens_per_s": e.tokens_per_s, "mfu": e.mfu,
            "gpu_utilization": e.gpu_utilization, "hbm_peak_bytes": e.hbm_peak_bytes,
            "host_peak_bytes": e.host_peak_bytes,
            "hbm_headroom_bytes": r.hardware.hbm.capacity_bytes - e.hbm_peak_bytes,
            "full_simulation": e.exact,
        })
        if r.price_per_gpu_hour:
            d["usd_per_million_tokens"] = e.usd_per_mtok(r.price_per_gpu_hour)
        step_iv, hbm_iv = step_interval(e), intervals.peak_interval(e.hbm_peak_bytes)
        d["step_time_interval_s"] = list(step_iv) if step_iv else None
        d["hbm_peak_interval_bytes"] = list(hbm_iv) if hbm_iv else None
        if r.ranked and e.feasible:
            d["tie_with_best"] = tie_with_best(r, e) or None
    if not math.isnan(e.est_hbm_bytes):
        d["estimated_hbm_bytes"] = e.est_hbm_bytes
    return d


def to_json(r: SearchResult, top: int, baseline: Evaluation | None = None) -> dict[str, Any]:
    counts = {s.value: r.count(s) for s in Status}
    out: dict[str, Any] = {
        "model": r.model.name,
        "hardware": r.hardware.name,
        "gpus": r.base.gpus,
        "objective": r.objective.value,
        "price_per_gpu_hour_usd": r.price_per_gpu_hour,
        "n_evaluated": r.n_evaluated,
        "n_feasible": r.n_feasible,
        "n_simulated": sum(counts[s.value] for s in (Status.FEASIBLE, Status.NO_FIT)),
        "counts": counts,
        "elapsed_s": r.elapsed_s,
        "plans": [evaluation_dict(e, r) for e in r.ranked[:top]],
        "pareto": [evaluation_dict(e, r) for e in pareto_front(r)],
    }
    if r.ranked:
        out["explanation"] = why_best(r)
    else:
        out["explanation"] = no_fit_advice(r)
    if baseline is not None:
        out["baseline"] = evaluation_dict(baseline, r)
    return out


def pareto_front(r: SearchResult) -> list[Evaluation]:
    """Feasible plans no other plan beats on both step time and HBM peak, fastest first."""
    pts = sorted(r.ranked, key=lambda e: (e.step_time_s, e.hbm_peak_bytes))
    front, best_mem = [], math.inf
    for e in pts:
        if e.hbm_peak_bytes < best_mem:
            front.append(e)
            best_mem = e.hbm_peak_bytes
    return front


def baseline_line(r: SearchResult, e: Evaluation) -> str:
    if e.status != Status.FEASIBLE:
        return f"your plan ({reproduce_flags(e.plan)}): {e.status.value}: {e.reason}"
    line = f"your plan: {e.step_time_s:.2f} s/step, {e.hbm_peak_bytes / GB:.1f} GB HBM"
    if r.ranked:
        best = r.ranked[0]
        line += f"; the best plan found is {e.step_time_s / best.step_time_s:.2f}x its speed"
    return line
