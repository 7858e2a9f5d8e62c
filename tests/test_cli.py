"""The CLI contract of DESIGN.md: keys, exit codes, one-line errors, files written."""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from ghsim.cli import main

SIM = ["simulate", "--model", "llama-2-7b", "--hardware", "gh200-96gb", "--precision", "bf16",
       "--recompute", "full", "--micro-batch", "1", "--seq", "4096"]


def cli(args):
    """Run the real console entry point: exit code, stdout, stderr."""
    p = subprocess.run([sys.executable, "-c", "from ghsim.cli import main; main()", *args],
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def test_simulate_json_has_contract_keys():
    code, out, err = cli(SIM + ["--json"])
    assert code == 0, err
    d = json.loads(out)
    for key in ("step_time_s", "tokens_per_s", "mfu", "gpu_utilization", "fits", "memory", "time_breakdown_s",
                "plan", "model", "hardware"):
        assert key in d
    assert d["memory"]["hbm_peak_bytes"] > 0 and "breakdown" in d["memory"]
    assert d["hardware"]["name"] == "gh200-96gb"
    # fp32 params + grads + AdamW states alone are 16 B/param = 108 GB > 96 GB of HBM
    assert d["fits"] is False and "HBM peak" in d["fit_problems"][0]


def test_simulate_table_and_trace_and_plot(tmp_path):
    trace, plot = tmp_path / "t.json", tmp_path / "p.png"
    code, out, err = cli(SIM + ["--trace", str(trace), "--plot", str(plot)])
    assert code == 0, err
    assert "step time" in out and "HBM peak" in out
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("cat") == "layer" and "fwd" in e["name"] for e in events)
    assert plot.stat().st_size > 10_000


@pytest.mark.parametrize("args, needle", [
    (["simulate", "--model", "no-such-model", "--hardware", "h100-sxm"], "unknown model"),
    (["simulate", "--model", "llama-2-7b", "--hardware", "no-such-gpu"], "unknown hardware"),
    (["simulate", "--model", "llama-2-7b", "--hardware", "h100-sxm", "--micro-batch", "0"], "micro-batch"),
    (["simulate", "--model", "llama-2-7b", "--hardware", "h100-sxm", "--seq", "-5"], "seq"),
    (["simulate", "--model", "llama-2-7b", "--hardware", "h100-sxm", "--offload", "gpu"], "offload"),
    (["simulate", "--model", "llama-2-7b", "--hardware", "h100-sxm", "--precision", "int4"], "precision"),
    (["simulate", "--hardware", "h100-sxm"], "model"),
    (["simulate", "--model", "llama-2-7b", "--hardware", "h100-sxm", "--plot", "step.xyz"], "cannot write"),
    (["calibrate", "tests/data/no-such.json", "--reference", "h100-sxm"], "no such file"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    code, out, err = cli(args)
    assert code == 2
    assert err.count("\n") == 1 and needle in err.lower()
    assert "Traceback" not in err


def test_malformed_model_files(tmp_path):
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("hidden_size = [unclosed")
    heads = tmp_path / "heads.toml"
    heads.write_text("hidden_size = 100\nintermediate_size = 300\nnum_layers = 2\nnum_attention_heads = 3\nvocab_size = 10\n")
    cfg = tmp_path / "config.json"
    cfg.write_text('{"hidden_size": 4096, "num_hidden_layers": 2')
    for path, needle in ((bad_toml, "malformed toml"), (heads, "does not divide"), (cfg, "malformed json")):
        code, _, err = cli(["simulate", "--model", str(path), "--hardware", "h100-sxm"])
        assert code == 2 and needle in err.lower(), err


def test_hf_config_json_loads(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 4,
                               "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000}))
    code, out, err = cli(["simulate", "--model", str(cfg), "--hardware", "h100-sxm", "--seq", "1024", "--json"])
    assert code == 0, err
    assert json.loads(out)["model"]["num_kv_heads"] == 4


def test_models_and_hardware_list():
    r = CliRunner().invoke(main, ["models"], standalone_mode=False)
    assert "llama-2-7b" in r.output
    r = CliRunner().invoke(main, ["hardware"], standalone_mode=False)
    for name in ("gh200-96gb", "gh200-144gb", "h100-sxm", "h100-pcie", "h200-sxm"):
        assert name in r.output


def test_trace_command_prints_capture_lines():
    code, out, err = cli(["trace", "command", "--model", "llama-2-7b", "--hardware", "h100-sxm", "--lora-rank", "8",
                          "--seq", "2048", "--steps", "10-12"])
    assert code == 0, err
    assert "nsys profile" in out and "--delay=" in out and "--duration=" in out
    assert "schedule(wait=9, warmup=1, active=3" in out


def test_calibrate_refuses_a_file_whose_meta_is_not_a_table(tmp_path):
    bad = tmp_path / "bench.json"
    bad.write_text(json.dumps({"meta": []}))
    code, out, err = cli(["calibrate", str(bad), "--reference", "h100-sxm", "--out-dir", str(tmp_path / "out")])
    assert code == 2 and "not a microbenchmark file" in err and "Traceback" not in err
