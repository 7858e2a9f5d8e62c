"""`ghsim models` and `ghsim hardware`: what --model and --hardware accept by name."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from ghsim.hardware import Hardware


@click.command()
def models() -> None:
    """List the model catalog: every name --model accepts (any letter case), aliases beside it."""
    from ghsim.model import catalog, model_from_dict
    from ghsim.tomlio import read_toml

    names_of: dict = {}
    for name, path in catalog().items():
        names_of.setdefault(path, []).append(name)
    for path in sorted(names_of, key=lambda p: p.stem):
        m = model_from_dict(read_toml(path), str(path), path.stem)
        kind = "dense"
        if m.moe:
            kind = f"MoE {m.moe.num_experts}x top-{m.moe.experts_per_token}, {m.active_params_per_token / 1e9:.1f}B active"
        aliases = sorted(n for n in names_of[path] if n != path.stem.lower())
        also = f"  (also: {', '.join(aliases)})" if aliases else ""
        click.echo(f"{path.stem:<16} {m.total_params / 1e9:8.2f}B  {m.num_layers:3d} layers  h={m.hidden_size:<6} "
                   f"{kind}{also}")
    click.echo("or: a model .toml, a Hugging Face config.json, or a folder holding one")


@click.command()
def hardware() -> None:
    """List the hardware profiles."""
    from ghsim.hardware import assumed_figures, load_hardware, profile_names

    for name in profile_names():
        hw = load_hardware(name)
        assumed = assumed_figures(hw)
        click.echo(f"{name:<18} HBM {hw.hbm.capacity_bytes / 1e9:5.0f} GB {hw.hbm.bandwidth / 1e12:4.1f} TB/s  "
                   f"bf16 {hw.peak_flops['bf16'] / 1e12:6.1f} TF  host link {hw.host_link.kind}  "
                   f"{hw.gpus_per_node} GPU(s)/node  {_host_path(hw)}assumed: {', '.join(assumed) if assumed else 'none'}")


def _host_path(hw: Hardware) -> str:
    """A host that runs the launch path at another speed than the calibration's (Grace) says so, and
    what it pays per tensor-parallel collective call where that is measured."""
    factor = f"host path x{hw.host_path_factor:.2f}  " if hw.host_path_factor != 1.0 else ""
    return factor + (f"TP call {hw.tp_collective_call_s * 1e6:.1f} us  " if hw.tp_collective_call_s else "")
