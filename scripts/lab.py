#!/usr/bin/env python3
"""Build the JupyterLite site that serve.py serves under /lab: notebooks that train on WebGPU.

JupyterLite is Jupyter running entirely in the page: the kernel is Pyodide in a Web Worker
(jupyterlite-pyodide-kernel), so a notebook cell can ``import webgrad`` and train on the tab's
GPU like the playground does. This module builds such a site from pinned PyPI packages
(jupyterlite-core and jupyterlite-pyodide-kernel: pyproject's `lab` extra, which the test extras
include; a Python without them makes itself a private environment with them, .cache/lab-env,
once) and the Pyodide
that serve.py already installed from npm, so that the site works with no internet:

1. ``web/assets/lab/src/static/pyodide``: npm's Pyodide core plus the pure-Python wheels the
   kernel needs from Pyodide's lock (micropip, packaging, ipython and its dependencies, jedi,
   parso), downloaded from PyPI with ``pip download``. npm's package ships none of the lock's
   wheels, and PyPI's wheels are not byte-identical to Pyodide's rebuilt ones, so the lock's
   ``sha256`` of each copied wheel is rewritten to the file's own digest.
2. ``web/assets/lab/src/pypi``: the wheels piplite installs from the site itself -- ``comm``
   (the kernel wants it and Pyodide's lock lacks it) and the webgrad wheel serve.py zipped.
3. ``jupyter lite build`` with the notebooks of ``notebooks/`` as contents, into
   ``web/assets/lab/site`` (served at /lab/), with ``disablePyPIFallback``: nothing is fetched
   from outside the server.

The build is redone only when its inputs change (a stamp of versions, this file, the webgrad
wheel and the notebooks). Everything lives under web/assets/ (git-ignored).

    python3 scripts/lab.py          # build (or check) the site, then exit
    python3 serve.py                # builds (or checks) it too, in the background while the
                                    # playground is served; open http://127.0.0.1:8000/lab/

serve.py serves /lab/ without cross-origin isolation (its NOT_ISOLATED says why).

In a notebook, webgrad's WebGPU backend finds its JS replay loop at /worker/replay.mjs (the
notebooks set ``webgradReplayURL``), which serve.py serves next to the site.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JUPYTERLITE_VERSION = "0.8.6"          # jupyterlite-core and jupyterlite-pyodide-kernel
COMM_VERSION = "0.2.3"
# What the kernel installs at start (piplite.install of each), besides micropip itself.
KERNEL_ROOTS = ("micropip", "packaging", "ipython", "jedi", "parso")
KERNEL_PLUGIN = "@jupyterlite/pyodide-kernel-extension:kernel"


class LabError(RuntimeError):
    """The site could not be built; the message says what to install or fix."""


def lab_paths(root: Path | str = ROOT) -> dict[str, Path]:
    root = Path(root).resolve()
    lab = root / "web" / "assets" / "lab"
    return {"root": root, "lab": lab, "src": lab / "src", "site": lab / "site",
            "downloads": lab / "downloads", "stamp": lab / "site.stamp",
            "notebooks": root / "notebooks",
            "npm_pyodide": root / "web" / "assets" / "npm" / "node_modules" / "pyodide"}


LAB_DISTS = ("jupyterlite-core", "jupyterlite-pyodide-kernel")
# The private environment serve.py makes for the build when its own Python lacks the lab extra
# (plain `python3 serve.py` on a fresh machine): made once, reused while the extra is unchanged.
LAB_ENV = Path(".cache") / "lab-env"
_ENV_MARK = "webgrad-lab.json"
_VERSIONS = ("import importlib.metadata as m, json; "
             f"print(json.dumps({{d: m.version(d) for d in {LAB_DISTS!r}}}))")


def lab_requirements(root: Path | str = ROOT) -> list[str]:
    """pyproject.toml's `lab` extra: what the site's build needs."""
    import tomllib
    project = tomllib.loads((Path(root) / "pyproject.toml").read_text())["project"]
    return list(project["optional-dependencies"]["lab"])


def _versions(python: str = sys.executable, run=subprocess.run) -> dict[str, str] | None:
    """The lab packages' versions in that Python, or None when it lacks one."""
    if python == sys.executable and run is subprocess.run:
        try:
            return {d: importlib.metadata.version(d) for d in LAB_DISTS}
        except importlib.metadata.PackageNotFoundError:
            return None
    done = run([python, "-c", _VERSIONS], capture_output=True, text=True)
    if done.returncode != 0:
        return None
    return json.loads(done.stdout)


