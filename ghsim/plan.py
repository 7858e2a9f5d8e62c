"""Plan: how a step is executed (precision, recompute, sharding, offload, parallelism).

A Plan is built from CLI flags, a plan.toml or a DeepSpeed ds_config.json and
checked against the model and hardware by `check_plan`, which says in one line
what is impossible about it.
"""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Any

from ghsim.errors import GhsimError
from ghsim.tomlio import read_toml


class Precision(str, Enum):
    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"

    @property
    def is_mixed(self) -> bool:
        return self in (Precision.BF16, Precision.FP16, Precision.FP8)


class Recompute(str, Enum):
    NONE = "none"
    SELECTIVE = "selective"  # attention core only (Korthikanti et al. 2022)
    FULL = "full"  # whole decoder layer


class Framework(str, Enum):
    """Whose mixed-precision semantics the step follows (see DESIGN.md, modeling notes)."""

    TORCH_AMP = "torch-amp"  # fp32 params; autocast casts weights to bf16 in every forward
    FSDP_MIXED = "fsdp-mixed"  # fp32 masters sharded; bf16 working copies gathered per layer
    DEEPSPEED = "deepspeed"  # fp32 masters in the optimizer; bf16 params cast once per step
    # Megatron-LM (and NeMo, TransformerEngine): bf16/fp16 working weights, fp32 masters in the
    # optimizer, and fused kernels (one kernel per norm, activation, rotary, loss; flash attention;
    # fused Adam): ghsim/graph/transformer.py, "Fused kernels"
    MEGATRON = "megatron"
    # Megatron-LM as the 2021-22 papers ran it (Narayanan et al. 2021, Korthikanti et al. 2022):
    # the same fused kernels, but attention as two batched GEMMs around the fused
    # scale-mask-softmax (no flash attention) and the cross entropy in PyTorch ops on fp32 logits
    MEGATRON_LEGACY = "megatron-legacy"

    @property
    def fused_kernels(self) -> bool:
        """Whether the step runs fused kernels (Megatron-style) rather than eager PyTorch ops."""
        return self in (Framework.MEGATRON, Framework.MEGATRON_LEGACY)

    @property
    def flash_attention(self) -> bool:
        """Attention as one flash kernel (PyTorch SDPA, TransformerEngine) rather than
        batched GEMMs around a softmax kernel that keeps the s x s probabilities."""
        return self is not Framework.MEGATRON_LEGACY

    @property
    def fused_cross_entropy(self) -> bool:
        """The loss as one fused vocab-parallel cross-entropy kernel each way."""
        return self is Framework.MEGATRON


class OffloadSchedule(str, Enum):
    """How offloaded state moves and where its work runs (ghsim/graph/offload.py)."""

    AUTO = "auto"  # sync for torch-amp, fsdp-mixed and megatron, overlapped for deepspeed
    SYNC = "sync"  # as plain PyTorch does it: save_on_cpu, copies on the compute stream, no overlap
    OVERLAPPED = "overlapped"  # ZeRO-Offload/Infinity: copy streams, bucketed grads, prefetch
    SUPEROFFLOAD = "superoffload"  # Lian et al. 2025: per-bucket CPU Adam during backward, GPU tail


class CpuOptimizer(str, Enum):
    """The AdamW implementation an offloaded optimizer step runs on the host (cost/cpu_optimizer.py)."""

    AUTO = "auto"  # the plan's library's own: DeepSpeedCPUAdam under DeepSpeed, else torch's CPU default
    DEEPSPEED = "deepspeed-cpuadam"  # DeepSpeedCPUAdam: SIMD C++ with OpenMP
    TORCH_FUSED = "torch-fused"  # torch.optim.AdamW(fused=True)
    TORCH_FOREACH = "torch-foreach"  # torch.optim.AdamW(foreach=True)
    TORCH_FORLOOP = "torch-forloop"  # torch.optim.AdamW() on CPU tensors: the single-tensor for-loop


