"""Checks of the Snakemake run itself, made while the Snakefile is parsed, before any job.

SLURM: with the cluster profile (``--profile slurm``, ``profiles/slurm``: ``executor: slurm``)
every job but the local rules is submitted with ``sbatch`` and followed with SLURM's other
commands. Where they are not on PATH, Snakemake would still run the local jobs and only fail at
the first submission; ``slurm_preflight`` says so before any job instead, naming what is missing
and the command that runs the campaign here. A dry run (``-n``) still plans, with the same words
as a warning, so that the plan can be read anywhere.

The executor is a command-line setting that Snakemake 9 hands to the workflow only when it
executes (``workflow.executor_plugin``, after parsing), so ``snakemake_arguments`` reads it from
the parsed command line of the running ``snakemake`` (profiles applied), found on the call stack
in ``snakemake.cli.args_to_api``; Snakemake driven through its Python API has none, and is not
checked.
"""
from __future__ import annotations

import shutil
import sys

#: SLURM's commands that snakemake-executor-plugin-slurm runs: sbatch (submit), squeue and sacct
#: (job status; sacct also guesses the account), scontrol (MinJobAge, partitions), scancel
#: (cancel on interrupt), sinfo (the default partition)
SLURM_COMMANDS = ("sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo")
#: modes of the command line that run no job (snakemake.cli.args_to_api's branches)
NOT_EXECUTING = ("lint", "list_target_rules", "list_rules", "print_compilation", "containerize",
                 "generate_unit_tests", "dag", "rulegraph", "filegraph", "d3dag", "unlock",
                 "cleanup_metadata", "conda_cleanup_envs", "conda_create_envs_only",
                 "list_conda_envs", "cleanup_shadow", "container_cleanup_images", "list_changes",
                 "list_input_changes", "list_params_changes", "list_untracked", "summary",
                 "detailed_summary", "archive", "delete_all_output", "delete_temp_output", "touch")


def snakemake_arguments():
    """The parsed command line of the running ``snakemake`` (profiles applied), or None."""
    try:
        from snakemake.cli import args_to_api
    except ImportError:
        return None
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is args_to_api.__code__:
            return frame.f_locals.get("args")
        frame = frame.f_back
    return None


def local_command(argv: list[str]) -> str:
    """``argv`` (a snakemake command line) without its profile and executor: the same campaign
    run on this machine."""
    out, skip = ["snakemake"], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--profile", "--executor", "-e"):
            skip = "=" not in arg
            continue
        out.append(arg)
    if not any(a.split("=", 1)[0] in ("--cores", "-c", "--jobs", "-j") for a in out):
        out[1:1] = ["--cores", "all"]
    return " ".join(out)


def slurm_preflight(args, argv: list[str], which=shutil.which) -> tuple[str, str] | None:
    """("error", message) when a run would submit to SLURM without its commands on PATH,
    ("warning", message) for such a dry run; None otherwise."""
    if args is None or getattr(args, "executor", None) != "slurm":
        return None
    missing = [c for c in SLURM_COMMANDS if which(c) is None]
    if not missing or any(getattr(args, mode, None) for mode in NOT_EXECUTING) or getattr(
            args, "report", None):
        return None
    profiles = [str(p) for p in getattr(args, "profile", None) or []]
    via = f"--profile {' '.join(profiles)}" if profiles else "--executor slurm"
    names = ", ".join(missing[:-1]) + (" and " if len(missing) > 1 else "") + missing[-1]
    what = (f"SLURM pre-flight: {via} submits the jobs to SLURM (executor slurm), but {names} "
            f"{'is' if len(missing) == 1 else 'are'} not on PATH (this is not a SLURM login node, "
            "or SLURM's commands are elsewhere).")
    # `make campaign` runs the default campaign (config.yaml): offered only for that one
    default = not any(a.split("=", 1)[0] in ("--configfile", "--configfiles") for a in argv)
    here = (f"To run the campaign on this machine instead: {local_command(argv)}"
            + ("  (or: make campaign)" if default else ""))
    if getattr(args, "dryrun", False):
        return "warning", f"{what} A run stops here, before any job; this dry run only plans.\n{here}"
    return "error", f"{what} Nothing was run.\n{here}"
