"""Issue 16 item 1: the published GH200 measurements as `ghsim validate` cases.

validation/published/sailor2025-clariden (Sailor, SOSP'25: OPT-350M on 1-32 quad-GH200 nodes,
15 plans; memory is nvidia-smi's device total) and validation/published/steiger2025-eth-gh200 (ETH,
DeepSpeed on one quad node, 7 runs).
The bounds below record today's accuracy so that a change which worsens it is noticed; the issue's
targets (10 % / 6 %, ETH 15 %) are not met and each folder's README reports every case's error.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ghsim.cost.device_memory import device_total_bytes, nccl_buffer_bytes
from ghsim.errors import GhsimError
from ghsim.graph.parallel import Layout
from ghsim.validate.cases import case_hardware, load_case, summary, validate

PUBLISHED = Path(__file__).resolve().parents[1] / "validation" / "published"


@pytest.fixture(scope="module")
def sailor():
    return validate(PUBLISHED / "sailor2025-clariden", with_trace=False)


@pytest.fixture(scope="module")
def eth():
    return validate(PUBLISHED / "steiger2025-eth-gh200", with_trace=False)


def test_every_published_gh200_case_is_simulated_on_the_quad_node(sailor, eth):
    assert len(sailor) == 15 and len(eth) == 7
    for r in sailor + eth:
        assert r.status != "skipped", r.reason
        assert r.case.hardware_name == "gh200-96gb-quad" and r.case.published


def test_sailor_accuracy_does_not_regress(sailor):
    s = summary(sailor)
    # 0.058 with Grace's host seconds per tensor-parallel call (profile [launch] tp_collective_call_us, from
    # Sailor's per-layer profile); 0.135 before; 0.170 with fp32 GEMMs at the H100 rate
    assert s["step_time_rel"]["median"] <= 0.07
    # 0.040 against the device total with the split and NCCL's buffers (0.109 before, 0.127 against the allocated peak)
    assert s["peak_memory_rel"]["median"] <= 0.05
    big_batches = [r for r in sailor if r.case.plan.micro_batch >= 8]  # -1.4 .. -14.7 %
    assert len(big_batches) == 9 and all(abs(r.errors["step_time_rel"]) <= 0.16 for r in big_batches)


def test_eth_memory_stays_close_and_step_time_is_reported(eth):
    s = summary(eth)
    # 0.074 before DeepSpeed ZeRO-3's whole-sub-group offload split (stage3.py, issue 14): at ratio 0.8 the
    # SuperOffload rows keep no optimizer state on the GPU (21.5 GB against the published 29-31 GB), which
    # moves the median to 0.113 (steiger2025-eth-gh200/README.md)
    assert s["peak_memory_rel"]["median"] <= 0.12
    # the issue's target is 0.15; 0.158 since ZeRO-3's hooks fire on every module (issue 14), 0.39 before
    # Grace's launch path
    assert s["step_time_rel"]["median"] <= 0.17


def test_a_published_case_keeps_the_profile_cpu_adam_rate():
    folder = next((PUBLISHED / "steiger2025-eth-gh200" / "cases").glob("*zerooffload*"))
    case = load_case(folder, {})
    profile_rate = 2.78e10  # gh200-96gb-quad [cpu] adamw_params_per_s
    assert case_hardware(case).cpu.adamw_params_per_s == pytest.approx(profile_rate)
    lent = case.__class__(**{**case.__dict__, "published": False})
    assert case_hardware(lent).cpu.adamw_params_per_s < profile_rate  # the lent x86 VM's measured rate


def test_nvidia_smi_peaks_are_compared_with_the_predicted_device_total(sailor, eth):
    for r in sailor:
        assert r.case.peak_memory_kind == "nvidia-smi"
        allocated = r.predicted["peak_allocated_bytes"]
        nccl = nccl_buffer_bytes(Layout.of(r.case.plan, case_hardware(r.case)).groups())
        assert 0 < nccl < 0.5e9  # the tensor-parallel ring at least; a few hundred MB at most on these plans
        assert r.predicted["peak_memory_bytes"] == pytest.approx(device_total_bytes(allocated, nccl))
        assert r.predicted["peak_memory_bytes"] > allocated
    for r in eth:  # torch max allocated: compared with the replayed peak itself
        assert r.case.peak_memory_kind == "allocated" and "peak_allocated_bytes" not in r.predicted


def test_an_unknown_peak_memory_kind_is_refused(tmp_path):
    source = next((PUBLISHED / "sailor2025-clariden" / "cases").glob("*gb1")) / "case.toml"
    text = source.read_text().replace('peak_memory_kind = "nvidia-smi"', 'peak_memory_kind = "nvml"')
    (tmp_path / "case.toml").write_text(text)
    with pytest.raises(GhsimError, match="peak_memory_kind"):
        load_case(tmp_path, {})


def test_the_device_total_adds_a_context_and_a_reserve_that_grows_with_the_peak():
    peaks = (0.0, 1e9, 4e10, 9e10)
    beyond = [device_total_bytes(a) - a for a in peaks]
    assert beyond[0] > 0  # the CUDA context alone
    assert all(later > earlier for earlier, later in zip(beyond, beyond[1:]))  # the allocator's reserve


def test_nccl_buffers_grow_with_the_communicators_a_plan_creates():
    """No communicator, no buffers; an NVLink ring holds channels x (LL + LL128 + Simple) FIFOs; a ring
    across nodes adds the sender's LL128 + Simple; a pipeline adds its send/recv FIFOs."""
    def nccl(gpus, tp, pp, dp):
        return nccl_buffer_bytes(Layout(gpus, tp, pp, dp, 1, 4).groups())

    assert nccl(1, 1, 1, 1) == 0.0
    fifo = 524288 + 4915200 + 4194304  # NCCL's default LL, LL128 and Simple FIFOs (src/init.cc)
    assert nccl(4, 4, 1, 1) == pytest.approx(16 * fifo)  # 16 NVLink ring channels (assumed)
    assert nccl(8, 4, 1, 2) > nccl(4, 4, 1, 1) < nccl(8, 4, 2, 1)
    assert nccl(8, 4, 1, 2) == nccl(128, 4, 1, 32)  # a ring's connections do not grow with its size
