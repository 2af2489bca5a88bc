"""Provision webgrad's browser app: fill ``web/assets/`` (git-ignored) with what the page loads.

serve.py serves the page; this module makes the files it serves exist, on first use and again
whenever a pinned version or a source changes. ``provision(root)`` installs:
   - Pyodide's core from npm (``npm install pyodide@PYODIDE_VERSION`` into ``web/assets/npm``);
   - ONNX Runtime Web from npm (``onnxruntime-web@ORT_VERSION``, beside it): the WebAssembly
     engine of the CPU backend ``wasm`` (webgrad/backends/onnx_runtime.py, worker/ort.mjs);
   - the micropip wheel from PyPI (``pip download``), which the worker loads to install webgrad;
   - the webgrad wheel, zipped here from ``pkg/webgrad`` (rewritten only when its bytes change),
     and wheels of a few pure-Python modules the demos import (pydoc_data, jinja2, markupsafe);
   - the playground's editor and chart (CodeMirror 6 with its Python mode, uPlot) from npm into
     ``web/assets/ui``, bundled by esbuild (also from npm) into one module ``ui/bundle.mjs``;
   - ``web/assets/manifest.json``, which tells the page the wheel file names and the examples.
``provision_lab(root)`` builds the JupyterLite notebook site served at /lab/ (scripts/lab.py).
After provisioning nothing is fetched from the internet. serve.py calls both (``python3
serve.py --provision-only`` runs them and exits); scripts/lab.py and webgrad.browser call
``provision`` before they serve.
"""
from __future__ import annotations

import ast
import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PYODIDE_VERSION = "314.0.7"
MICROPIP_VERSION = "0.11.1"
ORT_VERSION = "1.30.0"
# ONNX Runtime Web's files the worker loads (the WebAssembly-only build, SIMD and threads)
ORT_FILES = ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
# The files without which Pyodide cannot boot; checked after npm install.
PYODIDE_FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip",
                 "pyodide-lock.json")

# The playground's browser libraries (npm), pinned; esbuild bundles web/ui.src.mjs with them.
UI_PACKAGES = {"codemirror": "6.0.2", "@codemirror/lang-python": "6.2.1",
               "@codemirror/language": "6.11.3", "uplot": "1.6.32", "esbuild": "0.28.2"}

class ProvisionError(RuntimeError):
    """A browser asset could not be fetched or built; the message says what to install or fix."""


def layout(root: Path | str = ROOT) -> dict[str, Path]:
    """Where everything lives, relative to the repository root."""
    root = Path(root).resolve()
    assets = root / "web" / "assets"
    return {
        "root": root, "web": root / "web", "worker": root / "worker", "assets": assets,
        "npm": assets / "npm", "pyodide": assets / "npm" / "node_modules" / "pyodide",
        "ort": assets / "npm" / "node_modules" / "onnxruntime-web" / "dist",
        "wheels": assets / "wheels", "manifest": assets / "manifest.json",
        "package": root / "pkg" / "webgrad", "ui": assets / "ui",
        "ui_src": root / "web" / "ui.src.mjs", "examples": root / "examples",
        "models": root / "models",
    }


