"""The campaign: config.yaml checked against its schema, defaults filled, sweeps expanded.

The Snakefile builds a ``Campaign`` before any job runs: one pass that applies the JSON schema
(dlmpipe/config_schema.py: defaults filled, *every* error named by its dotted key,
``methods.archer.cache.K``), then adds what a schema cannot say:
checkpoint directories exist, tasks load registered benchmarks, sweeps expand into unique,
readable method names, per-backbone/per-task overrides (dlmpipe/overrides.py) name existing
backbones and tasks and valid parameters, ``auto`` parameters (SPA-Cache's profile) fit each
backbone, a cache can serve its sampler, blocks divide the generation length (a method's own
``gen_length``, else each task's), the reference method exists, and the paper tables
(``tables:``) name existing methods, tasks, backbones and speedup columns
(``analysis/table_spec.py``).

``Campaign.method(name, task, backbone)`` is what a generate job decodes with: the method's
parameters with that backbone's and task's overrides applied and its ``auto`` parameters chosen
for that backbone's checkpoint (dlmpipe/backbones/identity.py), so a change to one backbone's
parameters reruns exactly that backbone's jobs.

``python -m dlmpipe.campaign [config.yaml ...]`` prints the expanded campaign.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import re
import sys
from pathlib import Path

import yaml

from . import overrides, registry
from .analysis.targets import expand_analyses
from .config_schema import (SCHEMA, ConfigError, check_config, dotted, explain,  # noqa: F401
                            load_schema, validator_for)
from .backbones.identity import TOY, BackboneIdentity, CheckpointError, checkpoint_identity
from .registry import canonical

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
TEMPLATE_FIELD = re.compile(r"\{([^{}]*)\}")


# --------------------------------------------------------------------------------------
# methods: sweeps -> concrete, named methods
# --------------------------------------------------------------------------------------
def name_part(value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value).lower()


#: keys of a method besides its sampler/cache parameters that a sweep may vary, and their label
#: in default names (llada-confidence-g256)
METHOD_KEYS = {"gen_length": "g"}


def get_dotted(method: dict, field: str):
    if field in METHOD_KEYS:
        if method.get(field) is None:
            raise KeyError(field)
        return method[field]
    part, _, param = field.partition(".")
    if part not in ("sampler", "cache") or param not in method[part]:
        raise KeyError(field)
    return method[part][param]


def name_label(field: str) -> str:
    return METHOD_KEYS.get(field) or field.rsplit(".", 1)[-1].lower()


def method_name(base: str, spec: dict, method: dict, swept: list[str]) -> str:
    template = spec.get("name")
    if template is None:
        return base + "".join(f"-{name_label(k)}{name_part(get_dotted(method, k))}" for k in swept)
    return TEMPLATE_FIELD.sub(lambda m: name_part(get_dotted(method, m.group(1))), template)


def expand_method(base: str, spec: dict, schema: dict) -> tuple[list[dict], list[str]]:
    """All points of one method's sweep (cartesian, in config order) and the problems found."""
    sweep = spec.get("sweep") or {}
    swept = list(sweep)
    where = f"methods.{base}"
    methods, problems = [], []
    for field in swept:
        if field.endswith(".name"):
            problems.append(f"{where}.sweep.{field}: sweeps vary parameters; list other "
                            "samplers/caches as separate methods")
    if problems:
        return [], problems
    for point in itertools.product(*(sweep[k] for k in swept)):
        method = {"sampler": copy.deepcopy(spec["sampler"]), "cache": copy.deepcopy(spec["cache"]),
                  "gen_length": spec.get("gen_length")}
        for field, value in zip(swept, point):
            if field in METHOD_KEYS:
                method[field] = value
                key_schema = schema["$defs"]["method"]["properties"][field]
                for err in validator_for(schema, key_schema).iter_errors(value):
                    problems.append(f"{where}.sweep.{field}: {value!r}: {err.message}")
                continue
            part, param = field.split(".", 1)
            method[part][param] = value
        for part in ("sampler", "cache"):
            for err in validator_for(schema, schema["$defs"][part]).iter_errors(method[part]):
                for line in explain(err, schema):
                    k, _, rest = line.partition(": ")
                    field = f"{part}.{k}" if k != "(top level)" else part
                    label = (f"{where}.sweep.{field}" if field in sweep else f"{where}.{field}")
                    problems.append(f"{label}: {rest}")
            method[part] = {k: canonical(v) for k, v in method[part].items()}
        if problems:
            return [], problems
        try:
            method["name"] = method_name(base, spec, method, swept)
        except KeyError as e:
            return [], [f"{where}.name: template field {{{e.args[0]}}} is not a parameter of "
                        "this method (use sampler.<param>, cache.<param> or gen_length, when "
                        "the method sets it)"]
        if not NAME.match(method["name"]):
            return [], [f"{where}.name: expands to {method['name']!r}, not a valid name "
                        "(letters, digits, _ . + -)"]
        methods.append({"name": method["name"], "sampler": method["sampler"],
                        "cache": method["cache"],
                        **({"gen_length": method["gen_length"]} if method["gen_length"] else {})})
    return methods, problems


