"""ModelSpec: the shape of a decoder-only transformer, from the catalog, a TOML or an HF config.json
(ghsim/hf_config.py translates those per architecture)."""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import Any

from ghsim.errors import GhsimError
from ghsim.tomlio import read_json, read_toml, repo_root

MODELS_DIR = repo_root() / "models"


class MlpKind(str, Enum):
    """The MLP: gated (3 matrices: SwiGLU, or GeGLU as Gemma's) or not (2 matrices, GPT/Phi)."""

    SWIGLU = "swiglu"
    GEGLU = "geglu"
    GELU = "gelu"


class NormKind(str, Enum):
    RMSNORM = "rmsnorm"
    LAYERNORM = "layernorm"  # weight and bias


class PositionKind(str, Enum):
    ROPE = "rope"
    LEARNED = "learned"


class Bias(str, Enum):
    """Which linear layers carry a bias (counted in the parameters; the graph does not price them)."""

    NONE = "none"
    QKV = "qkv"  # Qwen2: q, k, v only
    ALL = "all"  # Phi-2, GPT-OSS attention: every projection


# Bounds on a model's sizes: far above any published model, low enough that the graph's
# arithmetic stays exact and a typo (10**400, 10**9 layers) is refused in one line.
MAX_DIM = 1 << 20  # hidden, FFN, head sizes
MAX_VOCAB = 1 << 24
MAX_LAYERS = 10_000
MAX_EXPERTS = 1 << 16
MAX_SEQ = 1 << 26


@dataclass(frozen=True)
class MoESpec:
    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    # always-on experts beside the routed ones (Qwen2-MoE, DeepSeek): their FFN width in all
    shared_intermediate_size: int = 0
    # the first layers keep a dense MLP of intermediate_size (DeepSeek's first_k_dense_replace)
    dense_layers: int = 0


@dataclass(frozen=True)
class MLASpec:
    """DeepSeek-V2/V3 multi-head latent attention: q and kv through low-rank latents."""

    q_lora_rank: int  # 0: q projected directly (DeepSeek-V2-Lite)
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int


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
    mlp: MlpKind = MlpKind.SWIGLU
    norm: NormKind = NormKind.RMSNORM
    position: PositionKind = PositionKind.ROPE
    max_seq_len: int = 4096
    moe: MoESpec | None = None
    # hidden and attention dropout probability in training (Megatron's --hidden-dropout and
    # --attention-dropout); the fused-kernel builder prices its masks and kernels, eager ignores it
    dropout: float = 0.0
    bias: Bias = Bias.NONE
    norms_per_layer: int = 2  # Phi's parallel block: 1; Gemma-2: 4 (pre and post norms)
    qk_norm: bool = False  # Qwen3: RMSNorm of q and k per head
    rotary_fraction: float = 1.0  # Phi: rotary embedding on part of each head
    sliding_window: int = 0  # tokens; 0: full attention
    sliding_window_pattern: str = "all"  # which layers have the window: "all", or "alternate" (Gemma-2, GPT-OSS)
    mla: MLASpec | None = None

    # --- parameter counts (elements); cached: the plan search asks for them per candidate --
    @cached_property
    def q_dim(self) -> int:
        if self.mla is not None:
            return self.num_attention_heads * (self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim)
        return self.num_attention_heads * self.head_dim

    @cached_property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @cached_property
    def attention_params(self) -> int:
        if self.mla is not None:
            return self._mla_params
        h = self.hidden_size
        # q, k, v, o projections (no biases in Llama-style models)
        weights = h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h
        biases = {Bias.NONE: 0, Bias.QKV: self.q_dim + 2 * self.kv_dim,
                  Bias.ALL: self.q_dim + 2 * self.kv_dim + h}[self.bias]
        return weights + biases + (2 * self.head_dim if self.qk_norm else 0)

    @cached_property
    def _mla_params(self) -> int:
        a, h, heads = self.mla, self.hidden_size, self.num_attention_heads
        qk_head = a.qk_nope_head_dim + a.qk_rope_head_dim
        q = (h * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * heads * qk_head if a.q_lora_rank
             else h * heads * qk_head)  # (the latent's RMSNorm weight included)
        kv = h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank \
            + a.kv_lora_rank * heads * (a.qk_nope_head_dim + a.v_head_dim)
        return q + kv + heads * a.v_head_dim * h

    @cached_property
    def mlp_matrices(self) -> int:
        return 2 if self.mlp == MlpKind.GELU else 3

    def _ffn_params(self, width: int) -> int:
        biases = (width * (self.mlp_matrices - 1) + self.hidden_size) if self.bias == Bias.ALL else 0
        return self.mlp_matrices * self.hidden_size * width + biases

    @cached_property
    def dense_mlp_params(self) -> int:
        return self._ffn_params(self.intermediate_size)

    @cached_property
    def expert_params(self) -> int:
        """Parameters of one routed expert (MoE only)."""
        assert self.moe is not None
        return self._ffn_params(self.moe.expert_intermediate_size)

    @cached_property
    def shared_expert_params(self) -> int:
        m = self.moe
        return self._ffn_params(m.shared_intermediate_size) if m and m.shared_intermediate_size else 0

    @cached_property
    def mlp_params(self) -> int:
        """The MLP of one MoE layer (of every layer when dense)."""
        if self.moe is None:
            return self.dense_mlp_params
        router = self.hidden_size * self.moe.num_experts
        return self.moe.num_experts * self.expert_params + self.shared_expert_params + router

    @cached_property
    def norm_params(self) -> int:
        per_norm = self.hidden_size * (2 if self.norm == NormKind.LAYERNORM else 1)
        return self.norms_per_layer * per_norm

    @cached_property
    def layer_params(self) -> int:
        """One layer as the simulator builds it (an MoE layer when the model has experts)."""
        return self.attention_params + self.mlp_params + self.norm_params

    @cached_property
    def dense_layers(self) -> int:
        return self.num_layers if self.moe is None else self.moe.dense_layers

    @cached_property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @cached_property
    def lm_head_params(self) -> int:
        return 0 if self.tie_embeddings else self.vocab_size * self.hidden_size

    @cached_property
    def total_params(self) -> int:
        final_norm = self.hidden_size * (2 if self.norm == NormKind.LAYERNORM else 1)
        dense_extra = (self.dense_mlp_params - self.mlp_params) * self.dense_layers if self.moe else 0
        return (
            self.num_layers * self.layer_params
            + dense_extra
            + self.embedding_params
            + self.lm_head_params
            + final_norm
        )

    @cached_property
    def active_params_per_token(self) -> int:
        """Parameters one token touches (MoE: only its top-k experts, and the shared ones)."""
        if self.moe is None:
            return self.total_params
        inactive = (self.moe.num_experts - self.moe.experts_per_token) * self.expert_params
        return self.total_params - (self.num_layers - self.moe.dense_layers) * inactive

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key, value in d.items():
            if isinstance(value, Enum):
                d[key] = value.value
        d["total_params"] = self.total_params
        return d


