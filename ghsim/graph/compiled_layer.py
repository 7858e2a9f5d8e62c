"""One decoder layer as torch.compile (Inductor) runs a Hugging Face Llama layer (plan.compile).

What changes against the eager layer (graph/eager_layer.py), as the compiled traces of
validation/measured_libraries (h100-compile-*) show it:
- each region between two GEMMs or attention calls is one Triton kernel that reads its inputs and
  writes its outputs once: the residual add with the RMSNorm after it and autocast's cast of the
  norm's output (one bf16 output feeds q, k and v: no per-projection input casts, no fp32
  normalised copy saved), SiLU x mul (silu's output not saved: backward recomputes it), the rotary
  embedding with its cast, and in backward the sum of the projections' input gradients with the
  norm's backward and the residual gradient;
- weight and gradient casts are Inductor's cast kernels;
- under torch.compile Hugging Face materialises the causal mask (masking_utils does not skip it
  while tracing), so SDPA gets a boolean mask and k, v expanded to every query head (repeat_kv):
  cuDNN's masked kernel, slower than is_causal (cost/library_overheads.py), and k, v saved at
  the query heads' width;
- the loss is Inductor's online log-softmax: no fp32 logits or log-probabilities kept, only the
  bf16 logits and a log-sum-exp per token.
Each region is priced on the curve measured for it compiled (hardware_profiles/calibration/
inductor_regions.toml, from validation/microbench/issue15/compile_regions.json): variant
"inductor:<region>".
"""

from __future__ import annotations

from ghsim.graph.dtypes import DOWNCAST, UPCAST, dtyped, inductor
from ghsim.graph.eager_layer import EagerLayer
from ghsim.graph.kernels import SDPA_BWD_KERNELS
from ghsim.graph.layer_ops import LayerOps, Projection
from ghsim.graph.ops import Category

# Kernels as the compiled HF Llama traces show them (validation/measured_libraries/h100-compile-*):
# the cross entropy's online log-softmax (2) and, in backward, the zero-filled gradient buffer HF's loss
# hands over (aten::zeros) and the fused kernel that reads it with the logits (2); the rotary's backward
# (q: 1; k: rotation and the sum over the heads it was expanded to, 2) and v's head sum (sum and a
# transposing copy, 2).
INDUCTOR_CE_FWD_KERNELS = 2
INDUCTOR_CE_BWD_KERNELS = 2
ROPE_BWD_KERNELS = 3
REPEAT_KV_BWD_KERNELS = 2


