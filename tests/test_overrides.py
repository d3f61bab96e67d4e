"""Per-backbone method settings: SPA-Cache's ``profile: auto`` chosen from each checkpoint, and a
method's ``overrides:`` block (dlmpipe/overrides.py): checked by key, applied per generate job,
rerunning exactly the jobs they touch, and recorded in what the jobs write."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dlmpipe import registry
from dlmpipe.backbones.identity import BackboneIdentity, checkpoint_identity
from dlmpipe.campaign import Campaign, ConfigError

from .checkpoints import make_tiny_checkpoint
from .workflow import REPORT_JOBS, decoding_jobs, fake_finished_run, scheduled, timing_jobs


# ---- profile: auto ---------------------------------------------------------------------------
def _config_only(path: Path, model_type: str, **fields) -> Path:
    """A checkpoint directory as far as its identity goes: config.json alone."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": model_type, **fields}))
    return path


def _profile(identity: BackboneIdentity, budget: str = "adaptive") -> str:
    return registry.bind("cache", {"name": "spa", "profile": "auto", "budget": budget}, identity)["profile"]


def test_auto_profile_follows_family_and_checkpoint_name(tmp_path):
    cases = {  # directory (relative to tmp_path), model_type, extra config.json fields -> profile
        "LLaDA-8B-Instruct": ("llada", {}, "llada-8b-instruct"),
        "LLaDA-8B-Base": ("llada", {}, "llada-8b-instruct"),
        "LLaDA-1.5": ("llada", {}, "llada-1.5"),
        "models--GSAI-ML--LLaDA-1.5/snapshots/0123abc": ("llada", {}, "llada-1.5"),
        "ckpt-final": ("llada", {"_name_or_path": "GSAI-ML/LLaDA-1.5"}, "llada-1.5"),
        "Dream-v0-Instruct-7B": ("Dream", {}, "dream-7b"),
        "some-qwen2-dlm": ("qwen2", {}, "dream-7b"),
    }
    for directory, (model_type, fields, profile) in cases.items():
        identity = checkpoint_identity(_config_only(tmp_path / directory, model_type, **fields))
        assert _profile(identity) == profile, directory
    # LLaDA-1.5 and LLaDA-8B-Instruct have the same config.json: a symlink's name counts too
    (tmp_path / "llada-1.5").symlink_to(tmp_path / "ckpt-final")
    assert "llada-1.5" in checkpoint_identity(tmp_path / "llada-1.5").names
    # the toy (LLaDA's format) and a bare model (its family only) take LLaDA-8B-Instruct's
    assert _profile(BackboneIdentity("llada")) == "llada-8b-instruct"


def test_no_fitting_profile_is_an_error_unless_the_profile_is_unused(tmp_path):
    diffucoder = checkpoint_identity(_config_only(tmp_path / "DiffuCoder-7B-cpGRPO", "Dream"))
    with pytest.raises(registry.NoFit, match=r"cache\.profile: auto: no SPA-Cache profile fits "
                                             r".*DiffuCoder-7B-cpGRPO.*DiffuCoder.*name one of "
                                             r"llada-8b-instruct, llada-1\.5, dream-7b"):
        _profile(diffucoder)
    with pytest.raises(registry.NoFit, match="mamba family.*no SPA-Cache profile is known"):
        _profile(BackboneIdentity("mamba"))
    assert _profile(diffucoder, budget="uniform") == "auto"  # rho(l) unused: nothing to choose
    named = registry.bind("cache", {"name": "spa", "profile": "dream-7b", "budget": "adaptive"}, diffucoder)
    assert named["profile"] == "dream-7b"


# ---- a two-backbone campaign ----------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    return {"llada": make_tiny_checkpoint(root / "LLaDA-1.5", "llada"),
            "dream": make_tiny_checkpoint(root / "Dream-v0-Instruct-7B", "dream"),
            "diffucoder": make_tiny_checkpoint(root / "DiffuCoder-7B-Instruct", "diffucoder")}


