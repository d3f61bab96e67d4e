"""dlmpipe and EleutherAI's lm-evaluation-harness (the optional extra ``dlmpipe[lm-eval]``).

- ``model.py``: any dlmpipe backbone + method as an lm-eval model (``--model dlmpipe``, or
  ``simple_evaluate(model=DlmpipeLM(...))``), with ``cli.py`` (``python -m dlmpipe lm-eval``);
- ``tasks.py``: lm-eval tasks loaded offline from local data files.
Only this package imports ``lm_eval``, and only inside functions (``model.py`` at its top, but
nothing outside this package imports it), so dlmpipe runs without the extra.
"""
