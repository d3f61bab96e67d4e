"""The user's commands: check a campaign, list the methods, decode one prompt, plan a campaign.

``check CONFIG``  the campaign validated and expanded (``python -m dlmpipe.campaign``'s output);
``methods``       every sampler and cache with parameters, defaults and ranges, and which caches
                  serve which samplers (registry/describe.py);
``decode``        one prompt, one method, one checkpoint (quick_decode.py);
``plan CONFIG``   jobs per rule, samples per task and GPU-hours, before anything is downloaded
                  (plan.py, cost.py);
``fetch CONFIG``  every Hugging Face Hub checkpoint and dataset the campaign names, into the
                  Hugging Face cache, where the network is (campaign/hub.py, hub.py);
``lm-eval ...``   lm-evaluation-harness with a dlmpipe method as its model (dlmpipe/lmeval/cli.py;
                  the optional extra ``dlmpipe[lm-eval]``).
Each is a thin parser around one library function, as the job commands are.
"""
from __future__ import annotations

import argparse
import sys

#: the user's commands, in the order ``--help`` lists them
COMMANDS = ("check", "methods", "decode", "plan", "fetch", "lm-eval")


def _check(a: argparse.Namespace) -> int:
    from ..campaign.show import main

    return main(a.config)


def _methods(a: argparse.Namespace) -> None:
    from ..registry import describe

    print(describe(a.format))


def _decode(a: argparse.Namespace) -> None:
    from ..quick_decode import parse_sets, quick_decode, report

    print(report(quick_decode(a.checkpoint, a.sampler, a.cache, a.prompt, a.gen_length,
                              parse_sets(a.set), device=a.device, dtype=a.dtype, chat=a.chat,
                              seed=a.seed, warmup=a.warmup, trace=a.trace,
                              block_size=a.block_size)))


def _plan(a: argparse.Namespace) -> int:
    from ..campaign import ConfigError, load_campaign
    from ..plan import Gpu, render

    try:
        campaign = load_campaign(a.config, check_paths=False)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    gpu = Gpu(a.gpu, a.gpu_tflops, a.utilization, a.utilization_b1)
    print(render(campaign, ", ".join(a.config), gpu, a.parallel_tokens, a.prompt_tokens))
    return 0


def _fetch(a: argparse.Namespace) -> int:
    from ..campaign import ConfigError, load_campaign
    from ..campaign.hub import fetch_campaign

    try:
        campaign = load_campaign(a.config)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    print("\n".join(fetch_campaign(campaign)))
    return 0


def _lm_eval(a: argparse.Namespace) -> int:
    try:
        import lm_eval  # noqa: F401  (the optional extra)
    except ModuleNotFoundError:
        raise ValueError("lm-eval is not installed: pip install 'dlmpipe[lm-eval]' (make setup "
                         "installs it)") from None
    from ..lmeval.cli import run

    return run(a.passed)


