"""`ghsim trace summarize`: JSON contract, tables, and exit code 2 on bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from ghsim.cli.trace import main, trace
from synthetic_traces import write_kineto, write_nsys_sqlite

CONTRACT_KEYS = {"gpu_busy_fraction", "idle_gaps", "kernel_share_by_category", "top_kernels", "memcpy",
                 "um_migration_share", "step_times_s"}
from trace_inputs import NEEDS, find


@pytest.fixture(scope="module")
def kineto_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "run.pt.trace.json.gz"
    write_kineto(path, steps=4, kernels_per_step=40, gz=True, seed=11)
    return path


@pytest.fixture(scope="module")
def nsys_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "run.sqlite"
    write_nsys_sqlite(path, schema="2024", steps=3)
    return path


def _json(args: list[str]) -> dict:
    result = CliRunner().invoke(trace, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _check_contract(d: dict) -> None:
    assert CONTRACT_KEYS <= set(d)
    shares = d["kernel_share_by_category"]
    assert list(shares) == ["gemm", "attention", "elementwise", "norm_reduction", "optimizer", "communication",
                            "other"]
    assert math.isclose(sum(shares.values()), 1.0, rel_tol=1e-9)
    assert set(d["memcpy"]) == {"HtoD", "DtoH", "DtoD", "PtoP"}
    for v in d["memcpy"].values():
        assert {"bytes", "time_s"} <= set(v)
    for k in d["top_kernels"]:
        assert {"name", "share"} <= set(k) and 0 <= k["share"] <= 1


def test_json_contract_kineto_steps(kineto_file):
    d = _json(["summarize", str(kineto_file), "--steps", "2-3", "--json"])
    _check_contract(d)
    assert len(d["step_times_s"]) == 2 and 0 < d["gpu_busy_fraction"] <= 1
    assert d["window"]["label"] == "steps 2-3"
    assert d["um_migration_share"] == 0.0 and d["memory_peak"]["allocated_bytes"] > 0


def test_json_contract_nsys_nvtx_device(nsys_file):
    d = _json(["summarize", str(nsys_file), "--nvtx", "forward_backward", "--device", "1", "--json", "--top", "3"])
    _check_contract(d)
    assert d["device"] == 1 and len(d["top_kernels"]) == 3 and len(d["step_times_s"]) == 3
    assert d["um_migration_share"] > 0


@pytest.mark.skipif(find("hta_a100_ddp_nccl_rank0.pt.trace.json.gz") is None, reason=NEEDS)
def test_json_contract_real_trace():
    d = _json(["summarize", str(find("hta_a100_ddp_nccl_rank0.pt.trace.json.gz")), "--steps", "5-6", "--json"])
    _check_contract(d)
    assert d["step_times_s"] == [0.219726905, 0.224936243]


def test_table_output(kineto_file):
    result = CliRunner().invoke(trace, ["summarize", str(kineto_file)])
    assert result.exit_code == 0
    assert "Kernel time by category" in result.output and "Memory operations" in result.output


def test_stats_csv_says_no_timeline(tmp_path):
    path = tmp_path / "r_cuda_gpu_kern_sum.csv"
    path.write_text("Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n"
                    "100.0,5000,5,1000.0,1000,1000,1000,0.0,saxpy\n")
    d = _json(["summarize", str(path), "--json"])
    _check_contract(d)
    assert d["gpu_busy_fraction"] is None and d["has_timeline"] is False
    assert any("no timeline" in n for n in d["notes"])
    text = CliRunner().invoke(trace, ["summarize", str(path)]).output
    assert "no timeline" in text


@pytest.mark.parametrize("args,message", [
    (["summarize", "{missing}"], "no such file"),
    (["summarize", "{garbage}"], "unrecognised trace format"),
    (["summarize", "{truncated}"], "truncated gzip"),
    (["summarize", "{kineto}", "--steps", "7-9"], "steps 7-9 not all in the trace"),
    (["summarize", "{kineto}", "--steps", "x"], "expected a step number"),
    (["summarize", "{kineto}", "--steps", "1", "--nvtx", "a"], "not both"),
    (["summarize", "{kineto}", "--device", "3"], "no GPU activity on device 3"),
])
def test_errors_exit_2_one_line(tmp_path, kineto_file, capsys, args, message):
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"\x00\x01\x02junk")
    truncated = tmp_path / "cut.json.gz"
    truncated.write_bytes(kineto_file.read_bytes()[:5000])
    paths = {"missing": tmp_path / "nope.json", "garbage": garbage, "truncated": truncated, "kineto": kineto_file}
    code = main([a.format(**paths) for a in args])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_usage_error_exit_2(capsys):
    assert main(["summarize"]) == 2
    assert main(["summarize", "x", "--device", "zero"]) == 2
    assert main(["--help"]) == 0
