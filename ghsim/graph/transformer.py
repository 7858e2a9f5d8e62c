"""The op graph of one training step of a decoder-only transformer on one GPU.

It follows what eager PyTorch really runs, kernel group by kernel group, for a
Hugging Face style Llama layer (validation/harness/model.py is the reference):
RMSNorm as its eager composite in fp32, q/k/v/o and gate/up/down projections,
eager rotary embedding, flash attention, SwiGLU, fp32 residual stream, and the
loss over the vocabulary on fp32 logits.

Precision semantics (DESIGN.md, modeling notes):
- torch-amp (fp32 parameters, autocast): every projection casts its fp32 input
  to bf16 (one cast per projection, each copy saved for backward) and its fp32
  weight to bf16 (cached per forward, held until the layer's backward); each
  weight gradient arrives in bf16 and is cast to fp32.
- fsdp-mixed / deepspeed (bf16 working weights): no per-op casts; the
  residual stream is bf16.
- fp32 / tf32: no casts, everything fp32.
- fp8: the seven projections quantise activation and weight per tensor in
  every forward and the output gradient in backward (dynamic scaling), and
  run the GEMMs at the fp8 rate.

Fused kernels (Framework.MEGATRON: Megatron-LM, NeMo, TransformerEngine): the
same layer as Megatron runs it, with bf16/fp16 working weights (no casts):
one fused LayerNorm/RMSNorm kernel each way, one fused QKV GEMM and one fc1
GEMM (gate and up together under SwiGLU), fused rotary (one kernel per q and
k; none with learned positions), flash attention, fused bias-GeLU/SwiGLU,
fused bias(-dropout)-add for the residuals, and in the loss one fused
vocab-parallel cross-entropy kernel each way. Each fused kernel reads its
inputs once and writes its outputs once; ghsim prices those minimal bytes on
the calibration's measured device copy (one input stream) or add (several)
curve, time = fixed + bytes/rate: that streaming rate is what a well-written
fused elementwise kernel reaches, and no other efficiency enters. Biases
ride in the GEMM epilogue or the fused kernel that follows (not separate
ops); dropout is not modeled (rate 0). What the forward saves for backward
is what Megatron saves (Korthikanti et al. 2022, Sec. 4.1, Table 2: the
norms' inputs, the QKV input, Q/K/V, the attention output, the MLP input,
the fc1 output and the activation output: 32sbh per layer with 16-bit
activations, plus fp32 norm statistics and flash attention's log-sum-exp
instead of the 5as^2b softmax terms; their 34sbh also counts the two
1-byte dropout masks, sbh each).

Each op records the bytes it allocates, frees and holds transiently, in issue
order, so the memory model can replay the allocator's view.
"""

from __future__ import annotations

from dataclasses import dataclass

from ghsim.graph.flops import attention_bwd_flops, attention_fwd_flops
from ghsim.graph import ops as K
from ghsim.graph.ops import Op
from ghsim.model import ModelSpec
from ghsim.plan import Framework, Plan, Precision, Recompute

# Kernels per eager composite, counted from the PyTorch ops they run
# (validation/harness/model.py): they set the host's launch cost.
RMSNORM_FWD_KERNELS = 6  # pow, mean, add eps, rsqrt, mul, mul weight
RMSNORM_BWD_KERNELS = 10  # mul/sum for the weight, rsqrt/mean/pow backward, accumulation
# cuDNN SDPA backward (PyTorch's default on Hopper) launches compute_dot_do_o, the
# bprop kernel and convert_dq_to_16bits, plus fmha_reduce_head for dK and dV under GQA
# (kernel names in PyTorch 2.11 profiler traces of validation/cases).
SDPA_BWD_KERNELS = 3
SDPA_BWD_GQA_REDUCE_KERNELS = 2


def sdpa_backward_kernels(heads: int, kv_heads: int) -> int:
    return SDPA_BWD_KERNELS + (SDPA_BWD_GQA_REDUCE_KERNELS if kv_heads != heads else 0)


# How a profiler files those kernels (ghsim.traces.categories): the reductions (mean;
# the two sums of the backward; amax) as norm_reduction, the rest as elementwise.
# Time is split in proportion to kernel counts.
RMSNORM_FWD_SPLIT = (("elementwise", 5 / 6), ("norm_reduction", 1 / 6))
RMSNORM_BWD_SPLIT = (("elementwise", 8 / 10), ("norm_reduction", 2 / 10))
FP8_QUANT_SPLIT = (("elementwise", 7 / 8), ("norm_reduction", 1 / 8))
COMPOSITE_SPLITS = {"rmsnorm_fwd": RMSNORM_FWD_SPLIT, "rmsnorm_bwd": RMSNORM_BWD_SPLIT, "fp8_quant": FP8_QUANT_SPLIT}
ROPE_FWD_KERNELS = 5  # per tensor: mul cos, neg, cat, mul sin, add
ROPE_BWD_KERNELS = 5
SWIGLU_FWD_KERNELS = 2  # silu, mul
SWIGLU_BWD_KERNELS = 3  # two muls, silu backward
# model._quant of the harness: abs, amax, clamp, scale, mul, clamp, cast, reciprocal
FP8_QUANT_KERNELS = 8
# Fused mode (Framework.MEGATRON): apex/TransformerEngine rotary applies one kernel to q and one to k
FUSED_ROPE_KERNELS = 2
# Learned absolute positions, as Megatron's Embedding runs them: word lookup, position lookup, add
LEARNED_POSITION_FWD_KERNELS = 3


def fused_variant(inputs: int, width: int) -> str:
    """The measured curve a fused kernel streams at: the device copy with one input stream,
    the add with several (time = fixed + bytes/rate; bytes = inputs read once + outputs written once)."""
    return _dtyped("copy" if inputs <= 1 else "add", width)


@dataclass(frozen=True)
class Dtypes:
    """Byte widths and GEMM dtype a plan implies."""

    gemm: str  # dtype the projections' GEMMs run in (cost model key)
    act: int  # bytes per element of activations feeding GEMMs
    residual: int  # bytes per element of the residual stream (and norm math input)
    param: int  # bytes per stored parameter
    grad: int  # bytes per stored gradient
    autocast_casts: bool  # per-op input and weight casts (torch-amp with fp32 params)

    @staticmethod
    def of(plan: Plan) -> "Dtypes":
        p = plan.precision
        if p in (Precision.FP32, Precision.TF32):
            return Dtypes(p.value, 4, 4, 4, 4, False)
        half = "fp16" if p == Precision.FP16 else "bf16"
        gemm = "fp8" if p == Precision.FP8 else half
        if plan.lora_rank:  # frozen base stored in half precision; adapters fp32
            return Dtypes(gemm, 2, 2, 2, 4, False)
        if plan.framework == Framework.TORCH_AMP:
            return Dtypes(gemm, 2, 4, 4, 4, True)
        if plan.framework.fused_kernels and p == Precision.BF16:
            # Megatron accumulates (and all-reduces) bf16 gradients in fp32 main_grad buffers
            # (megatron/training/arguments.py: bf16 sets accumulate_allreduce_grads_in_fp32)
            return Dtypes(gemm, 2, 2, 2, 4, False)
        return Dtypes(gemm, 2, 2, 2, 2, False)


