# Report: the summary table and the Pareto plots, registered for `snakemake --report` (the paper
# tables and sweep figures: tables.smk; the landing page: workflow/report/workflow.rst).
# Snakemake's report turns a label after the first into a toggle when it has two values, each on
# half a (sub)category's results, and its page breaks (TypeError reading 'mime_type') where a
# row lacks one of the two: every (sub)category here has one label, or labels that never do that.


rule summarize:
    """One row per (backbone, task, method): quality with its uncertainty, cost, paired speedups
    with intervals (timing stage), Pareto flags."""
    input:
        scores=all_scores,
        timing=all_timing,  # paired, interleaved timing per (backbone, task): the speedups
    output:
        parquet=f"{R}/summary.parquet",
        # the report shows the HTML page (also on its landing page, workflow.rst); the CSV is
        # the same table as a download
        html=report(
            f"{R}/summary.html",
            caption="../report/summary.rst",
            category="Summary",
            labels={"table": "summary"},
        ),
        csv=report(
            f"{R}/summary.csv",
            caption="../report/summary.rst",
            category="Summary",
            labels={"table": "summary (CSV download)"},
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
        " --out-parquet {output.parquet} --out-csv {output.csv} --out-html {output.html}"
        " --out-isolation {output.isolation} > {log} 2>&1 || show_failure {log}"


rule plot:
    """Quality vs speedup per (backbone, task), the Pareto front drawn as a step line; and
    index.html, the summary with every plot, which the report opens on."""
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
            subcategory="{backbone}",
            labels={"task": "{task}"},
        ),
    log:
        f"{R}/logs/plot.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        # index.html beside the plots: the report's landing page (workflow/report/workflow.rst)
        "{{ python -m dlmpipe plot --summary {input} --out-dir {output} &&"
        " python -m dlmpipe headline --summary {input} --plots {output}"
        " --out {output}/index.html; }} > {log} 2>&1 || show_failure {log}"
