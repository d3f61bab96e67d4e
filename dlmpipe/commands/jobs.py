"""The job commands: what the workflow's rules run (``python -m dlmpipe <job> ...``), and the
tools beside them (``TOOLS``: retraining the shipped toy, PC-Sampler's reference corpus, scoring
external samples, the sandbox check ``make campaign`` runs first).

Each command is a thin argument parser around one library function; the logic lives in the
library where it is unit-tested. Imports are lazy so ``--help`` and cheap commands stay fast.
The rules' command lines (workflow/rules/*.smk) call these exactly as written.
"""
from __future__ import annotations

import argparse
import json

#: commands no rule runs (``python -m dlmpipe --help`` lists them apart from the jobs)
TOOLS = ("ship-toy", "reference-corpus", "score-samples", "check-sandbox")


def _train_toy(a: argparse.Namespace) -> None:
    from ..backbones.toy import train_toy

    train_toy(a.out, **json.loads(a.options))


def _prepare_backbone(a: argparse.Namespace) -> None:
    from ..backbones.manifest import write_manifest

    write_manifest(a.path, a.out, name=a.name, dtype=a.dtype, chat=a.chat,
                   sha256=json.loads(a.sha256))


def _ship_toy(a: argparse.Namespace) -> None:
    from ..backbones.shipped import ship_toy

    ship_toy(a.name, json.loads(a.options) if a.options else None, a.out)


def _prepare_task(a: argparse.Namespace) -> None:
    from ..tasks import load_task, write_task_table

    write_task_table(load_task(a.name, **json.loads(a.options)), a.out)


def _generate(a: argparse.Namespace) -> None:
    from ..generate import run_generation_job

    run_generation_job(manifest=a.manifest, task_file=a.task_file, method=json.loads(a.method),
                       out=a.out, provenance=a.provenance, seed=a.seed, device=a.device,
                       compile=a.compile, config_hash=a.config_hash, shard=a.shard,
                       warmup=not a.no_warmup, proxies=a.proxies or None, limit=a.limit,
                       shadow=json.loads(a.shadow) if a.shadow else None,
                       probes_out=a.probes_out or None,
                       batch_size="auto" if a.batch_size in ("auto", "0") else int(a.batch_size))


def _reference_corpus(a: argparse.Namespace) -> None:
    from pathlib import Path

    from ..backbones.tokenizer import load_tokenizer
    from ..io import atomic_write_text
    from ..samplers.pc_sampler import count_jsonl

    tok = load_tokenizer(Path(a.checkpoint))
    keys = [k.strip() for k in a.keys.split(",") if k.strip()]
    corpus = count_jsonl(a.input, keys, lambda text: tok.encode(text, add_special_tokens=False))
    corpus["metadata"] = {"tokenizer": str(a.checkpoint), "keys": keys,
                          "files": [str(f) for f in a.input]}
    atomic_write_text(Path(a.out), json.dumps(corpus))


def _intervene(a: argparse.Namespace) -> None:
    from ..probes.jobs import run_intervention_job

    run_intervention_job(manifest=a.manifest, task_file=a.task_file, method=json.loads(a.method),
                         out_pairs=a.out_pairs, out_fresh=a.out_fresh, out_cached=a.out_cached,
                         seed=a.seed, device=a.device, limit=a.limit, threshold=a.threshold,
                         follow=a.follow, proxies=a.proxies or None, compile=a.compile)


def _drift_profile(a: argparse.Namespace) -> None:
    from ..probes.jobs import run_drift_job

    run_drift_job(manifest=a.manifest, task_file=a.task_file, method=json.loads(a.method),
                  out=a.out, proxies=a.proxies or None, rank=a.rank, tau=a.tau, seed=a.seed,
                  device=a.device, limit=a.limit, compile=a.compile)


def _shadow_analysis(a: argparse.Namespace) -> None:
    from ..analysis.shadow import shadow_analysis

    print(shadow_analysis(a.probes, a.trajectory, a.generations, a.out_bins, a.out_correlations,
                          a.out_reproduction, a.out_figure, edges=json.loads(a.bins), label=a.label))


def _intervention_analysis(a: argparse.Namespace) -> None:
    from ..analysis.intervention import intervention_analysis

    print(intervention_analysis(a.pairs, a.fresh_scores, a.cached_scores, a.out_table,
                                a.out_paired, a.out_figure, label=a.label, follow=a.follow))


def _drift_analysis(a: argparse.Namespace) -> None:
    from ..analysis.drift import drift_analysis

    print(drift_analysis(a.records, a.out_table, a.out_similarity, a.out_share, tau=a.tau,
                         label=a.label, profile=a.profile or None).to_string(index=False))


