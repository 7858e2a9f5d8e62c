"""The examples run as a user runs them, and say what their stories claim.

Each script is run from another directory with the measured calibration, exactly as
examples/README.md tells a user to; a broken flag, a quoting slip or a CI gate that
fails on the repository's own cases shows up here, not in a user's terminal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
pytestmark = pytest.mark.slow


def run(args: list[str], tmp_path: Path, **env: str) -> str:
    p = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**os.environ, **env})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return p.stdout


def test_ci_validate_passes_on_the_repository_cases(tmp_path):
    out = run(["bash", str(EXAMPLES / "ci_validate.sh")], tmp_path)
    assert " 0 skipped, 0 outside tolerance" in out
    assert "plan ok:" in out


def test_plan_story_writes_its_files(tmp_path):
    out = run(["bash", str(EXAMPLES / "plan_llama70b_4x_gh200.sh")], tmp_path)
    assert "why #1 wins" in out and "cheapest:" in out
    files = EXAMPLES / "out"
    assert (files / "llama70b-4xgh200-front.png").stat().st_size > 10_000
    assert json.loads((files / "llama70b-4xgh200-trace.json").read_text())
    assert json.loads((files / "llama70b-4xgh200-cost.json").read_text())["n_feasible"] > 0


def test_deepspeed_config_story(tmp_path):
    out = run(["bash", str(EXAMPLES / "check_deepspeed_config.sh")], tmp_path)
    assert "step time" in out and "why #1 wins" in out


def test_gh200_vs_h100_story_prints_both_parts(tmp_path):
    out = run([sys.executable, str(EXAMPLES / "gh200_vs_h100_7b_full_finetune.py")], tmp_path)
    rows = [line.split() for line in out.splitlines() if line.startswith(("gh200-96gb ", "h100-pcie "))]
    assert [r[0] for r in rows] == ["gh200-96gb", "h100-pcie"] and "GH200 is" in out


def test_sweep_story_on_a_small_sweep(tmp_path):
    pytest.importorskip("pyarrow")
    out = run(["bash", str(EXAMPLES / "sweep_on_dask.sh")], tmp_path,
              MODELS="llama-2-7b", HARDWARE="gh200-96gb,h100-sxm", GPUS="1")
    assert "gh200-96gb" in out and "h100-sxm" in out and "llama-2-7b" in out
