"""The model, hardware and plan flags that simulate, plan, compare and trace command share,
and the Plan they describe."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import click


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
        click.option("--model", "model_name", required=True, help="Catalog name (`ghsim models`), model TOML or HF config.json."),
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
        click.option("--lora-rank", type=INT, default=None),
        click.option("--cuda-graphs", is_flag=True, default=None, help="Replay the step as CUDA graphs (cheap launches)."),
        click.option("--dataloader-workers", type=INT, default=None, help="Data-loader worker processes (0: the trainer prepares batches itself)."),
        click.option("--batch-prep-ms", type=FLOAT, default=None, help="Host CPU time to prepare one micro-batch (default 0: data already on the GPU)."),
        click.option("--optimizer-impl", type=click.Choice(["foreach", "fused"]), default=None),
        click.option("--framework", type=click.Choice(["torch-amp", "fsdp-mixed", "deepspeed", "megatron",
                                                       "megatron-legacy"]), default=None,
                     help="Whose precision semantics and kernels the step follows: torch-amp (fp32 params, "
                          "autocast; eager kernels), fsdp-mixed and deepspeed (16-bit working weights, fp32 "
                          "masters; eager kernels), megatron (the same, with fused kernels: one per norm, "
                          "activation, rotary and loss, flash attention, fused Adam), megatron-legacy (Megatron-LM "
                          "of 2021-22: fused kernels, softmax attention between batched GEMMs)."),
        click.option("--plan", "plan_file", type=click.Path(), default=None, help="plan.toml (flags override it)."),
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
    "pp": "pp", "ep": "ep", "lora_rank": "lora_rank", "cuda_graphs": "cuda_graphs",
    "sequence_parallel": "sequence_parallel", "pp_interleave": "pp_interleave",
    "dataloader_workers": "dataloader_workers", "batch_prep_ms": "batch_prep_s", "optimizer_impl": "optimizer_impl", "framework": "framework",
}


def plan_from_flags(kw: dict[str, Any]):
    """A Plan from a plan file or ds_config (if given) with the explicit flags on top."""
    from ghsim.plan import plan_from_dict
    from ghsim.tomlio import read_toml

    base: dict[str, Any] = {}
    if kw.get("plan_file"):
        base.update(read_toml(Path(kw["plan_file"])))
    if kw.get("ds_file"):
        from ghsim.deepspeed import plan_dict_from_ds_config

        base.update(plan_dict_from_ds_config(Path(kw["ds_file"])))
    for flag, field_name in FLAG_TO_FIELD.items():
        if kw.get(flag) is not None:
            base[field_name] = kw[flag] / 1e3 if flag == "batch_prep_ms" else kw[flag]
    return plan_from_dict(base, "plan")
