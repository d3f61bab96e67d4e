# Timing: one job per (backbone, task, method) times the method against the campaign's reference
# method on the same samples, alternating and repeated, in one process; the reference's own job
# times it alone and is the clock every run of the (backbone, task) is expressed on. The
# summary's speedups, latencies, TPS and TTFT all come from these files (analysis/speedup.py).


rule time_method:
    """Load the model once, warm the method and the reference up, then decode the same samples
    with both in alternating order, `timing.repeats` times, and the method once more at its batch
    size (throughput); writes every synchronized time, logging each repeat as it ends."""
    input:
        manifest=f"{R}/backbones/{{backbone}}/manifest.json",
        task=f"{R}/tasks/{{task}}.parquet",
        proxies=timing_proxies_input,  # when the method or the reference reads the proxies
    output:
        f"{R}/timing/{{backbone}}/{{task}}/{{method}}.parquet",
    params:
        method=lambda w: as_json(timing_params(w)["method"]),
        reference=lambda w: as_json(timing_params(w)["reference"]) if timing_params(w)["reference"] else "",
        seed=config["seed"],
        device=config["device"],
        compile=config["compile"],
        samples=config["timing"]["samples"],
        repeats=config["timing"]["repeats"],
    # the generate jobs' device and threads: the times are of the decoding they measure
    group: job_group("timing")  # cluster.group_components.timing per allocation on a cluster
    threads: generate_threads
    resources:
        **model_job_resources(),
    log:
        f"{R}/logs/time_method/{{backbone}}/{{task}}/{{method}}.log",
    conda:
        "../../envs/generate.yaml"
    shell:
        # the GPUs it got, for its layers' placement (dlmpipe/placement.py)
        "DLMPIPE_GPUS={resources.gpu} "
        "python -m dlmpipe time-method --manifest {input.manifest} --task-file {input.task}"
        " --method {params.method:q} --reference={params.reference:q} --seed {params.seed}"
        " --device {params.device} --compile {params.compile}"
        " --samples {params.samples} --repeats {params.repeats} --proxies={input.proxies:q}"
        " --out {output} > {log} 2>&1 || show_failure {log}"
