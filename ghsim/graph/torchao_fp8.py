"""The projections of an eager-framework plan under `--precision fp8 --fp8-recipe tensorwise|rowwise`:
FP8 training as torchao runs it (convert_to_float8_training: every decoder-layer nn.Linear becomes a
Float8Linear; the LM head and attention stay bf16, as torchtitan filters them).

Float8Linear scales dynamically (torchao/float8/float8_linear.py, matmul_with_hp_or_float8_args):
- forward: the input (autocast's bf16 copy of it) and the fp32 master weight are each cast to e4m3 with
  a scale from their own amax (per tensor, or per row / column for rowwise), then one torch._scaled_mm;
  the high-precision input is what autograd keeps;
- backward: the output gradient is cast twice (one layout per GEMM), the weight cast again for the input
  gradient and the saved input for the weight gradient, plus the layout copies cuBLAS needs; the weight
  gradient comes back in bf16 and autocast casts it to the fp32 .grad.
Eager, each cast is a chain of PyTorch ops (abs, amax, scale, clamp, cast: 10-11 kernels; rowwise's
power-of-2 scales add log2, floor and exp2: validation/microbench/issue15/h100-microbench15b.json "f8lin",
79-81 kernels per tensorwise linear, 103-105 per rowwise one); under torch.compile (plan.compile) Inductor
fuses each into 1 (rowwise) or 3 (tensorwise) kernels, folds the layout copies in and casts a shared
input (q, k and v's; gate and up's) once. Compiled, no fp8 input is kept for backward: AOTAutograd's
min-cut partitioner recomputes it from tensors backward keeps anyway (the norm's input and 1/rms, SDPA's
output, gate and up: the compiled 1B traces' backward casts SiLU's product again inside the SiLU-backward
kernel), which is why compiled float8 1B peaks 4.8 GiB below compiled bf16, where a kept fp8 input would
leave 3.1 GiB (validation/measured_libraries/h100-ao-*-compile-llama1b-mb4-s2048). Tensorwise writes both
layouts of an operand from one scale and re-creates the forward's fp8 input with its saved scale;
rowwise scales each GEMM's operands along its own contraction axis, so the weight gradient's operands
(the input and the output gradient, scaled per column) are cast again from their high-precision copies
(the compiled kernel list of a rowwise Float8Linear: two casts of each operand).
Eager casts are priced at their measured rates (cost/fp8.py), compiled ones at the rate a compiled
Float8Linear's cast kernels reach (hardware_profiles/calibration/inductor_regions.toml
[fp8_cast_<recipe>]); GEMMs at the fp8 rate (rowwise at its measured factor).

Without a recipe `--precision fp8` keeps its earlier meaning (graph/layer_ops.py): the per-op eager
quantisation of our own harness (validation/harness/model.py), which validation/cases measured.
"""

from __future__ import annotations

from ghsim.graph.dtypes import inductor
from ghsim.graph.layer_ops import LayerOps, Projection
from ghsim.graph.ops import Category

ROWWISE = "rowwise"  # GEMM variant: a rowwise-scaled torch._scaled_mm
CAST = "fp8cast:"  # op variant of an eager dynamic cast: fp8cast:<recipe>:<bf16|fp32>
# Kernels per dynamic cast, eager by source width, as torchao 0.18 launches them (the kernel lists of one
# Float8Linear forward+backward: validation/microbench/issue15/h100-microbench15b.json "f8lin"): abs,
# amax, the scale's clamp, reciprocal and copies (7), then the cast's to-float, multiply, clamp and
# fp8 copy (4; an fp32 source needs no to-float copy); rowwise's power-of-2 scale rounding adds log2,
# floor and exp2. Compiled, by recipe (one fused kernel per cast; tensorwise: amax, scale, cast).
EAGER_CAST_KERNELS = {2: 11, 4: 10}
ROWWISE_SCALE_ROUNDING_KERNELS = 3
COMPILED_CAST_KERNELS = {"tensorwise": 3, ROWWISE: 1}
# eager only: the reciprocal of each scale before every torch._scaled_mm (2; rowwise also fills the
# scale vectors' layout, 2 more), and the layout copies (aten::contiguous) of a linear's backward
# operands (5 per linear in the 3B trace: validation/measured_libraries/h100-ao-tensorwise-eager-llama3b-mb1-s2048)
SCALE_RECIPROCALS = {"tensorwise": 2, ROWWISE: 4}
LAYOUT_COPIES = 5


def cast_variant(recipe: str, src_width: int) -> str:
    return f"{CAST}{recipe}:{'fp32' if src_width == 4 else 'bf16'}"


