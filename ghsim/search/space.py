"""The plan space `ghsim plan` searches: one tuple of values per plan dimension.

Every dimension's values come from what ghsim.plan defines (its enums, ZeRO
stages, offload targets, optimizer implementations) and from the model and
hardware (divisors for TP/PP/EP, node size, unified-memory support), so a value
added to the plan model is searched without touching this file. Candidates the
simulator cannot run are not filtered here: simulate() rejects them with a
reason, and the search counts them as infeasible (that is how multi-GPU plans
join the search the day the simulator accepts them).

A dimension only varies where it changes the plan (the offload schedule only
when something is offloaded, the optimizer kernels only when the optimizer runs
on the GPU, the framework only for mixed precision); elsewhere it keeps the
base plan's value. That keeps the space free of duplicates.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields, replace
from typing import Any, Iterator

from ghsim.errors import GhsimError
from ghsim.hardware import Hardware
from ghsim.model import ModelSpec
from ghsim.graph.offload.setup import library_refusal
from ghsim.plan import Framework, OffloadSchedule, Plan, Precision, Recompute, compile_refusal

# Offload sets, canonical: moving gradients or parameters to the host implies the
# optimizer goes with them (ZeRO-Offload, FSDP CPUOffload), so "grads" always
# rides with "optimizer" and "params" never comes alone.
OFFLOAD_SETS = (
    frozenset(),
    frozenset({"activations"}),
    frozenset({"optimizer", "grads"}),
    frozenset({"optimizer", "grads", "activations"}),
    frozenset({"optimizer", "grads", "params"}),
    frozenset({"optimizer", "grads", "params", "activations"}),
)
OFFLOAD_RATIOS = (1.0, 0.5)  # share of the optimizer on the CPU (ZeRO-Offload++ / SuperOffload)
DEFAULT_PRECISIONS = (Precision.BF16, Precision.FP8)  # fp16 prices as bf16; fp32/tf32 only lose
# the software a searched plan assumes unless told otherwise: ZeRO and offload plans are DeepSpeed's
DEFAULT_FRAMEWORK = Framework.DEEPSPEED
DEFAULT_OPTIMIZER = "fused"
MAX_MICRO_BATCH = 64
AUTO_RESOLVES_TO = ("sync", "overlapped")  # ghsim.graph.offload.resolve: by framework

# Plan fields the search varies, and those it takes from the user as given. The
# framework (whose mixed-precision semantics the training code has) and the GPU
# optimizer's kernels are the user's software, not a plan choice; `ghsim plan`
# defaults them to DeepSpeed and its fused Adam, and they can be searched too
# (SearchSpace.frameworks, .optimizer_impls).
SEARCHED = ("precision", "recompute", "zero", "offload", "offload_ratio", "offload_schedule",
            "unified_memory", "tp", "pp", "ep", "sequence_parallel", "pp_interleave", "micro_batch", "cuda_graphs")
LAYOUT = ("tp", "pp", "ep")  # the parallel split: a search space holds them together, as splits
GIVEN = ("gpus", "gpus_per_node", "seq", "global_batch", "lora_rank", "dataloader_workers", "batch_prep_s",
         "offload_pinned", "framework", "optimizer_impl", "lora_targets", "fused_norm", "rope_cast", "compile",
         "peft_input_cast", "modeling",
         "fp8_recipe", "fp8_params",
         # the host's CPU optimizer as the user's library runs it: facts, not choices
         "cpu_optimizer", "cpu_threads", "cpu_cores_share", "grad_clip", "fsdp2",
         # the user's DeepSpeed config and release
         "reduce_bucket_size", "sub_group_size", "max_live_parameters", "deepspeed_version",
         # the pipeline split: the search keeps the even one (ghsim plan refuses --pp-layers)
         "pp_layers")


@dataclass(frozen=True)
class SearchSpace:
    precisions: tuple[Precision, ...]
    frameworks: tuple[Framework, ...]
    recomputes: tuple[Recompute, ...]
    zero_stages: tuple[int, ...]
    offloads: tuple[frozenset[str], ...]
    offload_ratios: tuple[float, ...]
    offload_schedules: tuple[Any, ...]
    unified_memory: tuple[bool, ...]
    splits: tuple[tuple[int, int, int], ...]  # (tp, pp, ep)
    sequence_parallel: tuple[bool, ...]  # with tp > 1
    pp_interleave: tuple[int, ...]  # with pp > 1
    micro_batches: tuple[int, ...]
    cuda_graphs: tuple[bool, ...]
    optimizer_impls: tuple[str, ...]

    layers: int = 0  # the model's, for pipeline chunking

    def size(self, base: Plan) -> int:
        return sum(g.size for g in groups(self, base))


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def parallel_splits(model: ModelSpec, hw: Hardware, gpus: int, gpus_per_node: int) -> list[tuple[int, int, int]]:
    """(tp, pp, ep) that divide the GPUs and the model: TP within a node and across whole
    heads, PP over at most one layer per stage, EP over whole experts and data-parallel ranks."""
    node = gpus_per_node or hw.gpus_per_node or gpus
    out = []
    for tp in divisors(gpus):
        if tp > node or model.num_attention_heads % tp or model.num_kv_heads % tp and tp % model.num_kv_heads:
            continue
        for pp in divisors(gpus // tp):
            if pp > model.num_layers:
                continue
            dp = gpus // (tp * pp)
            eps = [1]
            if model.moe is not None:
                eps = [e for e in divisors(dp) if model.moe.num_experts % e == 0]
            out += [(tp, pp, ep) for ep in eps]
    return out


def default_global_batch(gpus: int) -> int:
    """Sequences per step when the user gives none: 4 per GPU, at least 32."""
    return max(32, 4 * gpus)


def default_space(model: ModelSpec, hw: Hardware, base: Plan,
                  precisions: tuple[Precision, ...] = DEFAULT_PRECISIONS) -> SearchSpace:
    gpus = base.gpus
    # "auto" is the framework's own schedule (plain PyTorch: sync, DeepSpeed: overlapped);
    # search it and every schedule no framework picks by itself (superoffload)
    schedules = tuple(s for s in OffloadSchedule if s.value not in AUTO_RESOLVES_TO)
    return SearchSpace(
        precisions=tuple(precisions),
        frameworks=(base.framework,),
        recomputes=tuple(Recompute),
        zero_stages=(0, 1, 2, 3) if gpus > 1 else (0,),
        offloads=OFFLOAD_SETS,
        offload_ratios=OFFLOAD_RATIOS,
        offload_schedules=schedules,
        unified_memory=(False, True) if hw.unified_memory.supported else (False,),
        splits=tuple(parallel_splits(model, hw, gpus, base.gpus_per_node)),
        sequence_parallel=(False, True),
        pp_interleave=(1, 2),
        micro_batches=tuple(2**i for i in range(MAX_MICRO_BATCH.bit_length()) if 2**i <= MAX_MICRO_BATCH),
        cuda_graphs=(False, True),
        optimizer_impls=(base.optimizer_impl,),
        layers=model.num_layers,
    )


_PIN_TO_SPACE = {
    "precision": "precisions", "framework": "frameworks", "recompute": "recomputes", "zero": "zero_stages",
    "offload": "offloads", "offload_ratio": "offload_ratios", "offload_schedule": "offload_schedules",
    "unified_memory": "unified_memory", "micro_batch": "micro_batches", "cuda_graphs": "cuda_graphs",
    "optimizer_impl": "optimizer_impls", "sequence_parallel": "sequence_parallel", "pp_interleave": "pp_interleave",
}


def pin(space: SearchSpace, pinned: dict[str, Any]) -> SearchSpace:
    """The space with the dimensions the user fixed (by flag) reduced to their value."""
    changes: dict[str, Any] = {}
    split = {k: pinned[k] for k in LAYOUT if k in pinned}
    if split:
        changes["splits"] = tuple(s for s in space.splits
                                  if all(s[LAYOUT.index(k)] == v for k, v in split.items()))
        if not changes["splits"]:
            changes["splits"] = ((pinned.get("tp", 1), pinned.get("pp", 1), pinned.get("ep", 1)),)
    for key, value in pinned.items():
        if key in _PIN_TO_SPACE:
            changes[_PIN_TO_SPACE[key]] = (value,)
        elif key not in LAYOUT:
            raise GhsimError(f"'{key}' is not a searched plan dimension")
    return replace(space, **changes)


@dataclass(frozen=True)
class Group:
    """Candidates that share everything the memory floor depends on (weights, gradients,
    optimizer states); they differ in recompute, micro-batch, unified memory, CUDA graphs.

    The search checks the floor once per group (most groups of a big model fail it as a
    whole), then walks the members in order of growing activations.
    """

    base: Plan  # recompute, micro_batch, unified_memory, cuda_graphs still to set
    recomputes: tuple[Recompute, ...]
    micro_batches: tuple[int, ...]  # ascending: activations grow with them
    unified_memory: tuple[bool, ...]
    cuda_graphs: tuple[bool, ...]

    @property
    def size(self) -> int:
        return len(self.recomputes) * len(self.micro_batches) * len(self.unified_memory) * len(self.cuda_graphs)


def groups(space: SearchSpace, base: Plan) -> Iterator[Group]:
    """The space as groups of candidates, every distinct plan exactly once, built on `base`."""
    global_batch = base.global_batch
    mixed = [p for p in space.precisions if p.is_mixed]
    plain = [p for p in space.precisions if not p.is_mixed]
    # the framework only changes mixed-precision (and non-LoRA) semantics
    prec_fw = [(p, f) for p in mixed for f in (space.frameworks if not base.lora_rank else space.frameworks[:1])]
    prec_fw += [(p, space.frameworks[0]) for p in plain]
    for tp, pp, ep in space.splits:
        if base.gpus % (tp * pp):
            continue
        dp = base.gpus // (tp * pp)
        if global_batch and global_batch % dp and len(space.splits) > 1:
            continue
        per_rank = global_batch // dp if global_batch else 0
        # (a dimension the user pinned keeps its value: simulate() then says what is wrong)
        mbs = tuple(sorted(_keep(space.micro_batches, lambda mb: not per_rank or per_rank % mb == 0)))
        zeros = _keep(space.zero_stages, lambda z: dp > 1 or z == 0)  # ZeRO shards over data parallel
        sps = _keep(space.sequence_parallel, lambda sp: tp > 1 or not sp)
        vs = _keep(space.pp_interleave, lambda v: v == 1 or pp > 1 and space.layers % (pp * v) == 0)
        for zero, offload, sp, v in itertools.product(zeros, space.offloads, sps, vs):
            for ratio, schedule in _offload_variants(space, offload):
                for impl in _impls(space, offload, ratio):
                    for prec, fw in prec_fw:
                        kw: dict[str, Any] = dict(precision=prec, framework=fw, zero=zero, offload=offload,
                                                  offload_ratio=ratio, tp=tp, pp=pp, ep=ep, optimizer_impl=impl,
                                                  sequence_parallel=sp, pp_interleave=v, offload_schedule=schedule)
                        plan = replace(base, **kw)
                        if library_refusal(plan) or compile_refusal(plan) or (
                                plan.fp8_recipe and plan.precision != Precision.FP8):  # a recipe pins fp8
                            continue  # a plan its library would not run (the commands refuse it when pinned)
                        # unified memory is searched as the alternative to explicit offload
                        um = space.unified_memory if not offload else _keep(space.unified_memory, lambda u: not u)
                        yield Group(plan, space.recomputes, mbs, tuple(um), space.cuda_graphs)


def _keep(values: tuple, ok) -> list:
    return [v for v in values if ok(v)] if len(values) > 1 else list(values)


def _offload_variants(space: SearchSpace, offload: frozenset[str]) -> list[tuple[float, Any]]:
    if not offload:
        return [(1.0, space.offload_schedules[0])]
    ratios = space.offload_ratios if "optimizer" in offload else (1.0,)
    # superoffload schedules the optimizer: it needs one on the host
    schedules = _keep(space.offload_schedules,
                      lambda s: "optimizer" in offload or s != OffloadSchedule.SUPEROFFLOAD)
    return [(r, s) for r in ratios for s in schedules]


def _impls(space: SearchSpace, offload: frozenset[str], ratio: float) -> tuple[str, ...]:
    if "optimizer" in offload and ratio >= 1.0:
        return (space.optimizer_impls[0],)  # the whole optimizer runs on the CPU
    return space.optimizer_impls


def searched_fields_cover_plan() -> set[str]:
    """Plan fields neither searched nor taken as given (a test keeps this empty)."""
    return {f.name for f in fields(Plan)} - set(SEARCHED) - set(GIVEN)
