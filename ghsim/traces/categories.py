"""Kernel name -> one of seven categories, the same seven the simulator uses (graph.ops.Category).

Rules are tried in order and the first match wins. The order matters:
communication and optimizer kernels are often built from reductions and
elementwise pieces, attention kernels from GEMMs, so the specific families
are recognised before the generic ones.
"""

from __future__ import annotations

import re
from functools import lru_cache

from ghsim.graph.ops import KERNEL_CATEGORIES, Category

CATEGORIES = KERNEL_CATEGORIES

_I = re.IGNORECASE

_RULES: tuple[tuple[Category, re.Pattern], ...] = (
    (Category.COMMUNICATION, re.compile(
        r"nccl|nvshmem|rccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|sendrecv"
        r"|cross_device_reduce|one_shot|two_shot|userbuffers|c10d", _I)),
    # "Adam" case-sensitively (or after a non-letter) so "hadamard" is not an optimizer.
    (Category.OPTIMIZER, re.compile(
        r"multi_tensor_apply|Adam|(?<![a-zA-Z])adam|(?<![a-zA-Z])sgd|Sgd|SGD"
        r"|(?i:optimizer|fused_optim|adagrad|lamb_|_lamb|lion_|adafactor)")),
    (Category.ATTENTION, re.compile(
        r"flash|fmha|attention|_attn|attn_|sdpa|scaled_dot_product|(?<![a-z])mha|xformers"
        r"|paged_attn|decode_attn|fort_native", _I)),
    (Category.GEMM, re.compile(
        r"gemm|gemv|cublas|cutlass|nvjet|xmma|wgmma|matmul|_mm_|scaled_mm|(?<![a-z])bmm"
        r"|s1688|s16816|h1688|h16816|i8816|i16832|splitkreduce|triton_tem"
        r"|scudnn|cudnn::cnn|implicit_convolve|convolution|conv2d|conv3d|dgrad|wgrad|fprop", _I)),
    (Category.OTHER, re.compile(r"topk|radixsort|sort_|_sort|sortpairs|devicescan|unique|histogram"
                                r"|philox|curand|normal_kernel|uniform_kernel|bernoulli", _I)),
    (Category.NORM_REDUCTION, re.compile(
        r"layer_?norm|rms_?norm|batch_?norm|group_?norm|instance_?norm|bn_fw|bn_bw|welford"
        r"|softmax|cross_?entropy|nll_loss|reduce|meanops|sum_functor|norm_kernel|lpnorm|l2norm"
        r"|argmax|argmin|(?<![a-z])ln_(?:fwd|bwd)|triton_red_|triton_per_", _I)),
    (Category.ELEMENTWISE, re.compile(
        r"elementwise|vectorized|unrolled|copy|cast|fill|catarray|index|gather|scatter|where"
        r"|masked|transpose|permute|nchwtonhwc|nhwctonchw|gelu|silu|swiglu|relu|sigmoid|tanh"
        r"|dropout|rope|rotary|embedding|triton_poi_|pointwise|bitwise|compare|clamp|functor"
        r"|triu|tril|convert|quantize|amax", _I)),
)


@lru_cache(maxsize=65536)
def categorize(name: str) -> Category:
    """The category of a kernel from its (short, demangled or mangled) name."""
    for category, pattern in _RULES:
        if pattern.search(name):
            return category
    return Category.OTHER
