"""`python3 serve.py` on a machine whose Python lacks jupyterlite: scripts/lab.py's lab_python
makes a private environment (.cache/lab-env) with pyproject's `lab` extra once, says so, and
reuses it; without a network (pip fails) or without Python's venv module it raises LabError
saying what to install by hand. The commands are checked against pyproject.toml read here with
tomllib; a recording stand-in for subprocess.run plays the interpreter, venv and pip."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _lab():
    spec = importlib.util.spec_from_file_location("webgrad_lab_test", REPO / "scripts" / "lab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeRun:
    """subprocess.run for a bare python3 (no lab packages) and a venv whose pip works or not."""

    def __init__(self, root: Path, pip_ok=True, venv_ok=True):
        self.root, self.pip_ok, self.venv_ok = root, pip_ok, venv_ok
        self.calls, self.installed = [], False

    def __call__(self, cmd, **kwargs):
        self.calls.append([str(c) for c in cmd])
        env_python = self.root / ".cache" / "lab-env" / "bin" / "python"
        ok, out = True, ""
        if cmd[1:3] == ["-m", "venv"]:
            ok = self.venv_ok
            if ok:
                env_python.parent.mkdir(parents=True)
                env_python.write_text("")
        elif cmd[1:4] == ["-m", "pip", "install"]:
            ok = self.installed = self.pip_ok
        elif cmd[1] == "-c":  # the version query
            ok = str(cmd[0]) == str(env_python) and self.installed
            out = json.dumps({"jupyterlite-core": "0.8.6", "jupyterlite-pyodide-kernel": "0.8.6"})
        return subprocess.CompletedProcess(cmd, 0 if ok else 1, out if ok else "",
                                           "" if ok else "ERROR: No matching distribution")


@pytest.fixture
def root(tmp_path):
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    return tmp_path


def test_lab_env_is_made_once_then_reused(root):
    lab = _lab()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extra = project["optional-dependencies"]["lab"]
    assert any(r.startswith("jupyterlite-core==") for r in extra)
    said, run = [], FakeRun(root)
    python, versions = lab.lab_python(root, python="/usr/bin/python3", run=run,
                                      say=said.append)
    env = root / ".cache" / "lab-env"
    assert python == str(env / "bin" / "python") and versions["jupyterlite-core"] == "0.8.6"
    commands = [c for c in run.calls if c[1] != "-c"]
    assert commands[0] == ["/usr/bin/python3", "-m", "venv", str(env)]
    assert commands[1][:4] == [python, "-m", "pip", "install"]
    assert commands[1][-len(extra):] == extra
    assert len(commands) == 2
    assert "private environment" in said[0] and " ".join(extra) in said[0] and "ready" in said[-1]
    # the second start reuses it: no venv, no pip, nothing said
    said.clear()
    run.calls.clear()
    assert lab.lab_python(root, python="/usr/bin/python3", run=run, say=said.append)[0] == python
    assert [c for c in run.calls if c[1] != "-c"] == [] and said == []
    # a changed extra installs again into the same environment
    text = (root / "pyproject.toml").read_text()
    assert text.count('"jupyter-server"]') == 1, "the test's edit of the lab extra needs updating"
    text = text.replace('"jupyter-server"]', '"jupyter-server", "comm"]')
    (root / "pyproject.toml").write_text(text)
    run.calls.clear()
    lab.lab_python(root, python="/usr/bin/python3", run=run, say=said.append)
    assert [c[:4] for c in run.calls if c[1] != "-c"] == [[python, "-m", "pip", "install"]]
    assert run.calls[-2][-1] == "comm"


def test_lab_env_without_network_or_venv_says_what_to_install(root):
    lab = _lab()
    with pytest.raises(lab.LabError) as offline:
        lab.lab_python(root, python="/usr/bin/python3", run=FakeRun(root, pip_ok=False),
                       say=lambda text: None)
    message = str(offline.value)
    assert "PyPI reachable" in message and "No matching distribution" in message
    assert '.[lab]' in message and "venv" in message
    assert not (root / ".cache" / "lab-env" / "webgrad-lab.json").exists()  # tried again next time
    shutil.rmtree(root / ".cache")
    with pytest.raises(lab.LabError) as no_venv:
        lab.lab_python(root, python="/usr/bin/python3", run=FakeRun(root, venv_ok=False),
                       say=lambda text: None)
    assert "python3-venv" in str(no_venv.value) and '.[lab]' in str(no_venv.value)


def test_a_python_with_the_lab_extra_is_used_as_it_is(root):
    lab = _lab()
    pytest.importorskip("jupyterlite_core")
    import sys
    python, versions = lab.lab_python(root, say=lambda text: pytest.fail(text))
    assert python == sys.executable and set(versions) == set(lab.LAB_DISTS)
    assert not (root / ".cache").exists()
