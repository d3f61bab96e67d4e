"""The environment fingerprint (dlmpipe/environment.py): its fields, and an id that changes
exactly when a field does."""
from __future__ import annotations

import os

import pytest
import torch

from dlmpipe.environment import COLUMNS, FIELDS, environment, fingerprint_id, provenance_versions


def test_the_cpu_environment_names_the_machine_and_software_and_no_gpu():
    env = environment("cpu")
    assert tuple(env) == COLUMNS
    assert env["gpu_name"] == env["gpu_driver"] == env["cuda_version"] == ""  # decoding on the CPU
    assert env["cpu_model"] and env["torch_version"] == torch.__version__
    assert env["transformers_version"] and env["dlmpipe_revision"]
    assert env["torch_threads"] == str(torch.get_num_threads())
    assert env["omp_num_threads"] == os.environ.get("OMP_NUM_THREADS", "")
    assert env["fingerprint"] == fingerprint_id(env) and len(env["fingerprint"]) == 12
    assert environment(torch.device("cpu")) == env  # once per process: the same facts
    # provenance names the same versions and revision (one fact, one place)
    versions = provenance_versions()
    assert versions["torch"] == env["torch_version"]
    assert versions["git_revision"] == env["dlmpipe_revision"]


@pytest.mark.parametrize("field", FIELDS)
def test_the_fingerprint_changes_when_a_field_changes(field):
    env = {f: f"value of {f}" for f in FIELDS}
    assert fingerprint_id({**env, field: env[field] + "'"}) != fingerprint_id(env)
    assert fingerprint_id({**env, field: ""}) != fingerprint_id(env)


def test_the_fingerprint_does_not_change_otherwise():
    env = {f: f"value of {f}" for f in FIELDS}
    shuffled = dict(reversed(list(env.items())))
    assert fingerprint_id(shuffled) == fingerprint_id(env)
    # the id itself, or anything outside the fields (a host name), does not enter it
    assert fingerprint_id({**env, "fingerprint": "x", "host": "node7"}) == fingerprint_id(env)
    assert fingerprint_id({**env, "torch_threads": 4}) == fingerprint_id({**env, "torch_threads": "4"})
    assert fingerprint_id({**env, "gpu_name": None}) == fingerprint_id({**env, "gpu_name": ""})


def test_a_gpu_environment_names_the_gpu_driver_and_cuda(monkeypatch):
    """The CUDA branch without a GPU: the GPU's facts fill the three fields and change the id."""
    import dlmpipe.environment as environment_module

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H200")
    monkeypatch.setattr(environment_module, "nvidia_driver", lambda: "550.54.15")
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    environment_module._environment.cache_clear()
    try:
        gpu = environment("cuda:0")
    finally:
        environment_module._environment.cache_clear()
    assert (gpu["gpu_name"], gpu["gpu_driver"], gpu["cuda_version"]) == ("NVIDIA H200", "550.54.15", "12.4")
    cpu = environment("cpu")
    assert {k: v for k, v in gpu.items() if not k.startswith(("gpu", "cuda", "fingerprint"))} == \
        {k: v for k, v in cpu.items() if not k.startswith(("gpu", "cuda", "fingerprint"))}
    assert gpu["fingerprint"] != cpu["fingerprint"]


# ---- the interpreter scripts/setup.sh makes .venv with (scripts/venv-python.sh) ----
def _venv_python(tmp_path, distro: str | None, **env: str) -> str:
    """What scripts/venv-python.sh chooses with DISTRO_PYTHON a stand-in script (``distro``: its
    body; None: no such file) and PYTHON unset unless given."""
    import subprocess
    from pathlib import Path

    from .workflow import REPO

    fake = tmp_path / "distro-python3"
    if distro is not None:
        fake.write_text("#!/bin/sh\n" + distro)
        fake.chmod(0o755)
    environ = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    out = subprocess.run(["bash", str(Path(REPO) / "scripts" / "venv-python.sh")], check=True,
                         capture_output=True, text=True, env={**environ, "DISTRO_PYTHON": str(fake), **env})
    return out.stdout.strip()