def part_problems(schema: dict, part: str, spec: dict) -> list[tuple[str, str]]:
    """(parameter, problem) of a sampler or cache spec against its registry entry."""
    return [(k, rest) for err in validator_for(schema, schema["$defs"][part]).iter_errors(spec)
            for k, _, rest in (line.partition(": ") for line in explain(err, schema))]


# --------------------------------------------------------------------------------------
# the campaign
# --------------------------------------------------------------------------------------
class Campaign:
    """A checked campaign: backbones, tasks and expanded methods, ready for the rules."""

    def __init__(self, config: dict, schema_path: str | Path = SCHEMA, check_paths: bool = True,
                 source: str = "config"):
        self.config = check_config(config, schema_path, source)
        schema = load_schema(schema_path)
        problems: list[str] = []
        if check_paths:
            problems += self._backbone_problems()
        problems += self._task_problems()
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
        self._identities: dict[str, BackboneIdentity | CheckpointError] = {}
        self._check_paths = check_paths
        problems += self._build_jobs()
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
        problems += found
        if not problems:
            problems += self._table_problems(origin)
        if problems:
            raise ConfigError(list(dict.fromkeys(problems)), source)

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

    def _backbone_problems(self) -> list[str]:
        from .backbones.shipped import shipped_names

        problems = []
        for name, b in self.config["backbones"].items():
            if "toy" in b and "sha256" in b:
                problems.append(f"backbones.{name}.sha256: a trained toy's weights depend on the "
                                "machine's CPU kernels; pin a `shipped:` or `path:` checkpoint")
            if "shipped" in b and b["shipped"] not in shipped_names():
                problems.append(f"backbones.{name}.shipped: no shipped checkpoint {b['shipped']!r} "
                                f"(shipped: {', '.join(shipped_names()) or 'none'})")
            if "path" in b:
                path = Path(b["path"]).expanduser()
                if not path.is_dir():
                    problems.append(f"backbones.{name}.path: {path} is not a directory")
                elif not (path / "config.json").is_file():
                    problems.append(f"backbones.{name}.path: {path} has no config.json")
        return problems

    def _table_problems(self, origin: dict[str, str]) -> list[str]:
        from .analysis.table_spec import table_problems

        against = [self.config["reference_method"], *self.config.get("also_speedup_against", [])]
        return [p for name, spec in self.config["tables"].items()
                for p in table_problems(name, spec, origin, self.backbones, self.tasks, against)]

    def _task_problems(self) -> list[str]:
        from .tasks.registry import TASKS, loader_options

        problems = []
        for name, opts in self.config["tasks"].items():
            benchmark = self.benchmark(name)
            if benchmark not in TASKS:
                known = ", ".join(sorted(TASKS))
                problems.append(
                    f"tasks.{name}.benchmark: unknown benchmark {benchmark!r}; known: {known}"
                    if "benchmark" in opts else
                    f"tasks.{name}: unknown task; known tasks: {known} (another name loads one of "
                    "them with `benchmark:`)")
                continue
            # each benchmark's loader declares its options (its signature): others are typos
            known = loader_options(benchmark) + ["limit", "ids", "gen_length", "benchmark"]
            problems += [f"tasks.{name}.{key}: task {benchmark!r} takes no option {key!r} (its "
                         f"options: {', '.join(known)})" for key in opts if key not in known]
        return problems

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
        """Where a backbone's weights are: the shipped directory or the local ``path`` (absolute);
        None for a toy the workflow trains."""
        b = self.config["backbones"][backbone]
        if "shipped" in b:
            from .backbones.shipped import SHIPPED_DIR
            return SHIPPED_DIR / b["shipped"]
        if "path" in b:
            return Path(b["path"]).expanduser().resolve()
        return None

    def weight_sha256(self, backbone: str) -> dict[str, str] | None:
        """The sha256 the backbone's weight files must have (checked when they load): the
        campaign's ``sha256``, else a shipped checkpoint's record; None: unpinned."""
        b = self.config["backbones"][backbone]
        if "sha256" in b:
            return {k: v.lower() for k, v in b["sha256"].items()}
        if "shipped" in b:
            from .backbones.shipped import read_record
            return read_record(b["shipped"])["sha256"]
        return None

    def benchmark(self, task: str) -> str:
        """The registered benchmark a task loads: its ``benchmark`` key, else the task's name
        (an alias loads one benchmark under another name, e.g. with other options)."""
        return self.config["tasks"][task].get("benchmark", task)

    def task_options(self, task: str) -> dict:
        """Loader options: everything but the benchmark name and gen_length (which only
        generation reads), passed to the loader unchanged."""
        return {k: v for k, v in self.config["tasks"][task].items()
                if k not in ("benchmark", "gen_length")}

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

    # ---- per job: overrides, auto parameters, gen_length ----------------------------------
    def differences(self, name: str) -> dict[str, str]:
        """Where the method's jobs decode with other parameters than configured (overrides,
        ``auto`` parameters): ``backbone`` (every task alike) or ``backbone/task`` -> the
        differing parameters as text."""
        point, out = self.methods[name], {}
        backbones, tasks = self._scope[self.origin[name]]
        for backbone in backbones:
            per_task = {}
            for task in tasks:
                job = self._jobs[(name, task, backbone)]
                per_task[task] = ", ".join(f"{part}.{k}={v}" for part in overrides.PARTS
                                           for k, v in job[part].items() if point[part].get(k) != v)
            if len(set(per_task.values())) == 1:
                if (diff := next(iter(per_task.values()))):
                    out[backbone] = diff
            else:
                out.update({f"{backbone}/{t}": d for t, d in per_task.items() if d})
        return out

    def _identity(self, backbone: str) -> BackboneIdentity | CheckpointError:
        """The backbone's family and checkpoint names, or why config.json cannot tell them."""
        if backbone not in self._identities:
            b = self.config["backbones"][backbone]
            if "toy" in b or "shipped" in b:  # trained by train_toy, in LLaDA's format
                kind = "toy" if "toy" in b else f"shipped {b['shipped']}"
                identity = dataclasses.replace(TOY, source=f"backbones.{backbone} ({kind})")
            else:
                try:
                    identity = dataclasses.replace(checkpoint_identity(b["path"]),
                                                   source=f"backbones.{backbone} ({b['path']})")
                except CheckpointError as e:
                    identity = e
            self._identities[backbone] = identity
        return self._identities[backbone]

    def _bind(self, where: str, method: dict, backbone: str) -> tuple[dict, list[str]]:
        """``method`` with its ``auto`` parameters chosen for the backbone."""
        if not any(method[part].get(key) == "auto"
                   for part in overrides.PARTS
                   for key in registry.lookup(part, method[part]["name"]).auto):
            return method, []
        identity = self._identity(backbone)
        if isinstance(identity, CheckpointError):
            # a missing directory or config.json is reported by _backbone_problems; unchecked
            # paths (check_paths=False): the generate job chooses, from the manifest
            path = Path(self.config["backbones"][backbone]["path"]).expanduser()
            return method, ([f"backbones.{backbone}.path: {identity} (needed to choose the auto "
                             f"parameters of {where})"]
                            if self._check_paths and (path / "config.json").is_file() else [])
        try:
            return {**method, **{part: registry.bind(part, method[part], identity)
                                 for part in overrides.PARTS}}, []
        except registry.NoFit as e:
            return method, [f"{where}.{e}; set {where}.{e.kind}.{e.key}, or "
                            f"{where}.overrides.{backbone}.{e.kind}.{e.key} for this backbone"]

    def _build_jobs(self) -> list[str]:
        """Every generate job's method (``method``), and the problems found on the way."""
        problems: list[str] = []
        self._jobs: dict[tuple[str, str, str], dict] = {}
        for name, point in self.methods.items():
            base = self.origin[name]
            where = f"methods.{base}"
            backbones, tasks = self._scope[base]
            # the generation length a job decodes with: the method's own, else each task's
            length_key = "gen_length" if "gen_length" in point else None
            for task in tasks:
                gen_length = self.gen_length(name, task)
                source_key = length_key or f"tasks.{task}.gen_length"
                for backbone in backbones:
                    method, applied, found = overrides.apply(where, point, self._overrides[base],
                                                             backbone, task)
                    method, bound = self._bind(where, method, backbone)
                    problems += found + bound
                    via = (f" on {backbone}, with " + ", ".join(f"{where}.overrides.{e.key}"
                                                                for e in applied)) if applied else ""
                    problems += [f"{where}.{p} (method {name}{via}, {source_key})"
                                 for p in registry.gen_length_problems(method, gen_length)]
                    self._jobs[(name, task, backbone)] = {**method, "gen_length": gen_length}
        return problems


