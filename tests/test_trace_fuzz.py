"""Fuzzing the importers: whatever the bytes, load_trace either returns a
TraceData or raises GhsimError with a one-line message, never anything else."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ghsim.errors import GhsimError
from ghsim.traces import load_trace, summarize
from ghsim.traces.events import TraceData
from trace_inputs import trace_path

REAL = {
    "pipit_saxpy-mpi-cuda_nsys_perlmutter0_a100.sqlite": 12,
    "pipit_perlmutter-cloverleaf-cuda_a100.sqlite": 12,
    "hta_a100_16rank_training_rank0.pt.trace.json.gz": 6,
    "hta_a100_ddp_nccl_rank0.pt.trace.json.gz": 8,
    "switchtransformer_a100_inference_profile_memory.pt.trace.json": 15,
}
def fuzz(examples: int) -> settings:
    return settings(deadline=None, max_examples=examples,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
_bytes: dict[str, bytes] = {}


def real_bytes(name: str) -> bytes:
    path = trace_path(name)
    if name not in _bytes:
        _bytes[name] = path.read_bytes()
    return _bytes[name]


def load_bytes(data: bytes, suffix: str) -> TraceData | GhsimError:
    """Load `data` from a file; return the trace or the GhsimError (anything else propagates)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"fuzz{suffix}"
        path.write_bytes(data)
        try:
            trace = load_trace(path)
        except GhsimError as e:
            message = str(e)
            assert message and "\n" not in message and str(path) in message, message
            return e
        summarize(trace)  # a trace that loads must also summarize
        return trace


def _suffix(name: str) -> str:
    return ".sqlite" if name.endswith(".sqlite") else ".json.gz" if name.endswith(".gz") else ".json"


@pytest.mark.parametrize("name", list(REAL))
def test_truncated_real_files(name):
    data = real_bytes(name)

    @fuzz(REAL[name])
    @given(st.integers(0, len(data) - 1))
    def check(cut):
        result = load_bytes(data[:cut], _suffix(name))
        if not name.endswith(".sqlite") and data[cut:].strip():
            # JSON and gzip lose content when cut anywhere but trailing blanks.
            assert isinstance(result, GhsimError)

    check()


@pytest.mark.parametrize("fraction", [0.03, 0.37, 0.5, 0.81, 0.999])
@pytest.mark.parametrize("name", list(REAL))
def test_deep_truncations(name, fraction):
    """Hypothesis favours small offsets; these cut deep into each file."""
    data = real_bytes(name)
    result = load_bytes(data[: int(len(data) * fraction)], _suffix(name))
    if not name.endswith(".sqlite"):
        assert isinstance(result, GhsimError)
        assert ("truncated gzip" if name.endswith(".gz") else "JSON cut off") in str(result)


@pytest.mark.parametrize("name", [n for n in REAL if not n.startswith("hta_a100_16rank")])
def test_corrupted_real_files(name):
    data = real_bytes(name)

    @fuzz(8)
    @given(st.lists(st.tuples(st.integers(0, len(data) - 1), st.integers(1, 255)), min_size=1, max_size=4))
    def check(flips):
        corrupt = bytearray(data)
        for at, mask in flips:
            corrupt[at] ^= mask
        load_bytes(bytes(corrupt), _suffix(name))

    check()


PREFIXES = [b"", b"SQLite format 3\x00", b"\x1f\x8b\x08\x00", b'{"traceEvents": [', b"[", b'{"traceEvents": [{"cat": "kernel", ',
            b"Time (%),Total Time (ns),Instances,Avg (ns),Name\n", b"Total (MB),Count,Operation\n"]


@fuzz(60)
@given(st.sampled_from(PREFIXES), st.binary(max_size=3000), st.sampled_from([".json", ".sqlite", ".csv", ".gz"]))
def test_random_bytes(prefix, body, suffix):
    assert isinstance(load_bytes(prefix + body, suffix), GhsimError)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
events = st.fixed_dictionaries({}, optional={
    "ph": st.sampled_from(["X", "i", "M", "f"]) | json_values,
    "cat": st.sampled_from(["kernel", "gpu_memcpy", "gpu_memset", "user_annotation", "gpu_user_annotation",
                            "cpu_op", "cpu_instant_event", "Kernel"]) | json_values,
    "name": st.sampled_from(["ProfilerStep#3", "[memory]", "Memcpy HtoD (Pinned -> Device)", "nccl", "k"])
    | json_values,
    "ts": st.integers(-10**6, 10**16) | st.floats(allow_nan=False) | json_values,
    "dur": st.integers(-5, 10**6) | st.floats(allow_nan=False) | json_values,
    "pid": json_values, "tid": json_values,
    "args": st.fixed_dictionaries({}, optional={
        "device": st.integers(-3, 40000) | json_values, "stream": json_values, "bytes": json_values,
        "Device Type": st.just(1) | json_values, "Device Id": json_values, "Total Allocated": json_values,
        "Total Reserved": json_values}) | json_values,
})


@fuzz(60)
@given(st.lists(events, max_size=12), st.dictionaries(st.sampled_from(["baseTimeNanoseconds", "deviceProperties",
                                                                     "schemaVersion", "traceName"]), json_values),
       st.booleans())
def test_random_trace_json(evs, header, events_first):
    doc = {"traceEvents": evs, **header} if events_first else {**header, "traceEvents": evs}
    load_bytes(json.dumps(doc).encode(), ".json")


@fuzz(60)
@given(json_values)
def test_random_json_documents(value):
    result = load_bytes(json.dumps(value).encode(), ".json")
    assert isinstance(result, GhsimError)


csv_cells = st.sampled_from(["Total Time (ns)", "Instances", "Name", "Operation", "Total (MB)", "Count", "1",
                             "2.5", "x", "", "[CUDA memcpy HtoD]", '"a,b"', "Time (%)", "Total Time (us)"])


@fuzz(60)
@given(st.lists(st.lists(csv_cells, min_size=1, max_size=8), min_size=1, max_size=6))
def test_random_csv(rows):
    text = "Time (%),Total Time (ns),Instances,Name\n" + "\n".join(",".join(r) for r in rows) + "\n"
    load_bytes(text.encode(), ".csv")
