"""The front door tells the truth: README's size and commands, and every file, command and make
target that README and docs/ name exists (so moving or renaming one fails here)."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from .workflow import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TOP = ("dlmpipe/", "docs/", "tests/", "benchmarks/", "scripts/", "configs/", "workflow/",
       "profiles/", "envs/")


def _named_paths(text: str) -> set[str]:
    """Repository paths a page names in backticks or links (templates and globs left out)."""
    found = set(re.findall(r"`([^`\s]+)`", text)) | set(re.findall(r"\]\(([^)\s#]+)\)", text))
    paths = set()
    for p in found:
        p = p.rstrip(".,:;)").split(":")[0]
        if p.startswith(TOP) and not re.search(r"[{}<>*]|\.\.\.|\$", p):
            paths.add(p)
    return paths


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_path_a_page_names_exists(page):
    missing = sorted(p for p in _named_paths(page.read_text())
                     if not (REPO / p).exists() and not (REPO / p.rstrip("/")).exists())
    assert not missing, f"{page.name} names files that do not exist: {missing}"


def test_readme_is_a_front_door():
    readme = (REPO / "README.md").read_text()
    assert len(readme.encode()) <= 10_000, "README.md grew past 10 KB: move the detail to docs/"
    # the two commands, and CI runs the test command README gives
    assert "make campaign" in readme and "make test" in readme
    assert "make test" in (REPO / ".ci" / "run").read_text()
    # the picture it shows exists
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme):
        assert (REPO / image).is_file(), image
    # the running times it states are filled in
    assert not re.search(r"__\w+__", readme)


def test_make_targets_the_pages_name_exist():
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
    for page in DOCS:
        for target in re.findall(r"`make ([\w-]+)", page.read_text()):
            assert target in targets, f"{page.name}: make {target}"


def test_dlmpipe_commands_the_pages_name_exist():
    help_text = subprocess.run([sys.executable, "-m", "dlmpipe", "--help"], capture_output=True,
                               text=True, cwd=REPO, check=True).stdout
    for page in DOCS:
        for command in re.findall(r"python -m dlmpipe ([a-z][\w-]*)", page.read_text()):
            assert re.search(rf"\b{re.escape(command)}\b", help_text), f"{page.name}: dlmpipe {command}"


def test_the_readme_campaign_is_a_valid_campaign(tmp_path, monkeypatch):
    """README's campaign for a real checkpoint validates as `plan` checks it, offline (its Hub
    checkpoint sized by its name)."""
    from huggingface_hub import constants

    from dlmpipe.campaign import Campaign
    from dlmpipe.plan import jobs_per_rule

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    block = re.search(r"```yaml\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)
    config = yaml.safe_load(block)
    campaign = Campaign(config, check_paths=False)
    assert campaign.config["reference_method"] in campaign.methods
    assert {"archer-k4", "archer-k8", "archer-kinf"} <= set(campaign.methods)
    assert jobs_per_rule(campaign)["fetch_backbone"] == jobs_per_rule(campaign)["fetch_dataset"] == 1
