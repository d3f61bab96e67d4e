"""dlmpipe and EleutherAI's lm-evaluation-harness (the optional extra ``dlmpipe[lm-eval]``;
docs/SCORING.md, "lm-evaluation-harness").

- ``model.py``: any dlmpipe backbone + method as an lm-eval model (``--model dlmpipe``, or
  ``simple_evaluate(model=DlmpipeLM(...))``), with ``cli.py`` (``python -m dlmpipe lm-eval``);
- ``campaign.py``: a campaign task ``benchmark: lm_eval`` whose prompts are lm-eval's and whose
  scores carry lm-eval's verdict beside dlmpipe's (``rules.py``: dlmpipe's rule per lm-eval task);
- ``tasks.py``: lm-eval tasks loaded offline from local data files.
Only this package imports ``lm_eval`` (model.py at its top; the others inside functions, as the
task registry and the CLI import them), so dlmpipe runs without the extra.
"""