def register(sub) -> None:
    """Add the user's commands to ``sub`` (the parser's subcommands), in ``COMMANDS`` order."""
    s = sub.add_parser("check", help="validate a campaign and print its expanded methods, where "
                       "each runs and where its parameters differ per backbone and task")
    s.add_argument("config", nargs="*", default=["config.yaml"], metavar="CONFIG", help="campaign files (later "
                   "ones override earlier ones key by key; default config.yaml)")
    s.set_defaults(func=_check)

    s = sub.add_parser("methods", help="every sampler and cache with its parameters, defaults and "
                       "ranges, and which caches serve which samplers")
    s.add_argument("--format", choices=["text", "markdown"], default="text",
                   help="markdown: tables for the docs")
    s.set_defaults(func=_methods)

    s = sub.add_parser("decode", help="decode one prompt with one method on one checkpoint (a "
                       "quick look: text, steps, NFE, time, tokens per second)")
    s.add_argument("--checkpoint", required=True, help="a checkpoint directory (LLaDA or Dream "
                   "family) or shipped:<name> (shipped:toy)")
    s.add_argument("--sampler", required=True, help="a sampler (dlmpipe methods lists them)")
    s.add_argument("--cache", default="none", help="a cache (default none: full recompute)")
    s.add_argument("--set", action="append", default=[], metavar="PART.PARAM=VALUE",
                   help="a parameter, e.g. cache.K=4 or sampler.block_length=8 (repeatable; "
                   "values as in a config file: 4, 0.9, inf, null)")
    s.add_argument("--prompt", required=True, help="the prompt text (no chat template unless "
                   "--chat)")
    s.add_argument("--gen-length", type=int, default=32, help="response positions (default 32)")
    s.add_argument("--chat", action="store_true", help="wrap the prompt in the checkpoint's chat "
                   "template (instruct models)")
    s.add_argument("--device", default="auto", help="auto (cuda where available), cpu, cuda")
    s.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, else float32), "
                   "float32, bfloat16, float16")
    s.add_argument("--seed", type=int, default=0, help="seed of the sampler's generator")
    s.add_argument("--warmup", action="store_true", help="one untimed decode first, as the jobs "
                   "do (the timed one then runs without first-call costs)")
    s.add_argument("--block-size", type=int, default=None, help="a block-causal backbone's "
                   "block size for this decode (its attention's blocks; default the "
                   "checkpoint's), as the releases' block length argument (docs/MODELS.md)")
    s.add_argument("--trace", metavar="FILE", help="write every forward of the decode to FILE "
                   "as JSON lines: rows computed, positions committed with tokens and "
                   "confidences, cache decisions (dlmpipe/trace.py; docs/METHODS.md)")
    s.set_defaults(func=_decode)

    from ..plan import Gpu  # its defaults are the plan's assumptions

    gpu = Gpu()
    s = sub.add_parser("plan", help="jobs per rule, samples per task and estimated GPU-hours per "
                       "backbone of a campaign, before its checkpoints or data are downloaded")
    s.add_argument("config", nargs="+", metavar="CONFIG", help="campaign files (later ones "
                   "override earlier ones key by key)")
    s.add_argument("--gpu", default=gpu.name, help="the GPU's name, for the output (default "
                   "%(default)s)")
    s.add_argument("--gpu-tflops", type=float, default=gpu.peak_tflops, help="its dense bf16 "
                   "peak (default %(default)s)")
    s.add_argument("--utilization", type=float, default=gpu.utilization, help="share of the peak "
                   "decoding reaches with samples decoded together (default %(default)s)")
    s.add_argument("--utilization-b1", type=float, default=gpu.utilization_b1, help="share of the "
                   "peak at batch 1: warm-ups, the timing stage's latency passes, analyses "
                   "(default %(default)s)")
    s.add_argument("--parallel-tokens", type=float, default=1.0, help="tokens per update assumed "
                   "for threshold/factor/EB-Sampler/WINO (default 1: their worst case)")
    s.add_argument("--prompt-tokens", type=float, default=None, help="one prompt length for every "
                   "task (default: each benchmark's, dlmpipe/tasks/registry.py)")
    s.set_defaults(func=_plan)

    s = sub.add_parser("fetch", help="fetch every Hugging Face Hub checkpoint and dataset a "
                       "campaign names into the Hugging Face cache (HF_HOME), where the network "
                       "is (a login node), checking the weights' sha256; its jobs then read them "
                       "offline")
    s.add_argument("config", nargs="+", metavar="CONFIG", help="campaign files (later ones "
                   "override earlier ones key by key)")
    s.set_defaults(func=_fetch)

    from ..lmeval.cli import HELP

    # every flag is lm-eval's: the parser passes what it does not know (cli.main)
    s = sub.add_parser("lm-eval", help=HELP, add_help=False)
    s.set_defaults(func=_lm_eval, passthrough=True)