def _dtyped(op: str, width: int) -> str:
    """The measured curve of `op` in the dtype it runs in (the norm math follows the residual stream)."""
    return f"{op}:{'fp32' if width == 4 else 'bf16'}"


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

    def create(self, op: Op, sizes: dict[str, float]) -> None:
        for name, nbytes in sizes.items():
            if name in self.live:
                raise ValueError(f"tensor {name} created twice")
            self.live[name] = nbytes
            op.change_hbm(memory_tag(name), nbytes)

    def free(self, op: Op, names: list[str]) -> None:
        for name in names:
            if name not in self.live:
                raise ValueError(f"tensor {name} freed but not live")
            op.change_hbm(memory_tag(name), -self.live.pop(name))


@dataclass(frozen=True)
class LayerSplit:
    """How one decoder layer is split over GPUs, Megatron-LM style (the default: one GPU).

    LayerBuilder is given the per-rank shard of the model (heads, kv heads, FFN
    width and experts already divided, see graph/parallel.py); this says which
    collectives join the shards. Column-parallel q/k/v and gate/up, row-parallel
    o and down: one all-reduce after o and after down in forward, one after the
    q/k/v and gate/up input gradients in backward (Shoeybi et al. 2019). With
    sequence parallelism (Korthikanti et al. 2022) norms and residuals hold
    seq/tp tokens, each all-reduce becomes a reduce-scatter and an all-gather
    feeds the column-parallel GEMMs (re-gathered in backward for their wgrad).
    With experts over `ep` ranks, tokens go to their experts and come back by
    all-to-all, forward and backward.
    """

    tp: int = 1
    sequence_parallel: bool = False
    ep: int = 1


@dataclass(frozen=True)
class Projection:
    name: str
    n_out: int
    n_in: int
    experts: int = 1  # MoE: expert weights this projection holds (tokens go to top-k of them)


