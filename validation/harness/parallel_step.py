"""Tensor-, pipeline- and expert-parallel training steps; writes validation/cases/<name>/.

    torchrun --standalone --nproc_per_node N validation/harness/parallel_step.py --spec '{...}'
    torchrun --standalone --nproc_per_node 2 validation/harness/parallel_step.py --spec '{...}' --tiny  # CPU, gloo

(cases.py starts it for specs whose mode is tp, pp or ep.)  Same model, data
and measurement as train_step.py (model.py: Llama-style decoder, random
weights, random tokens; bf16 autocast over fp32 parameters, "torch-amp";
AdamW foreach; no gradient clipping).  Spec keys as train_step.py plus:

mode = "tp": tensor parallelism over all ranks with PyTorch DTensor
  (torch.distributed.tensor.parallel.parallelize_module on a 1-D DeviceMesh):
  ColwiseParallel for q_proj, k_proj, v_proj, gate_proj, up_proj,
  RowwiseParallel for o_proj and down_proj (their outputs all-reduced), the
  embedding RowwiseParallel (vocabulary-sharded, input replicated), the LM head
  ColwiseParallel with vocabulary-sharded logits (use_local_output=False) and
  the loss under torch.distributed.tensor.parallel.loss_parallel() (cross-entropy
  over the sharded vocabulary).  Attention heads and kv heads are split over
  the ranks (the local module's head counts are divided by tp).
  sequence_parallel = true adds SequenceParallel on the two RMSNorms of each
  layer and the final norm, PrepareModuleInput (Shard(1) -> Replicate, an
  all-gather) in front of attention and MLP, RowwiseParallel(output_layouts=Shard(1))
  (a reduce-scatter) for o/down and the embedding, as torchtitan's Llama plan.
  All ranks see the same tokens (dp = 1); global batch = micro_batch.
mode = "pp": a pipeline of `pp` = world-size stages, the decoder layers split
  evenly (stage 0 also holds the embedding, the last stage the final norm, LM
  head and loss); `pp_microbatches` micro-batches of `micro_batch` sequences per
  step (global batch = micro_batch * pp_microbatches, dp = 1).
  pp_impl = "torch-pipelining": torch.distributed.pipelining.PipelineStage with
  Schedule1F1B (pp_schedule "1f1b") or ScheduleGPipe ("gpipe"); loss_fn =
  fp32 cross-entropy of the micro-batch, gradients scaled by 1/n_microbatches
  (scale_grads, the default); step(..., return_outputs=False) where the
  installed version accepts it.  The stage shapes are inferred at the first step
  (runtime shape inference, the default); pp_static_shapes = true passes
  input_args/output_args instead (torch 2.13 then sent no input gradients back
  in a CPU test: left off).
  pp_impl = "manual": an explicit non-interleaved 1F1B (Megatron-LM's
  forward_backward_pipelining_without_interleaving): stage r runs
  min(pp-r-1, M) warm-up forwards, then one-forward-one-backward, then the
  remaining backwards; activations (fp32 residual stream, micro_batch x seq x
  hidden) go forward and their gradients back with blocking
  torch.distributed.batch_isend_irecv pairs (send-forward+recv-backward and
  send-backward+recv-forward are one batched call each, so neighbours never
  deadlock); loss / M per micro-batch.  Used as the fallback if the
  torch.distributed.pipelining run fails.
mode = "ep": mixture-of-experts model (moe.py: router, top-k, experts sharded
  over `ep` = world-size ranks, token dispatch and combine by all_to_all_single),
  data parallel over the same ranks (DDP for the non-expert parameters, experts
  excluded), each rank its own tokens; global batch = micro_batch * world.

Measurement: 3 warm-up steps, median of 8 timed steps (host perf_counter around
zero_grad + forward/backward (+ schedule) + optimizer.step + cuda.synchronize on
rank 0; whether to stop early is agreed by all ranks outside the timed region);
peak = torch.cuda.max_memory_allocated/reserved after reset_peak_memory_stats,
every rank's in measured_extra.json and the MAXIMUM over ranks in case.toml;
torch.profiler trace (CPU+CUDA, wait 1, warmup 1, active `profile_active`) on
all ranks, rank 0's kept (flow events dropped, gzip), every rank's utilization
in measured_extra.json; gpu_utilization in case.toml is rank 0's.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import inspect
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model import ModelConfig, build_model, gqa_supported  # noqa: E402
from train_step import (REPO, hardware_name, kernel_utilization, slim_trace,  # noqa: E402
                        software_string, toml_dump)

DEFAULTS = dict(
    name="case", description="", hardware=None, precision="bf16", recompute="none",
    micro_batch=1, seq=2048, framework="torch-amp", optimizer_impl="foreach", warmup=3, steps=8,
    profile_active=1, mode="tp", sequence_parallel=False, pp_microbatches=8,
    pp_impl="torch-pipelining", pp_schedule="1f1b", moe=None,
)


def _allreduce_flag(flag: bool, device) -> bool:
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


# ----------------------------------------------------------------------------- pipeline stage
class PipeStage(nn.Module):
    """Layers [lo, hi) of the harness Llama model; the first stage embeds, the last
    normalises, projects to the vocabulary and returns fp32 logits."""

    def __init__(self, full, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        self.embed_tokens = full.embed_tokens if first else None
        self.layers = full.layers
        self.norm = full.norm if last else None
        self.lm_head = full.lm_head if last else None
        self.register_buffer("cos_cached", full.cos_cached, persistent=False)
        self.register_buffer("sin_cached", full.sin_cached, persistent=False)

    def forward(self, x):
        s = x.shape[1]
        cos, sin = self.cos_cached[:s], self.sin_cached[:s]
        if self.first:
            x = self.embed_tokens(x)
        for layer in self.layers:
            x = layer(x, cos, sin)
        if self.last:
            x = self.lm_head(self.norm(x)).float()
        return x


def ce_loss(logits, labels):
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


# ----------------------------------------------------------------------------- runner
class ParRunner:
    def __init__(self, spec: dict, tiny: bool):
        self.spec = s = {**DEFAULTS, **spec}
        self.tiny = tiny
        self.cuda = torch.cuda.is_available() and not tiny
        local = int(os.environ.get("LOCAL_RANK", 0))
        self.device = torch.device("cuda", local) if self.cuda else torch.device("cpu")
        if self.cuda:
            torch.cuda.set_device(self.device)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29512")
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        dist.init_process_group("nccl" if self.cuda else "gloo", device_id=self.device if self.cuda else None)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.amp = s["precision"] in ("bf16",)
        self.extra = {"spec": s, "gqa_enable_gqa": gqa_supported(), "world_size": self.world,
                      "env": {k: os.environ.get(k, "") for k in
                              ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")}}

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16) if self.amp else contextlib.nullcontext()

    # ---------------------------------------------------------------- build
    def build(self):
        s = self.spec
        mc = dict(s["model"])
        moe = mc.pop("moe", None) or s.get("moe")
        cfg = ModelConfig(**{k: v for k, v in mc.items() if k in ModelConfig.__dataclass_fields__})
        if self.tiny:
            gqa = cfg.num_kv_heads < cfg.num_attention_heads
            cfg = ModelConfig(name=cfg.name, hidden_size=64, intermediate_size=128,
                              num_layers=4 if s["mode"] == "pp" else 2, num_attention_heads=4 * max(1, self.world // 2),
                              num_kv_heads=(2 if gqa else 4) * max(1, self.world // 2), head_dim=16,
                              vocab_size=128, max_seq_len=64, source=cfg.source)
            s["seq"] = min(s["seq"], 32)
            s["micro_batch"] = min(s["micro_batch"], 2)
            s["pp_microbatches"] = min(s["pp_microbatches"], 4)
            s["warmup"], s["steps"] = 1, 3
            if moe:
                moe = dict(moe, expert_intermediate_size=32)
        self.cfg, self.moe = cfg, moe
        mode = s["mode"]
        getattr(self, f"_build_{mode}")()
        self.n_params_local = sum(p.numel() if not hasattr(p, "to_local") else p.to_local().numel()
                                  for p in self.model.parameters())
        self.extra["n_params_local_rank0_or_this_rank"] = self.n_params_local
        params = [p for p in self.model.parameters() if p.requires_grad]
        kw = {"fused": True} if (s["optimizer_impl"] == "fused" and self.cuda) else {"foreach": True}
        # foreach kernels cannot mix DTensor and plain tensors: one AdamW per kind
        # (under TP without sequence parallelism the RMSNorm weights stay plain, replicated tensors)
        dt = [p for p in params if hasattr(p, "to_local")]
        plain = [p for p in params if not hasattr(p, "to_local")]
        self.opts = [torch.optim.AdamW(g, lr=1e-5, weight_decay=0.01, **kw) for g in (dt, plain) if g]
        self.extra["optimizer_used"] = (f"torch.optim.AdamW({kw})" + (
            f" x2 (DTensor params: {len(dt)}, plain tensors: {len(plain)})" if dt and plain else ""))

    def _tokens(self, batch, seed):
        g = torch.Generator(device="cpu").manual_seed(seed)
        V = self.cfg.vocab_size
        t = torch.randint(0, V, (batch, self.spec["seq"]), generator=g).to(self.device)
        lab = torch.randint(0, V, (batch, self.spec["seq"]), generator=g).to(self.device)
        return t, lab

    def _build_tp(self):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                       SequenceParallel, parallelize_module)
        s, cfg, tp = self.spec, self.cfg, self.world
        assert cfg.num_attention_heads % tp == 0 and cfg.num_kv_heads % tp == 0 and cfg.vocab_size % tp == 0
        mesh = init_device_mesh(self.device.type, (tp,), mesh_dim_names=("tp",))
        torch.manual_seed(1234)  # identical full weights on every rank before sharding
        model = build_model(cfg, self.device)
        sp = bool(s["sequence_parallel"])
        if sp:
            top = {"embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
                   "norm": SequenceParallel(),
                   "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)}
        else:
            top = {"embed_tokens": RowwiseParallel(input_layouts=Replicate()),
                   "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
        for layer in model.layers:
            lp = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
                  "self_attn.v_proj": ColwiseParallel(),
                  "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel()}
            if sp:
                lp.update({
                    "input_layernorm": SequenceParallel(),
                    "post_attention_layernorm": SequenceParallel(),
                    "self_attn": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                                    desired_input_layouts=(Replicate(), None, None)),
                    "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                    "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
                    "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1))})
            else:
                lp.update({"self_attn.o_proj": RowwiseParallel(), "mlp.down_proj": RowwiseParallel()})
            parallelize_module(layer, mesh, lp)
            layer.self_attn.nh //= tp
            layer.self_attn.nkv //= tp
        parallelize_module(model, mesh, top)
        self.model = model
        self.tokens, self.labels = self._tokens(s["micro_batch"], 7)  # same data on all TP ranks
        self.tokens_per_step = s["micro_batch"] * s["seq"]
        self.extra["tp_plan"] = ("torchtitan-style Llama plan with SequenceParallel" if sp else
                                 "ColwiseParallel q,k,v,gate,up; RowwiseParallel o,down; embedding RowwiseParallel; "
                                 "LM head ColwiseParallel + loss_parallel")

    def _tp_loss(self):
        m = self.model
        s = self.tokens.shape[1]
        cos, sin = m.cos_cached[:s], m.sin_cached[:s]
        x = m.embed_tokens(self.tokens)
        for layer in m.layers:
            x = layer(x, cos, sin)
        logits = m.lm_head(m.norm(x)).float()
        return ce_loss(logits, self.labels)

    def _build_pp(self):
        s, cfg = self.spec, self.cfg
        pp, r = self.world, self.rank
        assert cfg.num_layers % pp == 0
        per = cfg.num_layers // pp
        first, last = r == 0, r == pp - 1
        torch.manual_seed(1234 + r)
        part = ModelConfig(**{**cfg.__dict__, "num_layers": per})
        full = build_model(part, self.device)
        self.model = PipeStage(full, first, last)
        del full
        if self.cuda:
            torch.cuda.empty_cache()
        M, mb = s["pp_microbatches"], s["micro_batch"]
        self.M = M
        self.tokens, self.labels = self._tokens(mb * M, 7)  # stage 0 uses tokens, the last stage labels
        self.tokens_per_step = mb * M * s["seq"]
        self.stage_layers = (r * per, (r + 1) * per)
        self.extra["pp_stage_layers"] = self.stage_layers
        self.pp_impl = s["pp_impl"]
        if self.pp_impl == "torch-pipelining":
            from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
            h = cfg.hidden_size
            act_dtype = torch.float32  # the residual stream stays fp32 under autocast
            in_ex = (torch.empty(mb, s["seq"], dtype=torch.long, device=self.device) if first else
                     torch.empty(mb, s["seq"], h, dtype=act_dtype, device=self.device, requires_grad=True))
            # (requires_grad on the received activation: else the stage sends no input gradient back)
            out_ex = (torch.empty(mb, s["seq"], cfg.vocab_size, dtype=torch.float32, device=self.device) if last else
                      torch.empty(mb, s["seq"], h, dtype=act_dtype, device=self.device))
            if s.get("pp_static_shapes"):
                self.stage = PipelineStage(self.model, r, pp, self.device, input_args=(in_ex,), output_args=(out_ex,))
            else:  # shapes inferred at the first step (the default in torch 2.11)
                self.stage = PipelineStage(self.model, r, pp, self.device)
            cls = Schedule1F1B if s["pp_schedule"] == "1f1b" else ScheduleGPipe
            self.schedule = cls(self.stage, n_microbatches=M, loss_fn=ce_loss)
            self.step_kw = {}
            if "return_outputs" in inspect.signature(self.schedule.step).parameters:
                self.step_kw["return_outputs"] = False
            self.extra["pp_schedule_class"] = cls.__name__
            self.extra["pp_step_kwargs"] = self.step_kw
        else:
            self.act_shape = (mb, s["seq"], cfg.hidden_size)

    def _build_ep(self):
        from torch.nn.parallel import DistributedDataParallel as DDP
        from moe import build_moe_model
        s, cfg, moe = self.spec, self.cfg, self.moe
        assert moe, "mode ep needs model.moe"
        ep = self.world
        self.ep_group = dist.new_group(list(range(ep)))
        torch.manual_seed(1234)  # same non-expert weights on all ranks (DDP broadcasts anyway)
        model = build_moe_model(cfg, moe, self.device, ep, self.rank, self.ep_group)
        # experts differ per rank
        torch.manual_seed(4321 + self.rank)
        for layer in model.layers:
            for e in layer.mlp.experts:
                for p in e.parameters():
                    nn.init.kaiming_uniform_(p, a=5 ** 0.5)
        ignore = [n for n, _ in model.named_parameters() if ".experts." in n]
        DDP._set_params_and_buffers_to_ignore_for_model(model, ignore)
        self.model = DDP(model, device_ids=[self.device.index] if self.cuda else None)
        self.inner = model
        self.tokens, self.labels = self._tokens(s["micro_batch"], 7 + self.rank)
        self.tokens_per_step = s["micro_batch"] * s["seq"] * self.world
        self.extra["ep_ignored_params_in_ddp"] = len(ignore)

    # ---------------------------------------------------------------- steps
    def step(self):
        for o in self.opts:
            o.zero_grad(set_to_none=True)
        getattr(self, f"_step_{self.spec['mode']}")()
        for o in self.opts:
            o.step()
        if self.cuda:
            torch.cuda.synchronize()

    def _step_tp(self):
        from torch.distributed.tensor.parallel import loss_parallel
        with loss_parallel():
            with self.autocast():
                loss = self._tp_loss()
            loss.backward()
        self.last_loss = loss

    def _step_ep(self):
        with self.autocast():
            loss = self.model(self.tokens, self.labels)
        loss.backward()
        self.last_loss = loss

    def _step_pp(self):
        if self.pp_impl == "torch-pipelining":
            first, last = self.rank == 0, self.rank == self.world - 1
            losses = [] if last else None
            with self.autocast():
                if first and last:
                    self.schedule.step(self.tokens, target=self.labels, losses=losses, **self.step_kw)
                elif first:
                    self.schedule.step(self.tokens, **self.step_kw)
                elif last:
                    self.schedule.step(target=self.labels, losses=losses, **self.step_kw)
                else:
                    self.schedule.step(**self.step_kw)
            if last and losses:
                self.last_loss = torch.stack([l.detach().float() for l in losses]).mean()
        else:
            self._manual_1f1b()

    # explicit 1F1B -------------------------------------------------------
    def _p2p(self, send=None, send_to=None, recv_from=None):
        """One batched send and/or receive with the neighbouring stages; returns the received tensor."""
        ops, buf = [], None
        if recv_from is not None:
            buf = torch.empty(self.act_shape, dtype=torch.float32, device=self.device)
            ops.append(dist.P2POp(dist.irecv, buf, recv_from))
        if send is not None:
            ops.append(dist.P2POp(dist.isend, send.contiguous(), send_to))
        if ops:
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        return buf

    def _manual_1f1b(self):
        r, pp, M, mb = self.rank, self.world, self.M, self.spec["micro_batch"]
        first, last = r == 0, r == pp - 1
        prev, nxt = (None if first else r - 1), (None if last else r + 1)
        warm = min(pp - r - 1, M)
        steady = M - warm
        saved = []
        losses = []

        def fwd(i, x):
            if first:
                x = self.tokens[i * mb:(i + 1) * mb]
            else:
                x.requires_grad_(True)
            with self.autocast():
                y = self.model(x)
                if last:
                    y = ce_loss(y, self.labels[i * mb:(i + 1) * mb]) / M
                    losses.append(y.detach())
            saved.append((x, y))
            return y

        def bwd(g):
            x, y = saved.pop(0)
            if last:
                y.backward()
            else:
                y.backward(g)
            return None if first else x.grad

        for i in range(warm):
            x = self._p2p(recv_from=prev)
            y = fwd(i, x)
            self._p2p(send=None if last else y.detach(), send_to=nxt)
        x = self._p2p(recv_from=prev) if steady > 0 else None
        for i in range(steady):
            y = fwd(warm + i, x)
            g = self._p2p(send=None if last else y.detach(), send_to=nxt, recv_from=nxt)
            gin = bwd(g)
            if i == steady - 1:
                self._p2p(send=gin, send_to=prev)
                x = None
            else:
                x = self._p2p(send=gin, send_to=prev, recv_from=prev)
        for i in range(warm):
            g = self._p2p(recv_from=nxt)
            gin = bwd(g)
            self._p2p(send=gin, send_to=prev)
        if last:
            self.last_loss = torch.stack(losses).sum()

    # ---------------------------------------------------------------- correctness (CPU, --check)
    def check(self):
        """fp32 loss (and for TP a gradient) of the parallel model against an unsharded reference
        built from the same weights on every rank; prints CHECK lines, raises if they differ."""
        mode, amp = self.spec["mode"], self.amp
        self.amp = False
        res = {}
        if mode == "tp":
            torch.manual_seed(1234)
            ref = build_model(self.cfg, self.device)
            loss_ref = ref(self.tokens, self.labels)
            loss_ref.backward()
            from torch.distributed.tensor.parallel import loss_parallel
            with loss_parallel():
                loss = self._tp_loss()
                loss.backward()
            g = self.model.layers[0].self_attn.q_proj.weight.grad.full_tensor()
            g_ref = ref.layers[0].self_attn.q_proj.weight.grad
            res = {"loss": float(loss.detach()), "loss_ref": float(loss_ref.detach()),
                   "q_proj_grad_rel_err": float((g - g_ref).norm() / g_ref.norm())}
            ok = abs(res["loss"] - res["loss_ref"]) < 1e-4 and res["q_proj_grad_rel_err"] < 1e-4
        elif mode == "ep":
            from moe import build_moe_model
            ref = build_moe_model(self.cfg, self.moe, self.device, 1, 0, None)
            inner = self.inner
            sd = {k: v for k, v in inner.state_dict().items() if ".experts." not in k}
            ref.load_state_dict(sd, strict=False)
            nl = inner.layers[0].mlp.n_local
            for li, layer in enumerate(inner.layers):
                for j, e in enumerate(layer.mlp.experts):
                    for name, prm in e.named_parameters():
                        parts = [torch.empty_like(prm) for _ in range(self.world)]
                        dist.all_gather(parts, prm.detach().contiguous())
                        for r_ in range(self.world):
                            getattr(ref.layers[li].mlp.experts[r_ * nl + j], name.split(".")[0]).weight.data.copy_(parts[r_])
            with torch.no_grad():
                loss = self.model(self.tokens, self.labels)
                loss_ref = ref(self.tokens, self.labels)
            res = {"loss": float(loss), "loss_ref": float(loss_ref)}
            ok = abs(res["loss"] - res["loss_ref"]) < 1e-4
        else:
            return
        for o in self.opts:
            o.zero_grad(set_to_none=True)
        self.amp = amp
        print(f"CHECK rank {self.rank} {mode}: {res} {'OK' if ok else 'MISMATCH'}", flush=True)
        self.extra["check"] = res
        if not ok:
            raise SystemExit(f"check failed: {res}")

    # ---------------------------------------------------------------- measure
    def run(self, out_root: Path, deadline: float, check: bool = False):
        s = self.spec
        self.build()
        if check:
            self.check()
        self.last_loss = None
        for _ in range(s["warmup"]):
            self.step()
        if self.last_loss is not None:
            self.extra["loss_after_warmup_this_rank"] = float(self.last_loss.detach().float())
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        times = []
        for i in range(s["steps"]):
            t0 = time.perf_counter()
            self.step()
            times.append(time.perf_counter() - t0)
            late = i >= 7 and time.time() > deadline - 4 * max(times) - 25
            if _allreduce_flag(late, self.device):
                break
        peak_alloc = torch.cuda.max_memory_allocated() if self.cuda else 0
        peak_res = torch.cuda.max_memory_reserved() if self.cuda else 0
        self.extra["step_times_s_rank0" if self.rank == 0 else "step_times_s"] = times
        case_dir = out_root / s["name"]
        if self.rank == 0:
            case_dir.mkdir(parents=True, exist_ok=True)
        trace_path = case_dir / "trace.pt.trace.json.gz"
        active = s["profile_active"]
        util = {}
        do_prof = _allreduce_flag(time.time() + (2 + active) * statistics.median(times) + 30 < deadline, self.device)
        if do_prof:
            from torch.profiler import ProfilerActivity, profile, schedule
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            with profile(activities=acts, schedule=schedule(wait=1, warmup=1, active=active),
                         record_shapes=False, with_stack=False) as prof:
                for _ in range(2 + active):
                    self.step()
                    prof.step()
            if self.rank == 0:
                path = trace_path
            else:
                path = Path(tempfile.mkdtemp(prefix=f"pstrace{self.rank}_")) / "trace.pt.trace.json.gz"
            prof.export_chrome_trace(str(path))
            slim_trace(path)
            util = kernel_utilization(path)
            if self.rank != 0:
                path.unlink()
        moe_counts = None
        if s["mode"] == "ep":
            moe_counts = [layer.mlp.last_counts for layer in self.inner.layers]
        gathered = [None] * self.world
        dist.all_gather_object(gathered, {"rank": self.rank, "peak": (peak_alloc, peak_res), "util": util,
                                          "times": times, "moe_local_expert_token_counts": moe_counts,
                                          "loss": float(self.last_loss.detach().float()) if self.last_loss is not None else None})
        if self.rank == 0:
            self.extra["per_rank"] = gathered
            self.write(case_dir, times, gathered, util, trace_path)
        dist.barrier()
        dist.destroy_process_group()

    def plan_table(self):
        s, W = self.spec, self.world
        mode = s["mode"]
        tp = W if mode == "tp" else 1
        pp = W if mode == "pp" else 1
        ep = W if mode == "ep" else 1
        dp = W // (tp * pp)
        gb = s["micro_batch"] * dp * (s["pp_microbatches"] if mode == "pp" else 1)
        plan = {"gpus": W, "gpus_per_node": W, "tp": tp, "pp": pp, "ep": ep,
                "sequence_parallel": bool(s["sequence_parallel"]) if mode == "tp" else False,
                "precision": s["precision"], "recompute": s["recompute"], "micro_batch": s["micro_batch"],
                "global_batch": gb, "seq": s["seq"], "lora_rank": 0, "offload": [], "zero": 0,
                "optimizer": "adamw", "optimizer_impl": s["optimizer_impl"], "framework": s["framework"]}
        return plan

    def write(self, case_dir: Path, times, gathered, util, trace_path):
        s = self.spec
        gpu = torch.cuda.get_device_name(self.device) if self.cuda else "cpu"
        med = statistics.median(times)
        mode = s["mode"]
        how = {"tp": f"tensor parallel over {self.world} GPUs with DTensor ({self.extra.get('tp_plan')})",
               "pp": (f"{self.world}-stage pipeline, {self.spec['pp_microbatches']} micro-batches, "
                      + (f"torch.distributed.pipelining {self.extra.get('pp_schedule_class')}"
                         if getattr(self, "pp_impl", "") == "torch-pipelining" else "explicit 1F1B with batch_isend_irecv")),
               "ep": f"MoE, experts over {self.world} ranks (all_to_all_single dispatch/combine), DDP for the rest"}[mode]
        method = ("validation/harness/parallel_step.py: " + how + "; random weights and random tokens; bf16 autocast "
                  "over fp32 params, AdamW foreach; step = zero_grad(set_to_none) + forward/backward + optimizer.step() + "
                  f"torch.cuda.synchronize(), host perf_counter on rank 0; {s['warmup']} warm-up steps, median of "
                  f"{len(times)} timed steps; peak = max over ranks of torch.cuda.max_memory_allocated/reserved after "
                  "reset_peak_memory_stats (every rank in measured_extra.json); torch.profiler trace of "
                  f"{s['profile_active']} step(s) (wait 1, warmup 1) on every rank, rank 0's kept; gpu_utilization = "
                  "rank 0's union of kernel intervals / wall of the profiled ProfilerSteps (other ranks in "
                  f"measured_extra.json); {self.world} ranks via torchrun; NCCL_NVLS_ENABLE=0")
        case = {"name": s["name"], "description": s["description"] or s["name"],
                "hardware": s["hardware"] or hardware_name(gpu), "date": _dt.date.today().isoformat(),
                "gpu": gpu, "software": software_string()
                + (f", NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}" if self.cuda else ""),
                "method": method}
        if trace_path.exists():
            case["trace"] = trace_path.name
        model = self.cfg.toml_dict()
        peak_a = max(int(g["peak"][0]) for g in gathered)
        peak_r = max(int(g["peak"][1]) for g in gathered)
        measured = {"step_time_s": med, "step_time_s_min": min(times), "step_time_s_max": max(times),
                    "peak_allocated_bytes": peak_a, "peak_reserved_bytes": peak_r,
                    "gpu_utilization": round(float(util.get("gpu_utilization_kernels", 0.0)), 4),
                    "tokens_per_s": self.tokens_per_step / med}
        ncores = os.cpu_count() or 0
        hw = {"cpu.cores": {"value": ncores,
                            "source": f"measured machine: {ncores} vCPUs (os.cpu_count) in a Firecracker VM"}}
        tables = {"case": case, "model": model}
        if self.moe:
            tables["model.moe"] = {"num_experts": int(self.moe["num_experts"]),
                                   "experts_per_token": int(self.moe["experts_per_token"]),
                                   "expert_intermediate_size": int(self.moe["expert_intermediate_size"])}
        tables.update({"plan": self.plan_table(), "measured": measured, "hardware_overrides": hw})
        (case_dir / "case.toml").write_text(toml_dump(tables))
        self.extra["trace_analysis_rank0"] = util
        (case_dir / "measured_extra.json").write_text(json.dumps(self.extra, indent=1, default=str))
        utils = [round(float((g["util"] or {}).get("gpu_utilization_kernels", 0.0)), 3) for g in gathered]
        print(f"CASE {s['name']}: step {med*1e3:.1f} ms (min {min(times)*1e3:.1f}, max {max(times)*1e3:.1f}) "
              f"peak {peak_a/1e9:.2f} GB alloc (max over ranks; per rank "
              f"{[round(g['peak'][0]/1e9, 2) for g in gathered]}), {peak_r/1e9:.2f} GB res, util per rank {utils}, "
              f"{measured['tokens_per_s']:.0f} tok/s", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True, help="JSON string or path to a JSON file")
    ap.add_argument("--out", default=str(REPO / "validation" / "cases"))
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test (gloo) with a tiny model")
    ap.add_argument("--deadline", type=float, default=0.0)
    ap.add_argument("--check", action="store_true", help="compare loss/grads with an unsharded reference first (tp, ep)")
    a = ap.parse_args()
    spec = json.loads(Path(a.spec).read_text()) if os.path.exists(a.spec) else json.loads(a.spec)
    deadline = a.deadline or time.time() + 3600
    ParRunner(spec, a.tiny).run(Path(a.out), deadline, a.check)


if __name__ == "__main__":
    main()