class TorchaoFp8Projections(LayerOps):
    """Projection forward and backward under torchao's float8 recipes (module docstring)."""

    def _fp8_cast(self, name: str, numel: float, src_width: int, outputs: int = 1, creates=None) -> None:
        """One dynamic cast of `numel` elements: the source read, `outputs` fp8 copies written."""
        recipe, compiled = self.torchao_recipe, self.plan.compile
        eager_kernels = EAGER_CAST_KERNELS[src_width] + (ROWWISE_SCALE_ROUNDING_KERNELS if recipe == ROWWISE else 0)
        kernels = COMPILED_CAST_KERNELS[recipe] if compiled else eager_kernels * outputs
        variant = inductor(f"fp8_cast_{recipe}") if compiled else cast_variant(recipe, src_width)
        self.mem(name, variant, numel * (src_width + outputs), kernels,
                 Category.ELEMENTWISE, creates=creates, transient=numel * outputs if creates is None else 0.0)

    def _fp8_gemm(self, name: str, m: int, n: int, k: int, creates=None, transient: float = 0.0) -> None:
        self.gemm(name, m, n, k, "fp8", creates=creates, transient=transient)
        op = self.ops[-1]
        kernels = 1 if self.plan.compile else 1 + SCALE_RECIPROCALS[self.torchao_recipe]
        self.ops[-1] = op._replace(variant=ROWWISE if self.torchao_recipe == ROWWISE else "", kernels=kernels)

    def _shares_input(self, p: Projection) -> bool:
        """Whether `p` reads the same input as a projection before it (k and v after q, up after gate)."""
        return p in self.attn_in[1:] or p in self.mlp_in[1:]

    def torchao_fwd(self, p: Projection, inp_bytes_per_el: int, T: int, out: str, out_bytes: float) -> list[str]:
        dt, keep = self.dt, []
        x = T * p.n_in
        if dt.autocast_casts and inp_bytes_per_el == 4 and not self.plan.compile:
            # Float8Linear casts an fp32 input to autocast's dtype first; that bf16 copy is what it saves
            self.mem(f"{p.name}.cast_in", self.downcast, x * 6, 1, Category.ELEMENTWISE, creates={f"{p.name}.x16": x * 2})
            keep.append(f"{p.name}.x16")
        if not self.plan.compile or not self._shares_input(p):  # Inductor casts a shared input once
            self._fp8_cast(f"{p.name}.fp8_cast_x", x, dt.act)
        w = p.n_in * p.n_out * p.experts
        self._fp8_cast(f"{p.name}.fp8_cast_w", w, dt.param)
        self._fp8_gemm(p.name, T, p.n_out, p.n_in, creates={out: out_bytes})
        return keep

    def torchao_bwd(self, p: Projection, T: int, grad_in: str, gin: float) -> None:
        """Casts, input-gradient and weight-gradient GEMMs of one projection (the caller frees what its
        forward kept)."""
        dt, compiled = self.dt, self.plan.compile
        g, w = T * p.n_out, p.n_in * p.n_out * p.experts
        rowwise = self.torchao_recipe == ROWWISE
        if compiled and rowwise:  # per row for the input gradient, per column for the weight gradient
            self._fp8_cast(f"{p.name}.fp8_cast_grad", g, dt.act)
            self._fp8_cast(f"{p.name}.fp8_cast_grad.t", g, dt.act)
        else:
            self._fp8_cast(f"{p.name}.fp8_cast_grad", g, dt.act, outputs=2)  # one layout per GEMM
        self._fp8_cast(f"{p.name}.fp8_cast_w.bwd", w, dt.param)
        if not compiled or rowwise:  # compiled rowwise: the saved input cast per column
            self._fp8_cast(f"{p.name}.fp8_cast_x.bwd", T * p.n_in, dt.act)
        elif not self._shares_input(p):
            # compiled tensorwise: the forward's fp8 input re-created with its saved scale (no amax), in
            # one fused kernel, from what backward keeps anyway (module docstring)
            x = T * p.n_in
            self.mem(f"{p.name}.fp8_recast_x", inductor("fp8_cast_tensorwise"), x * (dt.act + 1), 1,
                     Category.ELEMENTWISE, transient=x)
        if not compiled:
            moved = g + T * p.n_in + w  # the fp8 operands' transposed copies
            self.mem(f"{p.name}.fp8_layouts", "fp8_transpose", 2 * moved, LAYOUT_COPIES, Category.ELEMENTWISE,
                     transient=moved)
        self._fp8_gemm(f"{p.name}.dgrad", T, p.n_in, p.n_out, creates={grad_in: gin})
        if self.plan.lora_rank:
            return
        self._fp8_gemm(f"{p.name}.wgrad", p.n_out, p.n_in, T, transient=w * 2)
        self.mem(f"{p.name}.wgrad_cast", self.upcast, w * 6, 1, Category.ELEMENTWISE, creates={f"grad.{p.name}": w * 4})
