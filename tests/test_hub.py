"""Backbones and datasets by Hugging Face Hub name (dlmpipe/hub.py, dlmpipe/campaign/hub.py),
against a stand-in of the Hub's HTTP endpoints (tests/hub_standin.py; no network here):
`dlmpipe fetch` fills the standard cache, resumably, checking the weights' sha256; the campaign
check resolves each revision to its commit and turns a gated or missing repository, a wrong
revision, no network and offline mode into one problem each, naming the key; `plan` sizes a
checkpoint from its config.json alone; afterwards everything is read offline, and the manifest,
the task's table and every generation's provenance name the commits."""
from __future__ import annotations

import json
import os
import re

import pytest

from dlmpipe import hub
from dlmpipe.campaign import Campaign, ConfigError, load_campaign

from .checkpoints import make_tiny_checkpoint
from .hub_standin import HubStandIn, files_of

LLADA = "GSAI-ML/LLaDA-8B-Instruct"
ARITH = "dlmpipe-tests/arith"
#: a dataset card declaring GSM8K's config `main` (which dlmpipe's gsm8k loader asks for)
README = (b"---\nconfigs:\n- config_name: main\n  data_files:\n  - split: test\n"
          b"    path: data/test.jsonl\n---\n# arithmetic in GSM8K's format\n")
QUESTIONS = [{"id": f"a-{i}", "question": f"What is {i} + 1?", "answer": f"{i} plus 1 #### {i + 1}"}
             for i in range(3)]


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """The stand-in serving a tiny LLaDA-format checkpoint as GSAI-ML/LLaDA-8B-Instruct (tag v1)
    and a GSM8K-format dataset (tag v1), with this process's Hugging Face cache in tmp_path
    (huggingface_hub read its settings when imported: they are set here as it would have read
    them, and in the environment for subprocesses)."""
    from huggingface_hub import constants

    server = HubStandIn().start()
    home = tmp_path / "hf"
    for name, value in {"ENDPOINT": server.url, "HF_HUB_CACHE": str(home / "hub"),
                        "HUGGINGFACE_CO_URL_TEMPLATE": server.url + "/{repo_id}/resolve/{revision}/{filename}",
                        "HF_HUB_OFFLINE": False}.items():
        monkeypatch.setattr(constants, name, value)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    server.commits = {
        "model": server.add("model", LLADA, files_of(make_tiny_checkpoint(tmp_path / "ckpt", "llada")),
                            tags=["v1"]),
        "dataset": server.add("dataset", ARITH, {
            "README.md": README,
            "data/test.jsonl": "".join(json.dumps(q) + "\n" for q in QUESTIONS).encode()},
            tags=["v1"])}
    yield server
    server.stop()


def offline(monkeypatch, server: HubStandIn) -> None:
    """No network from here on: the stand-in stopped, HF_HUB_OFFLINE set."""
    from huggingface_hub import constants

    server.stop()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def campaign_config(tiny_config, **backbone) -> dict:
    """The tiny campaign on the Hub checkpoint, with a GSM8K task read from the Hub dataset."""
    tiny_config["backbones"] = {"llada": {"hub": LLADA, "revision": "v1", **backbone}}
    tiny_config["tasks"] = {"gsm8k": {"source": ARITH, "revision": "v1", "gen_length": 8}}
    tiny_config["methods"] = {"llada-confidence": tiny_config["methods"]["llada-confidence"]}
    return tiny_config


def problems(config: dict, **kwargs) -> list[str]:
    try:
        Campaign(config, **kwargs)
    except ConfigError as e:
        return e.problems
    return []


