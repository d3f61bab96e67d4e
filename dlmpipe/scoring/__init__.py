"""Sandboxed scoring: code in a sandbox per program (sandbox.py, harness.py), answers by match.

Entry points: ``score.score_generations`` (the score stage), ``samples.score_samples``
(``dlmpipe score-samples``). See docs/SCORING.md.
"""
