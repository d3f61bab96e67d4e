# Score: execute generated code in the sandbox (or match answers); one job per generations file.


rule score:
    """Add passed/score/status/detail/isolation to every generations row."""
    input:
        generations=f"{GENERATIONS}.parquet",  # generate's, or merge_generations' with shards
        task=rules.generate.input.task,
    output:
        f"{R}/scores/{{backbone}}/{{task}}/{{method}}.parquet",
    params:
        sandbox=score_sandbox(),
    # in its generate job's allocation on a cluster (seconds of work: no submission of its own)
    group: job_group("decode") if SHARDS == 1 else None
    threads: score_threads
    resources:
        mem_mb=RESOURCES["score"]["mem_mb"],
        runtime=RESOURCES["score"]["runtime"],
        **score_group_resources(),  # its generate job's partition when they share an allocation
    log:
        f"{R}/logs/score/{{backbone}}/{{task}}/{{method}}.log",
    conda:
        "../../envs/score.yaml"
    shell:
        "python -m dlmpipe score --generations {input.generations} --task-file {input.task}"
        # a failure's reason (e.g. no usable sandbox: nothing ran) in Snakemake's own output too
        " --out {output} --workers {threads} --sandbox {params.sandbox}"
        " > {log} 2>&1 || show_failure {log}"