OFFLOAD_TARGETS = ("optimizer", "grads", "params", "activations")
# the projections a LoRA adapter can sit on, by peft's names for Llama-style models
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# peft's default for Llama-family models (peft/utils/constants.py,
# TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING["llama"] = ["q_proj", "v_proj"])
PEFT_DEFAULT_LORA_TARGETS = ("q_proj", "v_proj")
OPTIMIZER_IMPLS = ("foreach", "fused", "cpu")  # cpu: the optimizer step runs on the host (offload)
# FP8 scaling recipes (--fp8-recipe), by framework. Megatron runs Transformer Engine (graph/te_fp8.py):
# "delayed" (DelayedScaling: scales from an amax history; its default) or "tensorwise"
# (Float8CurrentScaling: each tensor's scale from its own amax, read before the cast). The eager
# frameworks run torchao's float8 training (graph/torchao_fp8.py): "tensorwise" (one dynamic scale per
# tensor, torchao's default) or "rowwise" (per row / column). No recipe: an eager plan's --precision fp8
# is our harness's per-op eager quantisation, as before; Megatron's is delayed.
TORCHAO_FP8_RECIPES = ("tensorwise", "rowwise")
FP8_RECIPES = ("delayed",) + TORCHAO_FP8_RECIPES
MODELING_CODES = ("hf", "torchtitan")  # whose model code (Plan.modeling)
# DeepSpeed releases whose SuperOffload differs (Plan.deepspeed_version): 0.18.x holds each sub-group's
# gradients until the whole sub-group can be reduced and hands the worker its fp32 gradient on the GPU;
# 0.19 reduces in reduce_bucket_size buckets and hands over the pinned host copy
DEEPSPEED_VERSIONS = ("0.18", "0.19")
DEEPSPEED_VERSION = "0.19"  # the release a plan runs unless it names one
# zero_optimization defaults (deepspeed/runtime/zero/config.py): reduce_bucket_size, sub_group_size
DEEPSPEED_REDUCE_BUCKET = 5e8
DEEPSPEED_SUB_GROUP = 1e9
DEEPSPEED_MAX_LIVE = 1e9  # stage3_max_live_parameters


