"""The kernel-level ops of a one-GPU step, as the simulator builds them (graph/parallel.py's
micro-batch of the one pipeline chunk), for tests that inspect the graph rather than the report."""

from __future__ import annotations

from types import SimpleNamespace

from ghsim.simulate import chunk_graph, prepare

ONE_CHUNK = (True, True)  # holds the embedding and the loss


def step_graph(model, hw, plan, cal):
    """The step's last micro-batch; with gradient accumulation, preceded by the micro-batch the
    simulator runs for the others, M - 1 times (only `.ops`: the pipeline schedules them)."""
    rank = prepare(model, hw, plan, cal)
    final = chunk_graph(model, plan, rank, model.num_layers, ONE_CHUNK, True).graph
    if plan.grad_accum == 1:
        return final
    middle = chunk_graph(model, plan, rank, model.num_layers, ONE_CHUNK, False).graph
    return SimpleNamespace(ops=middle.ops * (plan.grad_accum - 1) + final.ops)
