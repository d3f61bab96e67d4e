# Tasks: load a benchmark (registry name + loader options) into tasks/{task}.parquet. The task's
# name is its `benchmark:` (an alias: one benchmark under several names and options) or itself.


rule prepare_task:
    """One row per problem: prompt, kind, answer, hidden tests (file contract in ARCHITECTURE.md)."""
    input:
        task_input,
    output:
        f"{R}/tasks/{{task}}.parquet",
    params:
        benchmark=lambda w: CAMPAIGN.benchmark(w.task),
        options=lambda w: as_json(CAMPAIGN.task_options(w.task)),
    log:
        f"{R}/logs/prepare_task/{{task}}.log",
    conda:
        "../../envs/score.yaml"
    shell:
        "python -m dlmpipe prepare-task --name {params.benchmark:q} --options {params.options:q}"
        " --out {output} > {log} 2>&1 || show_failure {log}"
