"""`ghsim validate`: hold predictions against measured training steps.

    cases.py   load validation/cases/*/case.toml, simulate each case, compare, render the errors
"""