def two_backbones(checkpoints) -> dict:
    """Tiny LLaDA-1.5 and Dream checkpoints, two exact-match tasks, SPA-Cache without a profile
    and Archer with Dream's K overridden (and one pair's)."""
    return {
        "seed": 0, "device": "cpu", "reference_method": "spa",
        "backbones": {"llada": {"path": str(checkpoints["llada"])},
                      "dream": {"path": str(checkpoints["dream"])}},
        "tasks": {"toy_arith": {"n": 2, "seed": 1000, "gen_length": 8},
                  "toy_code": {"n": 2, "seed": 1000, "gen_length": 8}},
        "methods": {
            "spa": {"sampler": {"name": "llada_confidence", "steps": 4},
                    "cache": {"name": "spa", "rank": 16, "refresh_steps": None}},
            "archer": {"sampler": {"name": "saber"}, "cache": {"name": "archer", "K": 8},
                       "overrides": {"dream": {"cache": {"K": 17}},
                                     "llada/toy_code": {"cache": {"K": 2}}}},
        },
        "resources": {"generate": {"threads": 1}, "score": {"threads": 1}},
    }


def test_campaign_binds_each_backbone_and_applies_overrides(checkpoints):
    c = Campaign(two_backbones(checkpoints))
    assert c.methods["spa"]["cache"]["profile"] == "auto" and c.methods["archer"]["cache"]["K"] == 8
    for task in c.tasks:
        assert c.method("spa", task, "llada")["cache"]["profile"] == "llada-1.5"
        assert c.method("spa", task, "dream")["cache"]["profile"] == "dream-7b"
        assert c.method("archer", task, "dream")["cache"]["K"] == 17
        assert c.method("archer", task, "dream")["name"] == "archer"  # the name stays
    assert c.method("archer", "toy_code", "llada")["cache"]["K"] == 2
    assert c.method("archer", "toy_arith", "llada")["cache"]["K"] == 8
    # everything else is the method as configured
    job = c.method("archer", "toy_arith", "dream")
    assert {**job["cache"], "K": 8} == c.methods["archer"]["cache"]
    assert job["sampler"] == c.methods["archer"]["sampler"]
    assert c.differences("archer") == {"llada/toy_code": "cache.K=2", "dream": "cache.K=17"}


def _planned(stdout: str) -> dict[tuple[str, str, str], dict]:
    """(backbone, task, method) -> the --method of every generate job a dry run printed (-p)."""
    out = {}
    for b, t, method in re.findall(r"--manifest \S*backbones/([^/]+)/manifest\.json "
                                   r"--task-file \S*tasks/(\w+)\.parquet --method '(\{.*?\})'", stdout):
        method = json.loads(method)
        out[(b, t, method["name"])] = method
    return out


def test_generate_jobs_get_each_backbones_parameters(tmp_path, warm_snakemake, write_config, checkpoints):
    path = write_config(two_backbones(checkpoints), tmp_path / "two.yaml")
    planned = _planned(warm_snakemake(tmp_path, "-n", "-p", configfile=path).stdout)
    assert len(planned) == 2 * 2 * 2
    for task in ("toy_arith", "toy_code"):
        assert planned[("llada", task, "spa")]["cache"]["profile"] == "llada-1.5"
        assert planned[("dream", task, "spa")]["cache"]["profile"] == "dream-7b"
        assert planned[("dream", task, "archer")]["cache"]["K"] == 17
    assert planned[("llada", "toy_code", "archer")]["cache"]["K"] == 2
    assert planned[("llada", "toy_arith", "archer")]["cache"]["K"] == 8


def test_changing_an_override_reruns_exactly_its_jobs(tmp_path, warm_snakemake, write_config, checkpoints):
    from concurrent.futures import ThreadPoolExecutor

    config = two_backbones(checkpoints)
    fake_finished_run(tmp_path, write_config(config, tmp_path / "two.yaml"), snakemake=warm_snakemake)
    changes = {
        "dream-K": lambda o: o["dream"]["cache"].update(K=9),
        "pair-K": lambda o: o["llada/toy_code"]["cache"].update(K=4),
        "task-mu": lambda o: o.update({"toy_arith": {"sampler": {"mu": 3}}}),
        # an override equal to the method's own value changes no job's parameters
        "same-K": lambda o: o.update({"llada/toy_arith": {"cache": {"K": 8}}}),
    }

    def rerun(name) -> set[tuple]:  # dry runs only read: side by side
        changed = copy.deepcopy(config)
        changes[name](changed["methods"]["archer"]["overrides"])
        proc = warm_snakemake(tmp_path, "-n", configfile=write_config(changed, tmp_path / f"{name}.yaml"))
        return scheduled(proc.stdout)

    with ThreadPoolExecutor(max_workers=len(changes)) as pool:
        got = dict(zip(changes, pool.map(rerun, changes)))
    # each method is timed in its own job: archer's timing where its parameters changed
    jobs = lambda backbones, tasks: (decoding_jobs(backbones, tasks, ["archer"])  # noqa: E731
                                     | timing_jobs(backbones, tasks, ["archer"]) | REPORT_JOBS)
    assert got["dream-K"] == jobs(["dream"], ["toy_arith", "toy_code"])
    assert got["pair-K"] == jobs(["llada"], ["toy_code"])
    assert got["task-mu"] == jobs(["llada", "dream"], ["toy_arith"])
    assert got["same-K"] == set()