def _time_method(a: argparse.Namespace) -> None:
    from ..timing import run_timing_job

    run_timing_job(manifest=a.manifest, task_file=a.task_file, method=json.loads(a.method),
                   reference=json.loads(a.reference) if a.reference else None,
                   out=a.out, seed=a.seed, device=a.device, compile=a.compile,
                   samples=a.samples, repeats=a.repeats, proxies=a.proxies or None)


def _svd(a: argparse.Namespace) -> None:
    from ..engine.proxies import write_checkpoint_proxies, write_proxies

    if a.manifest:
        write_proxies(a.manifest, a.out)
    else:
        write_checkpoint_proxies(a.path, a.out, name=a.name,
                                 sha256=json.loads(a.sha256) if a.sha256 else None)


def _merge_generations(a: argparse.Namespace) -> None:
    from ..shards import merge_shards

    merge_shards(a.shards, a.task_file, a.out, a.provenance, shard_provenance=a.shard_provenance)


def _score(a: argparse.Namespace) -> None:
    from ..scoring.score import score_generations

    score_generations(a.generations, a.task_file, a.out, workers=a.workers, sandbox=a.sandbox)


def _score_samples(a: argparse.Namespace) -> None:
    from ..scoring.samples import score_samples

    score_samples(task=a.task, samples=a.samples, out=a.out, workers=a.workers,
                  options=json.loads(a.options), sandbox=a.sandbox)


def _check_sandbox(a: argparse.Namespace) -> None:
    """The campaign's sandbox level, resolved as Snakemake and the score rule resolve it:
    ``--config sandbox=...``, else the last ``--configfile`` (default config.yaml) that sets
    it, else $DLMPIPE_SANDBOX, else bwrap; then checked here (SandboxUnavailable: exit 2)."""
    import yaml

    from ..scoring.levels import isolation, level_caveats, weaker_than_bwrap

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--configfile", "--configfiles", nargs="+", action="extend", default=[])
    p.add_argument("--config", "-C", nargs="+", action="extend", default=[])
    known, _ = p.parse_known_args([x for x in a.snakemake_args if x != "--"])
    level = None
    for path in known.configfile or ["config.yaml"]:
        with open(path, encoding="utf-8") as f:
            level = (yaml.safe_load(f) or {}).get("sandbox", level)
    for item in known.config:
        key, _, value = item.partition("=")
        if key == "sandbox":
            level = yaml.safe_load(value)
    iso = isolation(level)
    print(f"dlmpipe check-sandbox: scoring will use {iso.level} ({iso.variant}, {iso.python})")
    if weaker_than_bwrap(iso.level):
        print(f"WARNING: {iso.level} is weaker than bubblewrap: {level_caveats(iso.level)} "
              "(docs/SCORING.md)")


def _summarize(a: argparse.Namespace) -> None:
    from ..analysis.summary import summarize

    table = summarize(a.scores, reference=a.reference, out_parquet=a.out_parquet,
                      out_csv=a.out_csv, also_against=a.also_against, timing=a.timing,
                      seed=a.seed)
    if a.out_isolation:
        from ..analysis.isolation import write_isolation_note

        write_isolation_note(table, a.out_isolation)
    if a.out_html:
        from ..analysis.report_html import write_summary_html

        write_summary_html(table, a.out_html)


def _plot(a: argparse.Namespace) -> None:
    from ..analysis.plots import plot_pareto

    plot_pareto(a.summary, a.out_dir)


def _headline(a: argparse.Namespace) -> None:
    from ..analysis.report_html import write_headline_html

    write_headline_html(a.summary, a.plots, a.out)


def _csv_page(a: argparse.Namespace) -> None:
    from ..analysis.report_html import write_csv_page

    write_csv_page(a.title, a.csv, a.out)


def _tables(a: argparse.Namespace) -> None:
    from ..analysis.tables import write_tables

    campaign = json.loads(a.campaign)
    write_tables(a.summary, json.loads(a.tables), campaign["origin"], campaign["backbones"],
                 campaign["tasks"], a.out_dir, scope=campaign.get("scope"))


def _plot_sweeps(a: argparse.Namespace) -> None:
    from ..analysis.sweeps import plot_sweeps

    plot_sweeps(a.summary, json.loads(a.sweeps), a.out_dir)


def _sandbox_option(s: argparse.ArgumentParser) -> None:
    from ..scoring.levels import LEVELS

    s.add_argument("--sandbox", choices=LEVELS, default=None,
                   help="isolation of untrusted code (default: $DLMPIPE_SANDBOX, else bwrap, which "
                   "must work); 'process' opts in to the weaker level where bubblewrap is "
                   "unavailable, 'auto' to bwrap where it works and process elsewhere "
                   "(docs/SCORING.md)")


