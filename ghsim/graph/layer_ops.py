"""The shapes of one decoder layer's shard and the op constructors its builders share."""

from __future__ import annotations

from dataclasses import dataclass

from ghsim.graph.dtypes import DOWNCAST, UPCAST, Dtypes, dtyped
from ghsim.graph.flops import attention_bwd_flops, attention_fwd_flops, window_pair_fraction
from ghsim.graph.kernels import COMPOSITE_SPLITS, FP8_QUANT_KERNELS
from ghsim.graph.ops import Category, Collective, Kind, Op, Phase, Resource
from ghsim.graph.tensors import Tensors
from ghsim.model import WINDOW_PATTERNS, ModelSpec
from ghsim.plan import Plan, Precision


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


# the fused and MoE projections, by the peft projections they stand for (an adapter sits on the
# fused weight when any of its parts is targeted, as NeMo's on linear_qkv)
_LORA_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "fc1": ("gate_proj", "up_proj"),
               "expert_gate": ("gate_proj",), "expert_up": ("up_proj",), "expert_down": ("down_proj",),
               "shared_gate": ("gate_proj",), "shared_up": ("up_proj",), "shared_down": ("down_proj",),
               "shared_fc1": ("gate_proj", "up_proj")}


MASKED_SDPA = "masked"  # an attention op whose window reaches SDPA as a boolean mask


def lora_targeted(plan: Plan, projection: str) -> bool:
    """Whether the plan's LoRA puts an adapter on `projection` (the other projections are frozen)."""
    return any(t in plan.lora_targets for t in _LORA_PARTS.get(projection, (projection,)))


@dataclass(frozen=True)
class Projection:
    name: str
    n_out: int
    n_in: int
    experts: int = 1  # MoE: expert weights this projection holds (tokens go to top-k of them)


