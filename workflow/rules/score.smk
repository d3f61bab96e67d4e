# Score: execute generated code in the sandbox (or match answers); one job per generations file.


rule score:
    """Add passed/score/status/detail/isolation to every generations row."""
    input:
        generations=f"{GENERATIONS}.parquet",  # generate's, or merge_generations' with shards
        task=rules.generate.input.task,
    output:
        f"{R}/scores/{{backbone}}/{{task}}/{{method}}.parquet",
    threads: score_threads
    resources:
        mem_mb=RESOURCES["score"]["mem_mb"],
        runtime=RESOURCES["score"]["runtime"],
    log:
        f"{R}/logs/score/{{backbone}}/{{task}}/{{method}}.log",
    conda:
        "../../envs/score.yaml"
    shell:
        "python -m dlmpipe score --generations {input.generations} --task-file {input.task}"
        " --out {output} --workers {threads} > {log} 2>&1"