def test_jobs_record_the_parameters_they_decoded_with(tmp_path, warm_snakemake, write_config, checkpoints):
    """A real run of the generate jobs (and the manifests they need): SPA-Cache decodes each
    backbone with its own profile, which the generations' params, the provenance and the
    per-layer budget the cache really applied all show."""
    from dlmpipe.engine.spa import layer_budgets

    config = two_backbones(checkpoints)
    config["tasks"] = {"toy_arith": {"n": 2, "seed": 1000, "gen_length": 8}}
    del config["methods"]["archer"]["overrides"]["llada/toy_code"]
    config["methods"]["spa"]["cache"]["identifier"] = "value"  # no SVD jobs: the profile is what counts
    path = write_config(config, tmp_path / "two.yaml")
    gens = {b: Path("results", "generations", b, "toy_arith", "spa.parquet") for b in ("llada", "dream")}
    warm_snakemake(tmp_path, "--cores", "2", *map(str, gens.values()), configfile=path)
    gens = {b: tmp_path / g for b, g in gens.items()}
    for backbone, profile in (("llada", "llada-1.5"), ("dream", "dream-7b")):
        rows = pq.read_table(gens[backbone]).to_pylist()
        assert len(rows) == 2
        for row in rows:
            params = json.loads(row["params"])
            assert params["cache"]["profile"] == profile and params["cache"]["identifier"] == "value"
            # the budget the cache applied is that profile's rho(l) (2 layers; stats keep 6 digits)
            applied = json.loads(row["stats"])["layer_budget"]
            assert applied == pytest.approx(layer_budgets(2, profile), abs=1e-6)
        provenance = json.loads(gens[backbone].with_suffix(".provenance.json").read_text())
        assert provenance["method"]["cache"]["profile"] == profile
        assert provenance["method"] == {**json.loads(rows[0]["params"]), "name": "spa"}
    assert layer_budgets(2, "llada-1.5") != pytest.approx(layer_budgets(2, "dream-7b"))


def test_a_generate_job_chooses_auto_parameters_itself(tmp_path, checkpoints):
    """Run by hand (no campaign), ``dlmpipe generate`` binds ``auto`` from the manifest's
    checkpoint and records the concrete value."""
    from dlmpipe.backbones.manifest import write_manifest
    from dlmpipe.generate import run_generation_job
    from dlmpipe.tasks.registry import load_task, write_task_table

    write_manifest(checkpoints["llada"], tmp_path / "manifest.json", "llada")
    write_task_table(load_task("toy_arith", n=1), tmp_path / "task.parquet")
    method = {"name": "spa", "gen_length": 8, "sampler": {"name": "llada_confidence"},
              "cache": {"name": "spa", "identifier": "value"}}
    out = tmp_path / "spa.parquet"
    run_generation_job(str(tmp_path / "manifest.json"), str(tmp_path / "task.parquet"), method,
                       str(out), str(tmp_path / "spa.provenance.json"), device="cpu", warmup=False)
    params = json.loads(pq.read_table(out).to_pylist()[0]["params"])
    assert params["cache"]["profile"] == "llada-1.5" and params["cache"]["budget"] == "adaptive"
    provenance = json.loads((tmp_path / "spa.provenance.json").read_text())
    assert provenance["method"]["cache"]["profile"] == "llada-1.5"