def load_campaign(paths: list[str | Path], schema_path: str | Path = SCHEMA,
                  check_paths: bool = True) -> Campaign:
    """Campaign from config files; later files override earlier ones key by key."""
    config: dict = {}
    for p in paths:
        config = _merge(config, yaml.safe_load(Path(p).read_text()) or {})
    return Campaign(config, schema_path, check_paths, source=", ".join(map(str, paths)))


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def main(argv: list[str] | None = None) -> int:
    paths = (argv if argv is not None else sys.argv[1:]) or ["config.yaml"]
    try:
        c = load_campaign(paths)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    print(f"backbones: {', '.join(c.backbones)}\ntasks: {', '.join(c.tasks)}\n"
          f"methods ({len(c.methods)}), reference {c.config['reference_method']}:")
    scopes = c.scopes()
    for name, m in c.methods.items():
        shown = {k: m[k] for k in ("sampler", "cache", "gen_length") if k in m}
        print(f"  {name:24s} {json.dumps(shown)}")
        if (scope := scopes.get(c.origin[name])):
            print(f"    runs on backbones {', '.join(scope['backbones'])}; "
                  f"tasks {', '.join(scope['tasks'])}")
        for where, diff in c.differences(name).items():
            print(f"    on {where}: {diff}")
    print(f"generate jobs: {len(c.decoding_jobs())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
