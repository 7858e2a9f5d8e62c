"""`ghsim sweep`: one plan search per (model, hardware, cluster size), locally or on Dask.

Each task is a whole `ghsim plan` search (single process: the parallelism is across
tasks), returning one row: the best plan and what it costs. Rows become a pandas
DataFrame, written as Parquet or CSV. With a Dask scheduler address the tasks run on
its workers (`pip install ghsim[dask]`); the workers need ghsim and its profiles.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ghsim.errors import GhsimError
from ghsim.search.space import DEFAULT_FRAMEWORK, DEFAULT_OPTIMIZER, DEFAULT_PRECISIONS

COLUMNS = ("model", "hardware", "gpus", "status", "step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s",
           "mfu", "gpu_utilization", "hbm_peak_gb", "hbm_peak_lo_gb", "hbm_peak_hi_gb", "host_peak_gb", "usd_per_mtok",
           "flags", "n_evaluated", "n_feasible", "elapsed_s", "error")


@dataclass(frozen=True)
class SweepTask:
    model: str
    hardware: str
    gpus: int
    seq: int = 4096
    global_batch: int = 0  # 0: the plan search's default for this many GPUs
    lora_rank: int = 0
    objective: str = "time"
    precisions: tuple[str, ...] = tuple(p.value for p in DEFAULT_PRECISIONS)
    framework: str = DEFAULT_FRAMEWORK.value
    price: float | None = None
    pins: tuple[tuple[str, Any], ...] = ()  # plan dimensions fixed for every search: (field, value)
    time_limit: float = 0.0  # seconds of simulating per search (0: none), as `ghsim plan --time-limit`


def tasks_for(models: Sequence[str], hardware: Sequence[str], gpus: Sequence[int], **common: Any) -> list[SweepTask]:
    return [SweepTask(m, h, g, **common) for m in models for h in hardware for g in gpus]


def run_task(task: SweepTask, calibration: Any = None) -> dict[str, Any]:
    """One search; a plan that cannot be searched (bad name, nothing fits) is a row too."""
    from ghsim.hardware import has_fp8, load_hardware
    from ghsim.model import load_model
    from ghsim.plan import Framework, Plan, Precision, check_values
    from ghsim.search.core import search
    from ghsim.search.objective import Objective
    from ghsim.report import intervals
    from ghsim.search.explain import reproduce_flags, step_interval
    from ghsim.search.space import default_global_batch, default_space, pin

    row: dict[str, Any] = {c: None for c in COLUMNS}
    row.update(model=task.model, hardware=task.hardware, gpus=task.gpus)
    t0 = time.perf_counter()
    try:
        model, hw = load_model(task.model), load_hardware(task.hardware)
        base = Plan(gpus=task.gpus, seq=task.seq, lora_rank=task.lora_rank,
                    global_batch=task.global_batch or default_global_batch(task.gpus),
                    framework=Framework(task.framework), optimizer_impl=DEFAULT_OPTIMIZER)
        check_values(base)
        precisions = tuple(p for p in map(Precision, task.precisions) if p != Precision.FP8 or has_fp8(hw))
        space = default_space(model, hw, base, precisions)
        if task.pins:
            space = pin(space, pinned_values(dict(task.pins)))
        r = search(model, hw, base, space, Objective.parse(task.objective), calibration, task.price, jobs=1,
                   time_limit=task.time_limit)
        row.update(model=model.name, n_evaluated=r.n_evaluated, n_feasible=r.n_feasible)
        if r.best is None:
            row.update(status="no plan fits")
        else:
            b = r.best
            row.update(status="ok", step_time_s=b.step_time_s, tokens_per_s=b.tokens_per_s, mfu=b.mfu,
                       gpu_utilization=b.gpu_utilization, hbm_peak_gb=b.hbm_peak_bytes / 1e9,
                       host_peak_gb=b.host_peak_bytes / 1e9, flags=reproduce_flags(b.plan),
                       usd_per_mtok=b.usd_per_mtok(r.price_per_gpu_hour) if r.price_per_gpu_hour else math.nan)
            step_iv, hbm_iv = step_interval(b), intervals.peak_interval(b.hbm_peak_bytes)  # report/intervals.py
            if step_iv and hbm_iv:
                row.update(step_time_lo_s=step_iv[0], step_time_hi_s=step_iv[1], hbm_peak_lo_gb=hbm_iv[0] / 1e9,
                           hbm_peak_hi_gb=hbm_iv[1] / 1e9)
    except (GhsimError, ValueError) as e:
        row.update(status="error", error=str(e))
    row["elapsed_s"] = time.perf_counter() - t0
    return row


def sweep(tasks: Sequence[SweepTask], calibration: Any = None, scheduler: str | None = None, jobs: int = 1,
          progress: Callable[[int, int], None] | None = None):
    """Run every task; a DataFrame with one row per task, in task order."""
    import pandas as pd

    tasks = list(tasks)
    if scheduler:
        rows = _on_dask(tasks, calibration, scheduler, progress)
    elif jobs > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(min(jobs, len(tasks))) as pool:
            futures = [pool.submit(run_task, t, calibration) for t in tasks]
            rows = []
            for i, f in enumerate(futures, 1):
                rows.append(f.result())
                if progress:
                    progress(i, len(tasks))
    else:
        rows = []
        for i, t in enumerate(tasks, 1):
            rows.append(run_task(t, calibration))
            if progress:
                progress(i, len(tasks))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _on_dask(tasks: list[SweepTask], calibration: Any, address: str, progress) -> list[dict[str, Any]]:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise GhsimError("--scheduler needs Dask: pip install 'ghsim[dask]'") from None
    check_scheduler_address(address)
    try:
        client = Client(address, timeout=10)
    except (OSError, TimeoutError, ValueError) as e:
        raise GhsimError(f"cannot reach the Dask scheduler at {address}: {e}") from None
    try:
        cal = client.scatter(calibration, broadcast=True) if calibration is not None else None
        futures = client.map(run_task, tasks, calibration=cal, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        rows: list[Any] = [None] * len(tasks)
        for n, f in enumerate(as_completed(futures), 1):
            rows[index[f.key]] = f.result()
            if progress:
                progress(n, len(tasks))
        return rows
    finally:
        client.close()


def check_scheduler_address(address: str) -> None:
    """A Dask scheduler address is [protocol://]host:port; anything else is refused before Dask
    is imported (Dask's own error is a ValueError from deep inside its address parser)."""
    protocol, sep, location = address.partition("://")
    if sep:  # tcp://, tls://, inproc://...: Dask parses the rest (its ValueError is caught at connect)
        if protocol.isalnum() and location:
            return
        raise GhsimError(f"--scheduler: {address!r} is not a Dask scheduler address (tcp://host:port)")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise GhsimError(f"--scheduler: {address!r} is not a Dask scheduler address (tcp://host:port)")


def failures(df) -> tuple[int, str]:
    """How many rows failed (an error, not "no plan fits") and the first failure's reason."""
    failed = df[df["status"] == "error"]
    return len(failed), (str(failed["error"].iloc[0]) if len(failed) else "")


def pinned_values(pins: dict[str, Any]) -> dict[str, Any]:
    """Plan-typed values for pinned dimensions given as strings or plain values."""
    from ghsim.plan import check_values, plan_from_dict

    raw = {}
    for k, v in pins.items():
        if isinstance(v, str) and v.lower() in ("true", "false"):
            v = v.lower() == "true"
        elif isinstance(v, str) and v.replace(".", "", 1).isdigit():
            v = float(v) if "." in v else int(v)
        raw[k] = v
    plan = plan_from_dict(raw, "--pin")
    check_values(plan)
    return {k: getattr(plan, k) for k in raw}


def write_results(df, path: str) -> None:
    """Parquet (.parquet, .pq) or CSV (.csv), by the file's extension."""
    suffix = Path(path).suffix.lower()
    try:
        if suffix in (".parquet", ".pq"):
            df.to_parquet(path, index=False)
        elif suffix == ".csv":
            df.to_csv(path, index=False)
        else:
            raise GhsimError(f"{path}: write .parquet or .csv")
    except ImportError:
        raise GhsimError(f"{path}: Parquet needs pyarrow (pip install pyarrow), or write .csv") from None
    except OSError as e:
        raise GhsimError(f"{path}: cannot write: {e.strerror}") from None