# ---- rejections, each naming its key ---------------------------------------------------------
REJECTIONS = [  # (archer's overrides or a change to the campaign, what the message must say)
    ({"drem": {"cache": {"K": 3}}}, "methods.archer.overrides.drem: 'drem' is neither a backbone"),
    ({"llada/nonesuch": {"cache": {"K": 3}}},
     "methods.archer.overrides.llada/nonesuch: unknown task 'nonesuch'"),
    ({"dream": {"cache": {"K": 0}}},
     "methods.archer.overrides.dream.cache.K: 0 is out of range: must be >= 1 or inf"),
    ({"dream": {"cache": {"Kk": 3}}},
     "methods.archer.overrides.dream.cache.Kk: unknown key (allowed here: name, K"),
    ({"dream": {"sampler": {"mu": 0}}}, "methods.archer.overrides.dream.sampler.mu: 0 is out of range: must be > 0"),
    ({"dream": {"cache": {"name": "none"}}},
     "methods.archer.overrides.dream.cache.name: overrides change parameters"),
    ({"dream": {"cach": {"K": 3}}},
     "methods.archer.overrides.dream.cach: unknown key (allowed here: sampler, cache)"),
    ({"dream": {}}, "methods.archer.overrides.dream: {} should be non-empty"),
    ({"a b": {"cache": {"K": 3}}}, "methods.archer.overrides.a b: invalid name"),
    ({"*/*": {"cache": {"K": 3}}}, "methods.archer.overrides.*/*: applies everywhere"),
    ({"dream": {"cache": {"K": 3}}, "dream/*": {"cache": {"K": 4}}},
     "methods.archer.overrides.dream/*: the same backbone and task as methods.archer.overrides.dream"),
    ({"dream": {"cache": {"K": 3}}, "toy_code": {"cache": {"K": 4}}},
     "methods.archer.overrides: dream and toy_code both set cache.K (3 and 4) on dream/toy_code; "
     "set it in methods.archer.overrides.dream/toy_code.cache.K to choose"),
    ({"dream": {"sampler": {"block_length": 3}}},
     "methods.archer.sampler.block_length: 3 does not divide gen_length 8 (method archer on dream, "
     "with methods.archer.overrides.dream, tasks.toy_arith.gen_length)"),
]


@pytest.mark.parametrize("block,named", REJECTIONS,
                         ids=[f"{i}-{r[1].split(':')[0][16:]}" for i, r in enumerate(REJECTIONS)])
def test_bad_overrides_are_rejected_naming_the_key(checkpoints, block, named):
    config = two_backbones(checkpoints)
    config["methods"]["archer"]["overrides"] = block
    with pytest.raises(ConfigError) as err:
        Campaign(config)
    assert named in str(err.value)


def test_conflicts_settled_by_the_pair_and_sweeps_kept_apart(checkpoints):
    config = two_backbones(checkpoints)
    config["methods"]["archer"]["overrides"] = {"dream": {"cache": {"K": 3}}, "toy_code": {"cache": {"K": 4}},
                                                "dream/toy_code": {"cache": {"K": 5}}}
    c = Campaign(config)
    got = [c.method("archer", t, b)["cache"]["K"]
           for b in ("llada", "dream") for t in ("toy_arith", "toy_code")]
    assert got == [8, 4, 3, 5]
    swept = two_backbones(checkpoints)
    swept["methods"]["archer"]["sweep"] = {"cache.K": [1, 8]}
    with pytest.raises(ConfigError, match=r"methods\.archer\.overrides\.dream\.cache\.K: cache\.K is swept"):
        Campaign(swept)
    # an override applies to every point of a sweep of other parameters
    swept["methods"]["archer"]["sweep"] = {"cache.refresh": ["distance", "age"]}
    c = Campaign(swept)
    assert {c.method(m, "toy_arith", "dream")["cache"]["K"] for m in ("archer-refreshdistance",
                                                                      "archer-refreshage")} == {17}
    shown = two_backbones(checkpoints)
    shown["methods"]["archer"]["name"] = "archer-k{cache.K}"
    with pytest.raises(ConfigError, match=r"methods\.archer\.name: template field \{cache\.K\} is "
                                          r"overridden"):
        Campaign(shown)


def test_a_backbone_without_a_profile_must_name_one(checkpoints):
    config = two_backbones(checkpoints)
    config["backbones"]["coder"] = {"path": str(checkpoints["diffucoder"])}
    with pytest.raises(ConfigError) as err:
        Campaign(copy.deepcopy(config))
    assert ("methods.spa.cache.profile: auto: no SPA-Cache profile fits backbones.coder" in str(err.value)
            and "set methods.spa.cache.profile, or methods.spa.overrides.coder.cache.profile for this "
                "backbone" in str(err.value))
    config["methods"]["spa"]["overrides"] = {"coder": {"cache": {"profile": "dream-7b"}}}
    assert Campaign(config).method("spa", "toy_arith", "coder")["cache"]["profile"] == "dream-7b"
