"""`ghsim models` and `ghsim hardware`: what --model and --hardware accept by name."""

from __future__ import annotations

import click


@click.command()
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


@click.command()
def hardware() -> None:
    """List the hardware profiles."""
    from ghsim.hardware import assumed_figures, load_hardware, profile_names

    for name in profile_names():
        hw = load_hardware(name)
        assumed = assumed_figures(hw)
        click.echo(f"{name:<18} HBM {hw.hbm.capacity_bytes / 1e9:5.0f} GB {hw.hbm.bandwidth / 1e12:4.1f} TB/s  "
                   f"bf16 {hw.peak_flops['bf16'] / 1e12:6.1f} TF  host link {hw.host_link.kind}  "
                   f"{hw.gpus_per_node} GPU(s)/node  assumed: {', '.join(assumed) if assumed else 'none'}")