def project_metadata(root: Path | str = ROOT) -> dict:
    """The ``[project]`` table of pyproject.toml (name, version, description, ...)."""
    with open(Path(root) / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _run(cmd: list[str], what: str, fix: str) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        raise ProvisionError(f"cannot {what}: {cmd[0]!r} is not installed. {fix}") from None
    if done.returncode != 0:
        raise ProvisionError(f"cannot {what}: `{' '.join(cmd)}` exited {done.returncode}.\n"
                             f"{done.stdout[-2000:]}{done.stderr[-2000:]}\n{fix}")


def _provision_npm(package: str, version: str, folder: Path, files: tuple[str, ...]) -> Path:
    """npm-install ``package@version`` with prefix `folder` unless that version is there with
    every one of `files` (paths inside the package); returns the package's folder."""
    where = folder / "node_modules" / package
    pkg_json = where / "package.json"
    have = json.loads(pkg_json.read_text()).get("version") if pkg_json.exists() else None
    if have != version or not all((where / f).exists() for f in files):
        folder.mkdir(parents=True, exist_ok=True)
        npm = shutil.which("npm") or "npm"
        _run([npm, "install", "--prefix", str(folder), "--no-audit", "--no-fund",
              "--loglevel=error", f"{package}@{version}"],
             f"install {package}@{version} from npm",
             "Install Node.js and npm (Debian: apt-get install npm) and make sure the npm "
             f"registry is reachable, or copy a {folder} that has it.")
    missing = [f for f in files if not (where / f).exists()]
    if missing:
        raise ProvisionError(f"{where} lacks {missing}; delete {where} and run serve.py again.")
    return where


def provision_pyodide(paths: dict[str, Path]) -> Path:
    """Install the npm package ``pyodide`` into web/assets/npm unless that version is there."""
    return _provision_npm("pyodide", PYODIDE_VERSION, paths["npm"], PYODIDE_FILES)


def provision_ort(paths: dict[str, Path]) -> Path:
    """Install the npm package ``onnxruntime-web`` into web/assets/npm unless that version is there."""
    _provision_npm("onnxruntime-web", ORT_VERSION, paths["npm"],
                   tuple(f"dist/{f}" for f in ORT_FILES))
    return paths["ort"]


def provision_micropip(paths: dict[str, Path]) -> str:
    """Download the micropip wheel from PyPI into web/assets/wheels unless it is there.

    The wheel is chosen for Pyodide's Python (read from pyodide-lock.json), not this one.
    """
    name = f"micropip-{MICROPIP_VERSION}-py3-none-any.whl"
    if not (paths["wheels"] / name).exists():
        paths["wheels"].mkdir(parents=True, exist_ok=True)
        lock = json.loads((paths["pyodide"] / "pyodide-lock.json").read_text())
        py_version = ".".join(lock["info"]["python"].split(".")[:2])
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
              "--no-deps", "--only-binary=:all:", "--python-version", py_version,
              "-d", str(paths["wheels"]), f"micropip=={MICROPIP_VERSION}"],
             f"download micropip=={MICROPIP_VERSION}",
             "Make sure pip works and PyPI is reachable, or put the wheel there by hand.")
        if not (paths["wheels"] / name).exists():
            raise ProvisionError(f"pip download did not produce {paths['wheels'] / name}")
    return name


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def _zip_wheel(name: str, version: str, files: list[tuple[str, bytes]], metadata: list[str]
               ) -> tuple[str, bytes]:
    """A py3-none-any wheel of `files` (archive name, bytes); deterministic (sorted entries,
    fixed timestamps), so unchanged sources give byte-identical wheels."""
    dist_info = f"{name}-{version}.dist-info"
    files = list(files)
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *metadata]
    files.append((f"{dist_info}/METADATA", ("\n".join(metadata) + "\n").encode()))
    files.append((f"{dist_info}/WHEEL", (
        "Wheel-Version: 1.0\nGenerator: webgrad serve.py\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n").encode()))
    record = "".join(f"{arc},{_record_hash(data)},{len(data)}\n" for arc, data in files)
    files.append((f"{dist_info}/RECORD", (record + f"{dist_info}/RECORD,,\n").encode()))

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for arc, data in files:
            info = zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return f"{name}-{version}-py3-none-any.whl", buf.getvalue()


def _package_files(folder: Path) -> list[tuple[str, bytes]]:
    return [(path.relative_to(folder.parent).as_posix(), path.read_bytes())
            for path in sorted(folder.rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts
            and path.suffix not in (".pyc", ".pyo")]


def wheel_bytes(root: Path | str = ROOT) -> tuple[str, bytes]:
    """Zip pkg/webgrad into a py3-none-any wheel; returns (file name, bytes).

    The zip is deterministic, so ``provision`` can skip rewriting an unchanged wheel.
    """
    paths = layout(root)
    meta = project_metadata(paths["root"])
    files = _package_files(paths["package"]) if paths["package"].is_dir() else []
    metadata = [f"Summary: {meta.get('description', '')}",
                f"Requires-Python: {meta.get('requires-python', '>=3.11')}"]
    metadata += [f"Requires-Dist: {dep}" for dep in meta.get("dependencies", [])]
    return _zip_wheel(meta["name"], meta["version"], files, metadata)


def _write_if_changed(target: Path, data: bytes) -> None:
    if not target.exists() or target.read_bytes() != data:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)


