"""`ghsim validate`: hold predictions against measured training steps.

    cases.py   load validation/cases/*/case.toml, simulate each case, compare, render the errors

The comparison with published tables (Megatron-LM, ZeRO, an ETH GH200 study) is test and
benchmark code: tests/published_tables.py.
"""