def simulator_gap(model: ModelSpec) -> str | None:
    """What the simulator's op graph does not build for this model (None: nothing). The
    parameter counts cover it; a step time would silently price something else."""
    if model.mla is not None:
        return "multi-head latent attention (MLA: kv_lora_rank, q_lora_rank)"
    if model.moe is not None and model.moe.dense_layers:
        return f"dense layers before the MoE layers ({model.moe.dense_layers} of {model.num_layers})"
    return None


def simulation_notes(model: ModelSpec, seq: int) -> list[str]:
    """What the simulator prices approximately for this model at sequence length `seq`."""
    notes = []
    if 0 < model.sliding_window < seq:
        layers = "every layer" if model.sliding_window_pattern == "all" else "alternate layers"
        notes.append(f"{model.name}'s sliding-window attention ({model.sliding_window} tokens, {layers}): flash "
                     "kernels (Megatron/TE) skip the pairs outside the window; PyTorch SDPA (eager frameworks) gets "
                     "a boolean mask from Hugging Face and computes every pair")
    if model.mlp == MlpKind.GEGLU:
        notes.append("GeGLU MLP priced with SwiGLU's kernels (same bytes and GEMMs)")
    counted_only = [what for what, present in (
        (f"{model.bias.value} biases", model.bias != Bias.NONE), ("q/k norms", model.qk_norm),
        (f"{model.norms_per_layer} norms per layer", model.norms_per_layer != 2),
        (f"rotary on {model.rotary_fraction:g} of each head", model.rotary_fraction < 1)) if present]
    if counted_only:
        notes.append(f"{model.name}: {', '.join(counted_only)}: in the parameter count, not in the kernels "
                     "(priced as two norms, no biases, full rotary)")
    return notes


# --- reading a model table (models/*.toml, validation cases, hf_config.py) --------------------

