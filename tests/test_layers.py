"""The package's layers (docs/architecture.md), enforced on its import graph.

The graph is read from the source with ast, every import statement counted, those inside
functions too (a lazy import is still a dependency). The test fails on
  - a module of pkg/webgrad that no layer lists (a new module: give it a line in LAYERS and
    in docs/architecture.md),
  - an import from a lower layer to a higher one,
  - an import cycle, other than the op language's knot (tensor -> ops -> primitives ->
    tensor: Tensor's operators are ops, ops bind primitives, primitives return Tensors; the
    primitives package's modules, its registry and op families, are in the knot with it),
  - `from webgrad.x import _name`: another module's private name (make it public, with a
    docstring, where it is needed elsewhere),
each except the edges of EXCEPTIONS, which must still occur (remove a line once its edge is
gone).
"""
from __future__ import annotations

import ast
from fnmatch import fnmatch
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "pkg" / "webgrad"

# bottom-up; a module may import its own layer and those below. Names are relative to
# webgrad ("" is the package itself); "x.*" is every module of package x.
LAYERS = [
    ("data and specs", ["ir", "arrays", "init", "quants", "quants.*", "blocking"]),
    ("file formats", ["io", "io.safetensors", "io.gguf", "io.gpu_dequant", "io.modelcache"]),
    ("the op language", ["tensor", "primitives", "primitives.*", "ops"]),
    ("modules and autodiff", ["module", "nn", "lora", "grad", "optim", "lr"]),
    ("tracing", ["trace", "dce", "precision"]),
    ("lowering", ["codegen", "codegen.*", "buffers", "onnx", "onnx.*"]),
    ("executors", ["backends", "backends.*", "profile"]),
    ("the runtime API", ["compiled", "recovery", "stateful", "bounds", "io.checkpoint",
                         "io.torch_interop"]),
    ("the driver", ["compile"]),
    ("models and the package", ["models", "models.*", "", "browser", "playground"]),
    # models.*: bpe, sampling, decoding (CausalLM), gpt2, gpt2_cache, gpt2_gguf, gpt2_weights,
    # llama, llama_config, llama_weights, llama_gguf
]


# (importer, imported, private name or None): known, temporarily allowed
EXCEPTIONS = {
    # none now; a line here names a known edge, why it is there and what removes it
}


def module_name(path: Path) -> tuple[str, bool]:
    """('codegen.fusion', False) for codegen/fusion.py, ('codegen', True) for its __init__."""
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_pkg else parts), is_pkg


def modules() -> dict[str, tuple[Path, bool]]:
    return {module_name(p)[0]: (p, module_name(p)[1]) for p in sorted(PKG.rglob("*.py"))}


def _within(name: str) -> str | None:
    """'codegen.fusion' for 'webgrad.codegen.fusion', '' for 'webgrad', None outside webgrad."""
    if name == "webgrad":
        return ""
    return name[len("webgrad."):] if name.startswith("webgrad.") else None


def imports(mods) -> list[tuple[str, str, str | None, str]]:
    """(importer, imported module, imported name that is no module or None, 'file:line')."""
    out = []
    for mod, (path, is_pkg) in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(PKG.parent)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                for a in node.names:
                    target = _within(a.name)
                    if target is not None:
                        out.append((mod, target, None, where))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if mod else []
                    if not is_pkg:
                        base = base[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = _within(node.module or "")
                    if target is None:
                        continue
                for a in node.names:
                    sub = f"{target}.{a.name}" if target else a.name
                    if sub in mods:
                        out.append((mod, sub, None, where))
                    else:
                        out.append((mod, target, a.name, where))
    return out


def layer_of(mod: str) -> int | None:
    for k, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch(mod, p) if "*" in p else mod == p for p in patterns):
            return k
    return None


def _allowed(edge) -> bool:
    a, b, name, _ = edge
    return (a, b, name) in EXCEPTIONS or (name is not None and not name.startswith("_")
                                          and (a, b, None) in EXCEPTIONS)


def _cycles(nodes, edges) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    graph = {n: sorted({b for a, b in edges if a == n and b != n}) for n in nodes}
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for n in nodes:
        if n not in index:
            visit(n)
    return out


MODS = modules()
EDGES = imports(MODS)
# the op language: the one allowed cycle (the registry's family modules bind through
# primitives.registry, whose grad rules call ops)
KNOT = {"tensor", "ops", "primitives"} | {m for m in MODS if m.startswith("primitives.")}


def test_every_module_has_a_layer():
    missing = sorted(m for m in MODS if layer_of(m) is None)
    assert not missing, (f"modules in no layer: {missing}; add each to LAYERS here and a line "
                         "to docs/architecture.md")


def test_no_import_goes_up_a_layer():
    bad = list(dict.fromkeys(f"{w}: webgrad.{a} ({LAYERS[layer_of(a)][0]}) imports webgrad.{b} "
                             f"({LAYERS[layer_of(b)][0]})"
                             for a, b, name, w in EDGES
                             if layer_of(a) < layer_of(b) and not _allowed((a, b, name, w))))
    assert not bad, ("imports from a lower layer to a higher one (docs/architecture.md): move "
                     "the code to the layer it belongs to, or pass what it needs in:\n  "
                     + "\n  ".join(bad))


def test_no_cycle_but_the_op_language():
    edges = {(a, b) for a, b, name, w in EDGES if not _allowed((a, b, name, w))}
    cycles = [c for c in _cycles(sorted(MODS), edges) if not set(c) <= KNOT]
    assert not cycles, ("import cycles (only tensor/ops/primitives.* may import each other): "
                        f"{cycles}; move the shared code into the lower module")


def test_no_private_name_from_another_module():
    bad = [f"{w}: webgrad.{a} imports {name} from webgrad.{b}"
           for a, b, name, w in EDGES
           if name is not None and name.startswith("_") and not name.startswith("__")
           and a != b and (a, b, name) not in EXCEPTIONS]
    assert not bad, ("private names imported from another module: make each a public, "
                     "documented name of its module:\n  " + "\n  ".join(bad))


def test_exceptions_still_occur():
    seen = {(a, b, name) for a, b, name, _ in EDGES} | {(a, b, None) for a, b, _, _ in EDGES}
    stale = sorted(set(EXCEPTIONS) - seen, key=str)
    assert not stale, f"EXCEPTIONS lists imports that are gone: {stale}; delete their lines"


def test_the_op_language_knot_is_a_cycle():
    """The one allowed cycle is there and is what the docs say (a change to it is news)."""
    knots = [c for c in _cycles(sorted(MODS), {(a, b) for a, b, _, _ in EDGES}) if set(c) & KNOT]
    assert [set(c) for c in knots] == [KNOT]


def test_the_graph_reader_sees_lazy_and_relative_imports():
    """The reader itself: an import inside a function counts, relative imports resolve."""
    edges = {(a, b, name) for a, b, name, _ in EDGES}
    assert ("backends", "backends.reference", "ReferenceBackend") in edges   # in get_backend
    assert ("codegen.program", "codegen.cost", "group_cost") in edges
    assert ("models.gpt2", "ops", None) in edges                   # from .. import init, ops
    assert ("compiled", "blocking", "run_blocking") in edges