def test_setup_prefers_the_distributions_python_where_it_can_make_a_venv(tmp_path):
    import sys

    fake = str(tmp_path / "distro-python3")
    # a 3.10+ interpreter with venv and ensurepip (this one stands in: the suite needs 3.10+)
    assert _venv_python(tmp_path, f'exec {sys.executable} "$@"\n') == fake
    # one that cannot make a venv (Debian without python3-venv), or an older Python, or none
    assert _venv_python(tmp_path, 'exit 1\n') == "python3"
    assert _venv_python(tmp_path, None) == "python3"
    # the user's choice wins
    assert _venv_python(tmp_path, f'exec {sys.executable} "$@"\n', PYTHON="/opt/py/bin/python3") == \
        "/opt/py/bin/python3"


def test_the_repositorys_venv_runs_on_the_interpreter_setup_chooses(tmp_path):
    """Where this suite runs in the .venv that scripts/setup.sh made (make test, CI), that
    venv's interpreter is the one venv-python.sh chooses here (PYTHON's where it is set: setup
    makes a venv of another interpreter again)."""
    import subprocess
    from pathlib import Path

    from .workflow import REPO, skip_unless_in_setup_venv

    venv = skip_unless_in_setup_venv()
    chosen = subprocess.run(["bash", str(Path(REPO) / "scripts" / "venv-python.sh")], check=True,
                            capture_output=True, text=True).stdout.strip()
    # the real file each runs: the venv's python links to its base interpreter's
    real = subprocess.run([chosen, "-c", "import os, sys; print(os.path.realpath(sys.executable))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    assert Path(real) == (venv / "bin" / "python").resolve(), (chosen, real)


# ---- the versions setup installs (scripts/constraints.txt, written by scripts/lock.sh) ----
def _pins() -> dict[str, str]:
    """``{canonical name: version}`` of scripts/constraints.txt."""
    from packaging.utils import canonicalize_name

    from .workflow import REPO

    pins = {}
    for line in (REPO / "scripts" / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def _direct_requirements():
    """dlmpipe's requirements with its ``test`` and ``lm-eval`` extras (what setup installs),
    those whose markers hold here."""
    from packaging.requirements import Requirement

    from .workflow import REPO

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = project["dependencies"] + [r for extra in ("test", "lm-eval")
                                       for r in project["optional-dependencies"][extra]]
    return [r for r in map(Requirement, lines) if r.marker is None or r.marker.evaluate()]


def test_the_pinned_versions_satisfy_pyprojects_requirements():
    """Each of dlmpipe's requirements is pinned (torch aside: setup installs TORCH_SPEC) at a
    version it admits. A pyproject.toml change the pins no longer fit would make setup fail
    (installers refuse contradicting constraints) or leave a new package unpinned: `make lock`
    writes the pins again."""
    from packaging.utils import canonicalize_name

    pins = _pins()
    assert "torch" not in pins and "dlmpipe" not in pins
    unpinned, outside = [], []
    for req in _direct_requirements():
        name = canonicalize_name(req.name)
        if name == "torch":
            continue
        if name not in pins:
            unpinned.append(str(req))
        elif not req.specifier.contains(pins[name], prereleases=True):
            outside.append(f"{req} (pinned {pins[name]})")
    assert not unpinned and not outside, (
        f"scripts/constraints.txt does not fit pyproject.toml: unpinned {unpinned}, outside {outside}; "
        "run `make lock`")


def test_the_repositorys_venv_holds_the_pinned_versions():
    """Where this suite runs in the .venv setup made (make test, CI): every package it pins is
    installed at its pinned version, whichever installer setup used (uv or pip), and each of
    dlmpipe's requirements is installed."""
    from importlib.metadata import distributions

    from packaging.utils import canonicalize_name

    from .workflow import skip_unless_in_setup_venv

    skip_unless_in_setup_venv()
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in distributions()}
    pins = _pins()
    differ = {n: (v, installed[n]) for n, v in pins.items() if n in installed and installed[n] != v}
    assert not differ, f"installed at other versions than pinned (pinned, installed): {differ}"
    missing = [str(r) for r in _direct_requirements() if canonicalize_name(r.name) not in installed]
    assert not missing, missing
