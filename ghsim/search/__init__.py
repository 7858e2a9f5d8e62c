"""`ghsim plan` and `ghsim sweep`: search the plan space for the best plans.

    space.py            the plans searched (SearchSpace), in groups sharing a memory floor
    memory_estimate.py  the fast memory estimate that prunes plans which cannot fit
    screen.py           one plan's verdict from small simulations, extrapolated (Evaluation)
    core.py             search(): prune, screen best-first, confirm the best in full, rank
    explain.py          why the best plan won and why the others lost; tables and JSON
    plot.py             the Pareto front of step time against HBM
    sweep.py            many searches (models x hardware x GPU counts), locally or on Dask
"""
