"""The campaign: config.yaml checked, defaults filled, sweeps expanded, every job's method.

The Snakefile builds a ``Campaign`` before any job runs: one pass that checks everything
knowable before a job, and reports every problem at once, each line starting with the dotted key
it is about (``methods.archer.cache.K``). In order:

- relative paths made absolute against the folder of the campaign file that gives them
  (``paths.py``);
- task names (``tasks.py``): an unknown benchmark first, before the schema;
- the JSON schema (dlmpipe/config_schema.py: defaults filled, types, ranges stated);
- Hugging Face Hub names (``hub.py``): each backbone's ``hub`` and task's dataset id resolved to
  the commit its revision names, from the cache or the Hub;
- backbones (``backbones.py``): checkpoint directories and config.json exist, shipped names,
  weight pins (sha256 of the files on disk, each hashed once: ``hashes.py``);
- task options the benchmark's loader takes, the data files it reads, and a local dataset's
  records (``tasks.py``);
- methods (``expansion.py``): sweeps expand into unique, readable names; scopes, overrides
  (dlmpipe/overrides.py) and sampler/cache pairings;
- every job's method (``jobs.py``): overrides applied, ``auto`` parameters (SPA-Cache's
  profile) chosen for each checkpoint (dlmpipe/backbones/identity.py), blocks against the
  generation length (a method's own ``gen_length``, else each task's), parameters against the
  backbone's widths (SPA-Cache's rank; config.json read without torch, or a toy's options),
  a block size (``methods.<m>.block_size``, else ``backbones.<b>.block_size``) against the
  backbone's family and release (docs/MODELS.md, "Block sizes and generation lengths");
- the reference method, compile and batch settings, the analyses (analysis/targets.py) and the
  paper tables (``tables:``, analysis/table_spec.py).

``Campaign.method(name, task, backbone)`` is what a generate job decodes with, so a change to
one backbone's parameters reruns exactly that backbone's jobs. ``files.py`` reads campaign files
(a YAML syntax error names file, line and column); ``python -m dlmpipe.campaign [config.yaml
...]`` prints the expanded campaign (``show.py``).
"""
from __future__ import annotations

import itertools
from pathlib import Path

from .. import overrides, registry
from ..analysis.targets import expand_analyses
from ..config_schema import (SCHEMA, ConfigError, check_config, dotted, explain,  # noqa: F401
                             load_schema, validator_for)
from ..registry import canonical
from . import backbones as _backbones
from . import jobs as _jobs
from .expansion import TEMPLATE_FIELD, expand_method, part_problems
from .files import read_campaign_files
from .hashes import HashCache
from .hub import HubSources
from .paths import anchor_paths, annotate
from .tasks import task_problems, unknown_tasks