class LayerOps:
    """What every decoder-layer builder shares: the layer's shapes and dtypes, its live tensors,
    and the op constructors (kernels, collectives, MoE routing, projections) its forward and
    backward are written in. LayerBuilder (graph/transformer.py) is the one to use."""

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
        # MoE shared experts (Qwen2-MoE, DeepSeek): a dense MLP beside the routed experts, on every token
        fs = model.moe.shared_intermediate_size if model.moe is not None else 0
        self.shared_in = [Projection("shared_gate", fs, h), Projection("shared_up", fs, h)] if fs else []
        self.shared_down = Projection("shared_down", h, fs)
        if model.mlp == "gelu":
            self.mlp_in = self.mlp_in[:1]
            self.shared_in = self.shared_in[:1]
        # fused mode: Megatron's one QKV GEMM and one fc1 GEMM (SwiGLU's gate and up side by side)
        self.fused = plan.framework.fused_kernels
        self.qkv_proj = Projection("qkv_proj", q + 2 * kv, h)
        gate = self.mlp_in[0]
        self.fc1 = Projection("fc1", gate.n_out * len(self.mlp_in), h, gate.experts)
        self.shared_fc1 = Projection("shared_fc1", fs * len(self.shared_in), h)
        # SDPA runs in fp32 for fp32/tf32 plans (no tensor-core flash kernel), else in bf16
        self.attn_dtype = "fp32" if plan.precision in (Precision.FP32, Precision.TF32) else "bf16"
        self.t = Tensors()
        self.ops: list[Op] = []
        self.phase = Phase.FWD
        self.save = True

    # the measured curves of dtype casts (a compiled step's casts are Inductor's: graph/compiled_layer.py)
    downcast = DOWNCAST
    upcast = UPCAST

    @property
    def torchao_recipe(self) -> str:
        return self.plan.torchao_recipe

    # --- attention ---------------------------------------------------------------------
    def attention_call(self, backward: bool) -> tuple[tuple[int, ...], float, str]:
        """(shape, FLOPs, variant) of one attention kernel call (SDPA or flash), forward or backward.

        A sliding window shorter than the sequence does only the allowed pairs' work (on the layers
        that have it: all, or alternate ones). Flash kernels with a window (Megatron/Transformer
        Engine) skip the rest; PyTorch SDPA under Hugging Face gets a boolean mask instead
        (variant MASKED_SDPA) and computes every pair (cost/compute.attention_time). The shape
        carries the window and the share of layers with it for that pricing."""
        m, b, seq = self.m, self.plan.micro_batch, self.plan.seq
        shape = (b, m.num_attention_heads, m.num_kv_heads, seq, m.head_dim)
        flops = (attention_bwd_flops if backward else attention_fwd_flops)(b, m.num_attention_heads, seq, m.head_dim)
        if not 0 < m.sliding_window < seq:
            return shape, flops, ""
        share = WINDOW_PATTERNS[m.sliding_window_pattern]
        work = 1.0 - share + share * window_pair_fraction(seq, m.sliding_window)
        return (*shape, m.sliding_window, share), flops * work, "" if self.fused else MASKED_SDPA

    # --- op constructors --------------------------------------------------------------
    def _emit(self, op: Op, creates: dict[str, float] | None, frees: list[str] | None, transient: float,
              phase: Phase | None = None) -> Op:
        """Append `op` as this builder issues it: its waits, memory effects and phase (`phase`:
        other than the builder's). Returns the appended op (a changed copy of `op`)."""
        deps = op.deps
        if self._after is not None:
            deps = deps + (self._after,)
            self._after = None
        if self._before_wgrad is not None and op.name.endswith(".wgrad"):
            deps = deps + (self._before_wgrad,)
            self._before_wgrad = None
        changes = self.t.created(creates or {}) + self.t.freed(frees or [])
        op = op.evolve(changes, deps=deps, hbm_transient=transient, phase=phase or self.phase)
        self.ops.append(op)
        return op

    def mem(self, name: str, variant: str, nbytes: float, kernels: int, category: Category,
            creates=None, frees=None, transient: float = 0.0) -> Op:
        op = Op(name=name, category=category, kind=Kind.MEMBOUND, resource=Resource.GPU, bytes=nbytes,
                variant=variant, kernels=kernels, split=COMPOSITE_SPLITS.get(variant.split(":")[0]))
        return self._emit(op, creates, frees, transient)

    def gemm(self, name: str, m: int, n: int, k: int, dtype: str, creates=None, frees=None,
             transient: float = 0.0) -> Op:
        op = Op(name=name, category=Category.GEMM, kind=Kind.GEMM, resource=Resource.GPU,
                shape=(int(m), int(n), int(k)),
                flops=2.0 * m * n * k, dtype=dtype)
        return self._emit(op, creates, frees, transient)

    def bmm(self, name: str, batch: int, m: int, n: int, k: int, dtype: str, creates=None, frees=None,
            transient: float = 0.0) -> Op:
        """`batch` GEMMs of m x n x k (one per head), one kernel; bytes: every operand once."""
        width = 4 if dtype in ("fp32", "tf32") else 2
        op = Op(name=name, category=Category.GEMM, kind=Kind.GEMM, resource=Resource.GPU,
                shape=(int(batch * m), int(n), int(k)),
                flops=2.0 * batch * m * n * k, dtype=dtype, variant="batched",
                bytes=float(batch) * (m * k + k * n + m * n) * width)
        return self._emit(op, creates, frees, transient)

    def collective(self, name: str, kind: Collective, nbytes: float, resource: Resource, creates=None,
                   frees=None) -> Op:
        """A collective on its group's link stream: it waits for the op before it, the next op waits for it."""
        op = Op(name=name, category=Category.COMMUNICATION, kind=Kind.COLLECTIVE, resource=resource, variant=kind,
                bytes=nbytes, deps=(len(self.ops) - 1,))
        op = self._emit(op, creates, frees, 0.0)
        self._after = len(self.ops) - 1
        return op

    def tp_gather(self, name: str, tensor_bytes: float, out: str, for_wgrad: bool = False) -> str | None:
        """Sequence parallelism: all-gather a seq/tp-sharded tensor into `out` (full bytes given).

        for_wgrad: backward's re-gather of a GEMM input, which Megatron overlaps with the
        dgrad GEMM: only the first weight-gradient GEMM after it waits for it."""
        if self.Tn == self.T:
            return None
        self.collective(name, Collective.ALL_GATHER, tensor_bytes, Resource.TP, creates={out: tensor_bytes})
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
        self.mem("moe_dispatch", "copy", 2 * self.mlp_tokens * h * act, 6, Category.OTHER,
                 transient=self.mlp_tokens * h * act)
        self.ep_all_to_all("moe_dispatch.all_to_all", self.mlp_tokens * h * act)

    def moe_combine_fwd(self) -> None:
        """Expert outputs back to their tokens' ranks, then the weighted sum over the top-k."""
        if self.m.moe is None:
            return
        nbytes = self.mlp_tokens * self.m.hidden_size * self.dt.act
        self.ep_all_to_all("moe_combine.all_to_all", nbytes)
        self.mem("moe_combine", "copy", 2 * nbytes, 4, Category.OTHER)

    def moe_combine_bwd(self) -> None:
        if self.m.moe is None:
            return
        nbytes = self.mlp_tokens * self.m.hidden_size * self.dt.act
        self.mem("moe_combine.bwd", "copy", 2 * nbytes, 4, Category.OTHER)
        self.ep_all_to_all("moe_combine.bwd.all_to_all", nbytes)

    def gathered_grad(self, grad: str, tensor_bytes: float) -> str:
        """A branch's output gradient, all-gathered over the sequence under sequence parallelism
        (the sharded copy is freed); the name to use from here on."""
        if self.tp_gather(f"{grad}.all_gather", tensor_bytes, f"{grad}.g") is None:
            return grad
        self.ops[-1] = self.t.free(self.ops[-1], [grad])
        return f"{grad}.g"

    def tp_reduce(self, name: str, tensor: str, tensor_bytes: float) -> str:
        """Sum the partial outputs of a row-parallel GEMM; returns the name of the summed tensor."""
        if self.split.tp == 1:
            return tensor
        if self.Tn == self.T:
            self.collective(name, Collective.ALL_REDUCE, tensor_bytes, Resource.TP)
            return tensor
        out = tensor + ".sp"
        self.collective(name, Collective.REDUCE_SCATTER, tensor_bytes, Resource.TP,
                        creates={out: tensor_bytes / self.split.tp},
                        frees=[tensor])
        return out

    def ep_all_to_all(self, name: str, nbytes: float) -> None:
        if self.split.ep > 1:
            self.collective(name, Collective.ALL_TO_ALL, nbytes, Resource.EP)

    def release(self, names: list[str]) -> None:
        """Tensors whose last forward use has passed: kept if saved for backward, else freed."""
        if self.save or not names:
            return
        self.ops[-1] = self.t.free(self.ops[-1], [n for n in names if n in self.t.live])

    # --- projections -----------------------------------------------------------------
    def input_needed(self, projections: list[Projection]) -> bool:
        """Whether backward reads these projections' input: for a weight gradient, or a LoRA
        adapter's (unless each adapter keeps its own copy: peft_input_casts); a frozen projection
        without an adapter needs only its weight."""
        if not self.plan.lora_rank:
            return True
        return not self.peft_input_casts and any(lora_targeted(self.plan, p.name) for p in projections)

    @property
    def peft_input_casts(self) -> bool:
        """Whether each adapter casts its input to the adapters' fp32 and back (peft; eager_layer.py)."""
        return False

    def _proj_tokens(self, p: Projection) -> int:
        return self.mlp_tokens if p.experts > 1 else self.T

    def projection_fwd(self, p: Projection, inp: str, inp_bytes_per_el: int, out: str) -> list[str]:
        """Forward of one projection; returns the names it keeps for its backward."""
        dt, T = self.dt, self._proj_tokens(p)
        frozen = self.plan.lora_rank > 0  # LoRA: every base weight is frozen, in 16 bits
        lora = self.plan.lora_rank if frozen and lora_targeted(self.plan, p.name) else 0
        keep: list[str] = []
        out_bytes = T * p.n_out * dt.act
        if self.torchao_recipe:
            return self.torchao_fwd(p, inp_bytes_per_el, T, out, out_bytes)
        if self.plan.precision == Precision.FP8:
            for what, numel, src in (("x", T * p.n_in, inp_bytes_per_el), ("w", p.n_in * p.n_out, dt.param)):
                # bytes as microbench2 counts them: the source read once, the fp8 copy written once
                self.mem(f"{p.name}.fp8_quant_{what}", dtyped("fp8_quant", src), numel * (src + 1),
                         FP8_QUANT_KERNELS, Category.ELEMENTWISE, creates={f"{p.name}.{what}8": numel},
                         transient=numel * src)
                keep.append(f"{p.name}.{what}8")
            self.gemm(p.name, T, p.n_out, p.n_in, "fp8", creates={out: out_bytes})
            return keep
        # a frozen projection without an adapter needs only its weight for the input gradient:
        # autograd saves no input for it
        needs_input = not frozen or bool(lora)
        if dt.autocast_casts and inp_bytes_per_el == 4:
            # autocast casts the fp32 input once per projection; each copy is saved (if needed)
            self.mem(f"{p.name}.cast_in", self.downcast, T * p.n_in * 6, 1, Category.ELEMENTWISE,
                     creates={f"{p.name}.x16": T * p.n_in * 2})
            keep.append(f"{p.name}.x16")
        if dt.autocast_casts and not frozen:
            w = p.n_in * p.n_out * p.experts
            self.mem(f"{p.name}.cast_w", self.downcast, w * 6, 1, Category.ELEMENTWISE,
                     creates={f"{p.name}.w16": w * 2})
            keep.append(f"{p.name}.w16")
        self.gemm(p.name, T, p.n_out, p.n_in, dt.gemm, creates={out: out_bytes})
        if not needs_input and f"{p.name}.x16" in keep:
            keep.remove(f"{p.name}.x16")
            self.ops[-1] = self.t.free(self.ops[-1], [f"{p.name}.x16"])
        if lora:
            keep += self.lora_fwd(p, lora, T, out_bytes)
        return keep  # (the input itself is the caller's to keep)

    @property
    def adapter_dtype(self) -> str:
        """LoRA adapters run in 16 bits, also beside fp8 base GEMMs (NeMo's fp8 LoRA)."""
        return "bf16" if self.dt.gemm == "fp8" else self.dt.gemm

    def lora_fwd(self, p: Projection, lora: int, T: int, out_bytes: float) -> list[str]:
        """The adapter beside projection `p`: x A, then (x A) B added to the output; keeps x A
        (and, with peft_input_casts, its own 16-bit copy of x)."""
        dt, gemm = self.dt, self.adapter_dtype
        keep = []
        if self.peft_input_casts:
            # peft casts x to the fp32 adapter's dtype (LoraLayer._cast_input_dtype) and autocast casts
            # that back to bf16 for lora_A's GEMM, which saves the bf16 copy for its weight gradient
            x = T * p.n_in
            self.mem(f"{p.name}.lora_x_up", self.upcast, x * (dt.act + 4), 1, Category.ELEMENTWISE, transient=x * 4)
            self.mem(f"{p.name}.lora_x_down", self.downcast, x * (4 + dt.act), 1, Category.ELEMENTWISE,
                     creates={f"{p.name}.lora_x": x * dt.act}, transient=x * 4)
            keep.append(f"{p.name}.lora_x")
        self.gemm(f"{p.name}.lora_a", T, lora, p.n_in, gemm, creates={f"{p.name}.xa": T * lora * dt.act})
        self.gemm(f"{p.name}.lora_b", T, p.n_out, lora, gemm, transient=out_bytes)
        # scale-and-add, plus autocast's casts of the two fp32 adapters
        self.mem(f"{p.name}.lora_add", "add", out_bytes * 3, 4, Category.ELEMENTWISE, transient=out_bytes)
        return keep + [f"{p.name}.xa"]

    def lora_bwd(self, p: Projection, lora: int, T: int, gin: float) -> None:
        """The adapter's gradients (fp32) and its share of the input gradient."""
        dt, gemm = self.dt, self.adapter_dtype
        self.gemm(f"{p.name}.lora_b.wgrad", p.n_out, lora, T, gemm)
        self.gemm(f"{p.name}.lora_b.dgrad", T, lora, p.n_out, gemm, transient=T * lora * dt.act)
        self.gemm(f"{p.name}.lora_a.wgrad", lora, p.n_in, T, gemm)
        self.gemm(f"{p.name}.lora_a.dgrad", T, p.n_in, lora, gemm, transient=gin)
        if self.peft_input_casts:  # the two casts' backward: bf16 -> fp32 (autocast's), fp32 -> bf16 (peft's)
            x = T * p.n_in
            self.mem(f"{p.name}.lora_dx_up", self.upcast, x * (dt.act + 4), 1, Category.ELEMENTWISE, transient=x * 4)
            self.mem(f"{p.name}.lora_dx_down", self.downcast, x * (4 + dt.act), 1, Category.ELEMENTWISE,
                     transient=x * 4)
        self.mem(f"{p.name}.lora_grad_add", "add", gin * 3, 1, Category.ELEMENTWISE)
        adapter = lora * (p.n_in + p.n_out)
        self.mem(f"{p.name}.lora_grad_cast", self.upcast, adapter * 6, 2, Category.ELEMENTWISE,
                 creates={f"grad.{p.name}": adapter * 4})

    def projection_bwd(self, p: Projection, grad_out: str, grad_in: str, kept: list[str],
                       free_grad: bool = True) -> None:
        """dgrad into `grad_in`, weight (or adapter) gradients, then frees what the forward kept
        (and `grad_out`, unless another projection reads it too: a shared expert's)."""
        dt, T = self.dt, self._proj_tokens(p)
        frozen = self.plan.lora_rank > 0
        lora = self.plan.lora_rank if frozen and lora_targeted(self.plan, p.name) else 0
        gin = T * p.n_in * dt.act
        if self.torchao_recipe:
            self.torchao_bwd(p, T, grad_in, gin)
            self.ops[-1] = self.t.free(self.ops[-1], kept + ([grad_out] if free_grad else []))
            return
        if self.plan.precision == Precision.FP8:
            g = T * p.n_out
            self.mem(f"{p.name}.fp8_quant_grad", dtyped("fp8_quant", dt.act), g * (dt.act + 1), FP8_QUANT_KERNELS + 1,
                     Category.ELEMENTWISE, transient=g * (dt.act + 1))
            # transposed copies of the saved fp8 operands, for cuBLAS layouts
            moved = p.n_in * p.n_out + T * p.n_in + g
            self.mem(f"{p.name}.fp8_transpose", "fp8_transpose", 2 * moved, 3, Category.ELEMENTWISE, transient=moved)
        self.gemm(f"{p.name}.dgrad", T, p.n_in, p.n_out, dt.gemm, creates={grad_in: gin})
        if lora:
            self.lora_bwd(p, lora, T, gin)
        elif frozen:
            pass  # a frozen projection without an adapter: its input gradient only
        else:
            w = p.n_in * p.n_out * p.experts
            if self.plan.precision == Precision.FP8:  # fp8 wgrad writes the fp32 gradient directly
                self.gemm(f"{p.name}.wgrad", p.n_out, p.n_in, T, "fp8", creates={f"grad.{p.name}": w * 4})
            elif dt.autocast_casts:
                # the bf16 weight gradient flows back through the weight cast: fp32 .grad
                self.gemm(f"{p.name}.wgrad", p.n_out, p.n_in, T, dt.gemm, transient=w * 2)
                self.mem(f"{p.name}.wgrad_cast", self.upcast, w * 6, 1, Category.ELEMENTWISE,
                         creates={f"grad.{p.name}": w * 4})
            else:
                self.gemm(f"{p.name}.wgrad", p.n_out, p.n_in, T, dt.gemm, creates={f"grad.{p.name}": w * dt.grad})
        self.ops[-1] = self.t.free(self.ops[-1], kept + ([grad_out] if free_grad else []))
