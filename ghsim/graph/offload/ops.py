"""The ops offload schedules insert: host-link copies, casts on the GPU or the CPU, the CPU's
and the GPU's shares of AdamW, memory markers."""

from __future__ import annotations

from ghsim.graph import ops as K
from ghsim.graph.offload.setup import OffloadSetup
from ghsim.graph.ops import Category, Op, Phase, Resource
from ghsim.graph.optimizer import cpu_adamw_temporaries, gpu_adamw
from ghsim.plan import Framework, Plan

# bound once: the schedules build these ops per run and per gradient source (see graph/ops.py on member reads)
_ELEMENTWISE, _OTHER, _GPU, _CPU, _OPT = Category.ELEMENTWISE, Category.OTHER, Resource.GPU, Resource.CPU, Phase.OPT


def copy_op(name: str, direction: str, nbytes: float, phase: str, setup: OffloadSetup, resource: str,
          transfers: int = 1, duplex: bool = False) -> Op:
    return Op(name=name, category=K.COPY, kind=direction, resource=resource, bytes=nbytes, phase=phase,
              kernels=transfers, pinned=setup.pinned, variant="duplex" if duplex else "")


def gpu_cast(name: str, params: float, phase: str, stream: str = Resource.GPU) -> Op:
    """bf16 <-> fp32 on the GPU: read one width, write the other (6 bytes per element).
    `stream`: where it is queued (the stream of the collective it follows or feeds, if any)."""
    return Op(name=name, category=_ELEMENTWISE, kind=K.MEMBOUND, resource=stream, variant="cast_fp32_to_bf16",
              bytes=6 * params, phase=phase, hbm_transient=4 * params)


# the variant of a host pass that is torch._foreach_norm over CPU tensors (priced at its measured rate)
FOREACH_NORM = "foreach_norm"


def cpu_bytes(name: str, nbytes: float, phase: str, host_waits: bool, foreach_norm: bool = False) -> Op:
    return Op(name=name, category=K.CPU, kind=K.CPU_MEM, resource=_CPU, bytes=nbytes, phase=phase, kernels=0,
              host_waits=host_waits, variant=FOREACH_NORM if foreach_norm else "")


# the variant of the training thread's cast of updated fp32 parameters to 16 bits ahead of a
# blocking copy up (priced per parameter from a measurement: cost/library_overheads.py)
BLOCKING_CAST = "blocking_cast"


def blocking_cast(name: str, params: float, phase: str, temporary: float = 0.0) -> Op:
    """`temporary`: the host bytes of the fresh 16-bit tensor torch casts into while it runs."""
    return Op(name=name, category=K.CPU, kind=K.HOST_WORK, resource=_CPU, params=params, phase=phase, kernels=0,
              host_waits=True, variant=BLOCKING_CAST, host_transient=temporary, mem_tag="cast_temporaries")


def cpu_adam(name: str, params: float, setup: OffloadSetup, host_waits: bool, tensors: tuple[int, ...] = (),
             step_params: float = 0.0) -> Op:
    """The CPU's AdamW over `params`; `tensors`: the model's tensor sizes it is priced over
    ((elements, count) pairs, flattened: StepFacts.tensor_elements). `step_params`: what the
    whole optimizer step covers (default `params`), whose temporaries it holds while it runs."""
    temporaries = cpu_adamw_temporaries(setup.cpu_impl, step_params or params, max(tensors[::2], default=0))
    return Op(name=name, category=K.CPU, kind=K.OPT_CPU, resource=_CPU, params=params, phase=_OPT,
              variant=setup.cpu_impl, kernels=0, host_waits=host_waits, shape=tensors,
              host_transient=temporaries, mem_tag="optimizer_temporaries")


def _marker(name: str, phase: str) -> Op:
    """A zero-time op on the compute stream that only carries a memory change."""
    return Op(name=name, category=_OTHER, kind=K.HOST_WORK, resource=_GPU, kernels=0, phase=phase)


def _gpu_adam(params: float, n_tensors: int, plan: Plan) -> Op:
    """The GPU's share of AdamW: DeepSpeed runs its fused multi-tensor Adam; PyTorch the plan's impl."""
    impl = plan.optimizer_impl
    if plan.framework == Framework.DEEPSPEED or impl not in ("foreach", "fused"):
        impl = "fused"
    return gpu_adamw(f"adamw.{impl}.gpu_share", params, n_tensors, impl)
