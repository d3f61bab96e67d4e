# Report: the summary table and the Pareto plots, registered for `snakemake --report` (the paper
# tables and sweep figures: tables.smk).


rule summarize:
    """One row per (backbone, task, method): quality with its uncertainty, cost, paired speedups
    with intervals (timing stage), Pareto flags."""
    input:
        scores=all_scores,
        timing=all_timing,  # paired, interleaved timing per (backbone, task): the speedups
    output:
        parquet=f"{R}/summary.parquet",
        csv=report(
            f"{R}/summary.csv",
            caption="../report/summary.rst",
            category="Summary",
            labels={"table": "summary"},
        ),
        isolation=report(
            f"{R}/isolation.html",
            caption="../report/isolation.rst",
            category="Summary",
            labels={"table": "sandbox isolation"},
        ),
    params:
        reference=config["reference_method"],
        also_against=" ".join(config["also_speedup_against"]),
        seed=config["seed"],  # of the bootstrap intervals
    log:
        f"{R}/logs/summarize.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        "python -m dlmpipe summarize --scores {input.scores} --timing {input.timing}"
        " --reference {params.reference} --also-against {params.also_against} --seed {params.seed}"
        " --out-parquet {output.parquet} --out-csv {output.csv}"
        " --out-isolation {output.isolation} > {log} 2>&1"


rule plot:
    """Quality vs speedup per (backbone, task), the Pareto front drawn as a step line."""
    input:
        rules.summarize.output.parquet,
    output:
        report(
            directory(f"{R}/plots"),
            patterns=[
                "pareto_{backbone,%s}_{task,%s}.png"
                % (_alternatives(CAMPAIGN.backbones), _alternatives(CAMPAIGN.tasks))
            ],
            caption="../report/pareto.rst",
            category="Pareto fronts",
            labels={"backbone": "{backbone}", "task": "{task}", "figure": "Pareto front"},
        ),
    log:
        f"{R}/logs/plot.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        "python -m dlmpipe plot --summary {input} --out-dir {output} > {log} 2>&1"
