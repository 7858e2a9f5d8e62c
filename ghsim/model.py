"""ModelSpec: the shape of a decoder-only transformer, from the catalog, a TOML or an HF config.json."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ghsim.errors import GhsimError
from ghsim.tomlio import read_json, read_toml, repo_root

MODELS_DIR = repo_root() / "models"


@dataclass(frozen=True)
class MoESpec:
    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_embeddings: bool = False
    mlp: str = "swiglu"  # swiglu (3 matrices) | gelu (2 matrices, GPT-style)
    norm: str = "rmsnorm"  # rmsnorm | layernorm
    position: str = "rope"  # rope | learned
    max_seq_len: int = 4096
    moe: MoESpec | None = None
    # hidden and attention dropout probability in training (Megatron's --hidden-dropout and
    # --attention-dropout); the fused-kernel builder prices its masks and kernels, eager ignores it
    dropout: float = 0.0

    # --- parameter counts (elements); cached: the plan search asks for them per candidate --
    @cached_property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @cached_property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @cached_property
    def attention_params(self) -> int:
        # q, k, v, o projections (no biases in Llama-style models)
        return self.hidden_size * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden_size

    @cached_property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "swiglu" else 2

    @cached_property
    def dense_mlp_params(self) -> int:
        return self.mlp_matrices * self.hidden_size * self.intermediate_size

    @cached_property
    def expert_params(self) -> int:
        """Parameters of one expert (MoE only)."""
        assert self.moe is not None
        return self.mlp_matrices * self.hidden_size * self.moe.expert_intermediate_size

    @cached_property
    def mlp_params(self) -> int:
        if self.moe is None:
            return self.dense_mlp_params
        router = self.hidden_size * self.moe.num_experts
        return self.moe.num_experts * self.expert_params + router

    @cached_property
    def norm_params(self) -> int:
        per_norm = self.hidden_size * (2 if self.norm == "layernorm" else 1)
        return 2 * per_norm

    @cached_property
    def layer_params(self) -> int:
        return self.attention_params + self.mlp_params + self.norm_params

    @cached_property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @cached_property
    def lm_head_params(self) -> int:
        return 0 if self.tie_embeddings else self.vocab_size * self.hidden_size

    @cached_property
    def total_params(self) -> int:
        final_norm = self.hidden_size * (2 if self.norm == "layernorm" else 1)
        return (
            self.num_layers * self.layer_params
            + self.embedding_params
            + self.lm_head_params
            + final_norm
        )

    @cached_property
    def active_params_per_token(self) -> int:
        """Parameters one token touches (MoE: only its top-k experts)."""
        if self.moe is None:
            return self.total_params
        inactive = (self.moe.num_experts - self.moe.experts_per_token) * self.expert_params
        return self.total_params - self.num_layers * inactive

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["total_params"] = self.total_params
        return d


_REQUIRED = (
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_attention_heads",
    "vocab_size",
)


def _positive_int(d: dict[str, Any], key: str, where: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise GhsimError(f"{where}: '{key}' must be a positive integer, got {v!r}")
    return v


def _choice(d: dict[str, Any], key: str, allowed: tuple[str, ...], where: str) -> str:
    v = d.get(key, allowed[0])
    if v not in allowed:
        raise GhsimError(f"{where}: '{key}' must be one of {', '.join(allowed)}, got {v!r}")
    return v


def model_from_dict(d: dict[str, Any], where: str, default_name: str = "custom") -> ModelSpec:
    """Build a ModelSpec from a models/*.toml style dict; `where` names the source in errors."""
    for key in _REQUIRED:
        if key not in d:
            raise GhsimError(f"{where}: missing field '{key}'")
    hidden = _positive_int(d, "hidden_size", where)
    heads = _positive_int(d, "num_attention_heads", where)
    kv_heads = _positive_int(d, "num_kv_heads", where) if "num_kv_heads" in d else heads
    if "head_dim" in d:
        head_dim = _positive_int(d, "head_dim", where)
    else:
        if hidden % heads:
            raise GhsimError(
                f"{where}: num_attention_heads ({heads}) does not divide hidden_size ({hidden})"
            )
        head_dim = hidden // heads
    if heads % kv_heads:
        raise GhsimError(
            f"{where}: num_kv_heads ({kv_heads}) does not divide num_attention_heads ({heads})"
        )
    moe = None
    if "moe" in d:
        m = d["moe"]
        if not isinstance(m, dict):
            raise GhsimError(f"{where}: [moe] must be a table")
        moe = MoESpec(
            num_experts=_positive_int(m, "num_experts", where + " [moe]"),
            experts_per_token=_positive_int(m, "experts_per_token", where + " [moe]"),
            expert_intermediate_size=_positive_int(m, "expert_intermediate_size", where + " [moe]"),
        )
        if moe.experts_per_token > moe.num_experts:
            raise GhsimError(f"{where}: experts_per_token exceeds num_experts")
    tie = d.get("tie_embeddings", False)
    if not isinstance(tie, bool):
        raise GhsimError(f"{where}: 'tie_embeddings' must be true or false")
    dropout = d.get("dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise GhsimError(f"{where}: 'dropout' must be a number in [0, 1), got {dropout!r}")
    return ModelSpec(
        name=str(d.get("name", default_name)),
        hidden_size=hidden,
        intermediate_size=_positive_int(d, "intermediate_size", where),
        num_layers=_positive_int(d, "num_layers", where),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=_positive_int(d, "vocab_size", where),
        tie_embeddings=tie,
        mlp=_choice(d, "mlp", ("swiglu", "gelu"), where),
        norm=_choice(d, "norm", ("rmsnorm", "layernorm"), where),
        position=_choice(d, "position", ("rope", "learned"), where),
        max_seq_len=_positive_int(d, "max_seq_len", where) if "max_seq_len" in d else 4096,
        moe=moe,
        dropout=float(dropout),
    )


def model_from_hf_config(cfg: dict[str, Any], where: str, name: str) -> ModelSpec:
    """Translate a Hugging Face config.json (Llama, Qwen, Mistral, Mixtral, GPT-OSS keys)."""
    if not isinstance(cfg, dict):
        raise GhsimError(f"{where}: config.json must hold a JSON object")
    d: dict[str, Any] = {"name": name}
    renames = {
        "hidden_size": "hidden_size",
        "intermediate_size": "intermediate_size",
        "num_hidden_layers": "num_layers",
        "num_attention_heads": "num_attention_heads",
        "num_key_value_heads": "num_kv_heads",
        "head_dim": "head_dim",
        "vocab_size": "vocab_size",
        "tie_word_embeddings": "tie_embeddings",
        "max_position_embeddings": "max_seq_len",
    }
    for hf_key, key in renames.items():
        if cfg.get(hf_key) is not None:
            d[key] = cfg[hf_key]
    n_experts = cfg.get("num_local_experts", cfg.get("num_experts"))
    if n_experts:
        top_k = cfg.get("num_experts_per_tok", cfg.get("experts_per_token"))
        if top_k is None:
            raise GhsimError(f"{where}: MoE config lacks 'num_experts_per_tok'")
        expert_ffn = cfg.get("moe_intermediate_size", cfg.get("intermediate_size"))
        d["moe"] = {
            "num_experts": n_experts,
            "experts_per_token": top_k,
            "expert_intermediate_size": expert_ffn,
        }
    return model_from_dict(d, where, name)


def catalog() -> dict[str, Path]:
    """Model names (and aliases) in models/ mapped to their files."""
    names: dict[str, Path] = {}
    for path in sorted(MODELS_DIR.glob("*.toml")):
        names[path.stem] = path
        try:
            aliases = read_toml(path).get("aliases", [])
        except GhsimError:
            continue
        for alias in aliases:
            names.setdefault(alias, path)
    return names


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog name, a path to a model TOML, or a path to an HF config.json."""
    path = Path(name_or_path)
    if path.suffix == ".json":
        return model_from_hf_config(read_json(path), str(path), path.parent.name or path.stem)
    if path.suffix == ".toml":
        return model_from_dict(read_toml(path), str(path), path.stem)
    known = catalog()
    if name_or_path not in known:
        raise GhsimError(
            f"unknown model '{name_or_path}' (known: {', '.join(sorted(known))}; "
            "or pass a path to a .toml or config.json)"
        )
    p = known[name_or_path]
    return model_from_dict(read_toml(p), str(p), p.stem)