def register(sub) -> None:
    """Add every job command and tool to ``sub`` (the parser's subcommands)."""
    s = sub.add_parser("train-toy", help="train the toy backbone and save it in LLaDA's format")
    s.add_argument("--out", required=True)
    s.add_argument("--options", default="{}", help="JSON keyword arguments of train_toy")
    s.set_defaults(func=_train_toy)

    s = sub.add_parser("prepare-backbone", help="check a checkpoint directory, write its manifest")
    s.add_argument("--path", required=True)
    s.add_argument("--name", required=True)
    s.add_argument("--dtype", default="float32")
    s.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    s.add_argument("--sha256", default="null", help="JSON {safetensors file: sha256} the weights "
                   "must have (null: unpinned)")
    s.add_argument("--out", required=True)
    s.set_defaults(func=_prepare_backbone)

    s = sub.add_parser("ship-toy", help="retrain a shipped toy checkpoint (dlmpipe/shipped/<name>) "
                       "from its recorded options, or from new ones; prints the sha256 to pin")
    s.add_argument("--name", default="toy")
    s.add_argument("--options", default="", help="JSON keyword arguments of train_toy (default: "
                   "the ones recorded in the shipped training.json)")
    s.add_argument("--out", default=None, help="where to write it (default: the shipped "
                   "directory itself, replacing it)")
    s.set_defaults(func=_ship_toy)

    s = sub.add_parser("prepare-task", help="load a benchmark into tasks/{t}.parquet")
    s.add_argument("--name", required=True, help="the registered benchmark (a task's `benchmark:`, "
                   "else its name)")
    s.add_argument("--options", default="{}", help="JSON loader options (n, seed, source, limit, "
                   "ids, ...), passed to the loader unchanged")
    s.add_argument("--out", required=True)
    s.set_defaults(func=_prepare_task)

    s = sub.add_parser("generate", help="decode every sample of a task with one method")
    s.add_argument("--manifest", required=True)
    s.add_argument("--task-file", required=True)
    s.add_argument("--method", required=True, help="JSON: name, sampler{...}, cache{...}, gen_length")
    s.add_argument("--out", required=True)
    s.add_argument("--provenance", required=True)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", default="auto")
    s.add_argument("--compile", default="none", choices=["none", "cuda_graphs", "torch_compile"],
                   help="how fixed-shape steps run (dlmpipe/graphs.py)")
    s.add_argument("--config-hash", default="")
    s.add_argument("--shard", default="0/1", help="i/n: this job decodes the i-th of n contiguous, disjoint "
                   "sample ranges (dlmpipe.shards.shard_range)")
    s.add_argument("--no-warmup", action="store_true")
    s.add_argument("--proxies", default="", help="the backbone's proxies.safetensors (SPA-Cache's "
                   "singular identifier); empty: none")
    s.add_argument("--limit", type=int, default=None, help="decode only the first N samples")
    s.add_argument("--shadow", default="", help="JSON options of the shadow-forward probe (rate, "
                   "steps, seed; docs/ANALYSES.md); empty: no probe")
    s.add_argument("--probes-out", default="", help="the shadow probes' parquet (with --shadow)")
    s.add_argument("--batch-size", default="auto", help="samples decoded together, each with the "
                   "tokens it gets alone (dlmpipe/batching.py); auto: 16 on CUDA, 8 on the CPU, "
                   "1 with a compile mode or a shadow probe; 0 means auto (the workflow's resource)")
    s.set_defaults(func=_generate)

    s = sub.add_parser("time-method", help="time one method against the reference on the same "
                       "samples, interleaved and repeated, in one process (paired speedups)")
    s.add_argument("--manifest", required=True)
    s.add_argument("--task-file", required=True)
    s.add_argument("--method", required=True, help="JSON: the method as generate takes it (with "
                   "its batch_size for the throughput pass)")
    s.add_argument("--reference", default="", help="JSON: the reference method it is paired "
                   "with; empty when the method is the reference")
    s.add_argument("--out", required=True)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", default="auto")
    s.add_argument("--compile", default="none", choices=["none", "cuda_graphs", "torch_compile"],
                   help="how fixed-shape steps run, as in the generate jobs (dlmpipe/graphs.py)")
    s.add_argument("--samples", type=int, default=10, help="time the first N samples of the task")
    s.add_argument("--repeats", type=int, default=3, help="decodes per (method, sample)")
    s.add_argument("--proxies", default="", help="the backbone's proxies.safetensors; empty: none")
    s.set_defaults(func=_time_method)

    def model_job(s: argparse.ArgumentParser) -> None:
        s.add_argument("--manifest", required=True)
        s.add_argument("--task-file", required=True)
        s.add_argument("--method", required=True, help="JSON: name, sampler{...}, cache{...}, gen_length")
        s.add_argument("--seed", type=int, default=0)
        s.add_argument("--device", default="auto")
        s.add_argument("--limit", type=int, default=None, help="only the first N problems")
        s.add_argument("--proxies", default="", help="the backbone's proxies.safetensors; empty: none")
        s.add_argument("--compile", default="none", choices=["none", "cuda_graphs", "torch_compile"],
                       help="how fixed-shape steps run (dlmpipe/graphs.py)")

    s = sub.add_parser("intervene", help="matched-state feedback intervention: Fresh and Cached "
                       "branches from the first confident acceptance (docs/ANALYSES.md)")
    model_job(s)
    s.add_argument("--threshold", type=float, default=0.9, help="confidence of the branch token")
    s.add_argument("--follow", type=int, default=5, help="updates the branch token is followed")
    s.add_argument("--out-pairs", required=True)
    s.add_argument("--out-fresh", required=True, help="Fresh branch completions (generations format)")
    s.add_argument("--out-cached", required=True, help="Cached branch completions (generations format)")
    s.set_defaults(func=_intervene)

    s = sub.add_parser("drift-profile", help="per-layer step-to-step similarities along a method's "
                       "trajectory (docs/ANALYSES.md)")
    model_job(s)
    s.add_argument("--rank", type=int, default=None, help="singular proxy rank (default: stored)")
    s.add_argument("--tau", type=float, default=0.95, help="drifting: cosine similarity below tau")
    s.add_argument("--out", required=True)
    s.set_defaults(func=_drift_profile)

    s = sub.add_parser("shadow-analysis", help="disagreement by anchor distance, partial Spearman "
                       "correlations, reproduction check, figure")
    s.add_argument("--probes", required=True)
    s.add_argument("--trajectory", required=True, help="the probed job's generations")
    s.add_argument("--generations", required=True, help="the main generations of the same method")
    s.add_argument("--bins", default="[0, 1, 2, 4, 8, 16, 32, 64, 128]", help="JSON bin edges")
    s.add_argument("--label", default="")
    for out in ("bins", "correlations", "reproduction", "figure"):
        s.add_argument(f"--out-{out}", required=True)
    s.set_defaults(func=_shadow_analysis)

    s = sub.add_parser("intervention-analysis", help="Pass@1, Rev.@5 and paired counts of the "
                       "intervention's branches, figure")
    s.add_argument("--pairs", required=True)
    s.add_argument("--fresh-scores", required=True)
    s.add_argument("--cached-scores", required=True)
    s.add_argument("--follow", type=int, default=5)
    s.add_argument("--label", default="")
    for out in ("table", "paired", "figure"):
        s.add_argument(f"--out-{out}", required=True)
    s.set_defaults(func=_intervention_analysis)

    s = sub.add_parser("drift-analysis", help="per-layer drift table, similarity and drift-share "
                       "figures")
    s.add_argument("--records", required=True)
    s.add_argument("--tau", type=float, default=0.95)
    s.add_argument("--profile", default="llada-8b-instruct", help="adaptive rho(l) drawn for "
                   "comparison; empty: none")
    s.add_argument("--label", default="")
    for out in ("table", "similarity", "share"):
        s.add_argument(f"--out-{out}", required=True)
    s.set_defaults(func=_drift_analysis)

    s = sub.add_parser("reference-corpus", help="token counts of JSON-lines texts with a "
                       "backbone's tokenizer: PC-Sampler's reference corpus (baseline_name; "
                       "docs/METHODS.md §1.7)")
    s.add_argument("--checkpoint", required=True, help="backbone directory (its tokenizer)")
    s.add_argument("--input", nargs="+", required=True, help="JSON-lines files")
    s.add_argument("--keys", required=True, help="comma-separated keys whose text is counted")
    s.add_argument("--out", required=True, help="the corpus JSON (num_token, p_baseline_dict)")
    s.set_defaults(func=_reference_corpus)

    s = sub.add_parser("svd", help="float32 thin SVD of every layer's value projection -> proxies.safetensors")
    source = s.add_mutually_exclusive_group(required=True)
    source.add_argument("--manifest", help="the backbone's manifest (its checkpoint, name and pins)")
    source.add_argument("--path", help="the checkpoint directory (the workflow's svd rule: beside "
                        "prepare-backbone, not after it)")
    s.add_argument("--name", help="with --path: the backbone's name")
    s.add_argument("--sha256", default="", help="with --path: the weight files' pinned sha256 (JSON)")
    s.add_argument("--out", required=True)
    s.set_defaults(func=_svd)

    s = sub.add_parser("merge-generations", help="join a method's generation shards: every sample "
                       "once, ordered by sample_index; provenance merged; atomic")
    s.add_argument("--shards", nargs="+", required=True, help="shard files, in shard order (0/n, 1/n, ...)")
    s.add_argument("--shard-provenance", nargs="+", default=None, help="their provenance files, same order")
    s.add_argument("--task-file", required=True, help="the task the shards decoded (sample count, task ids)")
    s.add_argument("--out", required=True)
    s.add_argument("--provenance", required=True)
    s.set_defaults(func=_merge_generations)

    s = sub.add_parser("score", help="score generations (code in the sandbox, answers by match)")
    s.add_argument("--generations", required=True)
    s.add_argument("--task-file", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--workers", type=int, default=0, help="parallel programs (0: all cores)")
    _sandbox_option(s)
    s.set_defaults(func=_score)

    s = sub.add_parser("score-samples", help="score external EvalPlus-style samples")
    s.add_argument("--task", required=True)
    s.add_argument("--samples", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--workers", type=int, default=0)
    s.add_argument("--options", default="{}", help="JSON task loader options (source, limit, ids)")
    _sandbox_option(s)
    s.set_defaults(func=_score_samples)

    s = sub.add_parser("check-sandbox", help="check that the campaign's sandbox works here "
                       "(no generated code runs); `make campaign` runs it before Snakemake")
    s.add_argument("snakemake_args", nargs=argparse.REMAINDER,
                   help="after --: the Snakemake arguments (--configfile, --config sandbox=...)")
    s.set_defaults(func=_check_sandbox)

    s = sub.add_parser("summarize", help="one summary row per (backbone, task, method)")
    s.add_argument("--scores", nargs="+", required=True)
    s.add_argument("--reference", required=True)
    s.add_argument("--also-against", nargs="*", default=[], help="extra speedup references")
    s.add_argument("--timing", nargs="*", default=[], help="the timing stage's files: speedups "
                   "as paired median ratios with bootstrap intervals (else: ratios of mean times)")
    s.add_argument("--seed", type=int, default=0, help="seed of the bootstrap intervals")
    s.add_argument("--out-parquet", required=True)
    s.add_argument("--out-csv", required=True)
    s.add_argument("--out-isolation", default="", help="HTML page for the report: the rows "
                   "scored under a sandbox weaker than bubblewrap, or the all-clear")
    s.add_argument("--out-html", default="", help="the summary as an HTML page for the report "
                   "(headline columns first, the device and sandbox level that ran)")
    s.set_defaults(func=_summarize)

    s = sub.add_parser("plot", help="quality-vs-speedup Pareto plots per (backbone, task)")
    s.add_argument("--summary", required=True)
    s.add_argument("--out-dir", required=True)
    s.set_defaults(func=_plot)

    s = sub.add_parser("headline", help="the report's landing page: the summary and every Pareto "
                       "plot in one HTML file (plots embedded)")
    s.add_argument("--summary", required=True, help="summary.parquet")
    s.add_argument("--plots", required=True, help="the directory of the Pareto plots")
    s.add_argument("--out", required=True)
    s.set_defaults(func=_headline)

    s = sub.add_parser("csv-page", help="CSV tables as one HTML page for the report (which shows "
                       "HTML, but offers CSV only as a download)")
    s.add_argument("--title", required=True)
    s.add_argument("--csv", nargs="+", required=True)
    s.add_argument("--out", required=True)
    s.set_defaults(func=_csv_page)

    s = sub.add_parser("tables", help="paper-style tables (Archer, SPA-Cache) from the summary: "
                       "{name}.csv, .md and .html per table")
    s.add_argument("--summary", required=True)
    s.add_argument("--tables", required=True, help="JSON: the campaign's tables section")
    s.add_argument("--campaign", required=True,
                   help='JSON: {"origin": {method: base}, "backbones": [...], "tasks": [...]}')
    s.add_argument("--out-dir", required=True)
    s.set_defaults(func=_tables)

    s = sub.add_parser("plot-sweeps", help="quality, speedup and TPS against the swept value, "
                       "per (backbone, task, swept base method)")
    s.add_argument("--summary", required=True)
    s.add_argument("--sweeps", required=True,
                   help='JSON: {base: {"keys": [...], "points": {method: [values]}}}')
    s.add_argument("--out-dir", required=True)
    s.set_defaults(func=_plot_sweeps)
