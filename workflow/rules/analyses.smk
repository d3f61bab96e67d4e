# Mechanism analyses (docs/ANALYSES.md): for each (backbone, task, method) the config's
# `analyses:` section names, a job that runs the model with a probe or an intervention, then a
# local job that makes the tables and figures. Everything lives under analyses/{analysis}/ and
# no main generate or score job depends on it: adding an analysis reruns nothing else, and an
# analysis option reruns only the jobs that read it. The report shows each target's figures and
# tables.html, its CSV tables as one page (the report offers a CSV only as a download).

wildcard_constraints:
    branch="fresh|cached",


# ---- Archer: shadow-forward probes -------------------------------------------------------
rule shadow_probe:
    """The generate job's code path with the shadow probe on, over the first `limit` problems:
    its trajectory (checked against the main generations) and one row per probe."""
    input:
        manifest=f"{R}/backbones/{{backbone}}/manifest.json",
        task=f"{R}/tasks/{{task}}.parquet",
        proxies=proxies_input,  # the method's own artifacts, as for its generate job
    output:
        probes=f"{SHADOW}/probes.parquet",
        trajectory=f"{SHADOW}/trajectory.parquet",
        provenance=f"{SHADOW}/trajectory.provenance.json",
    params:
        method=lambda w: as_json(generate_params(w)["method"]),
        seed=config["seed"],
        device=config["device"],
        compile=config["compile"],  # the main generate job's: the same trajectory
        config_hash=config_hash,
        shadow=lambda w: as_json({k: option("shadow", k)(w) for k in ("rate", "steps", "seed")}),
        limit=option_flag("shadow", "limit"),
    threads: generate_threads
    resources:
        **model_job_resources(),
    log:
        f"{R}/logs/shadow_probe/{{backbone}}/{{task}}/{{method}}.log",
    conda:
        "../../envs/generate.yaml"
    shell:
        # the GPUs it got, for its layers' placement (dlmpipe/placement.py)
        "DLMPIPE_GPUS={resources.gpu} "
        "python -m dlmpipe generate --manifest {input.manifest} --task-file {input.task}"
        " --method {params.method:q} --seed {params.seed} --device {params.device}"
        " --compile {params.compile} --config-hash {params.config_hash} --out {output.trajectory}"
        " --provenance {output.provenance} --proxies={input.proxies:q} --no-warmup"
        " --shadow {params.shadow:q} --probes-out {output.probes} {params.limit}"
        " > {log} 2>&1 || show_failure {log}"


