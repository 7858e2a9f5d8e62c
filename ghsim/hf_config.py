"""A Hugging Face config.json as a model table (ghsim/model.py), per architecture.

Each architecture's keys are read as its transformers class reads them (its defaults
included); what ghsim does not model is refused in one line naming it, instead of
being read as a Llama.
"""

from __future__ import annotations

from typing import Any, Callable

from ghsim.errors import GhsimError
from ghsim.model import MAX_EXPERTS, ModelSpec, bounded_int, model_from_dict, shown

Table = dict[str, Any]

# HF key -> model-table key, common to every architecture below
_COMMON = {
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "max_seq_len",
}

_GELU = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_python")


def _common(cfg: Table, tie_default: bool) -> Table:
    d = {key: cfg[hf] for hf, key in _COMMON.items() if cfg.get(hf) is not None}
    tie = cfg.get("tie_word_embeddings")
    d["tie_embeddings"] = tie_default if tie is None else tie
    return d


def _activation(cfg: Table, where: str, allowed: tuple[str, ...], key: str = "hidden_act") -> str:
    act = cfg.get(key, allowed[0])
    if act not in allowed:
        raise GhsimError(f"{where}: activation {shown(act)} is not modeled for this architecture "
                         f"(modeled: {', '.join(allowed)})")
    return act


def _sliding(cfg: Table, d: Table) -> None:
    window = cfg.get("sliding_window")
    if window is not None and cfg.get("use_sliding_window", True) is not False:
        d["sliding_window"] = window


def _llama_like(cfg: Table, where: str) -> Table:
    """Llama, Mistral, Qwen2/2.5, Qwen3, Phi-3: pre-norm RMSNorm, RoPE, SwiGLU."""
    _activation(cfg, where, ("silu",))
    d = _common(cfg, tie_default=False)
    if cfg.get("mlp_bias"):
        d["bias"] = "all"
    elif cfg.get("attention_bias") or cfg.get("model_type") in ("qwen2", "qwen2_moe"):  # Qwen2 always biases q, k, v
        d["bias"] = "qkv"
    if cfg.get("model_type") in ("qwen3", "qwen3_moe"):
        d["qk_norm"] = True
    if cfg.get("partial_rotary_factor") is not None:
        d["rotary_fraction"] = cfg["partial_rotary_factor"]
    _sliding(cfg, d)
    return d


def _moe(cfg: Table, where: str, experts_key: str, ffn_key: str) -> Table:
    top_k = cfg.get("num_experts_per_tok")
    if top_k is None:
        raise GhsimError(f"{where}: MoE config lacks 'num_experts_per_tok'")
    return {"num_experts": cfg.get(experts_key), "experts_per_token": top_k,
            "expert_intermediate_size": cfg.get(ffn_key)}


def _mixtral(cfg: Table, where: str) -> Table:
    d = _llama_like(cfg, where)
    d["moe"] = _moe(cfg, where, "num_local_experts", "intermediate_size")
    return d


def _qwen_moe(cfg: Table, where: str) -> Table:
    """Qwen2-MoE (one gated shared expert) and Qwen3-MoE; every layer sparse."""
    if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
        raise GhsimError(f"{where}: dense layers among the MoE layers (mlp_only_layers, decoder_sparse_step) "
                         "are not modeled")
    d = _llama_like(cfg, where)
    d["moe"] = _moe(cfg, where, "num_experts", "moe_intermediate_size")
    if cfg.get("shared_expert_intermediate_size"):
        d["moe"]["shared_intermediate_size"] = cfg["shared_expert_intermediate_size"]
    return d


def _gemma(cfg: Table, where: str) -> Table:
    """Gemma and Gemma-2: gated GELU (GeGLU), explicit head_dim, tied embeddings; Gemma-2 adds
    a norm after attention and after the MLP, and sliding-window attention on alternate layers."""
    act_key = "hidden_activation" if cfg.get("hidden_activation") is not None else "hidden_act"
    _activation(cfg, where, _GELU, act_key)
    d = _common(cfg, tie_default=True)
    d["mlp"] = "geglu"
    if cfg.get("model_type") == "gemma2":
        d["norms_per_layer"] = 4
        _sliding(cfg, d)
        d["sliding_window_pattern"] = "alternate"  # Gemma-2: local and global attention take turns
    return d


