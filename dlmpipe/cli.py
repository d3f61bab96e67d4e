"""``python -m dlmpipe <command>``: the user's commands first, then the jobs the workflow runs.

The commands live in dlmpipe/commands/: user.py (check, methods, decode, plan) and jobs.py (every
command a rule calls, and the tools beside them; reports.py holds the analyses' and the report's). Here: the parser's layout, whose ``--help``
lists the three groups apart, and ``main``, which settles the job's threads before torch loads
and turns the errors a user can fix into one line and exit status 2.
"""
from __future__ import annotations

import argparse
import os
import sys
import textwrap

from .commands import jobs, user


def job_environment() -> None:
    """Settle how this job's threads behave before torch (and its OpenMP runtime) loads.

    Threads that reach an OpenMP barrier first sleep instead of spinning (libgomp spins for a
    while by default). Alone on its cores a job barely notices; on a shared login node or
    workstation a spinning thread burns the CPU its descheduled partner needs, and a 2-thread
    job next to one busy process slowed 4-14x instead of its fair share
    (benchmarks/bench_shared_cpu.py). The thread count itself is the job's: Snakemake sets
    OMP_NUM_THREADS to the rule's threads. A value set by the user wins.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


class _Commands:
    """The parser's subcommands, recording each one's help line for the grouped listing (each
    command's own ``-h`` shows it too)."""

    def __init__(self, sub):
        self.sub, self.help = sub, {}

    def add_parser(self, name: str, help: str, **kwargs) -> argparse.ArgumentParser:
        self.help[name] = help
        return self.sub.add_parser(name, help=help, description=help, **kwargs)


def _listing(title: str, names, help: dict[str, str]) -> str:
    lines = [f"{title}:"]
    for name in names:
        lines += textwrap.wrap(help[name], 100, initial_indent=f"  {name:22s}",
                               subsequent_indent=" " * 24)
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dlmpipe", usage="python -m dlmpipe <command> [options]",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = _Commands(p.add_subparsers(dest="command", required=True, metavar="<command>",
                                          prog="python -m dlmpipe", help=argparse.SUPPRESS))
    user.register(commands)
    jobs.register(commands)
    rules = [n for n in commands.help if n not in user.COMMANDS and n not in jobs.TOOLS]
    p.description = "\n\n".join([
        "Evaluation campaigns of diffusion-language-model decoders and caches (README.md, "
        "docs/).\n`python -m dlmpipe <command> -h` shows a command's options.",
        _listing("user commands", user.COMMANDS, commands.help),
        _listing("tools", jobs.TOOLS, commands.help),
        _listing("job commands (what the workflow's rules run)", rules, commands.help)])
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(args, "passthrough", False):  # lm-eval takes its own flags
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.passed = rest
    job_environment()  # before anything loads torch
    from .scoring.levels import SandboxUnavailable

    try:
        return args.func(args) or 0
    except SandboxUnavailable as e:
        print(f"dlmpipe {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as e:
        from .backbones.loading import CheckpointError

        if isinstance(e, (CheckpointError, FileNotFoundError)) or type(e) is ValueError:
            print(f"dlmpipe {args.command}: error: {e}", file=sys.stderr)
            return 2
        raise