def _env_python(env: Path) -> Path:
    return env / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def lab_python(root: Path | str = ROOT, *, python: str = sys.executable, run=subprocess.run,
               say=None) -> tuple[str, dict[str, str]]:
    """A Python that has the lab extra, and its lab packages' versions: ``python`` itself when
    it has them (a .venv made by scripts/test.sh), else the private environment LAB_ENV,
    made (``python -m venv``, then pip install of the extra) on the first call and reused."""
    versions = _versions(python, run)
    if versions is not None:
        return python, versions
    say = say or (lambda text: print(text, flush=True))
    root = Path(root).resolve()
    env = root / LAB_ENV
    env_python = _env_python(env)
    wanted = lab_requirements(root)
    mark = env / _ENV_MARK
    if mark.exists() and env_python.exists() and json.loads(mark.read_text()) == wanted:
        versions = _versions(str(env_python), run)
        if versions is not None:
            return str(env_python), versions
    howto = ("or install them into the Python that runs serve.py: `python3 -m venv .venv && "
             ".venv/bin/pip install -e \".[lab]\"`, then `.venv/bin/python serve.py`")
    say(f"notebooks: {Path(python).name} lacks {', '.join(LAB_DISTS)}; installing the lab extra "
        f"({' '.join(wanted)}) into a private environment, {LAB_ENV} (once; a minute or two)…")
    if not env_python.exists():
        done = run([python, "-m", "venv", str(env)], capture_output=True, text=True)
        if done.returncode != 0:
            raise LabError(
                f"cannot make the environment {LAB_ENV} (`{Path(python).name} -m venv` exited "
                f"{done.returncode}: {(done.stderr or done.stdout).strip()[-500:]}); on "
                f"Debian/Ubuntu `sudo apt install python3-venv` gives Python venv, {howto}")
    mark.unlink(missing_ok=True)
    done = run([str(env_python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                "--timeout", "20", *wanted], capture_output=True, text=True)
    if done.returncode != 0:
        raise LabError(
            f"cannot install the lab extra into {LAB_ENV} (pip exited {done.returncode}; is "
            f"PyPI reachable? {(done.stderr or done.stdout).strip()[-800:]}); run serve.py again "
            f"once online, {howto}")
    versions = _versions(str(env_python), run)
    if versions is None:
        raise LabError(f"pip installed the lab extra into {LAB_ENV}, yet its Python cannot "
                       f"import {' or '.join(LAB_DISTS)}; delete {LAB_ENV} and retry")
    mark.write_text(json.dumps(wanted))
    say(f"notebooks: {LAB_ENV} is ready; building the notebook site…")
    return str(env_python), versions


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        raise LabError(f"cannot {what}: `{' '.join(map(str, cmd))}` exited {done.returncode}.\n"
                       f"{done.stdout[-3000:]}{done.stderr[-3000:]}")


def kernel_packages(lock: dict) -> list[str]:
    """The lock's packages the kernel needs: KERNEL_ROOTS and everything they depend on."""
    packages = {k.lower().replace("_", "-"): k for k in lock["packages"]}
    seen: list[str] = []
    todo = list(KERNEL_ROOTS)
    while todo:
        name = packages.get(todo.pop().lower().replace("_", "-"))
        if name is None or name in seen:
            continue
        seen.append(name)
        todo += lock["packages"][name]["depends"]
    return sorted(seen)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _download(paths: dict[str, Path], requirements: list[str], python: str,
              builder: str = sys.executable) -> None:
    """pip download pure-Python wheels (no dependencies: the lock already resolved them)."""
    paths["downloads"].mkdir(parents=True, exist_ok=True)
    _run([builder, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
          "--no-deps", "--only-binary=:all:", "--python-version", python,
          "-d", str(paths["downloads"]), *requirements],
         "download the notebook kernel's wheels from PyPI (is PyPI reachable?)")


def prepare_pyodide(paths: dict[str, Path], builder: str = sys.executable) -> Path:
    """src/static/pyodide: npm's Pyodide, the kernel's wheels and a lock whose digests match."""
    npm = paths["npm_pyodide"]
    if not (npm / "pyodide-lock.json").exists():
        raise LabError(f"{npm} is missing: run `python3 serve.py --provision-only` first")
    lock = json.loads((npm / "pyodide-lock.json").read_text())
    python = ".".join(lock["info"]["python"].split(".")[:2])
    names = kernel_packages(lock)
    entries = [lock["packages"][n] for n in names]
    for e in entries:
        if not e["file_name"].endswith("-none-any.whl"):
            raise LabError(f"the kernel needs {e['name']} from Pyodide's lock, which is not a "
                           f"pure-Python wheel ({e['file_name']}): it cannot come from PyPI")
    wanted = [f"{e['name']}=={e['version']}" for e in entries] + [f"comm=={COMM_VERSION}"]
    missing = [e["file_name"] for e in entries if not (paths["downloads"] / e["file_name"]).exists()]
    if missing or not list(paths["downloads"].glob("comm-*.whl")):
        _download(paths, wanted, python, builder)
    out = paths["src"] / "static" / "pyodide"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in npm.iterdir():
        if f.is_file() and f.suffix != ".map" and f.name != "pyodide-lock.json":
            shutil.copyfile(f, out / f.name)
    for e in entries:
        wheel = paths["downloads"] / e["file_name"]
        if not wheel.exists():
            raise LabError(f"pip download did not produce {e['file_name']} (PyPI names it "
                           "differently?)")
        shutil.copyfile(wheel, out / wheel.name)
        e["sha256"] = _sha256(wheel)
    (out / "pyodide-lock.json").write_text(json.dumps(lock))
    return out


def _stamp(paths: dict[str, Path], webgrad_wheel: Path, versions: dict) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(versions, sort_keys=True).encode())
    h.update(Path(__file__).read_bytes())
    h.update((paths["npm_pyodide"] / "package.json").read_bytes())
    h.update(webgrad_wheel.name.encode() + webgrad_wheel.read_bytes())
    for nb in sorted(paths["notebooks"].glob("*.ipynb")):
        h.update(nb.name.encode() + nb.read_bytes())
    return h.hexdigest()


