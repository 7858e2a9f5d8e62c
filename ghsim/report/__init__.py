"""What a simulated step costs, as people read it: the StepReport (step_report.py), assembled
once for every layout (assemble.py) from where the compute stream's time went (breakdown.py)
and what the host side did (host.py), rendered as a table, JSON, a Chrome trace (step_report.py)
or figures (plots.py)."""
