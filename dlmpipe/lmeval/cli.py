"""``python -m dlmpipe lm-eval ...``: lm-eval's own command line with dlmpipe's model.

Every flag is lm-eval's (``--model_args``, ``--tasks``, ``--limit``, ``--num_fewshot``,
``--batch_size``, ``--apply_chat_template``, ``--output_path``, ...), passed to its CLI unchanged;
``--model`` defaults to ``dlmpipe`` (model.py). Two flags are dlmpipe's, for offline runs: a
task's local data, ``--dataset_kwargs TASK=JSON`` and ``--dataset_path TASK=PATH`` (lm-eval's
task keys, tasks.py), which become an ``--include_path`` directory of override YAMLs. After
lm-eval's table, the speed of each dlmpipe model it decoded with (tokens per second, NFE).
"""
from __future__ import annotations

import argparse
import sys
import tempfile

HELP = ("run lm-evaluation-harness (its flags) with a dlmpipe backbone + method as the model: "
        "--model_args checkpoint=DIR,method=NAME,config=config.yaml --tasks gsm8k; "
        "lm-eval's table, then tokens/s and NFE")


def _own_flags(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--dataset_kwargs", action="append", default=[])
    p.add_argument("--dataset_path", action="append", default=[])
    return p.parse_known_args(argv)


def run(argv: list[str]) -> int:
    """lm-eval's CLI on ``argv`` (dlmpipe's flags taken out), then the speed table."""
    from . import model
    from .tasks import local_override, parse_task_values, write_overrides

    own, rest = _own_flags(argv)
    if not rest or rest[0] in ("-h", "--help"):
        print(f"python -m dlmpipe lm-eval: {HELP}\n\n  --dataset_kwargs TASK=JSON  the task's "
              "local data (lm-eval's dataset_kwargs), e.g.\n      'gsm8k={\"data_files\": "
              "{\"test\": \"../shared/data/gsm8k_test.jsonl\"}}'\n  --dataset_path TASK=PATH    "
              "a local dataset directory or datasets builder\n\nlm-eval's flags:", flush=True)
        rest = ["run", "--help"]
    kwargs = parse_task_values(own.dataset_kwargs, "--dataset_kwargs", as_json=True)
    paths = parse_task_values(own.dataset_path, "--dataset_path", as_json=False)
    if "--model" not in rest and "-M" not in rest and rest[0] not in ("ls", "validate"):
        rest = ["--model", "dlmpipe", *rest]
    with tempfile.TemporaryDirectory(prefix="dlmpipe-lm-eval-") as tmp:
        if kwargs or paths:
            if "--include_path" in rest:
                raise ValueError("--dataset_kwargs/--dataset_path write their own --include_path: "
                                 "put your task YAMLs' local data there instead")
            overrides = {name: local_override(name, paths.get(name), kwargs.get(name))
                         for name in dict.fromkeys([*kwargs, *paths])}
            rest += ["--include_path", str(write_overrides(overrides, tmp))]
        from lm_eval._cli import HarnessCLI

        argv0, sys.argv = sys.argv, ["lm-eval", *rest]
        try:
            cli = HarnessCLI()
            cli.execute(cli.parse_args())
        finally:
            sys.argv = argv0
    if model.CREATED:
        print(model.speed_table([m.speed() for m in model.CREATED]))
    return 0
