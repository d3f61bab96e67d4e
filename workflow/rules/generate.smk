# Generate: one job per (backbone, task, method) decodes every sample with the model loaded once.


rule generate:
    """Decode a task with one method; resumable (finished samples are journaled)."""
    input:
        manifest=f"{R}/backbones/{{backbone}}/manifest.json",
        task=f"{R}/tasks/{{task}}.parquet",
        proxies=proxies_input,  # SPA-Cache's singular proxies (svd.smk); empty for other methods
    output:
        generations=f"{R}/generations/{{backbone}}/{{task}}/{{method}}.parquet",
        provenance=f"{R}/generations/{{backbone}}/{{task}}/{{method}}.provenance.json",
    params:
        method=lambda w: as_json(generate_params(w)["method"]),
        seed=config["seed"],
        device=config["device"],
        config_hash=config_hash,
    threads: generate_threads
    resources:
        gpu=generate_gpus(),
        mem_mb=RESOURCES["generate"]["mem_mb"],
        runtime=RESOURCES["generate"]["runtime"],
        **({"gpu_model": RESOURCES["generate"]["gpu_model"]} if RESOURCES["generate"]["gpu_model"] else {}),
    log:
        f"{R}/logs/generate/{{backbone}}/{{task}}/{{method}}.log",
    conda:
        "../../envs/generate.yaml"
    shell:
        "python -m dlmpipe generate --manifest {input.manifest} --task-file {input.task}"
        " --method {params.method:q} --seed {params.seed} --device {params.device}"
        " --config-hash {params.config_hash} --out {output.generations}"
        " --provenance {output.provenance} --proxies={input.proxies:q} > {log} 2>&1"
