# Timing: one job per (backbone, task) times every method on the same samples, interleaved and
# repeated, in one process; the summary's speedups are paired ratios from it (analysis/speedup.py).


rule time_methods:
    """Load the model once, warm every method up, then decode the same samples with every method
    in a rotated order, `timing.repeats` times; writes every synchronized time."""
    input:
        manifest=f"{R}/backbones/{{backbone}}/manifest.json",
        task=f"{R}/tasks/{{task}}.parquet",
        proxies=timing_proxies_input,  # when an SPA-Cache method reads the backbone's proxies
    output:
        f"{R}/timing/{{backbone}}/{{task}}.parquet",
    params:
        methods=lambda w: as_json(timing_params(w)["methods"]),
        seed=config["seed"],
        device=config["device"],
        compile=config["compile"],
        samples=config["timing"]["samples"],
        repeats=config["timing"]["repeats"],
    # the generate jobs' device and threads: the times are of the decoding they measure
    threads: generate_threads
    resources:
        **model_job_resources(),
    log:
        f"{R}/logs/time_methods/{{backbone}}/{{task}}.log",
    conda:
        "../../envs/generate.yaml"
    shell:
        "python -m dlmpipe time-methods --manifest {input.manifest} --task-file {input.task}"
        " --methods {params.methods:q} --seed {params.seed} --device {params.device}"
        " --compile {params.compile}"
        " --samples {params.samples} --repeats {params.repeats} --proxies={input.proxies:q}"
        " --out {output} > {log} 2>&1"