def _phi(cfg: Table, where: str) -> Table:
    """Phi-1/1.5/2: GELU MLP of two matrices (not gated), LayerNorm with bias, a bias on every
    linear, partial rotary, attention and MLP in parallel off one norm."""
    _activation(cfg, where, _GELU)
    d = _common(cfg, tie_default=False)
    d.update(mlp="gelu", norm="layernorm", bias="all", norms_per_layer=1,
             rotary_fraction=cfg.get("partial_rotary_factor", 0.5))
    return d


def _gpt_oss(cfg: Table, where: str) -> Table:
    d = _common(cfg, tie_default=False)
    d["bias"] = "all" if cfg.get("attention_bias", True) else "none"
    d["moe"] = _moe(cfg, where, "num_local_experts", "intermediate_size")
    _sliding(cfg, d)
    d["sliding_window_pattern"] = "alternate"  # GPT-OSS: layer_types alternate sliding and full attention
    return d


def _deepseek(cfg: Table, where: str) -> Table:
    """DeepSeek-V2/V3: MLA attention; MoE with shared experts after the first dense layers.
    V3's multi-token-prediction module (num_nextn_predict_layers) is not part of the model."""
    _activation(cfg, where, ("silu",))
    d = _common(cfg, tie_default=False)
    d.pop("head_dim", None)
    d["mla"] = {k: cfg.get(k) for k in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")}
    if cfg.get("q_lora_rank") is not None:
        d["mla"]["q_lora_rank"] = cfg["q_lora_rank"]
    nope, rope = cfg.get("qk_nope_head_dim"), cfg.get("qk_rope_head_dim")
    if isinstance(nope, int) and isinstance(rope, int) and not isinstance(nope, bool):
        d["head_dim"] = nope + rope  # q and k heads; v heads are v_head_dim
    if cfg.get("n_routed_experts"):
        moe = _moe(cfg, where, "n_routed_experts", "moe_intermediate_size")
        shared = bounded_int(cfg, "n_shared_experts", where, MAX_EXPERTS, 0) if cfg.get("n_shared_experts") else 0
        width = cfg.get("moe_intermediate_size")
        if shared and isinstance(width, int):
            moe["shared_intermediate_size"] = shared * width
        moe["dense_layers"] = cfg.get("first_k_dense_replace", 0)
        if cfg.get("moe_layer_freq", 1) != 1:
            raise GhsimError(f"{where}: MoE every {shown(cfg.get('moe_layer_freq'))} layers is not modeled")
        d["moe"] = moe
    return d


ARCHITECTURES: dict[str, Callable[[Table, str], Table]] = {
    "llama": _llama_like, "mistral": _llama_like, "qwen2": _llama_like, "qwen3": _llama_like,
    "phi3": _llama_like, "mixtral": _mixtral, "qwen2_moe": _qwen_moe, "qwen3_moe": _qwen_moe,
    "gemma": _gemma, "gemma2": _gemma, "phi": _phi, "gpt_oss": _gpt_oss,
    "deepseek_v2": _deepseek, "deepseek_v3": _deepseek,
}


def model_type_of(cfg: Table, where: str) -> str:
    """The config's model_type (or, lacking one, its architectures class name) as ARCHITECTURES names it."""
    model_type = cfg.get("model_type")
    if model_type is None:
        classes = cfg.get("architectures")
        if not (isinstance(classes, list) and classes and isinstance(classes[0], str)):
            raise GhsimError(f"{where}: config.json names no 'model_type' or 'architectures'")
        name = classes[0].lower().removesuffix("forcausallm").removesuffix("model")
        model_type = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "deepseekv2": "deepseek_v2",
                      "deepseekv3": "deepseek_v3", "gptoss": "gpt_oss"}.get(name, name)
    if not isinstance(model_type, str) or model_type not in ARCHITECTURES:
        raise GhsimError(f"{where}: architecture {shown(model_type)} is not modeled "
                         f"(modeled: {', '.join(sorted(ARCHITECTURES))})")
    return model_type


def model_from_hf_config(cfg: Any, where: str, name: str) -> ModelSpec:
    """Translate a Hugging Face config.json of a modeled architecture."""
    if not isinstance(cfg, dict):
        raise GhsimError(f"{where}: config.json must hold a JSON object")
    model_type = model_type_of(cfg, where)
    table = ARCHITECTURES[model_type]({**cfg, "model_type": model_type}, where)
    table["name"] = name
    return model_from_dict(table, where, name)
