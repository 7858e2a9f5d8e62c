"""The `ghsim` command line. It only parses, calls and renders; errors become one line + exit 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

import click

from ghsim.errors import GhsimError
from ghsim.tomlio import write_text


class GhsimGroup(click.Group):
    """Turns GhsimError (and click's usage errors) into one line on stderr and exit code 2."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            return super().main(*args, **kwargs)
        except GhsimError as e:
            click.echo(f"ghsim: error: {e}", err=True)
            sys.exit(2)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("ghsim: aborted", err=True)
            sys.exit(1)
        except click.ClickException as e:
            click.echo(f"ghsim: error: {e.format_message()}", err=True)
            sys.exit(2)


@click.group(cls=GhsimGroup)
@click.version_option(package_name="ghsim")
def main() -> None:
    """Predict LLM training steps on Grace Hopper (GH200) and PCIe/SXM Hopper GPUs."""


def plan_options(f: Callable, searched: bool = False) -> Callable:
    """The model, hardware and plan flags shared by simulate, plan and compare.

    `searched`: the help of `ghsim plan`, where a flag left out is searched, not defaulted."""
    options = [
        click.option("--model", "model_name", required=True, help="Catalog name (`ghsim models`), model TOML or HF config.json."),
        click.option("--gpus", type=int, default=None, help="Total GPUs (default 1)."),
        click.option("--gpus-per-node", type=int, default=None, help="GPUs per node (default: the hardware's)."),
        click.option("--seq", type=int, default=None, help="Sequence length (default 4096)."),
        click.option("--micro-batch", type=int, default=None,
                     help="Sequences per GPU per micro-batch (default: " + ("searched)." if searched else "1).")),
        click.option("--global-batch", type=int, default=None, help="Sequences per step (default: " + (
            "4 per GPU, at least 32)." if searched else "one micro-batch per GPU).")),
        click.option("--zero", type=int, default=None, help="ZeRO stage 0-3."),
        click.option("--precision", type=click.Choice(["fp32", "tf32", "bf16", "fp16", "fp8"]), default=None),
        click.option("--recompute", type=click.Choice(["none", "selective", "full"]), default=None),
        click.option("--offload", default=None, help="Comma list of optimizer,grads,params,activations."),
        click.option("--offload-ratio", type=float, default=None, help="Share of the optimizer step on the CPU."),
        click.option("--offload-schedule", type=click.Choice(["auto", "sync", "overlapped", "superoffload"]),
                     default=None, help="How offloaded state moves (auto: sync for torch, overlapped for deepspeed)."),
        click.option("--offload-pinned/--offload-pageable", "offload_pinned", default=None,
                     help="Offload buffers page-locked (default) or pageable."),
        click.option("--unified-memory", is_flag=True, default=None),
        click.option("--tp", type=int, default=None),
        click.option("--pp", type=int, default=None),
        click.option("--ep", type=int, default=None),
        click.option("--sequence-parallel", is_flag=True, default=None,
                     help="Megatron sequence parallelism with --tp (norms and residuals split over the sequence)."),
        click.option("--pp-interleave", type=int, default=None, help="Model chunks per pipeline stage (interleaved 1F1B)."),
        click.option("--lora-rank", type=int, default=None),
        click.option("--cuda-graphs", is_flag=True, default=None, help="Replay the step as CUDA graphs (cheap launches)."),
        click.option("--dataloader-workers", type=int, default=None, help="Data-loader worker processes (0: the trainer prepares batches itself)."),
        click.option("--batch-prep-ms", type=float, default=None, help="Host CPU time to prepare one micro-batch (default 0: data already on the GPU)."),
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


_FLAG_TO_FIELD = {
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
    for flag, field_name in _FLAG_TO_FIELD.items():
        if kw.get(flag) is not None:
            base[field_name] = kw[flag] / 1e3 if flag == "batch_prep_ms" else kw[flag]
    return plan_from_dict(base, "plan")


def _echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2))


@main.command()
@plan_options
@click.option("--hardware", "hardware_name", default="gh200-96gb", show_default=True, help="Profile name or TOML path.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--trace", "trace_file", type=click.Path(), default=None, help="Write the timeline as a Chrome trace.")
@click.option("--plot", "plot_file", type=click.Path(), default=None, help="Draw timeline and memory to a PNG.")
def simulate(hardware_name: str, as_json: bool, trace_file: str | None, plot_file: str | None, **kw: Any) -> None:
    """Simulate one training step and report time, memory and utilization."""
    from ghsim.hardware import load_hardware
    from ghsim.model import load_model
    from ghsim.report import chrome_trace, render_table
    from ghsim.simulate import simulate as run_simulation

    model = load_model(kw["model_name"])
    hw = load_hardware(hardware_name)
    plan = plan_from_flags(kw)
    report = run_simulation(model, hw, plan)
    if trace_file:
        write_text(trace_file, json.dumps(chrome_trace(report)))
    if plot_file:
        from ghsim.plots import plot_step

        plot_step(report, plot_file)
    if as_json:
        _echo_json(report.to_dict())
    else:
        click.echo(render_table(report))


@main.command()
def models() -> None:
    """List the model catalog."""
    from ghsim.model import catalog, load_model

    seen = set()
    for name, path in sorted(catalog().items()):
        if path in seen:
            continue
        seen.add(path)
        m = load_model(name)
        kind = f"MoE {m.moe.num_experts}x top-{m.moe.experts_per_token}" if m.moe else "dense"
        click.echo(f"{path.stem:<22} {m.total_params / 1e9:8.2f}B  {m.num_layers:3d} layers  h={m.hidden_size:<6} {kind}")


@main.command()
def hardware() -> None:
    """List the hardware profiles."""
    from ghsim.hardware import load_hardware, profile_names

    for name in profile_names():
        hw = load_hardware(name)
        click.echo(f"{name:<18} HBM {hw.hbm.capacity_bytes / 1e9:5.0f} GB {hw.hbm.bandwidth / 1e12:4.1f} TB/s  "
                   f"bf16 {hw.peak_flops['bf16'] / 1e12:6.1f} TF  host link {hw.host_link.kind}")


def _register_optional_commands() -> None:
    """Commands that live in their own modules (trace, validate, plan, compare, calibrate)."""
    import importlib

    for module, attr in (
        ("ghsim.cli_trace", "trace"),
        ("ghsim.cli_calibrate", "calibrate"),
        ("ghsim.cli_validate", "validate"),
        ("ghsim.cli_plan", "plan"),
        ("ghsim.cli_compare", "compare"),
        ("ghsim.cli_plan", "sweep"),
    ):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name == module:
                continue
            raise
        if hasattr(mod, attr):
            main.add_command(getattr(mod, attr))
    _add_trace_command()


def _add_trace_command() -> None:
    """`ghsim trace command`: capture exactly the steps that matter (needs the simulator, so it lives here)."""
    trace_group = main.commands.get("trace")
    if trace_group is None:
        return

    @trace_group.command("command")
    @plan_options
    @click.option("--hardware", "hardware_name", default="gh200-96gb", show_default=True)
    @click.option("--steps", required=True, metavar="A-B", help="Steps to capture, 0-based (e.g. 10-12).")
    @click.option("--startup-s", type=float, default=60.0, show_default=True,
                  help="Seconds from launch to the first step (model build, data, compile).")
    @click.option("--output", default="ghsim_capture", show_default=True, help="Report name.")
    @click.option("--program", default="python train.py", show_default=True, help="The training command.")
    def trace_command(hardware_name: str, steps: str, startup_s: float, output: str, program: str, **kw: Any) -> None:
        """Print the nsys command and PyTorch profiler schedule that capture steps A-B."""
        from ghsim.hardware import load_hardware
        from ghsim.model import load_model
        from ghsim.simulate import simulate as run_simulation
        from ghsim.trace_capture import capture_window, nsys_command, nsys_range_command, torch_profiler_snippet

        report = run_simulation(load_model(kw["model_name"]), load_hardware(hardware_name), plan_from_flags(kw),
                                keep_timeline=False)
        w = capture_window(steps, report.step_time_s, startup_s)
        click.echo(f"# predicted step {report.step_time_s * 1e3:.1f} ms; steps {w.first_step}-{w.last_step} start "
                   f"about {startup_s + w.first_step * report.step_time_s:.1f} s after launch")
        click.echo("# timed from the prediction (one step of margin each side):")
        click.echo(nsys_command(w, output, program))
        click.echo("# exact, if the script calls torch.cuda.profiler.start()/stop() around those steps:")
        click.echo(nsys_range_command(output, program))
        click.echo("# PyTorch profiler for the same steps:")
        click.echo(torch_profiler_snippet(w, output + "_torch"))


_register_optional_commands()