class CompiledLayer(EagerLayer):
    """The eager layer's regions as Inductor fuses them, when the plan compiles; else the eager ones."""

    _pending_add: tuple[str, str] | None = None  # a residual add Inductor fuses into the next norm

    @property
    def downcast(self) -> str:
        return inductor("downcast") if self.plan.compile else DOWNCAST

    @property
    def upcast(self) -> str:
        return inductor("upcast") if self.plan.compile else UPCAST

    @property
    def norm_out_width(self) -> int:
        return self.dt.act if self.plan.compile else super().norm_out_width

    @property
    def norm_out_cast(self) -> bool:
        return False if self.plan.compile else super().norm_out_cast

    @property
    def _hf_compiled_mask(self) -> bool:
        """Hugging Face's modeling code under compile: a boolean causal mask, k and v expanded (torchtitan's
        calls SDPA with is_causal and passes k and v as they are)."""
        return self.plan.compile and self.plan.modeling == "hf"

    @property
    def sdpa_mask(self) -> str:
        return "bool_mask" if self._hf_compiled_mask else super().sdpa_mask

    @property
    def sdpa_kv_dim(self) -> int:
        return self.m.q_dim if self._hf_compiled_mask else super().sdpa_kv_dim

    def _sdpa_bwd_kernels(self) -> int:
        # k and v come expanded: no GQA reduction kernels after cuDNN's backward
        return SDPA_BWD_KERNELS if self._hf_compiled_mask else super()._sdpa_bwd_kernels()

    # --- forward ------------------------------------------------------------------------
    def _residual_add(self, name: str, branch_out: str, out: str) -> None:
        if not self.plan.compile:
            return super()._residual_add(name, branch_out, out)
        if name == "attn_residual":  # fused into the post-attention norm that follows
            self._pending_add = (branch_out, out)
            return
        h, rs, act, Tn = self.m.hidden_size, self.dt.residual, self.dt.act, self.Tn
        self.mem(name, inductor("add"), Tn * h * (2 * rs + act), 1, Category.ELEMENTWISE,
                 creates={out: Tn * h * rs}, frees=[branch_out])

    def _eager_norm_fwd(self, name: str, prefix: str, tokens: int) -> None:
        if not self.plan.compile:
            return super()._eager_norm_fwd(name, prefix, tokens)
        h, rs, act = self.m.hidden_size, self.dt.residual, self.dt.act
        creates = {f"{prefix}.rstd": tokens * 4, f"{prefix}.out": tokens * h * act}
        nbytes, frees, region = tokens * h * (rs + act) + tokens * 4, [], "rmsnorm"
        if self._pending_add:  # reads the branch's output too, writes the new residual stream
            branch_out, out = self._pending_add
            self._pending_add = None
            nbytes += tokens * h * (act + rs)
            creates[out], frees, region = tokens * h * rs, [branch_out], "add_rmsnorm"
        self.mem(name, inductor(region), nbytes, 1, Category.NORM_REDUCTION, creates=creates, frees=frees)

    def _rope_fwd(self) -> None:
        if not self.plan.compile:
            return super()._rope_fwd()
        T, act, q, kv = self.T, self.dt.act, self.m.q_dim, self.m.kv_dim
        # q and k read once, rotated (k expanded to the query heads) and written once in bf16
        self.mem("rope", inductor("rope"), T * (q + kv) * act + T * (q + self.sdpa_kv_dim) * act, 2,
                 Category.ELEMENTWISE, creates={"q_rot": T * q * act, "k_rot": T * self.sdpa_kv_dim * act},
                 frees=["q", "k"])

    def _kv_for_sdpa(self) -> None:
        if not self._hf_compiled_mask:
            return super()._kv_for_sdpa()
        T, act = self.T, self.dt.act
        # HF's repeat_kv of v (k's expansion is fused into its rotation)
        self.mem("repeat_kv", inductor("downcast"), T * (self.m.kv_dim + self.sdpa_kv_dim) * act, 1,
                 Category.ELEMENTWISE, creates={"v.exp": T * self.sdpa_kv_dim * act}, frees=["v"])
        self.t.live["v"] = self.t.live.pop("v.exp")

    def _mlp_act_fwd(self, name: str, ff: float, inputs: int, act: str, prod: str) -> None:
        if not self.plan.compile:
            return super()._mlp_act_fwd(name, ff, inputs, act, prod)
        self.mem(name, inductor("swiglu"), ff * (inputs + 1), 1, Category.ELEMENTWISE, creates={prod: ff})

    # --- backward -----------------------------------------------------------------------
    def _mlp_act_bwd(self, name: str, ff: float, grads: dict[str, float], frees: list[str]) -> None:
        if not self.plan.compile:
            return super()._mlp_act_bwd(name, ff, grads, frees)
        self.mem(name, inductor("swiglu_bwd"), ff * 5, 1, Category.ELEMENTWISE, creates=grads, frees=frees)

    def _rope_bwd(self) -> None:
        if not self.plan.compile:
            return super()._rope_bwd()
        T, act, q, kv, kvs = self.T, self.dt.act, self.m.q_dim, self.m.kv_dim, self.sdpa_kv_dim
        # q's gradient rotated back; k's summed over the query heads it was expanded to, then rotated
        self.mem("rope.bwd", inductor("rope_bwd"), T * (2 * q + kvs + kv) * act, ROPE_BWD_KERNELS, Category.ELEMENTWISE,
                 creates={"g_qp": T * q * act, "g_kp": T * kv * act}, frees=["g_q", "g_k"])
        if self._hf_compiled_mask:
            self.mem("repeat_kv.bwd", inductor("downcast"), T * (kvs + kv) * act, REPEAT_KV_BWD_KERNELS,
                     Category.ELEMENTWISE, creates={"g_v.sum": T * kv * act}, frees=["g_v"])
            self.t.live["g_v"] = self.t.live.pop("g_v.sum")

    def _input_grads(self, projs: list[Projection], grads: list[str], kept: dict[str, list[str]],
                     into: str, extra_free: list[str] | None = None) -> None:
        """The projections' input gradients (bf16), summed by the kernel that runs the norm's backward
        and adds the residual gradient: `into` is the new residual gradient (see _norm_bwd)."""
        if not self.plan.compile:
            return super()._input_grads(projs, grads, kept, into, extra_free)
        parts = []
        for i, (p, g) in enumerate(zip(projs, grads)):
            parts.append(f"{into}.{i}")
            self.projection_bwd(p, g, parts[-1], kept[p.name])
        T, h, act, rs = self.Tn, self.m.hidden_size, self.dt.act, self.dt.residual
        g = self._grad_width
        live_extra = [n for n in (extra_free or []) if n in self.t.live]
        self.mem(f"{into}.norm_bwd", inductor("rmsnorm_bwd"), T * h * (len(parts) * act + rs + 2 * g) + T * 4, 1,
                 Category.NORM_REDUCTION, creates={into: T * h * g}, frees=parts + live_extra)

    def _norm_bwd(self, name: str, prefix: str, grad: str, norm_input: str) -> None:
        """`grad` already holds the new residual gradient (_input_grads): what is left is the norm
        weight's gradient, a reduction of the fused kernel's per-block partial sums."""
        if not self.plan.compile:
            return super()._norm_bwd(name, prefix, grad, norm_input)
        saved = [n for n in (f"{prefix}.out", f"{prefix}.rstd", norm_input) if n in self.t.live]
        weight_grad = {} if self.plan.lora_rank else {f"grad.{name}": self.m.hidden_size * self.dt.grad}
        self.mem(f"{name}.wgrad_reduce", "copy", 0.0, 1, Category.NORM_REDUCTION, creates=weight_grad,
                 frees=["g"] + saved)
        self.t.live["g"] = self.t.live.pop(grad)

    @property
    def _grad_width(self) -> int:
        """Bytes per element of the residual stream's gradient (fp32 under autocast)."""
        return 4 if self.dt.autocast_casts else self.dt.residual