@dataclass(frozen=True, slots=True)  # slots: a search holds 10^5 plans (1.7 kB each with a dict)
class Plan:
    gpus: int = 1
    gpus_per_node: int = 0  # 0: the hardware's node size (or gpus, if fewer)
    seq: int = 4096
    micro_batch: int = 1
    global_batch: int = 0  # 0: one micro-batch per data-parallel rank (no accumulation)
    zero: int = 0
    precision: Precision = Precision.BF16
    recompute: Recompute = Recompute.NONE
    offload: frozenset[str] = frozenset()
    offload_ratio: float = 1.0  # share of optimizer work on the CPU (SuperOffload split)
    unified_memory: bool = False
    tp: int = 1
    pp: int = 1
    ep: int = 1
    sequence_parallel: bool = False  # Megatron sequence parallelism (with tp > 1)
    pp_interleave: int = 1  # model chunks per pipeline stage (interleaved 1F1B)
    # decoder layers of each pipeline stage, first to last (); (): an even split. The embedding sits on the
    # first stage, the LM head and loss on the last (Megatron's --decoder-first/last-pipeline-num-layers,
    # DeepSpeed PipelineModule's partition_method / layer_partitioning)
    pp_layers: tuple[int, ...] = ()
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = LORA_TARGETS  # the projections with adapters (LORA_TARGETS names)
    fused_norm: bool = False  # eager frameworks: torch.nn.RMSNorm (one kernel each way) for HF's RMSNorm
    fp8_recipe: str = ""  # FP8_RECIPES, or "" (eager: the harness's per-op quantisation; Megatron: delayed)
    # Megatron's --fp8-param-gather (NeMo's fp8_params): the working weights are fp8 tensors, gathered and
    # stored in 1 byte; Transformer Engine keeps only their transposes for the step
    fp8_params: bool = False
    compile: bool = False  # torch.compile (Inductor) of the model: fused regions (graph/compiled_layer.py)
    rope_cast: bool = False  # eager: rotary tables cast to q's dtype (our harness) rather than HF's fp32 rotation
    # whose modeling code the model is: Hugging Face transformers ("hf": under torch.compile its masking
    # utilities hand SDPA a materialised boolean causal mask, k/v expanded to the query heads) or
    # torchtitan's ("torchtitan": SDPA with is_causal, GQA inside SDPA)
    modeling: str = "hf"
    # eager LoRA: each adapter casts its input to the adapters' fp32 and autocast casts it back, as peft
    # does (False: our harness's LoRALinear, whose adapters read the bf16 input as it is)
    peft_input_cast: bool = True
    cuda_graphs: bool = False
    dataloader_workers: int = 2
    batch_prep_s: float = 0.0  # host CPU seconds to prepare one micro-batch (0: data already on the GPU)
    optimizer_impl: str = "foreach"
    framework: Framework = Framework.TORCH_AMP
    offload_schedule: OffloadSchedule = OffloadSchedule.AUTO
    offload_pinned: bool = True  # offload buffers in page-locked host memory (DeepSpeed pin_memory)
    cpu_optimizer: CpuOptimizer = CpuOptimizer.AUTO
    cpu_threads: int = 0  # threads the CPU optimizer runs on per GPU; 0: what its launcher gives it
    cpu_cores_share: float = 0.0  # SuperOffload's cpuadam_cores_perc: cores its CPU-Adam worker gets; 0: 0.8
    grad_clip: bool = False  # gradients clipped by their global norm (DeepSpeed gradient_clipping > 0)
    # FSDP2 (fully_shard): with CPUOffloadPolicy it copies each layer's parameters up on the compute
    # stream, not on a copy stream as FSDP1 does (validation/measured_libraries/README.md)
    fsdp2: bool = False
    # DeepSpeed's zero_optimization.reduce_bucket_size and sub_group_size (elements) and its release
    reduce_bucket_size: float = DEEPSPEED_REDUCE_BUCKET
    sub_group_size: float = DEEPSPEED_SUB_GROUP
    # ZeRO-3's stage3_max_live_parameters (elements): how far its parameter prefetch runs ahead
    max_live_parameters: float = DEEPSPEED_MAX_LIVE
    deepspeed_version: str = DEEPSPEED_VERSION

    # --- derived sizes ----------------------------------------------------
    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def resolved_global_batch(self) -> int:
        return self.global_batch or self.dp * self.micro_batch

    @property
    def grad_accum(self) -> int:
        """Micro-batches each data-parallel rank runs per step."""
        return self.resolved_global_batch // (self.dp * self.micro_batch)

    @property
    def tokens_per_step(self) -> int:
        return self.resolved_global_batch * self.seq

    @property
    def torchao_recipe(self) -> str:
        """The torchao float8 recipe the plan runs (graph/torchao_fp8.py), "" for none: eager frameworks
        only (Megatron's fp8 is Transformer Engine's)."""
        fp8 = self.precision == Precision.FP8 and not self.framework.fused_kernels
        return self.fp8_recipe if fp8 and self.fp8_recipe in TORCHAO_FP8_RECIPES else ""

    def with_(self, **changes: Any) -> "Plan":
        """A copy with some fields changed (the search makes hundreds of thousands: no
        dataclasses.replace, which re-runs __init__ over every field)."""
        unknown = changes.keys() - _PLAN_FIELDS
        if unknown:
            raise TypeError(f"Plan has no field(s) {', '.join(sorted(unknown))}")
        values = list(_ALL_FIELDS(self))
        for name, value in changes.items():
            values[_FIELD_INDEX[name]] = value
        new = object.__new__(Plan)
        for set_slot, value in zip(_SLOT_SETTERS, values):  # (past the frozen __setattr__, as __init__ does)
            set_slot(new, value)
        return new

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["precision"] = self.precision.value
        d["recompute"] = self.recompute.value
        d["framework"] = self.framework.value
        d["offload_schedule"] = self.offload_schedule.value
        d["cpu_optimizer"] = self.cpu_optimizer.value
        d["lora_targets"] = list(self.lora_targets)
        d["offload"] = sorted(self.offload)
        if self.pp_layers:
            d["pp_layers"] = list(self.pp_layers)
        else:  # an even split: reports stay as they were before the field existed
            del d["pp_layers"]
        d["global_batch"] = self.resolved_global_batch
        d["grad_accum"] = self.grad_accum
        d["dp"] = self.dp
        return d

    def flags(self) -> str:
        """The `ghsim simulate` flags that reproduce this plan."""
        parts = [
            f"--gpus {self.gpus}",
            f"--seq {self.seq}",
            f"--micro-batch {self.micro_batch}",
            f"--global-batch {self.resolved_global_batch}",
            f"--precision {self.precision.value}",
            f"--recompute {self.recompute.value}",
        ]
        if self.zero:
            parts.append(f"--zero {self.zero}")
        if self.offload:
            parts.append(f"--offload {','.join(sorted(self.offload))}")
        if self.unified_memory:
            parts.append("--unified-memory")
        if self.tp > 1:
            parts.append(f"--tp {self.tp}")
        if self.pp > 1:
            parts.append(f"--pp {self.pp}")
        if self.ep > 1:
            parts.append(f"--ep {self.ep}")
        if self.sequence_parallel:
            parts.append("--sequence-parallel")
        if self.pp_interleave > 1:
            parts.append(f"--pp-interleave {self.pp_interleave}")
        if self.pp_layers:
            parts.append(f"--pp-layers {','.join(map(str, self.pp_layers))}")
        if self.lora_rank:
            parts.append(f"--lora-rank {self.lora_rank}")
            if self.lora_targets != LORA_TARGETS:
                parts.append(f"--lora-targets {','.join(self.lora_targets)}")
        if self.offload_ratio != 1.0:
            parts.append(f"--offload-ratio {self.offload_ratio:g}")
        if self.offload_schedule != OffloadSchedule.AUTO:
            parts.append(f"--offload-schedule {self.offload_schedule.value}")
        if not self.offload_pinned:
            parts.append("--offload-pageable")
        if self.cpu_optimizer != CpuOptimizer.AUTO:
            parts.append(f"--cpu-optimizer {self.cpu_optimizer.value}")
        if self.cpu_threads:
            parts.append(f"--cpu-threads {self.cpu_threads}")
        if self.grad_clip:
            parts.append("--grad-clip")
        if self.fsdp2:
            parts.append("--fsdp2")
        if self.cpu_cores_share:
            parts.append(f"--cpu-cores-share {self.cpu_cores_share:g}")
        if self.cuda_graphs:
            parts.append("--cuda-graphs")
        if self.fused_norm:
            parts.append("--fused-norm")
        if self.compile:
            parts.append("--compile")
        if self.modeling != "hf":
            parts.append(f"--modeling {self.modeling}")
        if self.fp8_recipe:
            parts.append(f"--fp8-recipe {self.fp8_recipe}")
        if self.fp8_params:
            parts.append("--fp8-params")
        if self.reduce_bucket_size != DEEPSPEED_REDUCE_BUCKET:
            parts.append(f"--reduce-bucket-size {self.reduce_bucket_size:g}")
        if self.sub_group_size != DEEPSPEED_SUB_GROUP:
            parts.append(f"--sub-group-size {self.sub_group_size:g}")
        if self.max_live_parameters != DEEPSPEED_MAX_LIVE:
            parts.append(f"--max-live-parameters {self.max_live_parameters:g}")
        if self.deepspeed_version != DEEPSPEED_VERSION:
            parts.append(f"--deepspeed-version {self.deepspeed_version}")
        if self.batch_prep_s:
            parts.append(f"--batch-prep-ms {self.batch_prep_s * 1e3:g} --dataloader-workers {self.dataloader_workers}")
        return " ".join(parts)


