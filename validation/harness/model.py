"""Llama-style decoder in plain PyTorch, random weights, for ghsim validation runs.

What is in it (and exactly what each option does):

* token embedding -> N decoder layers -> final RMSNorm -> untied LM head ->
  cross-entropy in fp32 over the vocabulary (logits are cast with .float()).
* RMSNorm is the eager composite used by Hugging Face Llama: upcast to fp32,
  x.pow(2).mean(-1), rsqrt(var + eps), multiply, cast back to the input dtype,
  multiply by the weight.  Several small elementwise kernels, as in real runs.
* Rotary embedding is eager (HF style): q*cos + rotate_half(q)*sin, cos/sin
  precomputed in fp32 and cast to q's dtype.
* Attention: separate q, k, v projections, GQA through
  F.scaled_dot_product_attention(is_causal=True, enable_gqa=True) when the
  installed PyTorch accepts it (else k, v are repeat_interleave'd, HF style);
  the backend is whatever PyTorch picks (not forced).
* SwiGLU MLP: down(silu(gate(x)) * up(x)), separate gate and up projections.

Options:

* lora_rank r > 0: every q, k, v, o, gate, up, down projection gets a LoRA
  adapter (A: r x in, kaiming-uniform; B: out x r, random small non-zero so the
  adapter path does real work), scaling alpha/r with alpha = 2r.  All base
  weights (projections, embedding, LM head, norm weights) are frozen
  (requires_grad=False).  When `base_dtype` is bf16 the frozen base weights are
  stored in bf16 (norm weights too); adapters stay fp32 (master) and run under
  autocast.  Only adapter parameters go to the optimizer.
* recompute = "full": torch.utils.checkpoint.checkpoint(layer, use_reentrant=False)
  around every decoder layer.  recompute = "selective": checkpoint around the
  attention core only (the SDPA call), so its output is recomputed in backward.
* fp8 = True: the seven projections of every decoder layer use Fp8Linear:
  forward quantises activation and weight to float8_e4m3fn with dynamic
  per-tensor scales (amax of the current tensor, scale = 448/amax) and calls
  torch._scaled_mm (bf16 out).  Backward (fp8_backward=True, default) quantises
  the output gradient to float8_e5m2 (scale = 57344/amax) and computes
  dgrad = g8 @ w8 and wgrad = g8^T @ x8 with torch._scaled_mm (the saved fp8
  copies are transposed to the layouts cuBLAS needs), wgrad in fp32.
  With fp8_backward=False the backward runs in bf16 from the saved fp8 copies
  (dequantised).  Embedding, LM head, attention core, norms stay bf16/fp32
  under autocast.  Master weights stay fp32 (torch-amp style).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


@dataclass
class ModelConfig:
    name: str = "llama"
    hidden_size: int = 2048
    intermediate_size: int = 5632
    num_layers: int = 22
    num_attention_heads: int = 32
    num_kv_heads: int = 4
    head_dim: int = 0  # 0 -> hidden/heads
    vocab_size: int = 32000
    max_seq_len: int = 4096
    tie_embeddings: bool = False
    source: str = "synthetic"
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def n_params(self) -> int:
        h, f, hd = self.hidden_size, self.intermediate_size, self.hd
        q = h * self.num_attention_heads * hd
        kv = 2 * h * self.num_kv_heads * hd
        o = self.num_attention_heads * hd * h
        mlp = 3 * h * f
        layer = q + kv + o + mlp + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_embeddings else 2)
        return self.num_layers * layer + emb + h

    def toml_dict(self) -> dict:
        return {
            "name": self.name,
            "source": self.source,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_layers": self.num_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.hd,
            "vocab_size": self.vocab_size,
            "tie_embeddings": self.tie_embeddings,
            "max_seq_len": self.max_seq_len,
        }


_GQA_OK: bool | None = None


def gqa_supported() -> bool:
    """Whether F.scaled_dot_product_attention accepts enable_gqa=True here."""
    global _GQA_OK
    if _GQA_OK is None:
        try:
            q = torch.randn(1, 4, 16, 16)
            k = torch.randn(1, 2, 16, 16)
            F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
            _GQA_OK = True
        except Exception:
            _GQA_OK = False
    return _GQA_OK


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.to(torch.float32)
        var = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + self.eps)
        return self.weight * x.to(dt)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(q, k, cos, sin):
    cos = cos.to(q.dtype)
    sin = sin.to(q.dtype)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


# ----------------------------------------------------------------------------- FP8
E4M3_MAX = 448.0
E5M2_MAX = 57344.0


def _quant(t: torch.Tensor, dtype, fmax: float):
    amax = t.detach().abs().amax().float().clamp(min=1e-12)
    scale = fmax / amax
    q = (t.float() * scale).clamp(-fmax, fmax).to(dtype) if t.dtype != torch.float32 \
        else (t * scale).clamp(-fmax, fmax).to(dtype)
    return q, scale.reciprocal()


def _mm8(a, b, sa, sb, out_dtype):
    """a (M,K) row-major fp8, b (K,N) column-major fp8."""
    if a.device.type == "cpu" and not _CPU_SCALED_MM:
        return ((a.float() * sa) @ (b.float() * sb)).to(out_dtype)
    return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)


def _probe_cpu_scaled_mm() -> bool:
    try:
        a = torch.randn(16, 16).to(torch.float8_e4m3fn)
        b = torch.randn(16, 16).to(torch.float8_e4m3fn).t()
        one = torch.tensor(1.0)
        torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return True
    except Exception:
        return False


_CPU_SCALED_MM = _probe_cpu_scaled_mm()


class _Fp8LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, fp8_bwd: bool):
        shp = x.shape
        x2 = x.reshape(-1, shp[-1])
        x8, sx = _quant(x2, torch.float8_e4m3fn, E4M3_MAX)
        w8, sw = _quant(w, torch.float8_e4m3fn, E4M3_MAX)
        out = _mm8(x8, w8.t(), sx, sw, torch.bfloat16)
        ctx.save_for_backward(x8, sx, w8, sw)
        ctx.fp8_bwd = fp8_bwd
        ctx.x_dtype = x.dtype
        ctx.w_dtype = w.dtype
        ctx.shp = shp
        return out.reshape(*shp[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, g):
        x8, sx, w8, sw = ctx.saved_tensors
        g2 = g.reshape(-1, g.shape[-1])
        if ctx.fp8_bwd:
            g8, sg = _quant(g2, torch.float8_e5m2, E5M2_MAX)
            # dgrad: (M,N) @ (N,K); b must be column-major (N,K)
            dx = _mm8(g8, w8.t().contiguous().t(), sg, sw, torch.bfloat16)
            # wgrad: (N,M) @ (M,K); a row-major (N,M), b column-major (M,K)
            dw = _mm8(g8.t().contiguous(), x8.t().contiguous().t(), sg, sx, torch.float32)
        else:
            gb = g2.to(torch.bfloat16)
            wb = (w8.to(torch.bfloat16) * sw.to(torch.bfloat16))
            xb = (x8.to(torch.bfloat16) * sx.to(torch.bfloat16))
            dx = gb @ wb
            dw = (gb.t() @ xb).float()
        return dx.reshape(*ctx.shp).to(ctx.x_dtype), dw.to(ctx.w_dtype), None


class Fp8Linear(nn.Linear):
    fp8_backward = True

    def forward(self, x):
        return _Fp8LinearFn.apply(x, self.weight, self.fp8_backward)


# ----------------------------------------------------------------------------- LoRA
class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, r: int):
        super().__init__()
        self.base = base
        self.base.weight.requires_grad_(False)
        self.r = r
        self.scaling = 2.0  # alpha = 2r
        dev = base.weight.device
        self.lora_a = nn.Parameter(torch.empty(r, base.in_features, device=dev))
        self.lora_b = nn.Parameter(torch.randn(base.out_features, r, device=dev) * 1e-3)
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))

    def forward(self, x):
        return self.base(x) + F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scaling


# ----------------------------------------------------------------------------- layers
def _linear(i, o, fp8):
    return Fp8Linear(i, o, bias=False) if fp8 else nn.Linear(i, o, bias=False)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, fp8=False, selective=False):
        super().__init__()
        h, hd = cfg.hidden_size, cfg.hd
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_kv_heads, hd
        self.q_proj = _linear(h, self.nh * hd, fp8)
        self.k_proj = _linear(h, self.nkv * hd, fp8)
        self.v_proj = _linear(h, self.nkv * hd, fp8)
        self.o_proj = _linear(self.nh * hd, h, fp8)
        self.selective = selective

    def core(self, q, k, v):
        if self.nkv != self.nh:
            if gqa_supported():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            rep = self.nh // self.nkv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.nkv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, k, cos, sin)
        if self.selective and torch.is_grad_enabled():
            o = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            o = self.core(q, k, v)
        o = o.transpose(1, 2).reshape(b, s, self.nh * self.hd)
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, fp8=False):
        super().__init__()
        h, f = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = _linear(h, f, fp8)
        self.up_proj = _linear(h, f, fp8)
        self.down_proj = _linear(f, h, fp8)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, fp8=False, selective=False):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn = Attention(cfg, fp8, selective)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = MLP(cfg, fp8)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, recompute: str = "none", lora_rank: int = 0,
                 fp8: bool = False, fp8_backward: bool = True, base_dtype=None):
        super().__init__()
        self.cfg = cfg
        self.recompute = recompute
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            [DecoderLayer(cfg, fp8, recompute == "selective") for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        nn.init.normal_(self.embed_tokens.weight, std=0.02)
        Fp8Linear.fp8_backward = fp8_backward
        hd = cfg.hd
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        t = torch.arange(cfg.max_seq_len, dtype=torch.float32)
        freqs = torch.outer(t, inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)
        if lora_rank > 0:
            for p in self.parameters():
                p.requires_grad_(False)
            if base_dtype is not None:
                self.to(base_dtype)
                self.cos_cached = self.cos_cached.float()
                self.sin_cached = self.sin_cached.float()
            for layer in self.layers:
                a, m = layer.self_attn, layer.mlp
                for mod, names in ((a, ("q_proj", "k_proj", "v_proj", "o_proj")),
                                   (m, ("gate_proj", "up_proj", "down_proj"))):
                    for n in names:
                        base = getattr(mod, n)
                        setattr(mod, n, LoRALinear(base, lora_rank))

    def forward(self, tokens, labels):
        s = tokens.shape[1]
        cos = self.cos_cached[:s]
        sin = self.sin_cached[:s]
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            if self.recompute == "full" and torch.is_grad_enabled():
                x = checkpoint(layer, x, cos, sin, use_reentrant=False)
            else:
                x = layer(x, cos, sin)
        x = self.norm(x)
        logits = self.lm_head(x).float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


def build_model(cfg: ModelConfig, device, recompute="none", lora_rank=0, fp8=False,
                fp8_backward=True, base_dtype=None) -> LlamaModel:
    with torch.device(device):
        m = LlamaModel(cfg, recompute, lora_rank, fp8, fp8_backward, base_dtype)
    return m


def fp8_selfcheck(device="cuda") -> dict:
    """Relative error of Fp8Linear forward/backward against an fp32 reference."""
    torch.manual_seed(0)
    x = torch.randn(256, 512, device=device, requires_grad=True)
    w = torch.randn(384, 512, device=device, requires_grad=True)
    g = torch.randn(256, 384, device=device)
    res = {}
    for bwd in (True, False):
        x.grad = None
        w.grad = None
        y = _Fp8LinearFn.apply(x, w, bwd)
        y.backward(g)
        xr = x.detach().clone().requires_grad_(True)
        wr = w.detach().clone().requires_grad_(True)
        yr = xr @ wr.t()
        yr.backward(g)
        rel = lambda a, b: float((a.float() - b.float()).norm() / b.float().norm())
        res["fp8_bwd" if bwd else "bf16_bwd"] = {
            "fwd": rel(y, yr), "dgrad": rel(x.grad, xr.grad), "wgrad": rel(w.grad, wr.grad)}
    return res
