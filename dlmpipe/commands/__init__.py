"""The commands of ``python -m dlmpipe``: user.py (check, methods, decode, plan: what a person
types) and jobs.py (what the workflow's rules run, and the tools beside them); dlmpipe/cli.py
lays them out and runs one."""
