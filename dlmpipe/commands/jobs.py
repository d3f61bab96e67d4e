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
from pathlib import Path

from . import reports

#: commands no rule runs (``python -m dlmpipe --help`` lists them apart from the jobs)
TOOLS = ("ship-toy", "reference-corpus", "score-samples", "check-sandbox")


def _train_toy(a: argparse.Namespace) -> None:
    from ..backbones.toy import train_toy

    train_toy(a.out, **json.loads(a.options))


def _prepare_backbone(a: argparse.Namespace) -> None:
    from ..backbones.manifest import write_manifest

    hub = next(iter(json.loads(Path(a.hub).read_text()).values())) if a.hub else None
    write_manifest(a.path, a.out, name=a.name, dtype=a.dtype, chat=a.chat,
                   sha256=json.loads(a.sha256), hub=hub)


def _fetch_hub(a: argparse.Namespace) -> None:
    from ..hub import fetch_all
    from ..io import atomic_write_json

    atomic_write_json(a.out, fetch_all(json.loads(a.repos)))


def _ship_toy(a: argparse.Namespace) -> None:
    from ..backbones.shipped import ship_toy

    ship_toy(a.name, json.loads(a.options) if a.options else None, a.out)


def _prepare_task(a: argparse.Namespace) -> None:
    from ..tasks.registry import prepare_task

    prepare_task(a.name, json.loads(a.options), a.out)


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
    s.add_argument("--hub", default=None, help="a Hub checkpoint's fetch record (fetch-hub's "
                   "output): its repository and commit recorded, the Hub's sha256 pinned")
    s.add_argument("--out", required=True)
    s.set_defaults(func=_prepare_backbone)

    s = sub.add_parser("fetch-hub", help="fetch Hugging Face Hub repositories at their commits "
                       "into the Hugging Face cache (a local job, where the network is); check "
                       "the safetensors sha256; record what was fetched")
    s.add_argument("--repos", required=True, help="JSON list of {key, repo, kind, revision, commit}")
    s.add_argument("--out", required=True)
    s.set_defaults(func=_fetch_hub)

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

    reports.register_analyses(sub)

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

    reports.register_reports(sub)