# --- the loss ---------------------------------------------------------------------------------
def compiled_cross_entropy_fwd(b: LayerOps, T: int, V: int, act: int) -> None:
    """Inductor's cross entropy: an online log-softmax reading the 16-bit logits once; it keeps the
    logits (for backward) and one log-sum-exp per token, no fp32 copies."""
    b.mem("cross_entropy", inductor("cross_entropy"), T * V * act + T * 4, INDUCTOR_CE_FWD_KERNELS,
          Category.NORM_REDUCTION, creates={"lse": T * 4})


def compiled_cross_entropy_bwd(b: LayerOps, T: int, V: int, act: int) -> None:
    """The softmax gradient recomputed from the logits and the log-sum-exp, written in the logits' dtype:
    HF's loss backward fills a zero gradient buffer (T x V) that the fused kernel reads with the logits;
    the logits and the new gradient are both held while it runs (the microbenchmark's peak).

    That buffer is the gradient autograd materialises for the logits output, which the loss does not use
    (AOTAutograd does not set_materialize_grads(False): torch/_functorch/_aot_autograd/runtime_wrappers.py,
    Note [AOTAutograd Backward Guards]). Under mode="reduce-overhead" the backward graph's recording copies
    every input that is neither static nor already in the graphs' pool into that pool
    (torch/_inductor/cudagraph_trees.py, CUDAGraphNode._allocate_and_copy_recording_inputs: "static_input
    does an allocation!"), while the backward call's arguments still hold the original: a second T x V
    buffer, held until the kernel that reads it; every replay copies the new zeros into it
    (CUDAGraphNode.run, _copy_input: the 3B reduce-overhead trace's one large Memcpy DtoD, 525,336,576
    bytes = 2048 x 128256 x 2, 347 us)."""
    pool_copy = T * V * act if b.plan.cuda_graphs else 0
    if pool_copy:
        b.mem("cudagraph.input_copy", dtyped("copy", act), 2 * pool_copy, 1, Category.ELEMENTWISE)
    b.mem("cross_entropy.bwd", inductor("cross_entropy_bwd"), 4 * T * V * act + T * 4, INDUCTOR_CE_BWD_KERNELS,
          Category.NORM_REDUCTION, creates={"g_logits": T * V * act}, frees=["logits", "lse"],
          transient=T * V * act + pool_copy)


def compiled_final_norm_bwd(b: LayerOps, creates: dict[str, float], frees: list[str]) -> None:
    """The final norm's backward: the LM head's input gradient (bf16), the saved input and 1/rms read,
    the residual stream's first gradient written; then the norm weight's reduction."""
    T, h = b.T, b.m.hidden_size
    nbytes = T * h * (b.dt.act + b.dt.residual) + T * 4 + creates["g"]
    b.mem("final_norm.bwd", inductor("rmsnorm_bwd"), nbytes, 2, Category.NORM_REDUCTION, creates=creates, frees=frees)
