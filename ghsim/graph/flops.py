"""FLOP counts: the work the graph builders state and the calibration measures against (one convention for both)."""


def gemm_flops(m: int, n: int, k: int) -> float:
    return 2.0 * m * n * k


def attention_fwd_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool = True) -> float:
    """QK^T and PV: 2 matmuls of 2*s*s*d each per head; causal masking halves the work."""
    full = 4.0 * batch * heads * seq * seq * head_dim
    return full / 2 if causal else full


def window_pair_fraction(seq: int, window: int) -> float:
    """Query-key pairs a causal sliding window of `window` tokens allows, over those of full causal
    attention (query i sees keys max(0, i-window+1)..i): 1 when the window covers the sequence."""
    if window <= 0 or window >= seq:
        return 1.0
    allowed = window * (window + 1) / 2 + (seq - window) * window
    return allowed / (seq * (seq + 1) / 2)


def attention_bwd_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool = True) -> float:
    """Flash-attention backward: 5 matmuls (recomputed QK^T, dV, dP, dQ, dK) vs the forward's 2."""
    return 2.5 * attention_fwd_flops(batch, heads, seq, head_dim, causal)