class LayerBuilder:
    """Op lists of one decoder layer for one micro-batch: forward, and backward.

    Tensor names are local to the layer; "x" is the layer's input (made by the
    layer before, kept for this layer's backward), "x_next" its output.
    """

    def __init__(self, model: ModelSpec, plan: Plan, split: LayerSplit = LayerSplit()):
        self.m = model
        self.plan = plan
        self.split = split
        self.T = plan.micro_batch * plan.seq
        # tokens in the norm/residual regions: a 1/tp slice of the sequence under sequence parallelism
        self.Tn = self.T // split.tp if split.sequence_parallel and split.tp > 1 else self.T
        self._after: int | None = None  # a collective the next op waits for
        self._before_wgrad: int | None = None  # a collective the next weight-gradient GEMM waits for
        self.dt = Dtypes.of(plan)
        h, q, kv, f = model.hidden_size, model.q_dim, model.kv_dim, model.intermediate_size
        self.attn_in = [Projection("q_proj", q, h), Projection("k_proj", kv, h), Projection("v_proj", kv, h)]
        self.o_proj = Projection("o_proj", h, q)
        if model.moe is None:
            self.mlp_in = [Projection("gate_proj", f, h), Projection("up_proj", f, h)]
            self.down = Projection("down_proj", h, f)
            self.mlp_tokens = self.T
        else:
            fe, ne = model.moe.expert_intermediate_size, model.moe.num_experts
            self.mlp_in = [Projection("expert_gate", fe, h, ne), Projection("expert_up", fe, h, ne)]
            self.down = Projection("expert_down", h, fe, ne)
            self.mlp_tokens = self.T * model.moe.experts_per_token
        if model.mlp == "gelu":
            self.mlp_in = self.mlp_in[:1]
        # fused mode: Megatron's one QKV GEMM and one fc1 GEMM (SwiGLU's gate and up side by side)
        self.fused = plan.framework.fused_kernels
        self.qkv_proj = Projection("qkv_proj", q + 2 * kv, h)
        gate = self.mlp_in[0]
        self.fc1 = Projection("fc1", gate.n_out * len(self.mlp_in), h, gate.experts)
        # SDPA runs in fp32 for fp32/tf32 plans (no tensor-core flash kernel), else in bf16
        self.attn_dtype = "fp32" if plan.precision in (Precision.FP32, Precision.TF32) else "bf16"
        self.t = Tensors()
        self.ops: list[Op] = []
        self.phase = "fwd"
        self.save = True

    # --- op constructors --------------------------------------------------------------
    def _emit(self, op: Op, creates: dict[str, float] | None, frees: list[str] | None, transient: float) -> Op:
        if self._after is not None:
            op.deps = op.deps + (self._after,)
            self._after = None
        if self._before_wgrad is not None and op.name.endswith(".wgrad"):
            op.deps = op.deps + (self._before_wgrad,)
            self._before_wgrad = None
        self.t.create(op, creates or {})
        self.t.free(op, frees or [])
        op.hbm_transient = transient
        op.phase = self.phase
        self.ops.append(op)
        return op

    def mem(self, name: str, variant: str, nbytes: float, kernels: int, category: str,
            creates=None, frees=None, transient: float = 0.0) -> Op:
        op = Op(name=name, category=category, kind=K.MEMBOUND, resource="gpu", bytes=nbytes,
                variant=variant, kernels=kernels, split=COMPOSITE_SPLITS.get(variant.split(":")[0]))
        return self._emit(op, creates, frees, transient)

    def gemm(self, name: str, m: int, n: int, k: int, dtype: str, creates=None, frees=None,
             transient: float = 0.0) -> Op:
        op = Op(name=name, category="gemm", kind=K.GEMM, resource="gpu", shape=(int(m), int(n), int(k)),
                flops=2.0 * m * n * k, dtype=dtype)
        return self._emit(op, creates, frees, transient)

    def bmm(self, name: str, batch: int, m: int, n: int, k: int, dtype: str, creates=None, frees=None,
            transient: float = 0.0) -> Op:
        """`batch` GEMMs of m x n x k (one per head), one kernel; bytes: every operand once."""
        width = 4 if dtype in ("fp32", "tf32") else 2
        op = Op(name=name, category="gemm", kind=K.GEMM, resource="gpu", shape=(int(batch * m), int(n), int(k)),
                flops=2.0 * batch * m * n * k, dtype=dtype, variant="batched",
                bytes=float(batch) * (m * k + k * n + m * n) * width)
        return self._emit(op, creates, frees, transient)

    def collective(self, name: str, kind: str, nbytes: float, resource: str, creates=None, frees=None) -> Op:
        """A collective on its group's link stream: it waits for the op before it, the next op waits for it."""
        op = Op(name=name, category="communication", kind=K.COLLECTIVE, resource=resource, variant=kind,
                bytes=nbytes, deps=(len(self.ops) - 1,))
        self._emit(op, creates, frees, 0.0)
        self._after = len(self.ops) - 1
        return op

    def tp_gather(self, name: str, tensor_bytes: float, out: str, for_wgrad: bool = False) -> str | None:
        """Sequence parallelism: all-gather a seq/tp-sharded tensor into `out` (full bytes given).

        for_wgrad: backward's re-gather of a GEMM input, which Megatron overlaps with the
        dgrad GEMM: only the first weight-gradient GEMM after it waits for it."""
        if self.Tn == self.T:
            return None
        self.collective(name, "all_gather", tensor_bytes, "tp", creates={out: tensor_bytes})
        if for_wgrad:
            self._after, self._before_wgrad = None, len(self.ops) - 1
        return out

    # --- MoE token routing (no-ops for dense models) -------------------------------------
    def moe_dispatch_fwd(self) -> None:
        """Router GEMM, gathering each token's copies per expert, and the all-to-all to their ranks."""
        m = self.m
        if m.moe is None:
            return
        h, act = m.hidden_size, self.dt.act
        self.gemm("router", self.T, m.moe.num_experts, h, self.dt.gemm)
        self.mem("moe_dispatch", "copy", 2 * self.mlp_tokens * h * act, 6, "other",
                 transient=self.mlp_tokens * h * act)
        self.ep_all_to_all("moe_dispatch.all_to_all", self.mlp_tokens * h * act)

    def moe_combine_fwd(self) -> None:
        """Expert outputs back to their tokens' ranks, then the weighted sum over the top-k."""
        if self.m.moe is None:
            return
        nbytes = self.mlp_tokens * self.m.hidden_size * self.dt.act
        self.ep_all_to_all("moe_combine.all_to_all", nbytes)
        self.mem("moe_combine", "copy", 2 * nbytes, 4, "other")

    def moe_combine_bwd(self) -> None:
        if self.m.moe is None:
            return
        nbytes = self.mlp_tokens * self.m.hidden_size * self.dt.act
        self.mem("moe_combine.bwd", "copy", 2 * nbytes, 4, "other")
        self.ep_all_to_all("moe_combine.bwd.all_to_all", nbytes)

    def gathered_grad(self, grad: str, tensor_bytes: float) -> str:
        """A branch's output gradient, all-gathered over the sequence under sequence parallelism
        (the sharded copy is freed); the name to use from here on."""
        if self.tp_gather(f"{grad}.all_gather", tensor_bytes, f"{grad}.g") is None:
            return grad
        self.t.free(self.ops[-1], [grad])
        return f"{grad}.g"

    def tp_reduce(self, name: str, tensor: str, tensor_bytes: float) -> str:
        """Sum the partial outputs of a row-parallel GEMM; returns the name of the summed tensor."""
        if self.split.tp == 1:
            return tensor
        if self.Tn == self.T:
            self.collective(name, "all_reduce", tensor_bytes, "tp")
            return tensor
        out = tensor + ".sp"
        self.collective(name, "reduce_scatter", tensor_bytes, "tp", creates={out: tensor_bytes / self.split.tp},
                        frees=[tensor])
        return out

    def ep_all_to_all(self, name: str, nbytes: float) -> None:
        if self.split.ep > 1:
            self.collective(name, "all_to_all", nbytes, "ep")

    def release(self, names: list[str]) -> None:
        """Tensors whose last forward use has passed: kept if saved for backward, else freed."""
        if self.save or not names:
            return
        self.t.free(self.ops[-1], [n for n in names if n in self.t.live])

    # --- projections -----------------------------------------------------------------
    def _proj_tokens(self, p: Projection) -> int:
        return self.mlp_tokens if p.experts > 1 else self.T

    def projection_fwd(self, p: Projection, inp: str, inp_bytes_per_el: int, out: str) -> list[str]:
        """Forward of one projection; returns the names it keeps for its backward."""
        dt, T = self.dt, self._proj_tokens(p)
        lora = self.plan.lora_rank
        keep: list[str] = []
        out_bytes = T * p.n_out * dt.act
        if self.plan.precision == Precision.FP8:
            for what, numel, src in (("x", T * p.n_in, inp_bytes_per_el), ("w", p.n_in * p.n_out, dt.param)):
                # bytes as microbench2 counts them: the source read once, the fp8 copy written once
                self.mem(f"{p.name}.fp8_quant_{what}", _dtyped("fp8_quant", src), numel * (src + 1),
                         FP8_QUANT_KERNELS, "elementwise", creates={f"{p.name}.{what}8": numel}, transient=numel * src)
                keep.append(f"{p.name}.{what}8")
            self.gemm(p.name, T, p.n_out, p.n_in, "fp8", creates={out: out_bytes})
            return keep
        if dt.autocast_casts and inp_bytes_per_el == 4:
            # autocast casts the fp32 input once per projection; each copy is saved
            self.mem(f"{p.name}.cast_in", "cast_fp32_to_bf16", T * p.n_in * 6, 1, "elementwise",
                     creates={f"{p.name}.x16": T * p.n_in * 2})
            keep.append(f"{p.name}.x16")
        if dt.autocast_casts and not lora:
            w = p.n_in * p.n_out * p.experts
            self.mem(f"{p.name}.cast_w", "cast_fp32_to_bf16", w * 6, 1, "elementwise",
                     creates={f"{p.name}.w16": w * 2})
            keep.append(f"{p.name}.w16")
        self.gemm(p.name, T, p.n_out, p.n_in, dt.gemm, creates={out: out_bytes})
        if lora:
            self.gemm(f"{p.name}.lora_a", T, lora, p.n_in, dt.gemm, creates={f"{p.name}.xa": T * lora * dt.act})
            self.gemm(f"{p.name}.lora_b", T, p.n_out, lora, dt.gemm, transient=out_bytes)
            # scale-and-add, plus autocast's casts of the two fp32 adapters
            self.mem(f"{p.name}.lora_add", "add", out_bytes * 3, 4, "elementwise", transient=out_bytes)
            keep.append(f"{p.name}.xa")
        return keep  # (the input itself is the caller's to keep)

    def projection_bwd(self, p: Projection, grad_out: str, grad_in: str, kept: list[str]) -> None:
        """dgrad into `grad_in`, weight (or adapter) gradients, then frees what the forward kept."""
        dt, T = self.dt, self._proj_tokens(p)
        lora = self.plan.lora_rank
        gin = T * p.n_in * dt.act
        if self.plan.precision == Precision.FP8:
            g = T * p.n_out
            self.mem(f"{p.name}.fp8_quant_grad", _dtyped("fp8_quant", dt.act), g * (dt.act + 1), FP8_QUANT_KERNELS + 1,
                     "elementwise", transient=g * (dt.act + 1))
            # transposed copies of the saved fp8 operands, for cuBLAS layouts
            moved = p.n_in * p.n_out + T * p.n_in + g
            self.mem(f"{p.name}.fp8_transpose", "fp8_transpose", 2 * moved, 3, "elementwise", transient=moved)
        self.gemm(f"{p.name}.dgrad", T, p.n_in, p.n_out, dt.gemm, creates={grad_in: gin})
        if lora:
            self.gemm(f"{p.name}.lora_b.wgrad", p.n_out, lora, T, dt.gemm)
            self.gemm(f"{p.name}.lora_b.dgrad", T, lora, p.n_out, dt.gemm, transient=T * lora * dt.act)
            self.gemm(f"{p.name}.lora_a.wgrad", lora, p.n_in, T, dt.gemm)
            self.gemm(f"{p.name}.lora_a.dgrad", T, p.n_in, lora, dt.gemm, transient=gin)
            self.mem(f"{p.name}.lora_grad_add", "add", gin * 3, 1, "elementwise")
            adapter = lora * (p.n_in + p.n_out)
            self.mem(f"{p.name}.lora_grad_cast", "cast_fp32_to_bf16", adapter * 6, 2, "elementwise",
                     creates={f"grad.{p.name}": adapter * 4})
        else:
            w = p.n_in * p.n_out * p.experts
            if self.plan.precision == Precision.FP8:  # fp8 wgrad writes the fp32 gradient directly
                self.gemm(f"{p.name}.wgrad", p.n_out, p.n_in, T, "fp8", creates={f"grad.{p.name}": w * 4})
            elif dt.autocast_casts:
                # the bf16 weight gradient flows back through the weight cast: fp32 .grad
                self.gemm(f"{p.name}.wgrad", p.n_out, p.n_in, T, dt.gemm, transient=w * 2)
                self.mem(f"{p.name}.wgrad_cast", "cast_fp32_to_bf16", w * 6, 1, "elementwise",
                         creates={f"grad.{p.name}": w * 4})
            else:
                self.gemm(f"{p.name}.wgrad", p.n_out, p.n_in, T, dt.gemm, creates={f"grad.{p.name}": w * dt.grad})
        self.t.free(self.ops[-1], kept + [grad_out])

    # --- one layer -------------------------------------------------------------------
    def forward(self, save: bool, phase: str = "fwd") -> dict[str, list[str]]:
        """Emit one layer's forward. With save False (a checkpointed forward) only x_next stays."""
        if self.fused:
            return self._forward_fused(save, phase)
        self.save, self.phase = save, phase
        m, dt, T, b, seq = self.m, self.dt, self.T, self.plan.micro_batch, self.plan.seq
        h, q, kv = m.hidden_size, m.q_dim, m.kv_dim
        rs, act = dt.residual, dt.act
        kept: dict[str, list[str]] = {}

        # input RMSNorm (fp32 math): keeps rstd and the normalised tensor (and x, the input)
        Tn = self.Tn
        self.mem("input_norm", _dtyped("rmsnorm_fwd", rs), Tn * h * 2 * rs, RMSNORM_FWD_KERNELS, "norm_reduction",
                 creates={"n1.normed": Tn * h * 4, "n1.rstd": Tn * 4, "n1.out": Tn * h * rs}, transient=Tn * h * 4)
        gathered = self.tp_gather("n1.all_gather", T * h * rs, "n1.g")
        for p, out in zip(self.attn_in, ("q", "k", "v")):
            kept[p.name] = self.projection_fwd(p, gathered or "n1.out", rs, out)
        if gathered:  # not saved: backward gathers it again
            self.t.free(self.ops[-1], [gathered])
        self.release(["n1.normed", "n1.rstd"])
        if dt.autocast_casts or self.plan.precision == Precision.FP8:
            self.t.free(self.ops[-1], ["n1.out"])  # only its casts are kept
        else:
            self.release(["n1.out"])
        # rotary: rotated copies replace q and k
        self.mem("rope", "rope", 2 * T * (q + kv) * act, 2 * ROPE_FWD_KERNELS + 2, "elementwise",
                 creates={"q_rot": T * q * act, "k_rot": T * kv * act}, frees=["q", "k"], transient=T * (q + kv) * act)
        # flash attention keeps q, k, v, its output and the log-sum-exp
        lse = b * m.num_attention_heads * seq * 4
        shape = (b, m.num_attention_heads, m.num_kv_heads, seq, m.head_dim)
        selective = self.plan.recompute == Recompute.SELECTIVE
        attn = Op(name="flash_attn", category="attention", kind=K.ATTN_FWD, resource="gpu", dtype=self.attn_dtype,
                  flops=attention_fwd_flops(b, m.num_attention_heads, seq, m.head_dim), shape=shape)
        self._emit(attn, {"o": T * q * act, **({} if selective else {"lse": lse})}, None, 0.0)
        kept["o_proj"] = self.projection_fwd(self.o_proj, "o", act, "attn_out")
        self.release(["q_rot", "k_rot", "v", "o"] + ([] if selective else ["lse"]))
        attn_out = self.tp_reduce("attn_out.tp_reduce", "attn_out", T * h * act)
        self.mem("attn_residual", "add", Tn * h * (2 * rs + act), 1, "elementwise",
                 creates={"h1": Tn * h * rs}, frees=[attn_out])
        # post-attention RMSNorm and the MLP
        self.mem("post_attn_norm", _dtyped("rmsnorm_fwd", rs), Tn * h * 2 * rs, RMSNORM_FWD_KERNELS, "norm_reduction",
                 creates={"n2.normed": Tn * h * 4, "n2.rstd": Tn * 4, "n2.out": Tn * h * rs}, transient=Tn * h * 4)
        gathered = self.tp_gather("n2.all_gather", T * h * rs, "n2.g")
        self.moe_dispatch_fwd()
        mlp_outs = ("gate", "up")[: len(self.mlp_in)]
        for p, out in zip(self.mlp_in, mlp_outs):
            kept[p.name] = self.projection_fwd(p, gathered or "n2.out", rs, out)
        if gathered:
            self.t.free(self.ops[-1], [gathered])
        self.release(["n2.normed", "n2.rstd", "h1"])
        if dt.autocast_casts or self.plan.precision == Precision.FP8:
            self.t.free(self.ops[-1], ["n2.out"])
        else:
            self.release(["n2.out"])
        ff = self.mlp_tokens * self.mlp_in[0].n_out * act
        # bytes as the microbenchmark counts them: inputs read once, the product written once
        self.mem("swiglu" if len(self.mlp_in) == 2 else "gelu", "silu_mul", ff * (len(self.mlp_in) + 1),
                 SWIGLU_FWD_KERNELS, "elementwise", creates={"act": ff, "prod": ff})
        kept["down_proj"] = self.projection_fwd(self.down, "prod", act, "mlp_out")
        self.release(list(mlp_outs) + ["act", "prod"])
        self.moe_combine_fwd()
        mlp_out = self.tp_reduce("mlp_out.tp_reduce", "mlp_out", T * h * act)
        self.mem("mlp_residual", "add", Tn * h * (2 * rs + act), 1, "elementwise",
                 creates={"x_next": Tn * h * rs}, frees=[mlp_out])
        if not save:
            for names in kept.values():
                self.t.free(self.ops[-1], [n for n in names if n in self.t.live and not n.endswith(".w16")])
            # autocast's weight cache holds the bf16 copies until the forward ends
        return kept

    def backward(self, kept: dict[str, list[str]], phase: str = "bwd") -> None:
        """Emit one layer's backward; "g" (the residual-stream gradient) is live before and after."""
        if self.fused:
            return self._backward_fused(kept, phase)
        self.phase = phase
        m, dt, T, b, seq = self.m, self.dt, self.T, self.plan.micro_batch, self.plan.seq
        h, q, kv = m.hidden_size, m.q_dim, m.kv_dim
        act = dt.act
        g = 4 if dt.autocast_casts else dt.residual  # bytes of the residual-stream gradient
        grad_cast = dt.autocast_casts
        Tn = self.Tn
        # MLP branch
        self.mem("mlp_residual.bwd", "cast_fp32_to_bf16", Tn * h * (g + act), 1 if grad_cast else 0, "elementwise",
                 creates={"g_mlp_out": Tn * h * act})
        g_mlp_out = self.gathered_grad("g_mlp_out", T * h * act)
        self.moe_combine_bwd()
        self.projection_bwd(self.down, g_mlp_out, "g_prod", kept["down_proj"])
        ff = self.mlp_tokens * self.mlp_in[0].n_out * act
        grads_in = {f"g_{n}": ff for n in ("gate", "up")[: len(self.mlp_in)]}
        self.mem("swiglu.bwd", "silu_mul", ff * 5, SWIGLU_BWD_KERNELS, "elementwise", creates=grads_in,
                 frees=["g_prod", *[n for n in ("gate", "up", "act", "prod") if n in self.t.live]])
        regathered = self.tp_gather("n2.all_gather.bwd", T * h * self.dt.residual, "n2.g", for_wgrad=True)
        if m.moe is not None:
            self.ep_all_to_all("moe_dispatch.bwd.all_to_all", self.mlp_tokens * h * act)
        self._input_grads(self.mlp_in, list(grads_in), kept, "g_n2",
                          extra_free=["n2.out"] + ([regathered] if regathered else []))
        if m.moe is not None:
            self.gemm("router.bwd", T, h, m.moe.num_experts, dt.gemm)
        g_n2 = self.tp_reduce("g_n2.tp_reduce", "g_n2", T * h * (4 if dt.autocast_casts else act))
        self._norm_bwd("post_attn_norm", "n2", g_n2, "h1")
        # attention branch
        self.mem("attn_residual.bwd", "cast_fp32_to_bf16", Tn * h * (g + act), 1 if grad_cast else 0, "elementwise",
                 creates={"g_attn_out": Tn * h * act})
        g_attn_out = self.gathered_grad("g_attn_out", T * h * act)
        self.projection_bwd(self.o_proj, g_attn_out, "g_o", kept["o_proj"])
        shape = (b, m.num_attention_heads, m.num_kv_heads, seq, m.head_dim)
        if self.plan.recompute == Recompute.SELECTIVE:
            recompute = Op(name="flash_attn.recompute", category="attention", kind=K.ATTN_FWD, resource="gpu", dtype=self.attn_dtype,
                           flops=attention_fwd_flops(b, m.num_attention_heads, seq, m.head_dim), shape=shape)
            self._emit(recompute, {"lse": b * m.num_attention_heads * seq * 4}, None, T * q * act)
            self.ops[-1].phase = "recompute"
        bwd = Op(name="flash_attn.bwd", category="attention", kind=K.ATTN_BWD, resource="gpu", dtype=self.attn_dtype,
                 kernels=sdpa_backward_kernels(m.num_attention_heads, m.num_kv_heads),
                 flops=attention_bwd_flops(b, m.num_attention_heads, seq, m.head_dim), shape=shape)
        self._emit(bwd, {"g_q": T * q * act, "g_k": T * kv * act, "g_v": T * kv * act},
                   ["g_o", "q_rot", "k_rot", "v", "o", "lse"], T * q * 4)
        self.mem("rope.bwd", "rope", 2 * T * (q + kv) * act, 2 * ROPE_BWD_KERNELS, "elementwise",
                 creates={"g_qp": T * q * act, "g_kp": T * kv * act}, frees=["g_q", "g_k"])
        regathered = self.tp_gather("n1.all_gather.bwd", T * h * self.dt.residual, "n1.g", for_wgrad=True)
        self._input_grads(self.attn_in, ["g_qp", "g_kp", "g_v"], kept, "g_n1",
                          extra_free=["n1.out"] + ([regathered] if regathered else []))
        g_n1 = self.tp_reduce("g_n1.tp_reduce", "g_n1", T * h * (4 if dt.autocast_casts else act))
        self._norm_bwd("input_norm", "n1", g_n1, "x")

    def _input_grads(self, projs: list[Projection], grads: list[str], kept: dict[str, list[str]],
                     into: str, extra_free: list[str] | None = None) -> None:
        """Backward of projections sharing one input, summing their input gradients into `into`."""
        dt, T, h = self.dt, self.T, self.m.hidden_size
        parts = []
        for i, (p, g) in enumerate(zip(projs, grads)):
            part = f"{into}.{i}"
            self.projection_bwd(p, g, part, kept[p.name])
            if dt.autocast_casts:  # the input cast's backward: bf16 gradient to fp32
                self.mem(f"{p.name}.cast_in.bwd", "cast_fp32_to_bf16", T * h * 6, 1, "elementwise",
                         creates={part + ".f32": T * h * 4}, frees=[part])
                part += ".f32"
            parts.append(part)
        width = 4 if dt.autocast_casts else dt.act
        live_extra = [n for n in (extra_free or []) if n in self.t.live]
        self.mem(f"{into}.sum", "add", (len(parts) + 1) * T * h * width, len(parts) - 1, "elementwise",
                 creates={into: T * h * width}, frees=parts + live_extra)

    def _norm_bwd(self, name: str, prefix: str, grad: str, norm_input: str) -> None:
        """RMSNorm backward, then the residual sum: g += grad through the norm."""
        T, h = self.Tn, self.m.hidden_size
        g = 4 if self.dt.autocast_casts else self.dt.residual
        saved = [n for n in (f"{prefix}.normed", f"{prefix}.rstd", norm_input) if n in self.t.live]
        weight_grad = {} if self.plan.lora_rank else {f"grad.{name}": h * self.dt.grad}
        self.mem(f"{name}.bwd", _dtyped("rmsnorm_bwd", self.dt.residual), 3 * T * h * self.dt.residual,
                 RMSNORM_BWD_KERNELS, "norm_reduction",
                 creates={f"{grad}.x": T * h * g, **weight_grad}, frees=[grad] + saved, transient=T * h * 4)
        self.mem(f"{name}.residual_sum", "add", 3 * T * h * g, 1, "elementwise",
                 creates={"g.new": T * h * g}, frees=["g", f"{grad}.x"])
        self.t.live["g"] = self.t.live.pop("g.new")

    # --- fused kernels (Framework.MEGATRON) ----------------------------------------------
    def fused_op(self, name: str, nbytes: float, inputs: int, category: str, creates=None, frees=None,
              kernels: int = 1, transient: float = 0.0) -> Op:
        """One fused kernel moving its minimal `nbytes` (inputs read once, outputs written once)."""
        return self.mem(name, fused_variant(inputs, self.dt.act), nbytes, kernels, category,
                        creates=creates, frees=frees, transient=transient)

    def _norm_stats(self, tokens: int) -> float:
        """fp32 statistics a fused norm saves per token: mean and 1/std (LayerNorm), 1/rms (RMSNorm)."""
        return tokens * 4 * (2 if self.m.norm == "layernorm" else 1)

    def _fused_norm_fwd(self, name: str, prefix: str, inp_bytes_per_el: int, tokens: int) -> None:
        """Fused LayerNorm/RMSNorm forward: reads its input, writes the normalised output and stats."""
        h, act = self.m.hidden_size, self.dt.act
        stats = self._norm_stats(tokens)
        self.fused_op(name, tokens * h * (inp_bytes_per_el + act) + stats, 1, "norm_reduction",
                   creates={f"{prefix}.stats": stats, f"{prefix}.out": tokens * h * act})

    def _forward_fused(self, save: bool, phase: str) -> dict[str, list[str]]:
        """One layer's forward as Megatron runs it (module docstring, "Fused kernels")."""
        self.save, self.phase = save, phase
        m, dt, T = self.m, self.dt, self.T
        h, q, kv = m.hidden_size, m.q_dim, m.kv_dim
        rs, act, Tn = dt.residual, dt.act, self.Tn
        fp8 = self.plan.precision == Precision.FP8
        kept: dict[str, list[str]] = {}

        self._fused_norm_fwd("input_norm", "n1", rs, Tn)
        gathered = self.tp_gather("n1.all_gather", T * h * act, "n1.g")
        kept["qkv_proj"] = self.projection_fwd(self.qkv_proj, gathered or "n1.out", act, "qkv")
        if gathered:  # not saved: backward gathers it again
            self.t.free(self.ops[-1], [gathered])
        self.release(["n1.stats"])
        if fp8:
            self.t.free(self.ops[-1], ["n1.out"])  # only its fp8 copy is kept
        else:
            self.release(["n1.out"])
        # q, k and v are views of the one QKV output; rotary writes rotated q and k (the
        # QKV buffer stays alive through v until the attention backward)
        if m.position == "rope":
            self.fused_op("rope", 2 * T * (q + kv) * act, 1, "elementwise", kernels=FUSED_ROPE_KERNELS,
                          creates={"q_rot": T * q * act, "k_rot": T * kv * act})
        self._attention_core_fwd()
        kept["o_proj"] = self.projection_fwd(self.o_proj, "o", act, "attn_out")
        self.release(["qkv", "q_rot", "k_rot", "o", "lse", "probs", "probs.mask", "probs.drop"])
        attn_out = self.tp_reduce("attn_out.tp_reduce", "attn_out", T * h * act)
        self._fused_residual_fwd("attn_residual", attn_out, "h1", "drop1.mask")
        self._fused_norm_fwd("post_attn_norm", "n2", rs, Tn)
        gathered = self.tp_gather("n2.all_gather", T * h * act, "n2.g")
        self.moe_dispatch_fwd()
        kept["fc1"] = self.projection_fwd(self.fc1, gathered or "n2.out", act, "fc1")
        if gathered:
            self.t.free(self.ops[-1], [gathered])
        self.release(["n2.stats"])
        if fp8:
            self.t.free(self.ops[-1], ["n2.out"])
        else:
            self.release(["n2.out"])
        ff_in = self.mlp_tokens * self.fc1.n_out * act
        ff = self.mlp_tokens * self.down.n_in * act
        # fused bias-GeLU / SwiGLU: fc1's output read once, the activation written once; both saved
        self.fused_op("swiglu" if len(self.mlp_in) == 2 else "gelu", ff_in + ff, 1, "elementwise",
                      creates={"act": ff})
        kept["down_proj"] = self.projection_fwd(self.down, "act", act, "mlp_out")
        self.release(["fc1", "act"])
        self.moe_combine_fwd()
        mlp_out = self.tp_reduce("mlp_out.tp_reduce", "mlp_out", T * h * act)
        self._fused_residual_fwd("mlp_residual", mlp_out, "x_next", "drop2.mask")
        self.release(["h1"])
        if not save:
            for names in kept.values():
                self.t.free(self.ops[-1], [n for n in names if n in self.t.live])
        return kept

    def _fused_residual_fwd(self, name: str, branch: str, out: str, mask: str) -> None:
        """Fused bias-dropout-add: the branch output and the residual read once, the sum written
        once (with dropout, also its 1-byte mask, saved for backward)."""
        Tn, h, rs, act = self.Tn, self.m.hidden_size, self.dt.residual, self.dt.act
        drop = self.m.dropout > 0
        creates = {out: Tn * h * rs, **({mask: Tn * h} if drop else {})}
        self.fused_op(name, Tn * h * (act + 2 * rs + (1 if drop else 0)), 2, "elementwise",
                      creates=creates, frees=[branch])
        self.release([mask])

    def _fused_residual_bwd(self, name: str, mask: str, out: str) -> None:
        """The branch's output gradient. Without dropout the residual's backward passes g to the
        branch as it is (no kernel, a view of g); with dropout one kernel applies the mask."""
        if self.m.dropout <= 0:
            self.t.live[out] = 0.0
            return
        Tn, h, rs, act = self.Tn, self.m.hidden_size, self.dt.residual, self.dt.act
        self.fused_op(name, Tn * h * (rs + 1 + act), 2, "elementwise", creates={out: Tn * h * act}, frees=[mask])

    def _attention_dims(self) -> tuple[int, int, float]:
        """Batched heads, sequence and the bytes of one s x s score tensor (softmax attention)."""
        m, S = self.m, self.plan.seq
        B = self.plan.micro_batch * m.num_attention_heads
        return B, S, B * S * S * self.dt.act

    def _attention_core_fwd(self, phase: str | None = None) -> None:
        """Attention from q, k, v to its output "o". Flash attention: one kernel, keeping the
        log-sum-exp. Softmax attention (megatron-legacy): QK^T as a batched GEMM, Megatron's fused
        scale-mask-softmax, dropout on the probabilities, the batched GEMM with V, and the copy
        of the context into [s, b, h] layout; it keeps the probabilities (and the dropout mask
        and output), Korthikanti et al.'s 5as^2b. Selective recompute keeps none of them."""
        m, dt, T, b, seq = self.m, self.dt, self.T, self.plan.micro_batch, self.plan.seq
        q, act = m.q_dim, dt.act
        selective = self.plan.recompute == Recompute.SELECTIVE
        recompute = phase == "recompute"
        if self.plan.framework.flash_attention:
            lse = b * m.num_attention_heads * seq * 4
            shape = (b, m.num_attention_heads, m.num_kv_heads, seq, m.head_dim)
            if recompute:
                op = Op(name="flash_attn.recompute", category="attention", kind=K.ATTN_FWD, resource="gpu",
                        dtype=self.attn_dtype, shape=shape,
                        flops=attention_fwd_flops(b, m.num_attention_heads, seq, m.head_dim))
                self._emit(op, {"lse": lse}, None, T * q * act)
                op.phase = "recompute"
                return
            attn = Op(name="flash_attn", category="attention", kind=K.ATTN_FWD, resource="gpu", dtype=self.attn_dtype,
                      flops=attention_fwd_flops(b, m.num_attention_heads, seq, m.head_dim), shape=shape)
            self._emit(attn, {"o": T * q * act, **({} if selective else {"lse": lse})}, None, 0.0)
            return
        B, S, s2 = self._attention_dims()
        bmm = "bf16" if dt.gemm == "fp8" else dt.gemm
        name = "attn.recompute" if recompute else "attn"
        first = len(self.ops)
        self.bmm(f"{name}.qk", B, S, S, m.head_dim, bmm, creates={"scores": s2})
        self.fused_op(f"{name}.softmax", 2 * s2, 1, "norm_reduction", creates={"probs": s2}, frees=["scores"])
        if m.dropout > 0:
            n = B * S * S
            self.fused_op(f"{name}.dropout", s2 * 2 + n, 1, "elementwise",
                          creates={"probs.mask": n, "probs.drop": s2})
        ctx = T * q * act
        if recompute:  # the context is recomputed and dropped: the projection kept its own input
            self.bmm(f"{name}.pv", B, S, m.head_dim, S, bmm, transient=ctx)
            self.fused_op(f"{name}.context_copy", 2 * ctx, 1, "elementwise", transient=ctx)
            for op in self.ops[first:]:
                op.phase = "recompute"
            return
        self.bmm(f"{name}.pv", B, S, m.head_dim, S, bmm, creates={"ctx": ctx})
        self.fused_op(f"{name}.context_copy", 2 * ctx, 1, "elementwise", creates={"o": ctx}, frees=["ctx"])
        if selective:
            self.t.free(self.ops[-1], [n for n in ("probs", "probs.mask", "probs.drop") if n in self.t.live])

    def _attention_core_bwd(self) -> None:
        """Attention backward from "g_o" to "g_qkv" (the QKV GEMM's output gradient)."""
        m, dt, T, b, seq = self.m, self.dt, self.T, self.plan.micro_batch, self.plan.seq
        q, kv, act = m.q_dim, m.kv_dim, dt.act
        selective = self.plan.recompute == Recompute.SELECTIVE
        rotated = [n for n in ("q_rot", "k_rot") if n in self.t.live]
        if self.plan.framework.flash_attention:
            if selective:
                self._attention_core_fwd("recompute")
            shape = (b, m.num_attention_heads, m.num_kv_heads, seq, m.head_dim)
            # flash attention's backward writes dq, dk, dv into one buffer
            bwd = Op(name="flash_attn.bwd", category="attention", kind=K.ATTN_BWD, resource="gpu",
                     dtype=self.attn_dtype, kernels=sdpa_backward_kernels(m.num_attention_heads, m.num_kv_heads),
                     flops=attention_bwd_flops(b, m.num_attention_heads, seq, m.head_dim), shape=shape)
            self._emit(bwd, {"g_qkv": T * (q + 2 * kv) * act}, ["g_o", "o", "lse", "qkv", *rotated], T * q * 4)
            if rotated:  # fused rotary backward, in place on dq and dk
                self.fused_op("rope.bwd", 2 * T * (q + kv) * act, 1, "elementwise", kernels=FUSED_ROPE_KERNELS)
            return
        B, S, s2 = self._attention_dims()
        bmm = "bf16" if dt.gemm == "fp8" else dt.gemm
        ctx = T * q * act
        self.fused_op("attn.context_copy.bwd", 2 * ctx, 1, "elementwise", creates={"g_ctx": ctx}, frees=["g_o"])
        if selective:
            self._attention_core_fwd("recompute")
        drop = m.dropout > 0
        # dP = dO V^T and dV = P^T dO, batched over heads
        self.bmm("attn.pv.dgrad", B, S, S, m.head_dim, bmm, creates={"g_probs": s2})
        self.bmm("attn.pv.dv", B, S, m.head_dim, S, bmm, creates={"g_v": T * kv * act},
                  frees=["g_ctx", *(["probs.drop"] if drop else [])])
        g_probs = "g_probs"
        if drop:
            n = B * S * S
            self.fused_op("attn.dropout.bwd", s2 * 2 + n, 2, "elementwise", creates={"g_probs.d": s2},
                          frees=["g_probs", "probs.mask"])
            g_probs = "g_probs.d"
        self.fused_op("attn.softmax.bwd", 3 * s2, 2, "norm_reduction", creates={"g_scores": s2},
                      frees=[g_probs, "probs"])
        # dQ = dS K and dK = dS^T Q
        self.bmm("attn.qk.dq", B, S, m.head_dim, S, bmm, creates={"g_q": T * q * act})
        self.bmm("attn.qk.dk", B, S, m.head_dim, S, bmm, creates={"g_k": T * kv * act},
                  frees=["g_scores", "o", "qkv", *rotated])
        if rotated:
            self.fused_op("rope.bwd", 2 * T * (q + kv) * act, 1, "elementwise", kernels=FUSED_ROPE_KERNELS)
        # the split of the QKV output into q, k and v: its backward concatenates their gradients
        self.fused_op("attn.qkv_grad_cat", 2 * T * (q + 2 * kv) * act, 1, "elementwise",
                      creates={"g_qkv": T * (q + 2 * kv) * act}, frees=["g_q", "g_k", "g_v"])

    def _backward_fused(self, kept: dict[str, list[str]], phase: str) -> None:
        """One layer's backward as Megatron runs it; "g" (16-bit, the residual-stream gradient) is
        live before and after."""
        self.phase = phase
        m, dt, T = self.m, self.dt, self.T
        h, act = m.hidden_size, dt.act
        # MLP branch
        self._fused_residual_bwd("mlp_residual.bwd", "drop2.mask", "g_mlp_out")
        g_mlp_out = self.gathered_grad("g_mlp_out", T * h * act)
        self.moe_combine_bwd()
        self.projection_bwd(self.down, g_mlp_out, "g_act", kept["down_proj"])
        ff_in = self.mlp_tokens * self.fc1.n_out * act
        ff = self.mlp_tokens * self.down.n_in * act
        # fused bias-GeLU / SwiGLU backward: the activation's gradient and fc1's output read once,
        # fc1's output gradient written once
        self.fused_op("swiglu.bwd" if len(self.mlp_in) == 2 else "gelu.bwd", ff + 2 * ff_in, 2, "elementwise",
                      creates={"g_fc1": ff_in}, frees=["g_act", *[n for n in ("fc1", "act") if n in self.t.live]])
        regathered = self.tp_gather("n2.all_gather.bwd", T * h * act, "n2.g", for_wgrad=True)
        if m.moe is None:
            self.projection_bwd(self.fc1, "g_fc1", "g_n2", kept["fc1"])
        else:  # the experts' input gradients go back to their tokens, summed over the top-k
            self.projection_bwd(self.fc1, "g_fc1", "g_n2.experts", kept["fc1"])
            self.ep_all_to_all("moe_dispatch.bwd.all_to_all", self.mlp_tokens * h * act)
            self.mem("moe_dispatch.bwd", "copy", (self.mlp_tokens + T) * h * act, 1, "other",
                     creates={"g_n2": T * h * act}, frees=["g_n2.experts"])
            self.gemm("router.bwd", T, h, m.moe.num_experts, dt.gemm)
        self.t.free(self.ops[-1], [n for n in ["n2.out"] + ([regathered] if regathered else []) if n in self.t.live])
        g_n2 = self.tp_reduce("g_n2.tp_reduce", "g_n2", T * h * act)
        self._fused_norm_bwd("post_attn_norm", "n2", g_n2, "h1")
        # attention branch
        self._fused_residual_bwd("attn_residual.bwd", "drop1.mask", "g_attn_out")
        g_attn_out = self.gathered_grad("g_attn_out", T * h * act)
        self.projection_bwd(self.o_proj, g_attn_out, "g_o", kept["o_proj"])
        self._attention_core_bwd()
        regathered = self.tp_gather("n1.all_gather.bwd", T * h * act, "n1.g", for_wgrad=True)
        self.projection_bwd(self.qkv_proj, "g_qkv", "g_n1", kept["qkv_proj"])
        self.t.free(self.ops[-1], [n for n in ["n1.out"] + ([regathered] if regathered else []) if n in self.t.live])
        g_n1 = self.tp_reduce("g_n1.tp_reduce", "g_n1", T * h * act)
        self._fused_norm_bwd("input_norm", "n1", g_n1, "x")

    def _fused_norm_bwd(self, name: str, prefix: str, grad: str, norm_input: str) -> None:
        """Fused norm backward (one kernel: the output gradient, the saved input and stats read once,
        the input gradient written once; weight and bias gradients from its per-block partial sums),
        then autograd's residual sum: g += the gradient through the norm."""
        T, h, rs, act = self.Tn, self.m.hidden_size, self.dt.residual, self.dt.act
        stats = self._norm_stats(T)
        saved = [n for n in (f"{prefix}.stats", norm_input) if n in self.t.live]
        n_weights = 2 if self.m.norm == "layernorm" else 1
        weight_grad = {} if self.plan.lora_rank else {f"grad.{name}": n_weights * h * self.dt.grad}
        self.fused_op(f"{name}.bwd", T * h * (act + 2 * rs) + stats, 2, "norm_reduction",
                   creates={f"{grad}.x": T * h * rs, **weight_grad}, frees=[grad] + saved)
        self.fused_op(f"{name}.residual_sum", 3 * T * h * rs, 2, "elementwise",
                   creates={"g.new": T * h * rs}, frees=["g", f"{grad}.x"])
        self.t.live["g"] = self.t.live.pop("g.new")
