"""The model, hardware and plan flags that simulate, plan, compare and trace command share,
and the Plan they describe."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import click

from ghsim.errors import GhsimError
from ghsim.graph.offload.setup import library_refusal
from ghsim.plan import DEEPSPEED_VERSION, DEEPSPEED_VERSIONS, CpuOptimizer
from ghsim.plan_toml import HOST_FIGURES


class FiniteFloat(click.ParamType):
    """A float that is a number: NaN and infinity are refused (they would print as a step time of
    nan ms and as JSON that is not JSON)."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class BoundedInt(click.ParamType):
    """An integer no larger in size than `limit`: bigger counts describe no cluster or model and
    would overflow the float arithmetic of the cost model."""

    name = "integer"

    def __init__(self, limit: int = 10**9):
        self.limit = limit

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            number = value if isinstance(value, int) and not isinstance(value, bool) else int(str(value).strip())
        except ValueError:
            self.fail(f"{value!r} is not an integer", param, ctx)
        if abs(number) > self.limit:
            self.fail(f"{value} is out of range (at most {self.limit:,} in size)", param, ctx)
        return number


FLOAT = FiniteFloat()
INT = BoundedInt()


def plan_options(f: Callable, searched: bool = False) -> Callable:
    """The model, hardware and plan flags shared by simulate, plan and compare.

    `searched`: the help of `ghsim plan`, where a flag left out is searched, not defaulted."""
    options = [
        click.option("--model", "model_name", default=None,
                     help="Catalog name (`ghsim models`), model TOML or HF config.json (default: the --plan file's)."),
        click.option("--gpus", type=INT, default=None, help="Total GPUs (default 1)."),
        click.option("--gpus-per-node", type=INT, default=None, help="GPUs per node (default: the hardware's)."),
        click.option("--seq", type=INT, default=None, help="Sequence length (default 4096)."),
        click.option("--micro-batch", type=INT, default=None,
                     help="Sequences per GPU per micro-batch (default: " + ("searched)." if searched else "1).")),
        click.option("--global-batch", type=INT, default=None, help="Sequences per step (default: " + (
            "4 per GPU, at least 32)." if searched else "one micro-batch per GPU).")),
        click.option("--zero", type=INT, default=None, help="ZeRO stage 0-3."),
        click.option("--precision", type=click.Choice(["fp32", "tf32", "bf16", "fp16", "fp8"]), default=None),
        click.option("--recompute", type=click.Choice(["none", "selective", "full"]), default=None),
        click.option("--offload", default=None, help="Comma list of optimizer,grads,params,activations."),
        click.option("--offload-ratio", type=FLOAT, default=None, help="Share of the optimizer step on the CPU."),
        click.option("--offload-schedule", type=click.Choice(["auto", "sync", "overlapped", "superoffload"]),
                     default=None, help="How offloaded state moves (auto: sync for torch, overlapped for deepspeed)."),
        click.option("--offload-pinned/--offload-pageable", "offload_pinned", default=None,
                     help="Offload buffers page-locked (default) or pageable."),
        click.option("--unified-memory", is_flag=True, default=None),
        click.option("--tp", type=INT, default=None),
        click.option("--pp", type=INT, default=None),
        click.option("--ep", type=INT, default=None),
        click.option("--sequence-parallel", is_flag=True, default=None,
                     help="Megatron sequence parallelism with --tp (norms and residuals split over the sequence)."),
        click.option("--pp-interleave", type=INT, default=None, help="Model chunks per pipeline stage (interleaved 1F1B)."),
        click.option("--pp-layers", default=None,
                     help="Decoder layers of each pipeline stage, e.g. 11,13 (default: an even split); the embedding "
                          "is on the first stage, the LM head and loss on the last (Megatron's "
                          "--decoder-first/last-pipeline-num-layers, DeepSpeed's partition_method)."),
        click.option("--lora-rank", type=INT, default=None),
        click.option("--lora-targets", default=None,
                     help="Projections with LoRA adapters: all (default), peft (peft's Llama default: q_proj,v_proj) "
                          "or a comma list of q,k,v,o,gate,up,down."),
        click.option("--cuda-graphs", is_flag=True, default=None, help="Replay the step as CUDA graphs (cheap launches)."),
        click.option("--dataloader-workers", type=INT, default=None, help="Data-loader worker processes (0: the trainer prepares batches itself)."),
        click.option("--batch-prep-ms", type=FLOAT, default=None, help="Host CPU time to prepare one micro-batch (default 0: data already on the GPU)."),
        click.option("--optimizer-impl", type=click.Choice(["foreach", "fused"]), default=None),
        click.option("--cpu-optimizer", type=click.Choice([c.value for c in CpuOptimizer]), default=None,
                     help="AdamW the host runs for an offloaded optimizer (auto: DeepSpeedCPUAdam under "
                          "deepspeed, else torch.optim.AdamW's CPU default, the for-loop)."),
        click.option("--cpu-threads", type=INT, default=None,
                     help="Threads the CPU optimizer runs on per GPU (default: the cores its launcher gives it; "
                          "torchrun gives torch 1 per rank when several ranks share a node)."),
        click.option("--cpu-cores-share", type=FLOAT, default=None,
                     help="SuperOffload's cpuadam_cores_perc: share of a GPU's cores its CPU-Adam worker is "
                          "pinned to (default 0.8); the training process keeps the rest."),
        click.option("--fused-norm", is_flag=True, default=None,
                     help="Eager frameworks: RMSNorm as torch.nn.RMSNorm runs it (one fused kernel each way, "
                          "saving the input and 1/rms) instead of Hugging Face's LlamaRMSNorm."),
        click.option("--fp8-recipe", type=click.Choice(["delayed", "tensorwise", "rowwise"]), default=None,
                     help="With --precision fp8. Eager frameworks run torchao's float8 training: tensorwise (one "
                          "dynamic scale per tensor) or rowwise (per row); without a recipe, eager fp8 is a per-op "
                          "quantisation (README). --framework megatron runs Transformer Engine: delayed scaling from "
                          "an amax history (its default) or tensorwise current scaling (each tensor's amax first)."),
        click.option("--fp8-params", is_flag=True, default=None,
                     help="With --precision fp8 under --framework megatron: fp8 working weights, stored and gathered "
                          "in 1 byte (Megatron's --fp8-param-gather, NeMo's fp8_params)."),
        click.option("--compile", is_flag=True, default=None,
                     help="torch.compile the model (Inductor): fused norm, activation, rotary and loss regions, "
                          "fewer saved activations; with --cuda-graphs, mode='reduce-overhead'."),
        click.option("--modeling", type=click.Choice(["hf", "torchtitan"]), default=None,
                     help="Whose model code runs: Hugging Face transformers (default; under --compile SDPA gets a "
                          "materialised boolean causal mask and k/v expanded to every head) or torchtitan's "
                          "(SDPA with is_causal)."),
        click.option("--reduce-bucket-size", type=FLOAT, default=None,
                     help="DeepSpeed's zero_optimization.reduce_bucket_size in elements (default 5e8)."),
        click.option("--sub-group-size", type=FLOAT, default=None,
                     help="DeepSpeed's zero_optimization.sub_group_size in elements (default 1e9): ZeRO-3 offloads "
                          "and steps the optimizer in sub-groups of this many parameters per GPU."),
        click.option("--max-live-parameters", type=FLOAT, default=None,
                     help="DeepSpeed's zero_optimization.stage3_max_live_parameters (default 1e9): with ZeRO-3 "
                          "offload_param the fetched parameters it holds on the GPU (the last layers' stay "
                          "from forward into backward)."),
        click.option("--deepspeed-version", type=click.Choice(DEEPSPEED_VERSIONS), default=None,
                     help=f"DeepSpeed release (default {DEEPSPEED_VERSION}); 0.18's SuperOffload reduces whole sub-groups and "
                          "hands its worker the fp32 gradient on the GPU."),
        click.option("--grad-clip", is_flag=True, default=None,
                     help="Clip gradients by their global norm (DeepSpeed gradient_clipping > 0): with ZeRO-Offload "
                          "one more pass over the fp32 gradients on the CPU."),
        click.option("--fsdp2", is_flag=True, default=None,
                     help="FSDP2 (fully_shard) rather than FSDP1: with --offload params its CPUOffloadPolicy copies "
                          "each layer's parameters up on the compute stream, serialised with the layer's kernels."),
        click.option("--host-cores", type=INT, default=None,
                     help="CPU cores of the host (node) you have, e.g. 16 for a 16-vCPU VM (default: the profile's)."),
        click.option("--host-memory-gb", type=FLOAT, default=None,
                     help="Host memory (GB) of the node you have, e.g. 128 for a cloud VM (default: the profile's): "
                          "what offloaded state must fit in."),
        click.option("--framework", type=click.Choice(["torch-amp", "fsdp-mixed", "deepspeed", "megatron",
                                                       "megatron-legacy"]), default=None,
                     help="Whose precision semantics and kernels the step follows: torch-amp (fp32 params, "
                          "autocast; eager kernels), fsdp-mixed and deepspeed (16-bit working weights, fp32 "
                          "masters; eager kernels), megatron (the same, with fused kernels: one per norm, "
                          "activation, rotary and loss, flash attention, fused Adam), megatron-legacy (Megatron-LM "
                          "of 2021-22: fused kernels, softmax attention between batched GEMMs)."),
        click.option("--plan", "plan_file", type=click.Path(), default=None, help="plan.toml, e.g. from ghsim plan --save-plan: its model, hardware and plan (flags override it, with a note)."),
        click.option("--deepspeed", "ds_file", type=click.Path(), default=None, help="DeepSpeed ds_config.json."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


FLAG_TO_FIELD = {
    "gpus": "gpus", "gpus_per_node": "gpus_per_node", "seq": "seq", "micro_batch": "micro_batch",
    "global_batch": "global_batch", "zero": "zero", "precision": "precision", "recompute": "recompute",
    "offload": "offload", "offload_ratio": "offload_ratio", "offload_schedule": "offload_schedule",
    "offload_pinned": "offload_pinned", "unified_memory": "unified_memory", "tp": "tp",
    "pp": "pp", "ep": "ep", "lora_rank": "lora_rank", "lora_targets": "lora_targets", "cuda_graphs": "cuda_graphs",
    "sequence_parallel": "sequence_parallel", "pp_interleave": "pp_interleave", "pp_layers": "pp_layers",
    "dataloader_workers": "dataloader_workers", "batch_prep_ms": "batch_prep_s", "optimizer_impl": "optimizer_impl", "framework": "framework",
    "cpu_optimizer": "cpu_optimizer", "cpu_threads": "cpu_threads", "cpu_cores_share": "cpu_cores_share",
    "grad_clip": "grad_clip", "fsdp2": "fsdp2", "fused_norm": "fused_norm", "compile": "compile", "modeling": "modeling",
    "fp8_recipe": "fp8_recipe", "fp8_params": "fp8_params", "reduce_bucket_size": "reduce_bucket_size",
    "sub_group_size": "sub_group_size", "max_live_parameters": "max_live_parameters",
    "deepspeed_version": "deepspeed_version",
}


def load_hardware_for(name: str, kw: dict[str, Any]):
    """The hardware profile `name` with the host the user says they have (--host-cores, --host-memory-gb;
    else what a --plan file records)."""
    from ghsim.hardware import load_hardware

    recorded = _plan_file(kw)
    overrides = {}
    for key, figure in HOST_FIGURES.items():
        flag = "--" + key.replace("_", "-")
        from_flag = kw.get(key) is not None
        value = kw[key] if from_flag else recorded.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise GhsimError(f"{kw.get('plan_file')}: '{key}' must be a number, got {value!r}")
        if key == "host_cores" and value < 1:
            raise GhsimError(f"{flag} must be at least 1, got {value:g}")
        if key == "host_cores" and value != int(value):
            raise GhsimError(f"{flag} must be a whole number, got {value:g}")
        if value <= 0:
            raise GhsimError(f"{flag} must be positive, got {value:g}")
        said = flag if from_flag else f"{key} in {kw['plan_file']}"
        overrides[figure] = {"value": value, "source": f"stated by the user ({said})"}
    return load_hardware(name, overrides or None)


TARGET_KEYS = ("model", "hardware", *HOST_FIGURES)  # what a saved plan.toml records beside the plan's own fields
DEFAULT_HARDWARE = "gh200-96gb"


def _plan_file(kw: dict[str, Any]) -> dict[str, Any]:
    from ghsim.tomlio import read_toml

    return read_toml(Path(kw["plan_file"])) if kw.get("plan_file") else {}


def plan_from_flags(kw: dict[str, Any]):
    """A Plan from a plan file or ds_config (if given) with the explicit flags on top; a flag that
    changes a value of the plan file overrides it, with a note on stderr."""
    from ghsim.plan import plan_from_dict

    base = {k: v for k, v in _plan_file(kw).items() if k not in TARGET_KEYS}
    if kw.get("ds_file"):
        from ghsim.deepspeed import read_ds_config

        fields, notes = read_ds_config(Path(kw["ds_file"]))
        base.update(fields)
        for note in notes:
            click.echo(f"ghsim: note: {note}", err=True)
    file_keys = set(base)
    from_files = plan_from_dict(base, str(kw.get("plan_file") or kw.get("ds_file") or "plan")) if base else None
    for flag, field_name in FLAG_TO_FIELD.items():
        if kw.get(flag) is not None:
            base[field_name] = kw[flag] / 1e3 if flag == "batch_prep_ms" else kw[flag]
    plan = plan_from_dict(base, "plan")
    if from_files is not None:
        changed = [f"--{flag.replace('_', '-')}" for flag, name in FLAG_TO_FIELD.items()
                   if kw.get(flag) is not None and name in file_keys and getattr(plan, name) != getattr(from_files, name)]
        if changed:
            click.echo(f"ghsim: note: flags override the plan file's values: {', '.join(changed)}", err=True)
    refusal = library_refusal(plan)
    if refusal:  # the plan's library would not run it: say so rather than price a what-if as real
        raise GhsimError(refusal)
    return plan


def model_and_hardware(kw: dict[str, Any], hardware_flag: str | None) -> tuple[str, str]:
    """The model and hardware to run: the flags, else what a saved plan file records (ghsim plan
    --save-plan), else the default part. A --hardware that differs from the plan file's is an
    override (documented in --plan's help) and noted on stderr."""
    recorded = _plan_file(kw)
    for key in ("model", "hardware"):
        if key in recorded and not (isinstance(recorded[key], str) and recorded[key]):
            raise GhsimError(f"{kw['plan_file']}: '{key}' must be a name or path")
    model = kw.get("model_name") or recorded.get("model")
    if not model:
        raise GhsimError("--model is required (or a --plan file that names its model)")
    hardware = hardware_flag or recorded.get("hardware") or DEFAULT_HARDWARE
    if hardware_flag and recorded.get("hardware") and hardware_flag != recorded["hardware"]:
        click.echo(f"ghsim: note: --hardware {hardware_flag} overrides the plan file's {recorded['hardware']}", err=True)
    return model, hardware
