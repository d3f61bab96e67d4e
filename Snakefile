"""dlmpipe: one config.yaml -> a finished evaluation campaign (see docs/ARCHITECTURE.md).

    snakemake --cores all                          # the default campaign (config.yaml)
    snakemake --cores all --configfile my.yaml     # another campaign (replaces config.yaml)
    snakemake --report report.html                 # summary table and Pareto plots, one file
"""
import os
import sys

import immutables

from snakemake.utils import min_version

min_version("9.0")

# Parsing here and every job's `python -m dlmpipe` use the library of this checkout, also inside
# conda environments that do not install it.
DLMPIPE_SRC = workflow.basedir
sys.path.insert(0, DLMPIPE_SRC)
# Their `python` is the interpreter running Snakemake (its environment has dlmpipe's dependencies),
# also when that environment is not activated (`.venv/bin/snakemake`, `make test`, SLURM jobs);
# with --software-deployment-method conda, each rule's conda environment's.
PYTHON_BIN = "" if "conda" in str(workflow.deployment_settings.deployment_method).lower() else (
    os.path.dirname(sys.executable))
# Every job writes its output to its log (`> {log} 2>&1 || show_failure {log}`); where it fails,
# the log's last lines reach the console too (Snakemake's own error names only the command and
# the log file), and the job's exit status stands.
shell.prefix("set -euo pipefail; export PYTHONPATH={DLMPIPE_SRC:q}${{PYTHONPATH:+:$PYTHONPATH}}; "
             + ("export PATH={PYTHON_BIN:q}:$PATH; " if PYTHON_BIN else "")
             + 'show_failure() {{ status=$?; tail -n 20 "$1" >&2; exit $status; }}; ')

from dlmpipe.campaign import Campaign
from dlmpipe.campaign.files import read_campaign_file
from dlmpipe.preflight import slurm_preflight, snakemake_arguments

# SLURM pre-flight (dlmpipe/preflight.py): with the cluster profile and no SLURM commands on PATH,
# stop here, before any job, saying what is missing and how to run here instead (a dry run
# plans, with the same words as a warning).
SNAKEMAKE_ARGS = snakemake_arguments()  # None when Snakemake runs from its Python API
if (preflight := slurm_preflight(SNAKEMAKE_ARGS, sys.argv[1:])):
    level, message = preflight
    if level == "error":
        raise WorkflowError(message)
    logger.warning(message)

# A campaign given with --configfile replaces the default one instead of being merged into it
# (a merge would keep the default's methods and tasks). Its YAML syntax is checked before
# Snakemake reads it (profiles/default); the default's here (ConfigError naming line and column).
if not workflow.overwrite_configfiles:
    if os.path.isfile("config.yaml"):
        read_campaign_file("config.yaml")

    configfile: "config.yaml"


SCHEMA = "workflow/schemas/config.schema.yaml"
CONFIG_SOURCE = " + ".join(
    [*map(str, workflow.configfiles)]
    + (["--config"] if workflow.config_settings.overwrite_config else [])
)
# One validation pass before any job: the schema (its sampler/cache blocks from
# dlmpipe/registry.py) with Snakemake's default-filling validator, every error at once named by
# its dotted key (methods.archer.cache.K); then what a schema cannot say: checkpoint paths, task
# names, sweeps, pairings, the reference method. `config` is filled in place, its relative paths
# made absolute against the folder of the campaign file that gives them (dlmpipe/campaign/paths.py).
CAMPAIGN = Campaign(config, os.path.join(workflow.basedir, SCHEMA), source=CONFIG_SOURCE,
                    files=workflow.configfiles)

# The campaign's job-group sizes (`cluster.group_components`) as Snakemake's --group-components,
# which count on a cluster only; a count given to Snakemake itself (profile, command line) wins.
# The command line's settings are read after the Snakefile (they become the run's GroupSettings),
# so the merged counts go there, and to the workflow's current settings (Python API).
GROUP_COMPONENTS = {
    **{group: n for group, n in config["cluster"]["group_components"].items() if n is not None},
    **dict(getattr(SNAKEMAKE_ARGS, "group_components", None) or {}),
    **dict(getattr(workflow.group_settings, "group_components", None) or {})}
if SNAKEMAKE_ARGS is not None:
    SNAKEMAKE_ARGS.group_components = GROUP_COMPONENTS
if workflow.group_settings is not None:
    workflow.group_settings.group_components = immutables.Map(GROUP_COMPONENTS)


include: "workflow/rules/common.smk"
include: "workflow/rules/hub.smk"
include: "workflow/rules/backbones.smk"
include: "workflow/rules/svd.smk"
include: "workflow/rules/tasks.smk"
include: "workflow/rules/generate.smk"
include: "workflow/rules/score.smk"
include: "workflow/rules/timing.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/tables.smk"
include: "workflow/rules/analyses.smk"


report: "workflow/report/workflow.rst"


# Local jobs start without each importing torch: one job server per run forks them from a process
# that imported it once (dlmpipe/jobserver.py; docs/ARCHITECTURE.md, "Job start-up"). Not on a
# cluster, not with conda environments (another interpreter), not with DLMPIPE_JOB_SERVER=0.
JOB_SERVER = []


onstart:
    if PYTHON_BIN:
        from dlmpipe import jobserver

        JOB_SERVER.append(jobserver.start(workflow, DLMPIPE_SRC, [
            path for path in map(CAMPAIGN.checkpoint_path, CAMPAIGN.backbones) if path is not None]))


onsuccess:
    from dlmpipe import jobserver

    jobserver.stop(JOB_SERVER.pop() if JOB_SERVER else None)


onerror:
    from dlmpipe import jobserver

    jobserver.stop(JOB_SERVER.pop() if JOB_SERVER else None)


localrules:
    all,
    prepare_backbone,
    prepare_task,
    summarize,
    plot,
    plot_sweeps,


rule all:
    input:
        rules.summarize.output,
        rules.plot.output,
        rules.plot_sweeps.output,
        rules.tables.output if TABLES else [],
        analysis_outputs,  # the config's `analyses:` (docs/ANALYSES.md); none by default
    default_target: True
