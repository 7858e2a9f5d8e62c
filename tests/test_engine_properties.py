"""Invariants of the event engine, on random task graphs."""

from hypothesis import given, settings
from hypothesis import strategies as st

from ghsim.sim.engine import Resource, run

RESOURCES = [Resource("gpu"), Resource("h2d"), Resource("d2h"), Resource("cpu", servers=3)]


@st.composite
def task_graphs(draw):
    n = draw(st.integers(1, 60))
    res, dur, deps, issue, waits = [], [], [], [], []
    for i in range(n):
        res.append(draw(st.integers(0, len(RESOURCES) - 1)))
        dur.append(draw(st.floats(0, 5)))
        deps.append(tuple(sorted(set(draw(st.lists(st.integers(0, i - 1), max_size=3))))) if i else ())
        issue.append(draw(st.floats(0, 1)))
        waits.append(draw(st.booleans()))
    return res, dur, deps, issue, waits


@settings(max_examples=80, deadline=None)
@given(task_graphs())
def test_dependencies_respected(g):
    res, dur, deps, issue, waits = g
    s = run(RESOURCES, res, dur, deps, issue, waits)
    for i, ds in enumerate(deps):
        for d in ds:
            assert s.start[i] >= s.end[d] - 1e-12


@settings(max_examples=80, deadline=None)
@given(task_graphs())
def test_no_resource_runs_more_ops_than_servers(g):
    res, dur, deps, issue, waits = g
    s = run(RESOURCES, res, dur, deps, issue, waits)
    for r, resource in enumerate(RESOURCES):
        idx = [i for i in range(len(res)) if res[i] == r and dur[i] > 0]
        events = sorted([(s.start[i], 1) for i in idx] + [(s.end[i], -1) for i in idx])
        running = 0
        for _, delta in events:  # ends sort before starts at equal times
            running += delta
            assert running <= resource.servers


@settings(max_examples=80, deadline=None)
@given(task_graphs())
def test_ops_start_after_issue_and_in_queue_order(g):
    res, dur, deps, issue, waits = g
    s = run(RESOURCES, res, dur, deps, issue, waits)
    for i in range(len(res)):
        assert s.start[i] >= s.issue[i] - 1e-12
        for j in range(i):
            if res[j] == res[i]:
                assert s.start[i] >= s.start[j] - 1e-12  # in-order queues
    assert s.makespan >= max(s.end)


@settings(max_examples=50, deadline=None)
@given(task_graphs(), st.floats(0.1, 0.99))
def test_shorter_tasks_never_lengthen_the_makespan(g, factor):
    res, dur, deps, issue, waits = g
    slow = run(RESOURCES, res, dur, deps, issue, waits)
    fast = run(RESOURCES, res, [d * factor for d in dur], deps, issue, waits)
    assert fast.makespan <= slow.makespan + 1e-9


SHARED = [Resource("gpu", slowed_by=("comm", "pool"), slowdown=0.25), Resource("comm"), Resource("pool", servers=2)]


@settings(max_examples=80, deadline=None)
@given(task_graphs())
def test_a_shared_processor_slows_only_while_its_neighbours_work(g):
    """An op on a slowed resource takes between its duration and duration / (1 - slowdown),
    and exactly its duration when no earlier-issued work on a slowing resource overlaps it."""
    res, dur, deps, issue, waits = g
    res = [r % len(SHARED) for r in res]
    s = run(SHARED, res, dur, deps, issue, waits)
    for i in range(len(res)):
        if res[i] != 0 or dur[i] == 0:
            continue
        took = s.end[i] - s.start[i]
        assert dur[i] - 1e-12 <= took <= dur[i] / 0.75 + 1e-12
        overlapped = any(res[j] != 0 and s.start[j] < s.end[i] and s.end[j] > s.start[i] and s.end[j] > s.start[j]
                         for j in range(i))
        if not overlapped:
            assert abs(took - dur[i]) <= 1e-12
        if any(res[j] != 0 and s.start[j] <= s.start[i] and s.end[j] >= s.end[i] for j in range(i)):
            assert abs(took - dur[i] / 0.75) <= 1e-9  # slowed all the way