class Campaign:
    """A checked campaign: backbones, tasks and expanded methods, ready for the rules.

    ``check_paths=False`` leaves out what reads the disk: checkpoint directories, weight pins,
    task data files but the campaign's own (a campaign planned on another machine). ``files``:
    the campaign files ``config`` was read from, in order; relative paths resolve against the
    folder of the file that gives them (``paths.py``; none: the working directory)."""

    def __init__(self, config: dict, schema_path: str | Path = SCHEMA, check_paths: bool = True,
                 source: str = "config", files: list[str | Path] = ()):
        notes = anchor_paths(config, files)
        try:
            self._check(config, schema_path, check_paths, source)
        except ConfigError as e:
            raise ConfigError(annotate(e.problems, notes), e.source) from None

    def _check(self, config: dict, schema_path: str | Path, check_paths: bool, source: str):
        unknown = unknown_tasks(config)
        self._gpus: dict = {}  # backbone -> gpus.JobGpus, planned once
        try:
            self.config = check_config(config, schema_path, source)
        except ConfigError as e:
            # an unknown benchmark first; the schema's words on its keys mean nothing
            rest = [p for p in e.problems
                    if not any(p.startswith(f"tasks.{t}.") or p.startswith(f"tasks.{t}:")
                               for t in unknown)]
            # every problem at once: what the unfilled config still lets us check
            more = unchecked_problems(config, set(unknown), check_paths)
            raise ConfigError(list(dict.fromkeys([*unknown.values(), *rest, *more])),
                              source) from None
        schema = load_schema(schema_path)
        problems: list[str] = list(unknown.values())
        #: the Hub repositories (backbones' ``hub``, tasks' dataset ids), resolved to commits
        self.hub = HubSources(config, check_paths)
        problems += self.hub.problems
        if check_paths:
            hashes = HashCache()
            problems += _backbones.backbone_problems(config["backbones"], hashes, self.hub)
            hashes.save()
        problems += task_problems(config, check_data=check_paths)
        #: the expanded methods as configured (before overrides and ``auto`` parameters)
        self.methods: dict[str, dict] = {}
        origin: dict[str, str] = {}
        self._overrides: dict[str, list[overrides.Override]] = {}
        self.sweep_points: dict[str, dict] = {}  # method -> its swept key -> value ({} unswept)
        #: method -> its generate jobs' batch size ("auto" or a number; a scheduling setting)
        self.batch_sizes: dict[str, int | str] = {}
        #: base method -> the backbones and tasks it runs on (its ``backbones:``/``tasks:``)
        self._scope: dict[str, tuple[list[str], list[str]]] = {}
        for base, spec in config["methods"].items():
            self._scope[base], found = self._method_scope(base, spec)
            problems += found
            expanded, found = expand_method(base, spec, schema)
            problems += found
            sweep = spec.get("sweep") or {}
            for m, point in zip(expanded, itertools.product(*sweep.values())):
                self.sweep_points.setdefault(m["name"], {k: canonical(v) for k, v in zip(sweep, point)})
            entries, found = overrides.parse(f"methods.{base}", spec.get("overrides") or {},
                                             self.backbones, self.tasks)
            self._overrides[base], more = overrides.check(
                f"methods.{base}", spec, entries, set(TEMPLATE_FIELD.findall(spec.get("name") or "")),
                lambda part, params: part_problems(schema, part, params))
            problems += found + more
            for m in expanded:
                if m["name"] in self.methods:
                    by = ("" if origin[m["name"]] == base else
                          f" (also by methods.{origin[m['name']]})")
                    problems.append(f"methods.{base}: method name {m['name']!r} is produced "
                                    f"twice{by}; rename, or give the sweep a name template "
                                    "naming every swept key")
                    continue
                self.methods[m["name"]], origin[m["name"]] = m, base
                self.batch_sizes[m["name"]] = spec.get("batch_size", self.config.get("batch_size", "auto"))
                if (p := registry.pairing_problem(m["sampler"]["name"], m["cache"]["name"])):
                    problems.append(f"methods.{base}: {p}")
        self.origin = origin
        checkpoints = _backbones.Checkpoints(config["backbones"], self.hub)
        self._jobs, found = _jobs.build_jobs(self, checkpoints, check_paths)
        problems += found
        problems += self._comparison_scope_problems()
        ref = config["reference_method"]
        if self.methods and ref not in self.methods:
            problems.append(f"reference_method: {ref!r} is not a method of this campaign "
                            f"(methods: {', '.join(self.methods)})")
        for i, other in enumerate(config.get("also_speedup_against", [])):
            if self.methods and other not in self.methods:
                problems.append(f"also_speedup_against.{i}: {other!r} is not a method of this "
                                f"campaign (methods: {', '.join(self.methods)})")
        if config.get("compile") == "cuda_graphs" and config.get("device") == "cpu":
            problems.append("compile: cuda_graphs needs device: cuda (or auto on a GPU node); "
                            "with device: cpu use none or torch_compile")
        if config.get("compile", "none") != "none":
            for name, size in self.batch_sizes.items():
                if size != "auto" and size > 1:
                    where = ("batch_size" if "batch_size" not in config["methods"][origin[name]]
                             else f"methods.{origin[name]}.batch_size")
                    problems.append(f"{where}: {size} with compile: {config['compile']}: batched "
                                    "decoding runs eagerly (a captured or compiled step cannot wait "
                                    "for the other slots); use batch_size 1 or auto (1 there)")
        # analysis -> {(backbone, task, method): options} (docs/ANALYSES.md)
        self.analyses, found = expand_analyses(config["analyses"], self.backbones, self.tasks,
                                               self.methods, self.method, self.runs)
        problems += found + _jobs.drift_rank_problems(self, checkpoints, check_paths)
        problems += self._table_problems(origin)
        # the GPUs each backbone's model jobs need fit the campaign's keys; a backbone whose
        # checkpoint is already refused has no widths to plan with
        broken = {b for b in self.backbones if any(p.startswith(f"backbones.{b}") for p in problems)}
        problems += self._gpu_problems(broken)
        if problems:
            raise ConfigError(list(dict.fromkeys(problems)), source)

    def _gpu_problems(self, skip: set[str]) -> list[str]:
        from ..gpus import GpuPlanError

        problems = []
        for b in self.backbones:
            if b in skip:
                continue
            try:
                self.gpus(b)
            except GpuPlanError as e:
                problems.append(str(e))
        return problems

    def _method_scope(self, base: str, spec: dict) -> tuple[tuple[list[str], list[str]], list[str]]:
        """The backbones and tasks a base method runs on, in campaign order (default: every
        one), and the names that are not the campaign's."""
        scope, problems = [], []
        for key, known in (("backbones", self.backbones), ("tasks", self.tasks)):
            names = spec.get(key)
            problems += [f"methods.{base}.{key}[{i}]: {v!r} is not one of this campaign's {key} "
                         f"({', '.join(known)})" for i, v in enumerate(names or []) if v not in known]
            scope.append([k for k in known if names is None or k in names])
        return (scope[0], scope[1]), problems

    def _comparison_scope_problems(self) -> list[str]:
        """Every method's speedup is against the reference on the same backbone and task: the
        reference runs everywhere (an also_speedup_against method may not: its column is empty
        where it does not run)."""
        name = self.config["reference_method"]
        if name not in self.origin:
            return []  # reported as not a method
        base = self.origin[name]
        if self._scope[base] == (self.backbones, self.tasks):
            return []
        return [f"reference_method: {name!r} runs only on some backbones or tasks "
                f"(methods.{base}.backbones/tasks); every method's speedup is against it on the "
                "same backbone and task, so it runs on all of them"]

    def _table_problems(self, origin: dict[str, str]) -> list[str]:
        from ..analysis.table_spec import table_problems

        against = [self.config["reference_method"], *self.config.get("also_speedup_against", [])]
        return [p for name, spec in self.config["tables"].items()
                for p in table_problems(name, spec, origin, self.backbones, self.tasks, against)]

    # ---- what the rules read --------------------------------------------------------
    @property
    def backbones(self) -> list[str]:
        return list(self.config["backbones"])

    @property
    def tasks(self) -> list[str]:
        return list(self.config["tasks"])

    def is_toy(self, backbone: str) -> bool:
        return "toy" in self.config["backbones"][backbone]

    def toy_options(self, backbone: str) -> dict:
        return dict(self.config["backbones"][backbone]["toy"])

    def checkpoint_path(self, backbone: str) -> Path | None:
        """Where a backbone's weights are: the shipped directory, the local ``path`` (absolute)
        or a ``hub:`` one's snapshot folder of its commit (there once fetched); None for a toy
        the workflow trains."""
        return _backbones.checkpoint_path(self.config["backbones"][backbone], self.hub, backbone)

    def is_hub(self, backbone: str) -> bool:
        return "hub" in self.config["backbones"][backbone]

    def reads_dataset_ids(self, task: str) -> bool:
        """Whether the task reads a dataset by Hub name (fetched by its own fetch job)."""
        from ..tasks.registry import dataset_options

        return bool(dataset_options(self.config["tasks"][task]))

    def hub_fetches(self, section: str, name: str) -> list[dict]:
        """The Hub repositories the fetch job of backbone or task ``name`` fetches (``section``
        backbones or tasks): repository, kind, revision and the commit it names; [] for none."""
        return self.hub.fetch_entries(section, name)

    def weight_sha256(self, backbone: str) -> dict[str, str] | None:
        """The sha256 the backbone's weight files must have (checked here, and again when they
        load): the campaign's ``sha256``, else a shipped checkpoint's record; None: unpinned."""
        return _backbones.weight_sha256(self.config["backbones"][backbone])

    def benchmark(self, task: str) -> str:
        """The registered benchmark a task loads: its ``benchmark`` key, else the task's name
        (an alias loads one benchmark under another name, e.g. with other options)."""
        return self.config["tasks"][task].get("benchmark", task)

    def task_options(self, task: str) -> dict:
        """Loader options: everything but the benchmark name and gen_length (which only
        generation reads), passed to the loader unchanged, but dataset ids pinned to the commit
        their revision names (``org/name@commit``)."""
        return self.hub.job_options(task, {k: v for k, v in self.config["tasks"][task].items()
                                           if k not in ("benchmark", "gen_length")})

    def sweeps(self) -> dict[str, dict]:
        """Base methods whose sweep has two or more points: ``{base: {"keys": [swept keys],
        "points": {method: [its value of each key]}}}``, in campaign order (sweep figures)."""
        out: dict[str, dict] = {}
        for name, base in self.origin.items():
            point = self.sweep_points.get(name) or {}
            if point:
                entry = out.setdefault(base, {"keys": list(point), "points": {}})
                entry["points"][name] = list(point.values())
        return {b: e for b, e in out.items() if len(e["points"]) > 1}

    def runs(self, name: str, backbone: str, task: str) -> bool:
        """Whether method ``name`` decodes ``task`` on ``backbone`` (its base method's
        ``backbones:`` and ``tasks:``, default every one)."""
        backbones, tasks = self._scope[self.origin[name]]
        return backbone in backbones and task in tasks

    def scopes(self) -> dict[str, dict[str, list[str]]]:
        """The base methods that run only on some backbones or tasks: base -> {"backbones",
        "tasks"} (campaign order); the others run everywhere."""
        return {base: {"backbones": b, "tasks": t} for base, (b, t) in self._scope.items()
                if (b, t) != (self.backbones, self.tasks)}

    def methods_on(self, backbone: str, task: str) -> list[str]:
        """The methods that decode ``task`` on ``backbone``, in campaign order."""
        return [m for m in self.methods if self.runs(m, backbone, task)]

    def decoding_jobs(self) -> list[tuple[str, str, str]]:
        """Every (backbone, task, method) the campaign decodes and scores."""
        return [(b, t, m) for b in self.backbones for t in self.tasks for m in self.methods_on(b, t)]

    def needs_proxies(self, name: str, backbone: str | None = None, task: str | None = None) -> bool:
        """The method's generate jobs on ``backbone`` and ``task`` (None: any) read the backbone's
        singular proxies (``backbones/{b}/proxies.safetensors``, written by the svd rule)."""
        return any("proxies" in registry.artifacts(self._jobs[(name, t, b)])
                   for b in ([backbone] if backbone else self.backbones)
                   for t in ([task] if task else self.tasks)
                   if (name, t, b) in self._jobs)

    def analysis(self, kind: str, backbone: str, task: str, method: str) -> dict:
        """The options of analysis ``kind`` for one (backbone, task, method)."""
        try:
            return self.analyses[kind][(backbone, task, method)]
        except KeyError:
            raise ValueError(f"analyses.{kind} names no {backbone}/{task}/{method}") from None

    def analysis_targets(self, kind: str) -> list[tuple[str, str, str]]:
        return list(self.analyses.get(kind, {}))

    def gen_length(self, name: str, task: str) -> int:
        """The response length a method decodes a task with: the method's own ``gen_length``
        (set or swept on the method), else the task's."""
        return self.methods[name].get("gen_length") or self.config["tasks"][task]["gen_length"]

    def batch_size(self, name: str) -> int | str:
        """The batch size of ``name``'s generate jobs: its own ``batch_size``, else the
        campaign's (``auto``: chosen by the job for its device, dlmpipe/batching.py)."""
        return self.batch_sizes[name]

    def method(self, name: str, task: str, backbone: str) -> dict:
        """The concrete method a generate job decodes with: name, sampler, cache (overrides
        applied, ``auto`` parameters chosen for the backbone) and gen_length. Shared: do not
        modify."""
        try:
            return self._jobs[(name, task, backbone)]
        except KeyError:
            raise ValueError(f"method {name!r} does not run on {backbone}/{task} (its "
                             "backbones:/tasks:)") from None

    def gpus(self, backbone: str):
        """The GPUs every model job of ``backbone`` asks for, and why (``gpus.JobGpus``)."""
        from ..gpus import backbone_gpus

        if backbone not in self._gpus:
            self._gpus[backbone] = backbone_gpus(self, backbone)
        return self._gpus[backbone]

    def differences(self, name: str) -> dict[str, str]:
        """Where the method's jobs decode with other parameters than configured (overrides,
        ``auto`` parameters): ``backbone`` (every task alike) or ``backbone/task`` -> the
        differing parameters as text."""
        return _jobs.differences(self, name)


