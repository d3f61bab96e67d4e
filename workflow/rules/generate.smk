# Generate: one job per (backbone, task, method) decodes every sample with the model loaded once;
# with `shards: N` > 1, N jobs decode disjoint sample ranges and merge_generations joins them.


rule generate:
    """Decode a task with one method; resumable (finished samples are journaled)."""
    input:
        manifest=f"{R}/backbones/{{backbone}}/manifest.json",
        task=f"{R}/tasks/{{task}}.parquet",
        proxies=proxies_input,  # SPA-Cache's singular proxies (svd.smk); empty for other methods
    output:
        generations=f"{GENERATE_OUT}.parquet",
        provenance=f"{GENERATE_OUT}.provenance.json",
    params:
        method=lambda w: as_json(generate_params(w)["method"]),
        seed=config["seed"],
        device=config["device"],
        compile=config["compile"],
        config_hash=config_hash,
    group: job_group("decode")  # with its score job: one allocation on a cluster
    threads: generate_threads
    resources:
        **model_job_resources(),
        batch_size=generate_batch_size,
    log:
        f"{R}/logs/generate/{{backbone}}/{{task}}/{{method}}"
        + ("" if SHARDS == 1 else f".shard{{shard}}-of-{SHARDS}") + ".log",
    conda:
        "../../envs/generate.yaml"
    shell:
        # the GPUs it got, for its layers' placement (dlmpipe/placement.py)
        "DLMPIPE_GPUS={resources.gpu} "
        "python -m dlmpipe generate --manifest {input.manifest} --task-file {input.task}"
        " --method {params.method:q} --seed {params.seed} --device {params.device}"
        " --compile {params.compile} --batch-size {resources.batch_size}"
        " --config-hash {params.config_hash} --out {output.generations}"
        " --provenance {output.provenance} --proxies={input.proxies:q}"
        + ("" if SHARDS == 1 else f" --shard {{wildcards.shard}}/{SHARDS}")
        + " > {log} 2>&1 || show_failure {log}"


if SHARDS > 1:

    rule merge_generations:
        """Join a method's shards: every sample of the task exactly once, in sample order, in the
        shard that owns it; provenance merged; written atomically. Cheap: runs where Snakemake runs."""
        input:
            shards=expand(f"{GENERATE_OUT}.parquet", shard=range(SHARDS), allow_missing=True),
            provenance=expand(f"{GENERATE_OUT}.provenance.json", shard=range(SHARDS), allow_missing=True),
            task=f"{R}/tasks/{{task}}.parquet",
        output:
            generations=f"{GENERATIONS}.parquet",
            provenance=f"{GENERATIONS}.provenance.json",
        localrule: True
        log:
            f"{R}/logs/merge_generations/{{backbone}}/{{task}}/{{method}}.log",
        conda:
            "../../envs/generate.yaml"
        shell:
            "python -m dlmpipe merge-generations --shards {input.shards}"
            " --shard-provenance {input.provenance} --task-file {input.task}"
            " --out {output.generations} --provenance {output.provenance}"
            " > {log} 2>&1 || show_failure {log}"
