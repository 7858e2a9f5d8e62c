"""Named live tensors of a layer builder, and the memory-breakdown category of each."""

from __future__ import annotations

from ghsim.graph.ops import Op


def memory_tag(tensor: str) -> str:
    """The memory-breakdown category of a builder tensor, from its name."""
    if tensor.startswith("grad."):
        return "grads"
    if tensor.endswith(".w16"):
        return "weight_copies"
    if tensor.startswith(("logits", "lsm", "g_logits")):
        return "logits"
    if tensor == "g" or tensor.startswith(("g_", "g.")):  # gradients; "gate" is an activation
        return "activation_grads"
    return "activations"


class Tensors:
    """Named live tensors of one builder, so each op states what it creates and frees.

    Turning names into byte counts here (rather than hand-summing bytes per op)
    keeps the memory replay honest: freeing a tensor that was never created, or
    twice, is a bug in the builder and raises at once.
    """

    def __init__(self) -> None:
        self.live: dict[str, float] = {}

    def free(self, op: Op, names: list[str]) -> Op:
        """`op` as the op after which these tensors are freed (a changed copy)."""
        return op.evolve(self.freed(names)) if names else op

    def created(self, sizes: dict[str, float]) -> list[tuple[str, float]]:
        """Mark these tensors live; the HBM changes (tag, bytes) an op creating them makes."""
        out = []
        for name, nbytes in sizes.items():
            if name in self.live:
                raise ValueError(f"tensor {name} created twice")
            self.live[name] = nbytes
            out.append((memory_tag(name), nbytes))
        return out

    def freed(self, names: list[str]) -> list[tuple[str, float]]:
        """Mark these tensors dead; the HBM changes (tag, -bytes) an op freeing them makes."""
        out = []
        for name in names:
            if name not in self.live:
                raise ValueError(f"tensor {name} freed but not live")
            out.append((memory_tag(name), -self.live.pop(name)))
        return out