def unchecked_problems(config: dict, unknown: set[str], check_paths: bool) -> list[str]:
    """What can still be checked on a config the schema refused (docs/ARCHITECTURE.md: every
    problem at once): task options and data, backbones' checkpoints, sampler/cache pairings.
    Each part is checked only where it is well-formed enough; the schema has named the rest."""
    problems: list[str] = []
    tasks = config.get("tasks")
    if isinstance(tasks, dict):
        good = {t: o for t, o in tasks.items() if t not in unknown and isinstance(o, dict)}
        try:
            problems += task_problems({"tasks": good}, check_data=check_paths)
        except (TypeError, ValueError, KeyError, AttributeError):
            pass  # malformed options: the schema's problems say how
    backbones = config.get("backbones")
    if check_paths and isinstance(backbones, dict) and all(isinstance(b, dict)
                                                             for b in backbones.values()):
        try:
            problems += _backbones.backbone_problems(backbones, None)
        except (TypeError, ValueError, KeyError, AttributeError):
            pass
    methods = config.get("methods")
    for base, spec in (methods.items() if isinstance(methods, dict) else ()):
        parts = [spec.get(k) if isinstance(spec, dict) else None for k in ("sampler", "cache")]
        names = [p.get("name") if isinstance(p, dict) else None for p in parts]
        if names[0] in registry.SAMPLERS and names[1] in registry.CACHES:
            if (p := registry.pairing_problem(*names)):
                problems.append(f"methods.{base}: {p}")
    return problems


def load_campaign(paths: list[str | Path], schema_path: str | Path = SCHEMA,
                  check_paths: bool = True) -> Campaign:
    """Campaign from config files; later files override earlier ones key by key (a YAML syntax
    error is a ConfigError naming file, line and column)."""
    return Campaign(read_campaign_files(paths), schema_path, check_paths,
                    source=", ".join(map(str, paths)), files=paths)
