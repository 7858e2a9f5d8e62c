"""`ghsim sweep`: many searches as one DataFrame, locally and on a Dask cluster the test starts."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from ghsim.cli import main
from synthetic import TINY_MODEL_TOML
from ghsim.search.sweep import COLUMNS, SweepTask, sweep, tasks_for, write_results



PINS = (("recompute", "full"), ("cuda_graphs", True), ("offload_schedule", "auto"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "tiny-llama.toml"
    path.write_text(TINY_MODEL_TOML)
    return str(path)


def _tasks(tiny):
    common = dict(seq=512, global_batch=8, precisions=("bf16",), pins=PINS)
    return tasks_for([tiny, "no-such-model"], ["h100-sxm"], [1], **common) + [SweepTask(tiny, "gh200-96gb", 1, **common)]


def test_local_sweep_gives_one_row_per_task(cal, tiny):
    df = sweep(_tasks(tiny), cal)
    assert list(df.columns) == list(COLUMNS) and len(df) == 3
    ok = df[df.status == "ok"]
    assert set(ok.hardware) == {"h100-sxm", "gh200-96gb"} and (ok.step_time_s > 0).all()
    assert (ok.n_evaluated >= ok.n_feasible).all() and ok["flags"].str.startswith("--gpus 1").all()
    bad = df[df.status == "error"].iloc[0]
    assert "no-such-model" in bad.error


def test_sweep_on_a_local_dask_cluster(cal, tiny):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        df = sweep(_tasks(tiny), cal, scheduler=cluster.scheduler_address)
    local = sweep(_tasks(tiny), cal)
    cols = ["model", "hardware", "gpus", "status", "step_time_s", "n_evaluated"]
    pd.testing.assert_frame_equal(df[cols], local[cols])


def test_results_as_parquet_and_csv(cal, tiny, tmp_path):
    df = sweep(_tasks(tiny)[:1], cal)
    write_results(df, str(tmp_path / "r.csv"))
    assert pd.read_csv(tmp_path / "r.csv").step_time_s.iloc[0] == pytest.approx(df.step_time_s.iloc[0])
    pytest.importorskip("pyarrow")
    write_results(df, str(tmp_path / "r.parquet"))
    assert pd.read_parquet(tmp_path / "r.parquet")["flags"].iloc[0] == df["flags"].iloc[0]


def test_cli_sweep_writes_csv(cal, tiny, tmp_path):
    from synthetic import synthetic_microbench

    calfile = tmp_path / "cal.json"
    calfile.write_text(json.dumps(synthetic_microbench()))
    out = tmp_path / "sweep.csv"
    r = CliRunner().invoke(main, ["sweep", "--models", tiny, "--hardware", "h100-sxm,gh200-96gb", "--gpus", "1",
                                  "--seq", "512", "--global-batch", "8", "--precisions", "bf16", "--jobs", "1",
                                  "--pin", "recompute=full,cuda_graphs=true,offload_schedule=auto",
                                  "--calibration", str(calfile), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert len(pd.read_csv(out)) == 2 and "wrote" in r.output


def test_cli_sweep_bad_input(tmp_path):
    r = CliRunner().invoke(main, ["sweep", "--models", "x", "--gpus", "four"])
    assert r.exit_code == 2
    r = CliRunner().invoke(main, ["sweep", "--models", "x", "--out", str(tmp_path / "r.xlsx")])
    assert r.exit_code == 2
