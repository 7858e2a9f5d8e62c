"""DeepSpeed ZeRO-3's parameter prefetch window: how many of the last layers keep their gathered
(or fetched) parameters on the GPU from forward into backward.

Read from DeepSpeed 0.19.8 (runtime/zero/partitioned_param_coordinator.py). `_fetch_sub_module_impl`
prefetches down the recorded parameter trace while fewer than stage3_max_live_parameters elements
are available (`__n_available_params`; a parameter already AVAILABLE is passed at no cost). Once
that window passes the end of forward it records the backward (or recompute) use of every layer
still available (`__most_recent_step_id_param_fetched_for`), and `__params_to_release` then keeps
those parameters at their forward release. The window holds the LM head's weight (the embedding's,
when tied) and as many of the last layers as fit beside it.
"""

from __future__ import annotations


def layers_kept_for_backward(max_live: float, head_params: float, layer_params: float, layers: int) -> int:
    """The last layers whose parameters stay gathered from their forward to their backward, for a
    window of `max_live` elements (stage3_max_live_parameters), an LM head of `head_params` elements
    and layers of `layer_params` elements each (one rank's, before ZeRO partitioning).

    Measured: a 2.5e8-parameter Llama at three settings (validation/measured_libraries/_raw/
    zero3_live_params.json, one GPU with offload_param); the 3B Llama's traces, one GPU with
    offload_param (H2D copies: 22 of 28 layers fetched again in backward) and two GPUs (all-gathers:
    22 of 28 layers gathered again in backward, h200x2-ds-z3-offopt-llama3b). Not modeled: the
    prefetch's overshoot (up to one tensor past the bound), the window running further ahead
    during forward and backward (the peak is at the loss, where the window is these layers), and
    stage3_max_reuse_distance, which keeps no more than this with DeepSpeed's defaults on these
    models."""
    if max_live <= 0 or layer_params <= 0:
        return 0
    return max(0, min(layers, int((max_live - head_params) // layer_params)))