rule shadow_analysis:
    """Disagreement by anchor-distance bin, partial Spearman correlations, the reproduction
    check against the main generations, and the figure."""
    input:
        probes=rules.shadow_probe.output.probes,
        trajectory=rules.shadow_probe.output.trajectory,
        generations=f"{GENERATIONS}.parquet",
    output:
        bins=f"{SHADOW}/bins.csv",
        correlations=f"{SHADOW}/correlations.csv",
        reproduction=f"{SHADOW}/reproduction.csv",
        page=report_item(f"{SHADOW}/tables.html", "shadow", "shadow", "tables"),
        figure=report_item(f"{SHADOW}/disagreement.png", "shadow", "shadow", "figure"),
    params:
        bins=lambda w: as_json(option("shadow", "bins")(w)),
        label=analysis_label,
    localrule: True
    log:
        f"{R}/logs/shadow_analysis/{{backbone}}/{{task}}/{{method}}.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        "{{ python -m dlmpipe shadow-analysis --probes {input.probes} --trajectory {input.trajectory}"
        " --generations {input.generations} --bins {params.bins:q} --label {params.label:q}"
        " --out-bins {output.bins} --out-correlations {output.correlations}"
        " --out-reproduction {output.reproduction} --out-figure {output.figure} &&"
        " python -m dlmpipe csv-page --title {params.label:q} --csv {output.bins}"
        " {output.correlations} {output.reproduction} --out {output.page}; }}"
        " > {log} 2>&1 || show_failure {log}"


# ---- Archer: matched-state feedback intervention --------------------------------------------
rule intervention:
    """Fresh and Cached branches from the first confident acceptance of each problem."""
    input:
        manifest=f"{R}/backbones/{{backbone}}/manifest.json",
        task=f"{R}/tasks/{{task}}.parquet",
        proxies=proxies_input,  # the method's own artifacts, as for its generate job
    output:
        pairs=f"{INTERVENTION}/pairs.parquet",
        fresh=f"{INTERVENTION}/fresh.parquet",
        cached=f"{INTERVENTION}/cached.parquet",
    params:
        method=lambda w: as_json(generate_params(w)["method"]),
        seed=config["seed"],
        device=config["device"],
        compile=config["compile"],
        threshold=option("intervention", "threshold"),
        follow=option("intervention", "follow"),
        limit=option_flag("intervention", "limit"),
    threads: generate_threads
    resources:
        **model_job_resources(),
    log:
        f"{R}/logs/intervention/{{backbone}}/{{task}}/{{method}}.log",
    conda:
        "../../envs/generate.yaml"
    shell:
        # the GPUs it got, for its layers' placement (dlmpipe/placement.py)
        "DLMPIPE_GPUS={resources.gpu} "
        "python -m dlmpipe intervene --manifest {input.manifest} --task-file {input.task}"
        " --method {params.method:q} --seed {params.seed} --device {params.device}"
        " --compile {params.compile} --proxies={input.proxies:q}"
        " --threshold {params.threshold} --follow {params.follow}"
        " {params.limit} --out-pairs {output.pairs} --out-fresh {output.fresh}"
        " --out-cached {output.cached} > {log} 2>&1 || show_failure {log}"


rule score_branch:
    """Score one branch's completions exactly like generations (the score stage, sandboxed)."""
    input:
        generations=f"{INTERVENTION}/{{branch}}.parquet",
        task=f"{R}/tasks/{{task}}.parquet",
    output:
        f"{INTERVENTION}/{{branch}}.scores.parquet",
    params:
        sandbox=score_sandbox(),
    threads: score_threads
    resources:
        mem_mb=RESOURCES["score"]["mem_mb"],
        runtime=RESOURCES["score"]["runtime"],
    log:
        f"{R}/logs/score_branch/{{backbone}}/{{task}}/{{method}}.{{branch}}.log",
    conda:
        "../../envs/score.yaml"
    shell:
        "python -m dlmpipe score --generations {input.generations} --task-file {input.task}"
        " --out {output} --workers {threads} --sandbox {params.sandbox}"
        " > {log} 2>&1 || show_failure {log}"


rule intervention_analysis:
    """Pass@1 and Rev.@5 per branch, branch-only passes, paired counts, figure."""
    input:
        pairs=rules.intervention.output.pairs,
        fresh=f"{INTERVENTION}/fresh.scores.parquet",
        cached=f"{INTERVENTION}/cached.scores.parquet",
    output:
        branches=f"{INTERVENTION}/branches.csv",
        paired=f"{INTERVENTION}/paired.csv",
        page=report_item(f"{INTERVENTION}/tables.html", "intervention", "intervention", "tables"),
        figure=report_item(f"{INTERVENTION}/intervention.png", "intervention", "intervention",
                           "figure"),
    params:
        follow=option("intervention", "follow"),
        label=analysis_label,
    localrule: True
    log:
        f"{R}/logs/intervention_analysis/{{backbone}}/{{task}}/{{method}}.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        "{{ python -m dlmpipe intervention-analysis --pairs {input.pairs} --fresh-scores {input.fresh}"
        " --cached-scores {input.cached} --follow {params.follow} --label {params.label:q}"
        " --out-table {output.branches} --out-paired {output.paired}"
        " --out-figure {output.figure} && python -m dlmpipe csv-page --title {params.label:q}"
        " --csv {output.branches} {output.paired} --out {output.page}; }}"
        " > {log} 2>&1 || show_failure {log}"


# ---- SPA-Cache: per-layer drift profile ----------------------------------------------------
rule drift_profile:
    """Per layer and update, step-to-step similarities along the method's trajectory."""
    input:
        manifest=f"{R}/backbones/{{backbone}}/manifest.json",
        task=f"{R}/tasks/{{task}}.parquet",
        proxies=f"{R}/backbones/{{backbone}}/proxies.safetensors",  # the singular proxy series
    output:
        f"{DRIFT}/records.parquet",
    params:
        method=lambda w: as_json(generate_params(w)["method"]),
        seed=config["seed"],
        device=config["device"],
        compile=config["compile"],
        rank=option_flag("drift", "rank"),
        tau=option("drift", "tau"),
        limit=option_flag("drift", "limit"),
    threads: generate_threads
    resources:
        **model_job_resources(),
    log:
        f"{R}/logs/drift_profile/{{backbone}}/{{task}}/{{method}}.log",
    conda:
        "../../envs/generate.yaml"
    shell:
        # the GPUs it got, for its layers' placement (dlmpipe/placement.py)
        "DLMPIPE_GPUS={resources.gpu} "
        "python -m dlmpipe drift-profile --manifest {input.manifest} --task-file {input.task}"
        " --method {params.method:q} --seed {params.seed} --device {params.device}"
        " --compile {params.compile} --proxies {input.proxies} {params.rank}"
        " --tau {params.tau} {params.limit}"
        " --out {output} > {log} 2>&1 || show_failure {log}"


rule drift_analysis:
    """The per-layer table, the similarity figure (Figure 1) and the drift-share figure (Figure 2)."""
    input:
        rules.drift_profile.output,
    output:
        layers=f"{DRIFT}/layers.csv",
        page=report_item(f"{DRIFT}/tables.html", "drift", "drift", "tables"),
        similarity=report_item(f"{DRIFT}/similarity.png", "drift", "drift", "similarity figure"),
        share=report_item(f"{DRIFT}/drift_share.png", "drift", "drift", "drift-share figure"),
    params:
        tau=option("drift", "tau"),
        profile=lambda w: option("drift", "profile")(w) or "",
        label=analysis_label,
    localrule: True
    log:
        f"{R}/logs/drift_analysis/{{backbone}}/{{task}}/{{method}}.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        "{{ python -m dlmpipe drift-analysis --records {input} --tau {params.tau}"
        " --profile {params.profile:q} --label {params.label:q} --out-table {output.layers}"
        " --out-similarity {output.similarity} --out-share {output.share} &&"
        " python -m dlmpipe csv-page --title {params.label:q} --csv {output.layers}"
        " --out {output.page}; }} > {log} 2>&1 || show_failure {log}"
