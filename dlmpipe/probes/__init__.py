"""Mechanism probes: observers and interventions on the decode loop (docs/ANALYSES.md).

- ``shadow``: Archer's non-intervening shadow forward (cached vs fresh action at one state);
- ``intervention``: Archer's matched-state feedback intervention (Fresh vs Cached branches);
- ``drift``: SPA-Cache's per-layer step-to-step drift profile.

Each runs the model; the tables and figures made from their records live in
``dlmpipe.analysis.mechanism`` (no torch).
"""