def test_fetch_fills_the_cache_and_everything_is_read_offline_afterwards(
        standin, tiny_config, write_config, tmp_path, monkeypatch, capsys):
    from dlmpipe.cli import main

    config = write_config(campaign_config(tiny_config), tmp_path / "c.yaml")
    campaign = load_campaign([config])  # the check: commits resolved, config.json read alone
    assert campaign.hub_fetches("backbones", "llada") == [
        {"key": "backbones.llada.hub", "repo": LLADA, "kind": "model", "revision": "v1",
         "commit": standin.commits["model"]}]
    assert campaign.task_options("gsm8k")["source"] == f"{ARITH}@{standin.commits['dataset']}"
    assert not [p for p in standin.downloads() if p.endswith(".safetensors")]
    assert main(["fetch", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"backbones.llada.hub: model {LLADA} at revision 'v1' -> commit {standin.commits['model']}, " \
           "3 safetensors sha256 checked" in out
    assert f"tasks.gsm8k.source: dataset {ARITH} at revision 'v1' -> commit " \
           f"{standin.commits['dataset']}" in out
    snapshot = hub.cached(hub.Repo(LLADA, "v1"))
    assert snapshot.folder == campaign.checkpoint_path("llada")
    assert sorted(p.name for p in snapshot.folder.iterdir()) == sorted(
        files_of(tmp_path / "ckpt"))
    offline(monkeypatch, standin)
    requests = len(standin.requests)
    assert load_campaign([config]).checkpoint_path("llada") == snapshot.folder
    assert hub.fetch(hub.Repo(LLADA, standin.commits["model"])).sha256 == snapshot.sha256
    assert len(standin.requests) == requests


def test_a_fetch_resumes_a_broken_download(standin, monkeypatch):
    from huggingface_hub import constants

    # huggingface_hub resumes from the last chunk it wrote (10 MB chunks): smaller ones here,
    # so that the tiny file shows it
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 4096)
    standin.break_once("model-00001-of-00003.safetensors")   # the line drops halfway
    hub.fetch(hub.Repo(LLADA, "v1"))
    ranges = [r for m, p, r in standin.requests if m == "GET"
              and p.endswith("model-00001-of-00003.safetensors")]
    assert len(ranges) == 2 and ranges[0] is None and ranges[1].startswith("bytes="), ranges
    assert int(ranges[1][len("bytes="):-1]) > 0


def test_a_failed_fetch_keeps_what_it_fetched_and_the_next_fetches_the_rest(standin):
    repo = hub.Repo(LLADA, "v1")
    failing = "model-00002-of-00003.safetensors"
    standin.fail_once(failing)    # the Hub answers 500
    start = len(standin.downloads())
    with pytest.raises(hub.HubError, match=r"answered Server error '500 Internal Server Error' "
                                           r"for url .*/model-00002-of-00003.safetensors"):
        hub.fetch(repo)
    assert hub.cached(repo) is None  # incomplete: not a snapshot the jobs would read
    before = len(standin.downloads())
    hub.fetch(repo)
    first, second = ([p.rsplit("/", 1)[1] for p in standin.downloads()[a:b]]
                     for a, b in ((start, before), (before, None)))
    # which other files the first fetch reached before the failure stopped it depends on its
    # download threads' timing (snapshot_download cancels those not yet started; under load,
    # some): the second fetches the failed file and exactly the files the first never got
    assert failing in first and failing in second, (first, second)
    assert not set(second) & (set(first) - {failing}), (first, second)
    assert len(second) == len(set(second)) and set(first) | set(second) == {
        p.name for p in hub.cached(repo).folder.iterdir()}, (first, second)


def test_a_weight_file_whose_sha256_is_not_the_hubs_stops_the_fetch(standin):
    standin.lying["model-00003-of-00003.safetensors"] = "0" * 64
    with pytest.raises(hub.HubError, match=r"model-00003-of-00003.safetensors has sha256 [0-9a-f]{64}, "
                                           r"the Hub records 0{64}: delete .* and fetch again"):
        hub.fetch(hub.Repo(LLADA, "v1"))


def test_each_bad_hub_input_stops_the_check_with_its_own_message(standin, tiny_config, monkeypatch):
    standin.add("model", "GSAI-ML/LLaDA-gated",
                standin.repos[("model", LLADA)].files[standin.commits["model"]], gated=True)
    config = campaign_config(tiny_config)
    config["backbones"] = {
        "gated": {"hub": "GSAI-ML/LLaDA-gated"},
        "missing": {"hub": "GSAI-ML/LLaDA-8B-Instrukt"},
        "wrong": {"hub": LLADA, "revision": "v9"}}
    config["tasks"]["gsm8k"]["revision"] = "v9"
    url = standin.url
    found = problems(config)
    assert found[:4] == [
        f"backbones.gated.hub: GSAI-ML/LLaDA-gated is gated: accept its conditions at "
        f"{url}/GSAI-ML/LLaDA-gated with your account, then log in where dlmpipe fetches it "
        "(`hf auth login`, or HF_TOKEN)",
        f"backbones.missing.hub: no model repository GSAI-ML/LLaDA-8B-Instrukt at {url} (a "
        "misspelt name, or a private repository: log in with a token that can read it)",
        f"backbones.wrong.revision: {LLADA} has no revision 'v9' (a branch, tag or commit of "
        f"{url}/{LLADA})",
        f"tasks.gsm8k.revision: {ARITH} has no revision 'v9' (a branch, tag or commit of "
        f"{url}/datasets/{ARITH})"], found
    cache = hub.cache_dir()
    config = campaign_config(tiny_config)
    standin.stop()  # no network
    assert problems(config)[:2] == [
        f"backbones.llada.hub: model {LLADA} at revision 'v1' is not in the Hugging Face cache "
        f"({cache}) and {url} cannot be reached (ConnectError: [Errno 111] Connection refused): "
        "run `python -m dlmpipe fetch CONFIG` where the network is, with the same HF_HOME",
        f"tasks.gsm8k.source: dataset {ARITH} at revision 'v1' is not in the Hugging Face cache "
        f"({cache}) and {url} cannot be reached (ConnectError: [Errno 111] Connection refused): "
        "run `python -m dlmpipe fetch CONFIG` where the network is, with the same HF_HOME"]
    offline(monkeypatch, standin)
    assert problems(config)[0] == (
        f"backbones.llada.hub: model {LLADA} at revision 'v1' is not in the Hugging Face cache "
        f"({cache}) and HF_HUB_OFFLINE is set: run `python -m dlmpipe fetch CONFIG` where the "
        "network is, with the same HF_HOME (or unset HF_HUB_OFFLINE here)")


def test_a_revision_pins_only_a_hub_name(tiny_config, tmp_path):
    (tmp_path / "q.jsonl").write_text(json.dumps(QUESTIONS[0]) + "\n")
    tiny_config["backbones"]["toy"]["revision"] = "v1"
    tiny_config["tasks"]["gsm8k"] = {"source": str(tmp_path / "q.jsonl"), "revision": "v1",
                                     "gen_length": 8}
    assert problems(tiny_config) == [
        "backbones.toy.revision: pins a `hub:` checkpoint's revision; this backbone names none",
        "tasks.gsm8k.revision: pins a dataset id's revision (a `source` of the form org/name); "
        "this task reads local files"]


def test_plan_sizes_a_hub_checkpoint_from_its_config_json_alone(standin, tiny_config,
                                                               write_config, tmp_path, capsys):
    from dlmpipe.cli import main

    config = write_config(campaign_config(tiny_config), tmp_path / "c.yaml")
    assert main(["plan", str(config)]) == 0
    out = capsys.readouterr().out
    folder = hub.snapshot_folder(hub.Repo(LLADA), standin.commits["model"])
    assert str(folder / "config.json") in out                  # the size's source
    assert [p.rsplit("/", 1)[1] for p in standin.downloads()] == ["config.json"]
    assert re.search(r"fetch_backbone +1\n +fetch_dataset +1\n", out)
    assert f"Hub checkpoints not fetched yet (`python -m dlmpipe fetch CONFIG`, or the workflow's " \
           f"fetch jobs): llada ({LLADA})" in out


def test_a_dataset_id_is_read_offline_at_its_commit_and_the_commit_recorded(
        standin, tiny_config, tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    import datasets

    from dlmpipe.arrow import task_sources
    from dlmpipe.tasks.registry import prepare_task, read_task_table

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    campaign = Campaign(campaign_config(tiny_config))
    hub.fetch_all(campaign.hub_fetches("tasks", "gsm8k"))
    offline(monkeypatch, standin)
    out = tmp_path / "gsm8k.parquet"
    prepare_task("gsm8k", campaign.task_options("gsm8k"), out)
    assert [r["task_id"] for r in read_task_table(out)] == ["a-0", "a-1", "a-2"]
    assert task_sources(out) == {"source": {"repo": ARITH, "commit": standin.commits["dataset"]}}


def test_the_campaign_runs_offline_on_what_fetch_fetched_and_provenance_names_the_commits(
        standin, tiny_config, write_config, tmp_path, monkeypatch, snakemake):
    """The issue's campaign: a GSAI-ML/LLaDA-8B-Instruct-style checkpoint and a dataset id,
    `dlmpipe fetch` from the stand-in, then the workflow's jobs with the network off."""
    pytest.importorskip("datasets")
    from dlmpipe.cli import main

    config = write_config(campaign_config(tiny_config), tmp_path / "c.yaml")
    assert main(["fetch", str(config)]) == 0
    url = standin.url
    standin.stop()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": url, "OMP_NUM_THREADS": "1"}
    generations = "results/generations/llada/gsm8k/llada-confidence"
    snakemake(tmp_path, "--cores", "1", f"{generations}.parquet", configfile=config, env=env)
    provenance = json.loads((tmp_path / f"{generations}.provenance.json").read_text())
    assert provenance["backbone_hub"] == {"repo": LLADA, "revision": "v1",
                                          "commit": standin.commits["model"]}
    assert provenance["task_sources"] == {"source": {"repo": ARITH,
                                                     "commit": standin.commits["dataset"]}}
    manifest = json.loads((tmp_path / "results/backbones/llada/manifest.json").read_text())
    assert manifest["hub"]["commit"] == standin.commits["model"] and len(manifest["hub"]["sha256"]) == 3