def provision_stdlib_extras(paths: dict[str, Path]) -> dict[str, str]:
    """Wheels of the standard-library modules Pyodide leaves out of its core download and the
    demos use: ``pydoc_data`` (the char-level LM's text), zipped from this CPython's stdlib.
    Returns {module: wheel file}; the worker installs one when code names its module."""
    import pydoc_data
    folder = Path(pydoc_data.__file__).parent
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    name, data = _zip_wheel("pydoc_data", version, _package_files(folder),
                            ["Summary: pydoc_data from the CPython standard library"])
    _write_if_changed(paths["wheels"] / name, data)
    return {"pydoc_data": name, **provision_chat_extras(paths)}


def provision_chat_extras(paths: dict[str, Path]) -> dict[str, str]:
    """jinja2 and markupsafe (pure Python: markupsafe falls back to _native without its C
    speedups), zipped from the Python running serve.py: chat templates (llama.Tokenizer.
    apply_chat_template, the chat page) need them, and the worker cannot reach PyPI. Where
    jinja2 is not installed the chat page says so; install it (pip install jinja2) and rerun."""
    import importlib.metadata
    import importlib.util
    out = {}
    for module in ("jinja2", "markupsafe"):
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            print(f"serve.py: {module} is not installed here, so the chat page cannot render "
                  "chat templates; pip install jinja2 and run serve.py again", file=sys.stderr)
            return {}
        folder = Path(next(iter(spec.submodule_search_locations)))
        files = [(n, b) for n, b in _package_files(folder)
                 if not n.endswith((".so", ".pyd", ".c"))]
        version = importlib.metadata.version(module)
        name, data = _zip_wheel(module, version, files, [f"Summary: {module}, pure Python"])
        _write_if_changed(paths["wheels"] / name, data)
        out[module] = name
    return out


def provision_webgrad(paths: dict[str, Path]) -> str:
    """Write web/assets/wheels/webgrad-*.whl from pkg/webgrad when its contents changed."""
    name, data = wheel_bytes(paths["root"])
    target = paths["wheels"] / name
    if not target.exists() or target.read_bytes() != data:
        for old in paths["wheels"].glob("webgrad-*.whl"):
            old.unlink()
        _write_if_changed(target, data)
    return name


def provision_ui(paths: dict[str, Path]) -> str:
    """npm-install the editor/chart packages into web/assets/ui and bundle them with esbuild.

    Redone only when the pinned versions or web/ui.src.mjs change (a stamp file records both).
    Returns the bundle's URL path under /assets/.
    """
    ui = paths["ui"]
    bundle = ui / "bundle.mjs"
    source = paths["ui_src"].read_bytes()
    stamp = hashlib.sha256(json.dumps(UI_PACKAGES, sort_keys=True).encode() + source).hexdigest()
    stamp_file = ui / "bundle.stamp"
    if bundle.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        return "ui/bundle.mjs"
    ui.mkdir(parents=True, exist_ok=True)
    npm = shutil.which("npm") or "npm"
    installed = True
    for name, version in UI_PACKAGES.items():
        pkg_json = ui / "node_modules" / name / "package.json"
        installed &= pkg_json.exists() and json.loads(pkg_json.read_text())["version"] == version
    if not installed:
        _run([npm, "install", "--prefix", str(ui), "--no-audit", "--no-fund", "--loglevel=error",
              *(f"{name}@{version}" for name, version in UI_PACKAGES.items())],
             "install the playground's editor and chart from npm",
             "Install Node.js and npm (Debian: apt-get install npm) and make sure the npm "
             "registry is reachable.")
    esbuild = ui / "node_modules" / ".bin" / "esbuild"
    tmp = ui / "bundle.tmp.mjs"
    entry = ui / "ui.src.mjs"  # next to node_modules, where esbuild resolves the imports
    entry.write_bytes(source)
    _run([str(esbuild), str(entry), "--bundle", "--format=esm", "--minify",
          "--log-level=error", f"--outfile={tmp}"],
         "bundle web/ui.src.mjs with esbuild", f"Delete {ui} and run serve.py again.")
    shutil.copyfile(ui / "node_modules" / "uplot" / "dist" / "uPlot.min.css", ui / "uPlot.min.css")
    os.replace(tmp, bundle)
    stamp_file.write_text(stamp)
    return "ui/bundle.mjs"


