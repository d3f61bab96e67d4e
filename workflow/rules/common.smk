# Shared helpers of the rules: paths, wildcard constraints, and each job's params.
# Params carry only the builtin-typed config values a job uses, so that a config change reruns
# exactly the jobs it affects (Snakemake's params rerun trigger).
import hashlib
import json
import os
import re
from pathlib import Path

R = config["results_dir"].rstrip("/")
RESOURCES = config["resources"]
# A method's generations, without suffix (.parquet, .provenance.json). With `shards: N` > 1 each
# generate job writes shard {shard} of N under {method}.shards/ and merge_generations joins them.
SHARDS = config["shards"]
GENERATIONS = f"{R}/generations/{{backbone}}/{{task}}/{{method}}"
GENERATE_OUT = GENERATIONS if SHARDS == 1 else f"{GENERATIONS}.shards/{{shard}}-of-{SHARDS}"


# Job groups on a cluster (docs/CLUSTER.md, "Few submissions"): a cluster executor submits each
# group's connected components, `cluster.group_components` of them at a time, as one allocation;
# local runs ignore groups. Group decode: a method's generate job and its score job (not with
# shards: their merge runs on the login node between them); group timing: time_method.
# Only with a cluster executor (a local one runs jobs one by one anyway).
GROUPED = config["cluster"]["group_components"]
# a cluster executor runs this workflow, or plans it (a dry run's executor is "dryrun", the
# requested one is on the command line or in the profile)
ON_CLUSTER = not workflow.local_exec or getattr(SNAKEMAKE_ARGS, "executor", None) not in (
    None, "local", "dryrun", "touch")


def job_group(name):
    """The rule's Snakemake group on a cluster executor; None where the campaign leaves it
    ungrouped (null) and on a local executor (which would run the jobs one by one anyway), so
    local runs, dry runs included, show the jobs as before."""
    return None if GROUPED[name] is None or not ON_CLUSTER else name


def score_group_resources():
    """What a score job takes from its generate job when they share an allocation (group decode
    on a cluster): the partition of the jobs that run the model (profiles/slurm's
    DLMPIPE_SLURM_GPU_PARTITION), as one allocation has one partition. It asks for no GPU."""
    partition = os.environ.get("DLMPIPE_SLURM_GPU_PARTITION")
    if job_group("decode") and SHARDS == 1 and partition:
        return {"slurm_partition": partition}
    return {}


def _alternatives(names):
    return "|".join(re.escape(n) for n in names)


wildcard_constraints:
    backbone=_alternatives(CAMPAIGN.backbones),
    task=_alternatives(CAMPAIGN.tasks),
    method=_alternatives(CAMPAIGN.methods),
    shard=r"\d+",


