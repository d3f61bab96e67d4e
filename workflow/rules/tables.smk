# Paper tables and sweep figures: local jobs from the summary, registered for `snakemake --report`.
TABLES = config["tables"]
SWEEPS = CAMPAIGN.sweeps()


if TABLES:

    rule tables:
        """The campaign's paper-style tables (Archer, SPA-Cache) as CSV, Markdown and HTML."""
        input:
            rules.summarize.output.parquet,
        output:
            csv=[f"{R}/tables/{name}.csv" for name in TABLES],
            md=[f"{R}/tables/{name}.md" for name in TABLES],
            html=[
                report(
                    f"{R}/tables/{name}.html",
                    caption="../report/tables.rst",
                    category="Paper tables",
                    labels={"table": name},  # one label: see report.smk
                )
                for name in TABLES
            ],
        params:
            out_dir=lambda w, output: os.path.dirname(output.csv[0]),
            tables=as_json(TABLES),
            # which base method each row comes from; the table's default axes; where the
            # methods with backbones:/tasks: run
            campaign=in_campaign_order(
                {"origin": CAMPAIGN.origin, "backbones": CAMPAIGN.backbones, "tasks": CAMPAIGN.tasks,
                 **({"scope": CAMPAIGN.scopes()} if CAMPAIGN.scopes() else {})}
            ),
        localrule: True
        log:
            f"{R}/logs/tables.log",
        conda:
            "../../envs/analysis.yaml"
        shell:
            "python -m dlmpipe tables --summary {input} --tables {params.tables:q}"
            " --campaign {params.campaign:q} --out-dir {params.out_dir}"
            " > {log} 2>&1 || show_failure {log}"


rule plot_sweeps:
    """Quality, speedup and TPS against the swept value of every swept base method."""
    input:
        rules.summarize.output.parquet,
    output:
        report(
            directory(f"{R}/sweeps"),
            patterns=[
                "sweep_{backbone,%s}_{task,%s}_{base,%s}.png"
                % (
                    _alternatives(CAMPAIGN.backbones),
                    _alternatives(CAMPAIGN.tasks),
                    _alternatives(SWEEPS) or "(?!)",
                )
            ],
            caption="../report/sweeps.rst",
            category="Sweeps",
            subcategory="{backbone}",
            labels={"sweep": "{base} on {task}"},  # one label: see report.smk
        ),
    params:
        sweeps=in_campaign_order(SWEEPS),
    log:
        f"{R}/logs/plot_sweeps.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        "python -m dlmpipe plot-sweeps --summary {input} --sweeps {params.sweeps:q}"
        " --out-dir {output} > {log} 2>&1 || show_failure {log}"