def list_examples(paths: dict[str, Path]) -> list[dict]:
    """examples/*.py with the first line of each docstring, for the playground's menu."""
    out = []
    for path in sorted(paths["examples"].glob("*.py")):
        try:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        except SyntaxError:
            doc = ""
        out.append({"file": path.name, "title": doc.strip().split("\n")[0] or path.stem})
    order = {"mlp_sin.py": 0}  # the first one is what the page opens with
    return sorted(out, key=lambda e: (order.get(e["file"], 1), e["file"]))


def provision(root: Path | str = ROOT) -> dict:
    """Make sure every browser asset exists; returns the manifest (also written to disk)."""
    paths = layout(root)
    provision_pyodide(paths)
    provision_ort(paths)
    manifest = {
        "pyodide_version": PYODIDE_VERSION,
        "ort_version": ORT_VERSION,
        "micropip_wheel": provision_micropip(paths),
        "webgrad_wheel": provision_webgrad(paths),
        "webgrad_version": project_metadata(paths["root"])["version"],
        "ui_bundle": provision_ui(paths),
        "extra_wheels": provision_stdlib_extras(paths),
        "examples": list_examples(paths),
    }
    # Names the worker's cached Pyodide memory snapshot (worker.mjs): it holds the installed
    # wheels' imported modules, so any change to them must make a new one.
    key = hashlib.sha256(PYODIDE_VERSION.encode())
    for wheel in (manifest["micropip_wheel"], manifest["webgrad_wheel"]):
        key.update((paths["wheels"] / wheel).read_bytes())
    manifest["boot_key"] = key.hexdigest()[:20]
    text = json.dumps(manifest, indent=2) + "\n"
    if not paths["manifest"].exists() or paths["manifest"].read_text() != text:
        paths["manifest"].write_text(text)
    return manifest


def load_lab(root: Path | str = ROOT):
    """scripts/lab.py (the JupyterLite site's builder) as a module."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("webgrad_lab", Path(root) / "scripts" / "lab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Why the last provision_lab() built no site (None: it did, or it has not run yet); a visit to
# /lab/ without a site gets a page saying so and what to install. LAB_BUSY: a build is under
# way (the first one may first make the lab extra's private environment, minutes).
LAB_PROBLEM: str | None = None
LAB_BUSY = False
LAB_HOWTO = ("The notebook site is built by scripts/lab.py from jupyterlite-core and "
             "jupyterlite-pyodide-kernel (pyproject's `lab` extra). When the Python running "
             "serve.py lacks them, serve.py installs them once into a private environment, "
             ".cache/lab-env, which needs PyPI and Python's venv module. To install them by "
             "hand instead: `python3 -m venv .venv && .venv/bin/pip install -e \".[lab]\"`, "
             "then start `.venv/bin/python serve.py` (./scripts/test.sh makes that .venv too).")
LAB_BUILDING = ("The notebook site is being built (the first time, serve.py also installs "
                "jupyterlite into .cache/lab-env: a minute or two); its terminal says how far "
                "it got. Reload this page when it says `notebooks: /lab/`.")


def provision_lab(root: Path | str = ROOT) -> Path | None:
    """Build the notebook site served at /lab/ unless it is up to date (scripts/lab.py), in a
    Python that has the lab extra: this one, or the private environment .cache/lab-env that
    lab.lab_python makes on the first run. A failure (no network for that install, no venv
    module) is reported and the playground is served all the same; returns the site, or None."""
    global LAB_PROBLEM, LAB_BUSY
    lab = load_lab(root)
    LAB_BUSY = True
    try:
        site = lab.build_lab(root)
    except lab.LabError as e:
        LAB_PROBLEM = str(e)
        print(f"serve.py: no notebooks at /lab/: {e}", file=sys.stderr)
        return None
    finally:
        LAB_BUSY = False
    LAB_PROBLEM = None
    print(f"notebooks: /lab/ ({site})", flush=True)
    return site