def build_lab(root: Path | str = ROOT, webgrad_wheel: Path | None = None, *,
              force: bool = False, say=None) -> Path:
    """Build web/assets/lab/site unless it is up to date; returns the site folder.

    ``webgrad_wheel`` defaults to the one serve.py wrote into web/assets/wheels. The build runs
    in a Python that has the lab extra (lab_python: this one, or a private environment).
    """
    paths = lab_paths(root)
    builder, versions = lab_python(root, say=say)
    if webgrad_wheel is None:
        found = sorted((paths["root"] / "web" / "assets" / "wheels").glob("webgrad-*.whl"))
        if not found:
            raise LabError("no webgrad wheel in web/assets/wheels: run "
                           "`python3 serve.py --provision-only` first")
        webgrad_wheel = found[-1]
    stamp = _stamp(paths, webgrad_wheel, versions)
    if (not force and paths["stamp"].exists() and paths["stamp"].read_text() == stamp
            and (paths["site"] / "index.html").exists()):
        return paths["site"]

    src = paths["src"]
    src.mkdir(parents=True, exist_ok=True)
    prepare_pyodide(paths, builder)
    pypi = src / "pypi"
    if pypi.exists():
        shutil.rmtree(pypi)
    pypi.mkdir()
    shutil.copyfile(webgrad_wheel, pypi / webgrad_wheel.name)
    comm = sorted(paths["downloads"].glob(f"comm-{COMM_VERSION}-*.whl"))
    if not comm:
        raise LabError(f"comm=={COMM_VERSION} was not downloaded")
    shutil.copyfile(comm[0], pypi / comm[0].name)
    (src / "jupyter-lite.json").write_text(json.dumps({
        "jupyter-lite-schema-version": 0,
        "jupyter-config-data": {
            "appName": "webgrad notebooks",
            "exposeAppInBrowser": True,  # window.jupyterapp: the browser test runs cells with it
            "litePluginSettings": {KERNEL_PLUGIN: {"disablePyPIFallback": True}},
        },
    }, indent=2))
    (src / "jupyter_lite_config.json").write_text(json.dumps({
        "LiteBuildConfig": {"no_sourcemaps": True, "no_unused_shared_packages": True},
    }, indent=2))
    if paths["site"].exists():
        shutil.rmtree(paths["site"])
    for state in src.glob(".jupyterlite.doit.db*"):
        state.unlink()  # doit's state would believe the removed site is still there
    _run([builder, "-m", "jupyterlite_core", "build", "--lite-dir", str(src),
          "--output-dir", str(paths["site"]),
          "--contents", str(paths["notebooks"])],
         "build the JupyterLite site (jupyter lite build)", cwd=src)
    config = json.loads((paths["site"] / "jupyter-lite.json").read_text())["jupyter-config-data"]
    kernel = config.get("litePluginSettings", {}).get(KERNEL_PLUGIN, {})
    if not kernel.get("pyodideUrl", "").startswith("./static/pyodide/"):
        raise LabError(f"the built site does not use the local Pyodide: {config}")
    paths["stamp"].write_text(stamp)
    return paths["site"]


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import provisioning  # the webgrad wheel and npm's Pyodide (provisioning.py, beside serve.py)
    try:
        provisioning.provision(ROOT)
    except provisioning.ProvisionError as e:
        print(f"lab.py: {e}", file=sys.stderr)
        return 1
    try:
        site = build_lab(ROOT, force=args.force)
    except LabError as e:
        print(f"lab.py: {e}", file=sys.stderr)
        return 1
    print(f"notebook site: {site} (python3 serve.py, then open /lab/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
