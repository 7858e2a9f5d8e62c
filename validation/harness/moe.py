"""Mixture-of-experts MLP with expert parallelism (all-to-all), for ghsim validation runs.

The MoE decoder layer is the harness Llama layer (model.py) with its SwiGLU MLP
replaced by `MoEMLP`:

* router: `nn.Linear(h, E, bias=False)` (under autocast: a bf16 GEMM), softmax
  in fp32, top-k experts per token, the k gate weights renormalised to sum to 1
  (Mixtral style).  No capacity limit, no token dropping, no auxiliary
  load-balancing loss (random weights and random tokens route about evenly;
  the per-expert token counts of the last step are kept in measured_extra.json).
* dispatch (forward): the hidden state is cast to bf16 when autocast is on (the
  tokens travel in bf16, as in Megatron), the T*k (token, expert) pairs are
  sorted by expert (argsort), the rows gathered (index_select) and, with expert
  parallelism over `ep` ranks, sent to the rank that owns their expert with one
  `all_to_all_single` (uneven splits; the per-expert counts go first in a small
  all_to_all_single of int64, whose `.tolist()` is a host sync, as in real
  dropless implementations).  The received rows are regrouped by local expert
  (one more index_select).
* experts: each rank holds E/ep experts, each a SwiGLU MLP
  down(silu(gate(x)) * up(x)) of width `expert_intermediate_size`, run one
  after the other on their contiguous slice of rows (a Python loop, E/ep GEMM
  triples; no grouped GEMM).
* combine: the inverse of dispatch: un-group, `all_to_all_single` back,
  un-sort (index_copy into the T*k order), multiply by the gate weights and
  sum over the k choices.
* backward: the two all-to-alls are an autograd Function whose backward is the
  all-to-all with the splits swapped, so backward has two all-to-alls too.

Data parallelism: the non-expert parameters (attention, norms, router,
embedding, LM head) are replicated and their gradients all-reduced by
DistributedDataParallel (expert parameters excluded with
`_set_params_and_buffers_to_ignore_for_model`): with ep == dp every expert lives
on exactly one rank and needs no reduction.  The all-to-alls run on their own
process group (a second NCCL communicator).  (Expert gradients are the sum over the
ranks' losses while DDP averages the others; irrelevant to timing, not rescaled.)
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from model import Attention, ModelConfig, RMSNorm, LlamaModel, _linear  # noqa: F401


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.out_splits, ctx.in_splits, ctx.group = out_splits, in_splits, group
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        gi = g.new_empty((sum(ctx.in_splits),) + tuple(g.shape[1:]))
        dist.all_to_all_single(gi, g.contiguous(), ctx.in_splits, ctx.out_splits, group=ctx.group)
        return gi, None, None, None


def all_to_all(x, out_splits, in_splits, group):
    return _AllToAll.apply(x, out_splits, in_splits, group)


class Expert(nn.Module):
    def __init__(self, h, f):
        super().__init__()
        self.gate_proj = nn.Linear(h, f, bias=False)
        self.up_proj = nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoEMLP(nn.Module):
    """Top-k MoE MLP; this rank holds experts [rank*E/ep, (rank+1)*E/ep)."""

    def __init__(self, h, f, num_experts, top_k, ep=1, ep_rank=0, group=None):
        super().__init__()
        assert num_experts % ep == 0
        self.E, self.k, self.ep, self.ep_rank, self.group = num_experts, top_k, ep, ep_rank, group
        self.n_local = num_experts // ep
        self.router = nn.Linear(h, num_experts, bias=False)
        self.experts = nn.ModuleList([Expert(h, f) for _ in range(self.n_local)])
        self.last_counts = None

    def forward(self, x):
        b, s, h = x.shape
        xt = x.reshape(-1, h)
        if torch.is_autocast_enabled(x.device.type):
            xt = xt.to(torch.bfloat16)
        T = xt.shape[0]
        logits = self.router(xt)
        probs = torch.softmax(logits.float(), dim=-1)
        w, idx = torch.topk(probs, self.k, dim=-1)  # (T, k)
        w = w / w.sum(-1, keepdim=True)
        flat_e = idx.reshape(-1)  # (T*k,) expert of each pair
        order = torch.argsort(flat_e, stable=True)
        tok = order // self.k  # token of each sorted pair
        xs = xt.index_select(0, tok)  # (T*k, h) sorted by expert
        counts = torch.bincount(flat_e, minlength=self.E)  # per global expert, from this rank
        if self.ep > 1:
            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts, group=self.group)  # [src][local expert]
            send_splits = counts.view(self.ep, self.n_local).sum(1).tolist()
            rc = recv_counts.view(self.ep, self.n_local)
            recv_splits = rc.sum(1).tolist()
            xr = all_to_all(xs, recv_splits, send_splits, self.group)
            # regroup received rows (src-major, expert-minor) to expert-major
            rc_list = rc.tolist()
            starts, off = [], 0
            for src in range(self.ep):
                row = []
                for e in range(self.n_local):
                    row.append(off)
                    off += rc_list[src][e]
                starts.append(row)
            perm_parts, local_counts = [], []
            for e in range(self.n_local):
                n_e = 0
                for src in range(self.ep):
                    c = rc_list[src][e]
                    if c:
                        perm_parts.append(torch.arange(starts[src][e], starts[src][e] + c, device=x.device))
                    n_e += c
                local_counts.append(n_e)
            perm = torch.cat(perm_parts) if perm_parts else torch.zeros(0, dtype=torch.long, device=x.device)
            xe = xr.index_select(0, perm)
        else:
            local_counts = counts.tolist()
            xe = xs
        self.last_counts = local_counts
        outs, off = [], 0
        for e, n in enumerate(local_counts):
            if n:
                outs.append(self.experts[e](xe[off:off + n]))
            off += n
        ye = torch.cat(outs) if outs else xe.new_zeros((0, h))
        ye = ye.to(xs.dtype)
        if self.ep > 1:
            yr = torch.empty_like(ye).index_copy(0, perm, ye) if len(perm) else ye
            ys = all_to_all(yr, send_splits, recv_splits, self.group)
        else:
            ys = ye
        y = torch.empty_like(ys).index_copy(0, order, ys)  # back to (token, choice) order
        y = (y.view(T, self.k, h) * w.unsqueeze(-1).to(y.dtype)).sum(1)
        return y.view(b, s, h)


class MoEDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, moe: dict, ep, ep_rank, group):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = MoEMLP(cfg.hidden_size, moe["expert_intermediate_size"], moe["num_experts"],
                          moe["experts_per_token"], ep, ep_rank, group)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x


def build_moe_model(cfg: ModelConfig, moe: dict, device, ep=1, ep_rank=0, group=None) -> LlamaModel:
    """The harness LlamaModel with MoE layers (experts sharded over ep ranks)."""
    with torch.device(device):
        m = LlamaModel(ModelConfig(**{**cfg.__dict__, "num_layers": 0}))
        m.cfg = cfg
        m.layers = nn.ModuleList([MoEDecoderLayer(cfg, moe, ep, ep_rank, group) for _ in range(cfg.num_layers)])
    return m
