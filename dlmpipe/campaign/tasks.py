"""The campaign's tasks: each loads a registered benchmark (its name, or its ``benchmark:``), with
options that benchmark's loader takes and the data files it reads present.

Names are checked on the raw config, before the schema, so that an unknown benchmark is the
first problem reported (and the schema's complaints about that task's keys are left out: they
mean nothing for a benchmark that does not exist).
"""
from __future__ import annotations

from ..tasks.registry import TASKS, loader_options

#: keys every task takes besides its loader's options
COMMON_KEYS = ["limit", "ids", "gen_length", "benchmark", "revision"]


def benchmark_of(name: str, options) -> object:
    return options.get("benchmark", name) if isinstance(options, dict) else name


def unknown_tasks(config: dict) -> dict[str, str]:
    """Task name -> its problem, for the tasks whose benchmark is not registered (on the config
    as written: before the schema, whatever else is wrong)."""
    tasks = config.get("tasks") if isinstance(config, dict) else None
    if not isinstance(tasks, dict):
        return {}
    known = ", ".join(sorted(TASKS))
    out = {}
    for name, options in tasks.items():
        benchmark = benchmark_of(name, options)
        if not isinstance(benchmark, str) or not benchmark:
            continue  # the schema says what a benchmark name must be
        if benchmark not in TASKS:
            out[name] = (f"tasks.{name}.benchmark: unknown benchmark {benchmark!r}; known: {known}"
                         if isinstance(options, dict) and "benchmark" in options else
                         f"tasks.{name}: unknown task; known tasks: {known} (another name loads "
                         "one of them with `benchmark:`)")
    return out


def task_problems(config: dict, check_data: bool = True) -> list[str]:
    """Options the benchmark's loader does not take (its signature: a typo), its own checks of
    their values (``Benchmark.option_problems``), the data files it would not find
    (``tasks.benchmarks.DATA``; without ``check_data``, as ``plan`` checks, only the campaign's
    own files: a local task's), and the records of its files once they are there
    (``Benchmark.record_problems``: a local task's fields)."""
    from ..tasks.benchmarks import missing_data, option_problems, record_problems

    problems = []
    for name, options in config["tasks"].items():
        benchmark = benchmark_of(name, options)
        if benchmark not in TASKS:
            continue  # reported by unknown_tasks
        known = loader_options(benchmark) + COMMON_KEYS
        bad = [key for key in options if key not in known]
        problems += [f"tasks.{name}.{key}: task {benchmark!r} takes no option {key!r} (its "
                     f"options: {', '.join(known)})" for key in bad]
        if check_data and not bad and benchmark == "lm_eval":  # lm-eval's data_files
            from ..lmeval.campaign import missing_files

            problems += [f"tasks.{name}.dataset_kwargs.data_files: data file not found: {f}"
                         for f in missing_files(options)]
        if not bad:
            problems += [f"tasks.{name}.{p}" for p in option_problems(
                benchmark, {k: v for k, v in options.items() if k not in COMMON_KEYS})]
        if not bad:  # without check_data, the campaign's own files (DataFile.local) still
            loader = {k: v for k, v in options.items() if k not in COMMON_KEYS}
            missing = missing_data(benchmark, loader, own_only=not check_data)
            for need, why in missing:
                key = f"tasks.{name}.{need.key}"
                problems.append(f"{key}: {why if isinstance(why, str) else why.problem(key)}")
            if not missing and not option_problems(benchmark, loader):
                problems += [f"tasks.{name}.{p}" for p in record_problems(benchmark, loader)]
    return problems