def shown(value: Any) -> str:
    """A bad value as an error message shows it: short, one line, no Python type names."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**12:
        return f"a {len(str(abs(value))) if abs(value) < 10**4000 else 'huge'}-digit number"
    text = repr(value) if isinstance(value, str) else str(value)
    text = " ".join(text.split())
    return text if len(text) <= 40 else text[:37] + "..."


def bounded_int(d: dict[str, Any], key: str, where: str, limit: int, minimum: int = 1) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise GhsimError(f"{where}: '{key}' must be {what}, got {shown(v)}")
    if v > limit:
        raise GhsimError(f"{where}: '{key}' = {shown(v)} is beyond what ghsim models (at most {limit})")
    return v


def _flag(d: dict[str, Any], key: str, where: str) -> bool:
    v = d.get(key, False)
    if not isinstance(v, bool):
        raise GhsimError(f"{where}: '{key}' must be true or false, got {shown(v)}")
    return v


def _choice(d: dict[str, Any], key: str, kind: type[Enum], where: str) -> Any:
    allowed = [k.value for k in kind]
    v = d.get(key, allowed[0])
    if not isinstance(v, str) or v not in allowed:
        raise GhsimError(f"{where}: '{key}' must be one of {', '.join(allowed)}, got {shown(v)}")
    return kind(v)


def _fraction(d: dict[str, Any], key: str, where: str, default: float, low: float, high: float,
              closed_high: bool) -> float:
    v = d.get(key, default)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and low <= v and (v <= high if closed_high
                                                                                   else v < high)
    if not ok:
        bracket = "]" if closed_high else ")"
        raise GhsimError(f"{where}: '{key}' must be a number in [{low:g}, {high:g}{bracket}, got {shown(v)}")
    return float(v)


_REQUIRED = ("hidden_size", "intermediate_size", "num_layers", "num_attention_heads", "vocab_size")
_OPTIONAL = ("name", "aliases", "source", "notes", "sliding_window_pattern", "num_kv_heads", "head_dim",
             "tie_embeddings", "mlp", "norm", "position", "max_seq_len", "moe", "dropout", "bias",
             "norms_per_layer", "qk_norm", "rotary_fraction", "sliding_window", "mla")
_MOE_FIELDS = ("num_experts", "experts_per_token", "expert_intermediate_size", "shared_intermediate_size",
               "dense_layers")
_MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


WINDOW_PATTERNS = {"all": 1.0, "alternate": 0.5}  # share of the layers with the sliding window


def _window_pattern(d: dict[str, Any], where: str) -> str:
    value = d.get("sliding_window_pattern", "all")
    if value not in WINDOW_PATTERNS:
        raise GhsimError(f"{where}: 'sliding_window_pattern' must be one of {', '.join(WINDOW_PATTERNS)}, got {value!r}")
    return value


def _known_fields(d: dict[str, Any], known: tuple[str, ...], where: str) -> None:
    """A misspelt field would silently fall back to its default: refuse it, naming the nearest."""
    for key in d:
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean '{near[0]}'?" if near else ""
            raise GhsimError(f"{where}: unknown field {shown(key)}{hint}")


def _moe_from(m: Any, where: str, num_layers: int) -> MoESpec:
    where = where + " [moe]"
    if not isinstance(m, dict):
        raise GhsimError(f"{where} must be a table")
    _known_fields(m, _MOE_FIELDS, where)
    moe = MoESpec(
        num_experts=bounded_int(m, "num_experts", where, MAX_EXPERTS),
        experts_per_token=bounded_int(m, "experts_per_token", where, MAX_EXPERTS),
        expert_intermediate_size=bounded_int(m, "expert_intermediate_size", where, MAX_DIM),
        shared_intermediate_size=bounded_int(m, "shared_intermediate_size", where, MAX_DIM, 0)
        if "shared_intermediate_size" in m else 0,
        dense_layers=bounded_int(m, "dense_layers", where, MAX_LAYERS, 0) if "dense_layers" in m else 0,
    )
    if moe.experts_per_token > moe.num_experts:
        raise GhsimError(f"{where}: experts_per_token exceeds num_experts")
    if moe.dense_layers >= num_layers:
        raise GhsimError(f"{where}: dense_layers ({moe.dense_layers}) leaves no MoE layer of {num_layers}")
    return moe


def _mla_from(a: Any, where: str) -> MLASpec:
    where = where + " [mla]"
    if not isinstance(a, dict):
        raise GhsimError(f"{where} must be a table")
    _known_fields(a, _MLA_FIELDS, where)
    return MLASpec(q_lora_rank=bounded_int(a, "q_lora_rank", where, MAX_DIM, 0) if "q_lora_rank" in a else 0,
                   kv_lora_rank=bounded_int(a, "kv_lora_rank", where, MAX_DIM),
                   qk_rope_head_dim=bounded_int(a, "qk_rope_head_dim", where, MAX_DIM),
                   qk_nope_head_dim=bounded_int(a, "qk_nope_head_dim", where, MAX_DIM),
                   v_head_dim=bounded_int(a, "v_head_dim", where, MAX_DIM))


def _heads(d: dict[str, Any], where: str, hidden: int) -> tuple[int, int, int]:
    """(attention heads, kv heads, head size), checked against each other and the hidden size."""
    heads = bounded_int(d, "num_attention_heads", where, MAX_DIM)
    kv_heads = bounded_int(d, "num_kv_heads", where, MAX_DIM) if "num_kv_heads" in d else heads
    if "head_dim" in d:
        head_dim = bounded_int(d, "head_dim", where, MAX_DIM)
    else:
        if hidden % heads:
            raise GhsimError(f"{where}: num_attention_heads ({heads}) does not divide hidden_size ({hidden})")
        head_dim = hidden // heads
    if heads % kv_heads:
        raise GhsimError(f"{where}: num_kv_heads ({kv_heads}) does not divide num_attention_heads ({heads})")
    return heads, kv_heads, head_dim


def model_from_dict(d: dict[str, Any], where: str, default_name: str = "custom") -> ModelSpec:
    """Build a ModelSpec from a models/*.toml style dict; `where` names the source in errors."""
    if not isinstance(d, dict):
        raise GhsimError(f"{where}: a model must be a table of fields")
    _known_fields(d, _REQUIRED + _OPTIONAL, where)
    for key in _REQUIRED:
        if key not in d:
            raise GhsimError(f"{where}: missing field '{key}'")
    hidden = bounded_int(d, "hidden_size", where, MAX_DIM)
    heads, kv_heads, head_dim = _heads(d, where, hidden)
    layers = bounded_int(d, "num_layers", where, MAX_LAYERS)
    return ModelSpec(
        name=str(d.get("name", default_name)),
        hidden_size=hidden,
        intermediate_size=bounded_int(d, "intermediate_size", where, MAX_DIM),
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=bounded_int(d, "vocab_size", where, MAX_VOCAB),
        tie_embeddings=_flag(d, "tie_embeddings", where),
        mlp=_choice(d, "mlp", MlpKind, where),
        norm=_choice(d, "norm", NormKind, where),
        position=_choice(d, "position", PositionKind, where),
        max_seq_len=bounded_int(d, "max_seq_len", where, MAX_SEQ) if "max_seq_len" in d else 4096,
        moe=_moe_from(d["moe"], where, layers) if "moe" in d else None,
        dropout=_fraction(d, "dropout", where, 0.0, 0.0, 1.0, closed_high=False),
        bias=_choice(d, "bias", Bias, where),
        norms_per_layer=bounded_int(d, "norms_per_layer", where, 4) if "norms_per_layer" in d else 2,
        qk_norm=_flag(d, "qk_norm", where),
        rotary_fraction=_fraction(d, "rotary_fraction", where, 1.0, 0.0, 1.0, closed_high=True),
        sliding_window=bounded_int(d, "sliding_window", where, MAX_SEQ, 0) if "sliding_window" in d else 0,
        sliding_window_pattern=_window_pattern(d, where),
        mla=_mla_from(d["mla"], where) if "mla" in d else None,
    )


# --- names --------------------------------------------------------------------------------------

def catalog() -> dict[str, Path]:
    """Model names (and aliases) in models/ mapped to their files; names are lower case."""
    names: dict[str, Path] = {}
    for path in sorted(MODELS_DIR.glob("*.toml")):
        names[path.stem.lower()] = path
        try:
            aliases = read_toml(path).get("aliases", [])
        except GhsimError:
            continue
        for alias in aliases:
            names.setdefault(str(alias).lower(), path)
    return names


def resolve_name(name: str) -> Path:
    """The catalog file of a model name or alias, in any letter case."""
    known = catalog()
    key = name.strip().lower()
    if key in known:
        return known[key]
    near = difflib.get_close_matches(key, list(known), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(n) for n in near)}?" if near else "see `ghsim models`"
    raise GhsimError(f"unknown model {shown(name)}; {hint} (or pass a model .toml, a config.json or its folder)")


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog name, a model TOML, an HF config.json, or a folder holding one."""
    from ghsim.hf_config import model_from_hf_config  # (hf_config builds on this module)

    path = Path(name_or_path)
    if path.is_dir() and (path / "config.json").is_file():
        config = path / "config.json"
        return model_from_hf_config(read_json(config), str(config), path.resolve().name)
    if path.is_dir() and name_or_path.strip().lower() not in catalog():
        raise GhsimError(f"{path}: a model folder must hold a Hugging Face config.json")
    if path.suffix == ".json":
        name = path.parent.resolve().name if path.name == "config.json" else path.stem
        return model_from_hf_config(read_json(path), str(path), name)
    if path.suffix == ".toml":
        return model_from_dict(read_toml(path), str(path), path.stem)
    p = resolve_name(name_or_path)
    return model_from_dict(read_toml(p), str(p), p.stem)
