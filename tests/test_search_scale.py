"""The search at cluster scale: work shared across plans changes no answer; the time limit
is a real limit; --jobs is capped to the cores; SIGTERM stops the pool workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ghsim.errors import GhsimError
from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import Framework, Plan, Recompute
from ghsim.search.core import default_jobs, search, usable_jobs
from ghsim.search.memory_estimate import estimate_memory, memory_states
from ghsim.search.screen import Status
from ghsim.search.space import default_space, groups

ROOT = Path(__file__).resolve().parents[1]
H100 = load_hardware("h100-sxm")
BASE8 = Plan(gpus=8, seq=4096, global_batch=32, framework=Framework.DEEPSPEED, optimizer_impl="fused")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["llama-2-7b", "mixtral-8x7b", "llama-70b"]), data=st.data())
def test_shared_plan_states_give_the_same_estimate(name, data):
    """A group's members are estimated on the group's shared states: exactly what each
    plan's own estimate says (the states do not depend on recompute or the micro-batch)."""
    model = load_model(name)
    space = default_space(model, H100, BASE8)
    group = data.draw(st.sampled_from(list(groups(space, BASE8))))
    shared = memory_states(model, H100, group.base.with_(micro_batch=64, recompute=Recompute.NONE))
    for rc in group.recomputes:
        mb = data.draw(st.sampled_from(group.micro_batches))
        plan = group.base.with_(recompute=rc, micro_batch=mb)
        assert estimate_memory(model, H100, plan, shared) == estimate_memory(model, H100, plan)


def test_jobs_are_capped_to_the_cores():
    cores = default_jobs()
    assert usable_jobs(None) == (cores, "")
    assert usable_jobs(1) == (1, "")
    n, note = usable_jobs(100_000)
    assert n == cores and "capped" in note and str(cores) in note
    with pytest.raises(GhsimError, match="--jobs"):
        usable_jobs(0)


def test_a_time_limit_bounds_the_whole_search(cal):
    """Past the limit nothing more is judged, memory pruning included: the rest is unexplored."""
    model = load_model("llama-70b")
    t = time.perf_counter()
    r = search(model, H100, BASE8, default_space(model, H100, BASE8), calibration=cal, time_limit=0.05)
    assert time.perf_counter() - t < 5.0
    left = r.count(Status.UNEXPLORED)
    assert left > 0 and r.n_evaluated == r.n_candidates - left
    assert r.n_candidates == sum(r.count(s) for s in Status)


def _ghsim(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", "from ghsim.cli import main; main()", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_cli_time_limit_is_real_and_says_the_search_was_cut_short():
    t = time.perf_counter()
    p = _ghsim("plan", "--model", "llama-70b", "--gpus", "1000000", "--hardware", "h100-sxm", "--time-limit", "1",
               "--jobs", "1")
    out, err = p.communicate(timeout=120)
    wall = time.perf_counter() - t
    assert wall < 1 + 12  # the limit, interpreter start-up and loading on a loaded 2-core machine
    assert "cut short" in out + err and "Traceback" not in err


def test_cli_bad_jobs_and_time_limit_are_one_line_errors():
    for flags in (["--jobs", "0"], ["--time-limit", "nan"], ["--time-limit", "inf"], ["--time-limit", "-1"]):
        p = _ghsim("plan", "--model", "llama-2-7b", *flags)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 2 and err.count("\n") == 1 and "Traceback" not in err, (flags, err)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/task").exists() or default_jobs() < 2, reason="needs /proc and 2 cores")
def test_sigterm_stops_plan_and_its_workers():
    p = _ghsim("plan", "--model", "llama-70b", "--gpus", "8", "--hardware", "h100-sxm", "--time-limit", "0",
               "--jobs", "2", "--no-progress")
    workers: list[int] = []
    deadline = time.time() + 60
    while time.time() < deadline and len(workers) < 2:  # until the pool is up
        time.sleep(0.2)
        workers = _children(p.pid)
        assert p.poll() is None
    assert len(workers) >= 2
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=20)  # (workers left running would hold the pipe open)
    assert p.returncode == 128 + signal.SIGTERM and "Traceback" not in err and err.count("\n") == 1, err
    end = time.time() + 5
    while time.time() < end and any(_alive(w) for w in workers):
        time.sleep(0.1)
    assert not any(_alive(w) for w in workers)


def test_time_limited_pruning_takes_every_layout_in_turn():
    from ghsim.search.core import _by_layout_in_turn

    model = load_model("llama-70b")
    space = default_space(model, H100, BASE8)
    all_groups = list(groups(space, BASE8))
    turned = _by_layout_in_turn(all_groups)
    assert sorted(map(id, turned)) == sorted(map(id, all_groups))  # the same groups, each once
    layouts = {(g.base.tp, g.base.pp, g.base.ep) for g in all_groups}
    first = {(g.base.tp, g.base.pp, g.base.ep) for g in turned[:len(layouts)]}
    assert first == layouts and len(layouts) > 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_worker_forked_before_its_initializer_dies_quietly_on_sigterm():
    """A pool worker inherits the CLI's SIGTERM handler until its initializer resets it; the parent's
    shutdown terminating it in that window must not print the parent's message again."""
    from ghsim.cli.plan import stop_on_sigterm

    read_end, write_end = os.pipe()
    with stop_on_sigterm():
        pid = os.fork()
        if pid == 0:  # the child: stderr into the pipe, then wait for the signal
            os.dup2(write_end, 2)
            time.sleep(30)
            os._exit(0)
        os.close(write_end)
        time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
    printed = os.read(read_end, 4096)
    os.close(read_end)
    assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGTERM and printed == b""
