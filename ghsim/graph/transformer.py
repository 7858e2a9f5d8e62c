"""The op graph of one decoder layer of a transformer, for one micro-batch on one GPU.

Two ways to run the layer, as the plan's framework says:
- eager PyTorch, kernel group by kernel group, for a Hugging Face style Llama
  layer (graph/eager_layer.py), or its regions as torch.compile fuses them
  (plan.compile: graph/compiled_layer.py);
- fused kernels (Framework.MEGATRON: Megatron-LM, NeMo, TransformerEngine), with
  Megatron's fused kernels and saved tensors (graph/fused_layer.py).
Both are written in the op constructors of graph/layer_ops.py; which casts a
plan implies (precision semantics) is graph/dtypes.py's.

Each op records the bytes it allocates, frees and holds transiently, in issue
order, so the memory model can replay the allocator's view.
"""

from __future__ import annotations

from ghsim.graph.compiled_layer import CompiledLayer
from ghsim.graph.fused_layer import FusedLayer
from ghsim.graph.ops import Phase


class LayerBuilder(CompiledLayer, FusedLayer):
    """Op lists of one decoder layer for one micro-batch: forward, and backward.

    Tensor names are local to the layer; "x" is the layer's input (made by the
    layer before, kept for this layer's backward), "x_next" its output. The
    shapes and op constructors are graph/layer_ops.py's; the eager layer is
    graph/eager_layer.py, the fused one graph/fused_layer.py.
    """

    def forward(self, save: bool, phase: Phase = Phase.FWD) -> dict[str, list[str]]:
        """Emit one layer's forward. With save False (a checkpointed forward) only x_next stays."""
        if self.fused:
            return self._forward_fused(save, phase)
        return self._forward_eager(save, phase)

    def backward(self, kept: dict[str, list[str]], phase: Phase = Phase.BWD) -> None:
        """Emit one layer's backward; "g" (the residual-stream gradient) is live before and after."""
        if self.fused:
            return self._backward_fused(kept, phase)
        return self._backward_eager(kept, phase)