def _enum(cls: type[Enum], value: Any, what: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(m.value for m in cls)  # type: ignore[attr-defined]
        raise GhsimError(f"{what} must be one of {allowed}, got {value!r}") from None


def parse_offload(value: Any) -> frozenset[str]:
    if value in (None, "", "none"):
        return frozenset()
    items = value.split(",") if isinstance(value, str) else list(value)
    targets = frozenset(str(i).strip() for i in items if str(i).strip())
    unknown = targets - set(OFFLOAD_TARGETS)
    if unknown:
        raise GhsimError(
            f"unknown offload target(s) {', '.join(sorted(unknown))} "
            f"(choose from {', '.join(OFFLOAD_TARGETS)})"
        )
    return targets


def parse_pp_layers(value: Any, where: str = "--pp-layers") -> tuple[int, ...]:
    """Decoder layers per pipeline stage: '11,13' or a list of integers; '' or [] for an even split."""
    if value in (None, "", "even"):
        return ()
    items = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if items is None:
        raise GhsimError(f"{where} must list decoder layers per pipeline stage, e.g. 11,13; got {value!r}")
    layers = []
    for item in items:
        text = str(item).strip()
        if isinstance(item, bool) or not (text.isascii() and text.lstrip("-").isdigit()):
            raise GhsimError(f"{where} must list whole numbers of decoder layers per stage, e.g. 11,13; got {value!r}")
        layers.append(int(text))
    return tuple(layers)


def parse_lora_targets(value: Any) -> tuple[str, ...]:
    """'all', 'peft' (peft's Llama default: q_proj, v_proj), or a comma list of projections by
    peft's names or short ones (q, k, v, o, gate, up, down); in LORA_TARGETS order."""
    if value in ("all", None):
        return LORA_TARGETS
    if value == "peft":
        return PEFT_DEFAULT_LORA_TARGETS
    items = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if items is None:
        raise GhsimError(f"lora targets must be 'all', 'peft' or a list of projections, got {value!r}")
    given = [str(i).strip() for i in items if str(i).strip()]
    names = {g if g.endswith("_proj") else f"{g}_proj" for g in given}
    unknown = [g for g in given if (g if g.endswith("_proj") else f"{g}_proj") not in LORA_TARGETS]
    if unknown or not names:
        raise GhsimError(f"unknown LoRA target(s) {', '.join(unknown) or '(none)'} (choose from "
                         f"{', '.join(LORA_TARGETS)}, 'all' or 'peft')")
    return tuple(t for t in LORA_TARGETS if t in names)


_INT_FIELDS = {
    "gpus", "gpus_per_node", "seq", "micro_batch", "global_batch", "zero",
    "tp", "pp", "ep", "lora_rank", "dataloader_workers", "pp_interleave", "cpu_threads",
}


def plan_from_dict(d: dict[str, Any], where: str = "plan") -> Plan:
    known = {f.name for f in fields(Plan)} | {"grad_accum", "optimizer", "model", "hardware"}  # a saved plan's target
    unknown = set(d) - known
    if unknown:
        raise GhsimError(f"{where}: unknown plan field(s) {', '.join(sorted(unknown))}")
    kw: dict[str, Any] = {}
    for key, value in d.items():
        if key in _INT_FIELDS:
            if isinstance(value, bool) or not isinstance(value, int):
                raise GhsimError(f"{where}: '{key}' must be an integer, got {value!r}")
            kw[key] = value
        elif key == "precision":
            kw[key] = _enum(Precision, value, f"{where}: precision")
        elif key == "recompute":
            kw[key] = _enum(Recompute, value, f"{where}: recompute")
        elif key == "framework":
            kw[key] = _enum(Framework, value, f"{where}: framework")
        elif key == "offload":
            kw[key] = parse_offload(value)
        elif key == "lora_targets":
            kw[key] = parse_lora_targets(value)
        elif key == "pp_layers":
            kw[key] = parse_pp_layers(value, f"{where}: pp_layers")
        elif key == "offload_schedule":
            kw[key] = _enum(OffloadSchedule, value, f"{where}: offload_schedule")
        elif key == "cpu_optimizer":
            kw[key] = _enum(CpuOptimizer, value, f"{where}: cpu_optimizer")
        elif key in ("unified_memory", "cuda_graphs", "offload_pinned", "sequence_parallel", "grad_clip", "fsdp2", "fused_norm",
                     "fp8_params", "rope_cast", "compile", "peft_input_cast"):
            if not isinstance(value, bool):
                raise GhsimError(f"{where}: '{key}' must be true or false")
            kw[key] = value
        elif key in ("offload_ratio", "batch_prep_s", "cpu_cores_share", "reduce_bucket_size", "sub_group_size",
                     "max_live_parameters"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise GhsimError(f"{where}: '{key}' must be a number")
            kw[key] = float(value)
        elif key in ("optimizer_impl", "fp8_recipe", "modeling", "deepspeed_version"):
            kw[key] = str(value)
        elif key == "optimizer" and value != "adamw":
            raise GhsimError(f"{where}: only the AdamW optimizer is modeled, got {value!r}")
    plan = Plan(**kw)
    if "grad_accum" in d and "global_batch" not in d:
        ga = d["grad_accum"]
        if isinstance(ga, bool) or not isinstance(ga, int) or ga < 1:
            raise GhsimError(f"{where}: 'grad_accum' must be a positive integer")
        plan = plan.with_(global_batch=plan.dp * plan.micro_batch * ga if plan.dp > 0 else 0)
    return plan


def load_plan_toml(path: Path) -> Plan:
    return plan_from_dict(read_toml(path), str(path))


def compile_refusal(plan: Plan) -> str | None:
    """Why ghsim does not model the plan compiled (None: it does)."""
    if not plan.compile:
        return None
    if plan.framework.fused_kernels:
        return (f"--compile models torch.compile of an eager (Hugging Face) model; --framework "
                f"{plan.framework.value} runs its own fused kernels: drop --compile or pick an eager framework")
    if plan.tp > 1:
        return "--compile with tensor parallelism (--tp > 1) is not modeled: drop --compile or --tp"
    return None


def check_plan(plan: Plan) -> None:
    """Reject plans that are impossible regardless of model and hardware."""
    check_values(plan)
    refusal = compile_refusal(plan)
    if refusal:
        raise GhsimError(refusal)
    if plan.fp8_recipe and plan.precision != Precision.FP8:
        raise GhsimError(f"--fp8-recipe {plan.fp8_recipe} needs --precision fp8 (the plan runs {plan.precision.value})")
    if plan.fp8_recipe == "delayed" and not plan.framework.fused_kernels:
        raise GhsimError("--fp8-recipe delayed is Transformer Engine's delayed scaling: it needs --framework megatron "
                         "(the eager frameworks run torchao's float8: tensorwise or rowwise)")
    if plan.fp8_recipe == "rowwise" and plan.framework.fused_kernels:
        raise GhsimError("--fp8-recipe rowwise is torchao's recipe for eager frameworks; --framework "
                         f"{plan.framework.value} runs Transformer Engine (delayed or tensorwise)")
    if plan.gpus % (plan.tp * plan.pp):
        raise GhsimError(
            f"--gpus {plan.gpus} is not divisible by tp*pp = {plan.tp}*{plan.pp} = {plan.tp * plan.pp}"
        )
    if plan.fp8_params and (plan.precision != Precision.FP8 or not plan.framework.fused_kernels):
        raise GhsimError("--fp8-params keeps Megatron's working weights in fp8 (--fp8-param-gather): it needs "
                         "--precision fp8 and --framework megatron")
    if plan.pp_layers and len(plan.pp_layers) != plan.pp:
        raise GhsimError(f"--pp-layers lists {len(plan.pp_layers)} stage(s) but --pp is {plan.pp}")
    if plan.pp_layers and plan.pp_interleave > 1:
        raise GhsimError("--pp-layers with --pp-interleave is not modeled: an uneven split is one chunk per stage")
    if plan.global_batch and plan.global_batch % (plan.dp * plan.micro_batch):
        raise GhsimError(
            f"--global-batch {plan.global_batch} is not a multiple of data-parallel ranks x micro-batch "
            f"= {plan.dp} x {plan.micro_batch}"
        )


def check_values(plan: Plan) -> None:
    """Reject values no plan may take (counts below 1, negative sizes, unknown choices): what
    `ghsim plan` checks of the given fields before it searches the rest."""
    for name in ("gpus", "seq", "micro_batch", "tp", "pp", "ep", "pp_interleave"):
        if getattr(plan, name) < 1:
            raise GhsimError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(plan, name)}")
    for name in ("global_batch", "lora_rank", "gpus_per_node", "dataloader_workers", "cpu_threads"):
        if getattr(plan, name) < 0:
            raise GhsimError(f"--{name.replace('_', '-')} must not be negative")
    if any(n < 1 for n in plan.pp_layers):
        raise GhsimError(f"--pp-layers: every stage needs at least 1 decoder layer, got {','.join(map(str, plan.pp_layers))}")
    if plan.zero not in (0, 1, 2, 3):
        raise GhsimError(f"--zero must be 0, 1, 2 or 3, got {plan.zero}")
    if plan.batch_prep_s < 0:
        raise GhsimError(f"batch preparation time must not be negative, got {plan.batch_prep_s}")
    if not 0.0 <= plan.cpu_cores_share <= 1.0:
        raise GhsimError(f"the CPU optimizer's share of the cores must lie in [0, 1], got {plan.cpu_cores_share}")
    if not 0.0 <= plan.offload_ratio <= 1.0:
        raise GhsimError(f"offload ratio must lie in [0, 1], got {plan.offload_ratio}")
    if plan.fp8_recipe and plan.fp8_recipe not in FP8_RECIPES:
        raise GhsimError(f"fp8 recipe must be one of {', '.join(FP8_RECIPES)}, got {plan.fp8_recipe!r}")
    if plan.reduce_bucket_size < 1 or plan.sub_group_size < 1:
        raise GhsimError("reduce bucket and sub-group sizes must be at least 1 element, got "
                         f"{plan.reduce_bucket_size:g} and {plan.sub_group_size:g}")
    if plan.max_live_parameters < 0:
        raise GhsimError(f"max live parameters must be at least 0, got {plan.max_live_parameters:g}")
    if plan.deepspeed_version not in DEEPSPEED_VERSIONS:
        raise GhsimError(f"deepspeed version must be one of {', '.join(DEEPSPEED_VERSIONS)}, got {plan.deepspeed_version!r}")
    if plan.modeling not in MODELING_CODES:
        raise GhsimError(f"modeling must be one of {', '.join(MODELING_CODES)}, got {plan.modeling!r}")
    if plan.optimizer_impl not in OPTIMIZER_IMPLS:
        raise GhsimError(
            f"optimizer_impl must be one of {', '.join(OPTIMIZER_IMPLS)}, got {plan.optimizer_impl!r}"
        )


_PLAN_FIELDS = frozenset(f.name for f in fields(Plan))
# Plan.with_'s copy: every field read in one C call, then set through its slot
_FIELD_NAMES = tuple(f.name for f in fields(Plan))
_ALL_FIELDS = operator.attrgetter(*_FIELD_NAMES)
_FIELD_INDEX = {name: i for i, name in enumerate(_FIELD_NAMES)}
_SLOT_SETTERS = tuple(getattr(Plan, name).__set__ for name in _FIELD_NAMES)
