"""The `ghsim` command line: the group and its commands (one module per command or family).

    app.py        the group, its error contract (one line on stderr, exit 2), the commands
    options.py    model, hardware and plan flags shared by simulate, plan, compare, trace command
    simulate.py   simulate          catalog.py   models, hardware
    plan.py       plan, sweep       compare.py   compare
    validate.py   validate          trace.py     trace summarize, trace command
    calibrate.py  calibrate
"""

from ghsim.cli.app import main

__all__ = ["main"]
