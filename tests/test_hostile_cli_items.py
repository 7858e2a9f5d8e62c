"""Issue 17's classes of wrong answers that look right, one test each: the CLI refuses or says
so in one line, never answers as if the input made sense."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ghsim.cli import main
from synthetic import TINY_MODEL_TOML


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("model") / "tiny-llama.toml"
    path.write_text(TINY_MODEL_TOML)
    return str(path)


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def refused(r, *words: str) -> str:
    """The contract of a refusal: exit 2, one stderr line, no traceback, naming what is wrong."""
    assert r.exit_code == 2, r.output
    err = r.stderr.strip()
    assert "\n" not in err and "Traceback" not in err and err.startswith("ghsim: error:"), err
    for w in words:
        assert w in err, err
    return err


# -- item 7: NaN / inf / absurd numbers ------------------------------------------------------

@pytest.mark.parametrize("flag,value", [("--batch-prep-ms", "nan"), ("--offload-ratio", "inf"),
                                        ("--batch-prep-ms", "-inf"), ("--gpus", "1e400"),
                                        ("--seq", str(10**400))])
def test_non_finite_and_huge_numbers_are_refused(tiny, flag, value):
    refused(run("simulate", "--model", tiny, flag, value), flag)


@pytest.mark.parametrize("args", [["--price", "nan"], ["--price", "inf"], ["--time-limit", "nan"]])
def test_plan_number_flags_refuse_nan(tiny, args):
    refused(run("plan", "--model", tiny, *args), args[0])


@pytest.mark.parametrize("text", ["gpus = nan\n", "offload_ratio = inf\n", "batch_prep_s = -inf\n"])
def test_plan_file_with_nan_is_refused(tiny, tmp_path, text):
    plan = tmp_path / "p.toml"
    plan.write_text(text)
    refused(run("simulate", "--model", tiny, "--plan", str(plan)), str(plan), "not a finite number")


def test_hardware_toml_with_nan_is_refused(tiny, tmp_path):
    profile = (Path(__file__).parent.parent / "hardware_profiles" / "h100-sxm.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(profile.replace("value = 80", "value = nan", 1))
    assert bad.read_text() != profile
    refused(run("simulate", "--model", tiny, "--hardware", str(bad)), "not a finite number")


def test_json_with_nan_is_refused(tiny, tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text('{"train_micro_batch_size_per_gpu": NaN}')
    refused(run("simulate", "--model", tiny, "--deepspeed", str(ds)), "NaN is not a finite number")


def test_calibrate_refuses_another_gpus_microbenchmark(tmp_path):
    h200 = Path(__file__).parent.parent / "validation" / "microbench" / "h200.json"
    err = refused(run("calibrate", str(h200), "--reference", "h100-sxm", "--out-dir", str(tmp_path)), "H200")
    assert "h100-sxm" in err and not list(tmp_path.iterdir())


def test_plan_calibration_with_a_string_meta(tiny, tmp_path):
    bad = tmp_path / "m.json"
    bad.write_text('{"meta": "x"}')
    err = refused(run("plan", "--model", tiny, "--calibration", str(bad)), "reference_profile")
    assert "attribute" not in err


# -- item 4: fp8 where there are no FP8 Tensor Cores -------------------------------------------

def test_fp8_on_a100_is_refused_by_simulate_and_never_offered_by_plan(tiny):
    refused(run("simulate", "--model", tiny, "--hardware", "a100-sxm-80gb", "--precision", "fp8"), "FP8")
    refused(run("plan", "--model", tiny, "--hardware", "a100-sxm-80gb", "--precision", "fp8"), "FP8")
    r = run("plan", "--model", tiny, "--hardware", "a100-sxm-80gb", "--seq", "1024", "--jobs", "1",
            "--time-limit", "0", "--json", "--top", "50")
    assert r.exit_code == 0, r.output
    plans = json.loads(r.stdout)["plans"]
    assert plans and all(p["plan"]["precision"] != "fp8" for p in plans)
    ok = run("simulate", "--model", tiny, "--hardware", "h100-sxm", "--precision", "fp8")
    assert ok.exit_code == 0, ok.output


# -- item 6: flags that change nothing ---------------------------------------------------------

def test_flags_that_change_nothing(tiny):
    refused(run("simulate", "--model", tiny, "--offload-ratio", "0.5"), "--offload optimizer")
    refused(run("simulate", "--model", tiny, "--pp-interleave", "2"), "--pp 2")
    r = run("simulate", "--model", tiny, "--batch-prep-ms", "100")  # 2 workers prefetch the one micro-batch
    assert r.exit_code == 0 and "--batch-prep-ms costs nothing here" in r.stderr
    r = run("simulate", "--model", tiny, "--batch-prep-ms", "100", "--dataloader-workers", "0")
    assert r.exit_code == 0 and "note" not in r.stderr
    r = run("simulate", "--model", tiny, "--dataloader-workers", "4")
    assert r.exit_code == 0 and "--dataloader-workers changes nothing" in r.stderr
    ok = run("simulate", "--model", tiny, "--offload", "optimizer", "--offload-ratio", "0.5")
    assert ok.exit_code == 0 and "note" not in ok.stderr, ok.output


# -- item 3: a saved plan keeps its hardware ---------------------------------------------------

def test_saved_plan_runs_on_its_hardware(tiny, tmp_path):
    saved = tmp_path / "best.toml"
    r = run("plan", "--model", tiny, "--hardware", "h100-sxm", "--seq", "1024", "--jobs", "1",
            "--time-limit", "0", "--save-plan", str(saved))
    assert r.exit_code == 0, r.output
    text = saved.read_text()
    assert 'hardware = "h100-sxm"' in text and "gpus_per_node = 8" in text and "tiny-llama.toml" in text
    again = run("simulate", "--plan", str(saved), "--json")  # no --model, no --hardware
    assert again.exit_code == 0, again.output
    d = json.loads(again.stdout)
    assert d["hardware"]["name"] == "h100-sxm" and d["model"]["name"] == "tiny-llama"
    moved = run("simulate", "--plan", str(saved), "--hardware", "h200-sxm", "--json")
    assert moved.exit_code == 0 and "overrides the plan file's h100-sxm" in moved.stderr
    assert json.loads(moved.stdout)["hardware"]["name"] == "h200-sxm"
    refused(run("simulate"), "--model is required")


# -- item 5: a plan that does not fit says what to do ------------------------------------------

def test_a_plan_that_does_not_fit_points_to_the_search():
    r = run("simulate", "--model", "llama-2-7b", "--recompute", "full")
    assert r.exit_code == 0 and "fits             NO" in r.stdout
    assert "does not fit; `ghsim plan --model llama-2-7b" in r.stderr
    hbm = [line for line in r.stdout.splitlines() if line.startswith(("HBM peak", "host peak", "fits"))]
    assert hbm and all("GiB" not in line and "GB" in line for line in hbm)


# -- items 8, 9: sweep ---------------------------------------------------------------------------

def test_sweep_with_every_row_failed_exits_2(tmp_path):
    out = tmp_path / "r.csv"
    err = refused(run("sweep", "--models", "no-such-model", "--gpus", "1", "--hardware", "h100-sxm",
                      "--out", str(out)), "every sweep row failed (1 of 1)", "no-such-model")
    assert out.exists()  # the rows are still written, with their errors


def test_sweep_counts_the_failed_rows(tiny):
    r = run("sweep", "--models", f"{tiny},no-such-model", "--gpus", "1", "--hardware", "h100-sxm",
            "--seq", "1024", "--jobs", "1", "--precisions", "bf16", "--pin", "recompute=full")
    assert r.exit_code == 0, r.output
    assert "1 of 2 sweep rows failed" in r.stderr


@pytest.mark.parametrize("address", ["banana", "tcp://", "host:99999", ":80"])
def test_sweep_refuses_a_bad_scheduler_address(address):
    refused(run("sweep", "--models", "llama-2-7b", "--gpus", "1", "--scheduler", address), "--scheduler")


# -- item 1: compare --best ---------------------------------------------------------------------

def test_compare_best_keeps_the_global_batch_and_compares_the_best_plans(tiny):
    r = run("compare", "--model", tiny, "--gpus", "2", "--global-batch", "8", "--seq", "1024",
            "--hardware", "gh200-96gb", "--hardware", "h100-pcie", "--best", "--time-limit", "2", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert [b["plan"]["global_batch"] for b in d["best"]] == [8, 8]
    pair = d["best_comparisons"][0]
    assert pair["speedup"] >= 1.0 and "on their best plans" in pair["reason"]
    assert d["comparisons"][0]["fits_both"] in (True, False)
    refused(run("compare", "--model", tiny, "--hardware", "gh200-96gb", "--hardware", "h100-pcie",
                "--best", "--time-limit", "nan"), "--time-limit")


def test_compare_says_first_that_the_plan_does_not_fit():
    r = run("compare", "--model", "llama-2-7b", "--hardware", "gh200-96gb", "--hardware", "h100-pcie")
    assert r.exit_code == 0
    line = [x for x in r.stdout.splitlines() if "faster" in x][0]
    assert line.startswith("the plan does not fit on gh200-96gb or h100-pcie")


def test_console_entry_point_one_line_errors():
    p = subprocess.run([sys.executable, "-c", "from ghsim.cli import main; main()", "simulate", "--model",
                        "llama-2-7b", "--batch-prep-ms", "nan"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
