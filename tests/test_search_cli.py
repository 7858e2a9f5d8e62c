"""`ghsim plan` end to end: table, JSON, plan files, plot, trace, baseline, and bad input.

Small model, pinned dimensions and the synthetic calibration (written to a file and
passed with --calibration), so each command takes a couple of seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from ghsim.cli import main
from synthetic import TINY_MODEL_TOML
from ghsim.plan import load_plan_toml

MODEL_PATH = ""  # set by the tiny_model fixture
SMALL = ["--model", MODEL_PATH, "--seq", "1024", "--precision", "bf16", "--recompute", "full", "--cuda-graphs",
         "--offload-schedule", "auto", "--jobs", "1"]
GHSIM = [sys.executable, "-c", "from ghsim.cli import main; main()"]


@pytest.fixture(scope="module", autouse=True)
def tiny_model(tmp_path_factory):
    global MODEL_PATH
    path = tmp_path_factory.mktemp("model") / "tiny-llama.toml"
    path.write_text(TINY_MODEL_TOML)
    MODEL_PATH = str(path)
    SMALL[1] = MODEL_PATH


@pytest.fixture(scope="module")
def calfile(tmp_path_factory):
    from synthetic import synthetic_microbench

    path = tmp_path_factory.mktemp("cal") / "synthetic.json"
    path.write_text(json.dumps(synthetic_microbench()))
    return str(path)


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_table_explains_the_best_plan(calfile):
    r = run("plan", *SMALL, "--calibration", calfile, "--top", "3")
    assert r.exit_code == 0, r.output
    assert "candidate plans" in r.output and "judged in" in r.output
    assert "reproduce the best:" in r.output and "ghsim simulate --model tiny-llama" in r.output
    assert "why #1 wins" in r.output
    assert " 1 " in r.output and " 3 " in r.output


def test_json_has_the_contract_keys(calfile):
    r = run("plan", *SMALL, "--calibration", calfile, "--json", "--objective", "memory")
    assert r.exit_code == 0
    d = json.loads(r.output)
    assert {"plans", "n_evaluated", "n_feasible", "objective", "counts", "explanation", "pareto"} <= set(d)
    assert d["objective"] == "memory" and d["n_evaluated"] >= d["n_feasible"] > 0
    peaks = [p["hbm_peak_bytes"] for p in d["plans"]]
    assert peaks == sorted(peaks)
    assert all(p["status"] == "feasible" and p["flags"].startswith("--gpus") for p in d["plans"])


def test_plan_files_plot_and_trace(calfile, tmp_path):
    toml, png, trace = tmp_path / "best.toml", tmp_path / "front.png", tmp_path / "best.json"
    r = run("plan", *SMALL, "--calibration", calfile, "--save-plan", str(toml), "--plot", str(png),
            "--trace", str(trace), "--json")
    assert r.exit_code == 0, r.output
    best = json.loads(r.output)["plans"][0]
    plan = load_plan_toml(toml)
    assert plan.to_dict()["global_batch"] == best["plan"]["global_batch"]
    assert plan.to_dict() == {**best["plan"], "gpus_per_node": 1}  # resolved: a gh200-96gb node has 1
    assert 'hardware = "gh200-96gb"' in toml.read_text() and "model = " in toml.read_text()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(trace.read_text())["traceEvents"]
    # the saved plan is a plan ghsim simulate runs as is
    again = run("simulate", "--model", MODEL_PATH, "--plan", str(toml), "--json")
    assert again.exit_code in (0, 2)  # 2 only if the real calibration set is missing here


def test_deepspeed_config_is_the_baseline(calfile, tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
                              "bf16": {"enabled": True},
                              "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}}))
    r = run("plan", "--model", MODEL_PATH, "--seq", "1024", "--deepspeed", str(ds), "--calibration", calfile,
            "--recompute", "full", "--cuda-graphs", "--offload", "none", "--jobs", "1")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("your plan:")
    assert "override the plan file's values: --offload" in r.stderr  # ds_config offloads, --offload none


@pytest.mark.parametrize("args,message", [
    (["--objective", "speed"], "unknown objective 'speed'"),
    (["--top", "0"], "--top must be at least 1"),
    (["--precisions", "bf16,int4"], "--precisions"),
])
def test_bad_input_is_one_line_and_exit_2(calfile, args, message):
    r = subprocess.run([*GHSIM, "plan", *SMALL, "--calibration", calfile, *args],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def test_malformed_ds_config_exits_2(calfile, tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text('{"zero_optimization": {"stage": "three"}}')
    r = subprocess.run([*GHSIM, "plan", *SMALL, "--calibration", calfile,
                        "--deepspeed", str(ds)], capture_output=True, text=True)
    assert r.returncode == 2 and "zero_optimization.stage" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_model_that_fits_nowhere_says_what_would(calfile):
    r = subprocess.run([*GHSIM, "plan", "--model", "llama-3.1-405b", "--hardware",
                        "h100-pcie", "--calibration", calfile, "--precision", "bf16", "--recompute", "full",
                        "--jobs", "1"], capture_output=True, text=True)
    assert r.returncode == 2
    assert "no plan fits llama-3.1-405b on 1 x h100-pcie" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "more GPUs" in r.stdout and "LoRA" in r.stdout


def test_no_progress_bar_when_not_a_terminal(calfile):
    r = subprocess.run([*GHSIM, "plan", *SMALL, "--calibration", calfile, "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == ""


def test_progress_bar_on_a_terminal_ends_once(capsys):
    from ghsim.cli.plan import ProgressBar

    bar = ProgressBar(enabled=True)
    for done in (0, 5, 10, 10):  # the search reports its total twice: when the last plan is judged, and done
        bar(done, 10)
    err = capsys.readouterr().err
    assert err.count("100%") == 1 and err.endswith("\r")
    ProgressBar(enabled=False)(10, 10)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("flags, says", [
    (["--gpus", "0", "--tp", "1"], "--gpus must be at least 1"),
    (["--gpus", "2", "--tp", "0"], "--tp must be at least 1"),
    (["--micro-batch", "0"], "--micro-batch must be at least 1"),
    (["--seq", "-5"], "--seq must be at least 1"),
    (["--lora-rank", "-1"], "--lora-rank must not be negative"),
])
def test_impossible_plan_values_are_refused_before_the_search(flags, says):
    r = run("plan", "--model", "llama-2-7b", *flags)
    assert r.exit_code == 2 and says in r.output


def test_impossible_pins_are_refused_by_sweep():
    r = run("sweep", "--models", "llama-2-7b", "--gpus", "1", "--hardware", "h100-sxm", "--pin", "micro_batch=0")
    assert r.exit_code == 2 and "--micro-batch must be at least 1" in r.output


def test_plan_help_states_the_search_defaults():
    """The batch flags shared with simulate have other defaults in plan: searched, and 4 per GPU."""
    from ghsim.search.space import default_global_batch

    plan_help = " ".join(CliRunner().invoke(main, ["plan", "--help"]).output.split())
    assert "per micro-batch (default: searched)" in plan_help and "4 per GPU, at least 32" in plan_help
    assert default_global_batch(1) == 32 and default_global_batch(64) == 256
    simulate_help = " ".join(CliRunner().invoke(main, ["simulate", "--help"]).output.split())
    assert "(default: one micro-batch per GPU)" in simulate_help


def test_pareto_labels_tell_offload_sets_apart():
    """Every offload set gets its own label on the Pareto plot (grads were once left out)."""
    from itertools import combinations

    from ghsim.plan import Plan
    from ghsim.search.plot import compact_label

    targets = ("optimizer", "grads", "params", "activations")
    sets = [frozenset(c) for n in range(len(targets) + 1) for c in combinations(targets, n)]
    labels = {compact_label(Plan(gpus=4, zero=3, offload=s)) for s in sets}
    assert len(labels) == len(sets)
