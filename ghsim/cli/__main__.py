"""`python -m ghsim.cli ...`: the same as the `ghsim` console script."""

from ghsim.cli import main

main()