def as_json(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def in_campaign_order(value):
    """JSON keeping the campaign's order of methods and sweep points (the order of a paper
    table's rows and of a sweep's categories), unlike as_json's sorted keys."""
    return json.dumps(value, separators=(",", ":"))


def checkpoint_dir(backbone):
    """Where a backbone's weights live: trained by the workflow (toy), shipped with dlmpipe
    (dlmpipe/shipped/<name>), a local directory or a Hub checkpoint's snapshot in the Hugging
    Face cache (its commit's, once fetch_backbone has fetched it)."""
    if CAMPAIGN.is_toy(backbone):
        return f"{R}/checkpoints/{backbone}"
    return str(CAMPAIGN.checkpoint_path(backbone))


def backbone_input(wildcards):
    """The trained toy directory, a Hub checkpoint's fetch record (its commit in the params:
    another commit fetches and reruns), or every file of a shipped or local checkpoint
    directory (so replacing weights or tokenizer re-checks it and reruns what decoded with it)."""
    if CAMPAIGN.is_toy(wildcards.backbone):
        return {"checkpoint": checkpoint_dir(wildcards.backbone)}
    if CAMPAIGN.is_hub(wildcards.backbone):
        return {"checkpoint": hub_record(wildcards.backbone)}
    files = Path(checkpoint_dir(wildcards.backbone)).iterdir()
    return {"checkpoint": sorted(str(f) for f in files if f.is_file() and not f.name.startswith("."))}


def hub_record(backbone):
    return f"{R}/backbones/{backbone}/hub.json"


def hub_flag(wildcards):
    """prepare-backbone's --hub: a Hub checkpoint's fetch record (its manifest records it)."""
    return f"--hub {hub_record(wildcards.backbone)}" if CAMPAIGN.is_hub(wildcards.backbone) else ""


def task_input(wildcards):
    """Local task files are inputs: editing one rebuilds the task (dataset ids are not). Besides
    `source`, a task may read `base_source` (ET's base benchmark, PubMedQA's questions) and
    `fewshot_source` (exemplars)."""
    options = config["tasks"][wildcards.task]
    files = [options.get(key) for key in ("source", "base_source", "fewshot_source")]
    # an lm-eval task's local data (benchmark lm_eval: dataset_kwargs.data_files, split -> file)
    data = (options.get("dataset_kwargs") or {}).get("data_files") or {}
    files += list(data.values()) if isinstance(data, dict) else [data]
    local = [f for f in files if isinstance(f, str) and f and Path(f).expanduser().exists()]
    # its dataset ids, fetched (rules/hub.smk)
    fetched = CAMPAIGN.hub_fetches("tasks", wildcards.task)
    return ([f"{R}/tasks/{wildcards.task}.hub.json"] if fetched else []) + local


def generate_params(wildcards):
    """Everything a generate job's result depends on, besides its input files. The method's
    parameters are this backbone's and task's: overrides applied, `auto` parameters chosen for
    the checkpoint (dlmpipe.campaign), so changing them reruns exactly these jobs."""
    return {
        "method": CAMPAIGN.method(wildcards.method, wildcards.task, wildcards.backbone),
        "seed": config["seed"],
        "device": config["device"],
        "compile": config["compile"],
    }


def config_hash(wildcards):
    return hashlib.sha256(as_json(generate_params(wildcards)).encode()).hexdigest()[:16]


def generate_batch_size(wildcards):
    """The generate job's batch size as a resource (0: auto, chosen by the job for its device).
    A resource, not a param: tokens do not depend on it (tests/test_batching.py), so changing
    it reruns nothing, like the other scheduling settings."""
    size = CAMPAIGN.batch_size(wildcards.method)
    return 0 if size == "auto" else int(size)


def generate_gpus(wildcards):
    """GPUs of a job that runs the model on this backbone: planned from its memory need
    (dlmpipe/gpus.py; resources.generate.gpu fixes it, max_gpus caps it), 0 on the CPU."""
    return CAMPAIGN.gpus(wildcards.backbone).gpus


def generate_threads(wildcards=None):
    """On the CPU a generate job takes every core: jobs run one at a time and their timings
    stay comparable. On a GPU one thread drives the device."""
    from dlmpipe.gpus import uses_gpus

    threads = RESOURCES["generate"]["threads"]
    if threads is not None:
        return threads
    return 1 if uses_gpus(config) else workflow.cores


def model_job_resources():
    """Resources of every job that runs the model (generate, time_methods, the analyses' probe
    jobs; profiles/slurm sends these rules to the GPU partition, and the executor turns `gpu`
    into sbatch's --gpus; the job places its layers across the GPUs it got)."""
    from dlmpipe.gpus import uses_gpus

    return dict(
        gpu=generate_gpus,
        mem_mb=RESOURCES["generate"]["mem_mb"],
        # a retry (--retries) resumes from the journal, with more time in case time ran out
        runtime=lambda w, attempt: RESOURCES["generate"]["runtime"] * attempt,
        **({"gpu_model": RESOURCES["generate"]["gpu_model"]}
           if RESOURCES["generate"]["gpu_model"] and uses_gpus(config) else {}),
    )


def score_threads(wildcards=None):
    """Programs a score job runs at once: all cores unless the campaign says."""
    return RESOURCES["score"]["threads"] or workflow.cores


def score_sandbox():
    """The isolation level of score jobs: config `sandbox`, else $DLMPIPE_SANDBOX, else bwrap.
    Resolved here and passed as a param, so a change reruns the score jobs; whether the level
    works is checked by each score job before it runs any program (never at parse time)."""
    from dlmpipe.scoring.levels import requested_level

    return requested_level(config["sandbox"])


def all_scores(wildcards=None):
    return [f"{R}/scores/{b}/{t}/{m}.parquet" for b, t, m in CAMPAIGN.decoding_jobs()]


def proxies_input(wildcards):
    """The backbone's proxies file for methods that read it (generate jobs of other methods get
    none, so adding SPA methods reruns nothing else)."""
    if CAMPAIGN.needs_proxies(wildcards.method, wildcards.backbone, wildcards.task):
        return [f"{R}/backbones/{wildcards.backbone}/proxies.safetensors"]
    return []


def timed_method(name, wildcards):
    """A method as its generate job decodes it on this backbone and task, with its batch size
    (the throughput pass's: changing a batch size re-times the method, not its tokens)."""
    return {**CAMPAIGN.method(name, wildcards.task, wildcards.backbone),
            "batch_size": CAMPAIGN.batch_size(name)}


def timing_params(wildcards):
    """Everything a timing job's result depends on: its method and the reference it is paired
    with (None for the reference's own job), each as its generate job decodes it, seed, device,
    compile, samples and repeats. Changing one method re-times that method; changing the
    reference (which method, or how it decodes) re-times every method: each is paired with it."""
    reference = config["reference_method"]
    return {
        "method": timed_method(wildcards.method, wildcards),
        # the reference is timed at batch 1 only here (its throughput pass is its own job's)
        "reference": None if wildcards.method == reference else CAMPAIGN.method(
            reference, wildcards.task, wildcards.backbone),
        "seed": config["seed"],
        "device": config["device"],
        "compile": config["compile"],
        **config["timing"],
    }


def all_timing(wildcards=None):
    """One timing file per (backbone, task, method) the campaign decodes."""
    return [f"{R}/timing/{b}/{t}/{m}.parquet" for b, t, m in CAMPAIGN.decoding_jobs()]


def timing_proxies_input(wildcards):
    """The backbone's proxies file when the method or the reference reads it on this task."""
    pair = {wildcards.method, config["reference_method"]}
    if any(CAMPAIGN.needs_proxies(m, wildcards.backbone, wildcards.task) for m in pair):
        return [f"{R}/backbones/{wildcards.backbone}/proxies.safetensors"]
    return []

# ---- analyses (analyses.smk; docs/ANALYSES.md) ------------------------------------------------
ANALYSES = f"{R}/analyses"
SHADOW = f"{ANALYSES}/shadow/{{backbone}}/{{task}}/{{method}}"
INTERVENTION = f"{ANALYSES}/intervention/{{backbone}}/{{task}}/{{method}}"
DRIFT = f"{ANALYSES}/drift/{{backbone}}/{{task}}/{{method}}"


def option(kind, key):
    """One option of analysis ``kind`` for a job's (backbone, task, method) (a params function:
    a changed option reruns exactly the jobs that read it)."""
    return lambda w: CAMPAIGN.analysis(kind, w.backbone, w.task, w.method)[key]


def option_flag(kind, key):
    """The option as a command-line flag ``--key value``; nothing when it is null."""
    def flag(w):
        value = CAMPAIGN.analysis(kind, w.backbone, w.task, w.method)[key]
        return "" if value is None else f"--{key} {value}"
    return flag


def analysis_label(w):
    return f"{w.backbone}/{w.task}/{w.method}"


def analysis_outputs(wildcards=None):
    """Every table and figure the campaign's analyses produce (rule all)."""
    files = {"shadow": ["bins.csv", "correlations.csv", "reproduction.csv", "tables.html",
                        "disagreement.png"],
             "intervention": ["branches.csv", "paired.csv", "tables.html", "intervention.png"],
             "drift": ["layers.csv", "tables.html", "similarity.png", "drift_share.png"]}
    return [f"{ANALYSES}/{kind}/{b}/{t}/{m}/{name}"
            for kind, names in files.items()
            for b, t, m in CAMPAIGN.analysis_targets(kind)
            for name in names]


def report_item(path, kind, caption, name):
    # a subcategory per target, one label (report.smk: Snakemake's toggles)
    return report(path, caption=f"../report/{caption}.rst", category="Mechanism analyses",
                  subcategory=f"{kind}: {{method}} on {{backbone}} / {{task}}",
                  labels={"output": name})
