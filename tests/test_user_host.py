"""The host the user says they have (--host-cores, --host-memory-gb) is the host ghsim prices, also when
it reads --gpus-per-node as another node profile of the same superchip (gh200-96gb -> gh200-96gb-quad)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ghsim.cli import main
from ghsim.hardware import load_hardware, node_profile_for


def _simulate(*flags: str):
    res = CliRunner().invoke(main, ["simulate", "--json", *flags])
    return res


def test_stated_host_survives_the_switch_to_the_quad_node():
    stated = {"cpu.cores": {"value": 16, "source": "stated"}, "memory.host.capacity_gb": {"value": 200, "source": "stated"}}
    choice = node_profile_for(load_hardware("gh200-96gb", stated), gpus=4, gpus_per_node=4)
    assert choice.hardware.name == "gh200-96gb-quad"
    assert choice.hardware.cpu.cores == 16 and choice.hardware.host.capacity_bytes == pytest.approx(200e9)


def test_stated_cores_reach_the_report_after_the_switch():
    res = _simulate("--model", "llama-3-8b", "--hardware", "gh200-96gb", "--gpus", "4", "--gpus-per-node", "4",
                    "--zero", "2", "--offload", "optimizer", "--host-cores", "16")
    assert res.exit_code == 0, res.output
    note = next(n for n in json.loads(res.output)["notes"] if n.startswith("host:"))
    assert note.startswith("host: 16 cores")


def test_stated_host_memory_decides_what_fits():
    flags = ["--model", "llama-3-8b", "--hardware", "h100-sxm", "--zero", "3", "--offload", "optimizer",
             "--framework", "deepspeed", "--recompute", "full"]
    assert _simulate(*flags).exit_code == 0  # a DGX H100's 2 TB holds it
    res = _simulate(*flags, "--host-memory-gb", "128")  # a 128 GB cloud VM does not: 148 GB needed
    assert res.exit_code == 2 and "host memory" in res.output and "has 128 GB" in res.output


@pytest.mark.parametrize("value", ["0", "-3"])
def test_bad_host_memory_is_one_line(value):
    res = _simulate("--model", "llama-3-8b", "--host-memory-gb", value)
    assert res.exit_code == 2 and "--host-memory-gb must be positive" in res.output and "Traceback" not in res.output


def test_a_saved_plan_keeps_the_stated_host(tmp_path):
    saved = tmp_path / "p.toml"
    res = CliRunner().invoke(main, ["plan", "--model", "llama-2-7b", "--hardware", "h100-sxm", "--gpus", "1",
                                    "--host-cores", "16", "--host-memory-gb", "100", "--time-limit", "1",
                                    "--save-plan", str(saved)])
    assert res.exit_code == 0, res.output
    assert "host_cores = 16" in saved.read_text() and "host_memory_gb = 100.0" in saved.read_text()
    text = CliRunner().invoke(main, ["simulate", "--plan", str(saved)]).output
    assert "of 100 GB per node" in text
    assert _simulate("--plan", str(saved), "--host-memory-gb", "1").exit_code == 2  # the flag wins: nothing fits


def test_a_bad_host_figure_in_a_plan_file_is_one_line(tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_text('model = "llama-2-7b"\nhardware = "h100-sxm"\nhost_cores = "many"\n')
    res = _simulate("--plan", str(bad))
    assert res.exit_code == 2 and "'host_cores' must be a number" in res.output and "Traceback" not in res.output
