"""The primitive registry stays complete: every rule a primitive needs has a home.

`registry_problems()` is the primitives package's header checklist as code: it fails, naming the op,
when a primitive in primitives.PRIMS lacks a shape rule, a numpy reference, a decision about
its derivative, a cost rule, a lowering that codegen has (an expression rule or a builder
for its kernel kind), a public function in ops.py, a torch or an ONNX lowering — and when an
op codegen's passes create lacks a cost or a lowering. test_the_checker_names_* remove one
piece of one op and check that the checker names it. The op oracle (tests/oracle.py) must
have a record exercising every primitive, and every public op or nn building block.
A snapshot of one tiny graph's printed IR makes pass changes show up as readable diffs.
"""
from __future__ import annotations

import difflib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import oracle
import webgrad as wg
from webgrad import Module, init, nn, ops, optim
from webgrad.primitives import EXPR, LEAF, PRIMS, Cost

# read from the feed or the persistent store by the executor itself: no rules to run
LEAVES = {"input", "param", "state"}
# primitives that are deliberately not differentiable (grad=None); a new op whose grad was
# forgotten is not in this set and fails test_every_primitive_decides_its_gradient
NONDIFF = LEAVES | {"const", "arange", "sign", "less", "greater", "equal", "argmax_last",
                    "one_hot", "rand_uniform", "dequantize"}


OPS_SOURCE = (Path(__file__).resolve().parents[1] / "pkg" / "webgrad" / "ops.py").read_text()


def _lowering_problems(name: str, lowering: str, cost, where: str) -> list[str]:
    from webgrad.codegen import EXPR_RULES, KERNELS
    out = []
    if not (isinstance(cost, Cost) and callable(cost.flops) and isinstance(cost.recompute, int)):
        out.append(f"{name}: no cost rule ({where}: cost=ELEMENT, COSTLY, ... or a Cost; "
                   "codegen/cost.py counts its FLOPs and bytes from it)")
    if lowering == EXPR:
        if name not in EXPR_RULES:
            out.append(f"{name}: lowering 'expr' but codegen has no expression rule for it "
                       f"(@rule({name!r}) in its family's file under codegen/), or give "
                       f"{where} a kernel kind of codegen/program.py's KERNELS")
    elif lowering != LEAF and lowering not in KERNELS:
        out.append(f"{name}: kernel kind {lowering!r} has no builder in codegen/program.py's "
                   f"KERNELS (known kinds: {sorted(KERNELS)})")
    return out


def registry_problems() -> list[str]:
    """One line per missing piece ("op: what is missing (where it goes)"), reading every table
    when called."""
    from webgrad.codegen import CODEGEN_OPS, EXPR_RULES
    from webgrad.onnx import LOWERINGS
    from webgrad.onnx.lower import LEAVES as ONNX_LEAVES
    try:
        from webgrad.backends.torch_backend import TORCH_IMPLS
    except ImportError:  # no torch: test_every_primitive_has_a_torch_lowering says so
        TORCH_IMPLS = None
    problems = []
    for name, p in PRIMS.items():
        if not callable(p.shape):
            problems.append(f"{name}: no shape rule (defprim(..., shape=...))")
        if p.lowering != LEAF and not callable(p.ref):
            problems.append(f"{name}: no numpy reference (defprim(..., ref=...))")
        if (p.grad is None) != (name in NONDIFF) or not (p.grad is None or callable(p.grad)):
            problems.append(f"{name}: its derivative is undecided: grad= a rule, or grad=None "
                            "with the op in NONDIFF (tests/test_registry.py)")
        problems += _lowering_problems(name, p.lowering, p.cost, "its defprim in primitives/")
        if p.lowering == LEAF:
            continue  # bound by tracing (inputs, params, state), filled by each executor
        if f'bind("{name}"' not in OPS_SOURCE:
            problems.append(f"{name}: no public function in ops.py binds it")
        if TORCH_IMPLS is not None and name not in TORCH_IMPLS:
            problems.append(f"{name}: no torch lowering (backends/torch_backend.py TORCH_IMPLS)")
        if name not in LOWERINGS and name not in ONNX_LEAVES:
            problems.append(f"{name}: no ONNX lowering (onnx/lower.py LOWERINGS)")
    for name, (lowering, cost) in CODEGEN_OPS.items():
        problems += _lowering_problems(name, lowering, cost, "its pattern pass's table (attention_"
                                       "match.ATTN_PASS_OPS, rowfuse_match.ROW_PASS_OPS)")
    stale = sorted(set(EXPR_RULES) - set(PRIMS) - set(CODEGEN_OPS))
    problems += [f"{op}: codegen has an expression rule for an op no registry row names"
                 for op in stale]
    return problems


def test_every_primitive_has_every_piece():
    problems = registry_problems()
    assert not problems, ("the registry's checklist (primitives/__init__.py header):\n  "
                          + "\n  ".join(problems))


def _patch(table_name: str, key, attr=None, value=None):
    """(monkeypatch) -> None: takes one piece away from one op."""
    def apply(mp):
        from webgrad import codegen
        from webgrad.onnx import LOWERINGS
        tables = {"PRIMS": PRIMS, "EXPR_RULES": codegen.EXPR_RULES, "KERNELS": codegen.KERNELS,
                  "LOWERINGS": LOWERINGS, "CODEGEN_OPS": codegen.CODEGEN_OPS}
        table = tables[table_name]
        if attr is not None:
            mp.setattr(table[key], attr, value)
        elif value is not None:
            mp.setitem(table, key, value)
        else:
            mp.delitem(table, key)
    return apply


@pytest.mark.parametrize("patch, op, says", [
    (_patch("PRIMS", "erf", "cost", None), "erf", "no cost rule"),
    (_patch("PRIMS", "sum", "cost", None), "sum", "no cost rule"),
    (_patch("CODEGEN_OPS", "attn_out", value=("attention", None)), "attn_out", "no cost rule"),
    (_patch("PRIMS", "sin", "ref", None), "sin", "numpy reference"),
    (_patch("PRIMS", "exp", "grad", None), "exp", "derivative"),
    (_patch("EXPR_RULES", "gather_rows"), "gather_rows", "no expression rule"),
    (_patch("KERNELS", "scatter"), "scatter_add_rows", "KERNELS"),
    (_patch("PRIMS", "matmul", "lowering", "tiles"), "matmul", "KERNELS"),
    (_patch("PRIMS", "fold2d", "lowering", EXPR), "fold2d", "no expression rule"),
    (_patch("LOWERINGS", "where"), "where", "ONNX"),
], ids=["prim-cost", "kernel-cost", "pass-op-cost", "ref", "grad", "expr-rule",
        "kernel-builder", "unknown-kind", "kernel-as-expr", "onnx"])
def test_the_checker_names_a_missing_piece(monkeypatch, patch, op, says):
    assert not registry_problems()
    patch(monkeypatch)
    named = [line for line in registry_problems() if line.startswith(f"{op}:")]
    assert named and all(says in line for line in named), registry_problems()


def test_a_new_row_alone_is_named_with_every_missing_piece(monkeypatch):
    """A kernel op given only its registry row (shape, ref, grad, a new kernel kind, no
    cost): the checker lists each piece still to write, by file."""
    from webgrad.primitives import Prim
    monkeypatch.setitem(PRIMS, "cumsum_last", Prim(
        "cumsum_last", "reduce", shape=lambda ins, a: (ins[0].shape, "f32"),
        ref=lambda np, a, x: np.cumsum(x, axis=-1), grad=lambda g, i, o, a: [g],
        lowering="scan"))
    named = [line for line in registry_problems() if line.startswith("cumsum_last:")]
    for piece in ("no cost rule", "'scan' has no builder", "ops.py", "ONNX"):
        assert any(piece in line for line in named), (piece, named)


def test_the_checker_names_a_missing_torch_lowering(monkeypatch):
    pytest.importorskip("torch")
    from webgrad.backends.torch_backend import TORCH_IMPLS
    monkeypatch.delitem(TORCH_IMPLS, "fold2d")
    assert registry_problems() == [
        "fold2d: no torch lowering (backends/torch_backend.py TORCH_IMPLS)"]


def test_an_op_without_a_cost_rule_is_refused_not_counted(monkeypatch):
    """The cost model refuses an op with no rule (it used to count 1 FLOP an element)."""
    from webgrad.codegen import Limits, lower
    from webgrad.compile import build_train_graph, parse_inputs

    class Empty(Module):
        pass

    g = build_train_graph(Empty, lambda m, inp: ops.sum_all(ops.erf(inp["x"])),
                          parse_inputs({"x": ([4, 8], "f32")}), None)[1]
    low = lower(g, Limits())[0]
    assert sum(k["flops"] for k in low.kernels) > 0
    monkeypatch.setattr(PRIMS["erf"], "cost", None)
    with pytest.raises(ValueError, match=r"'erf' has no cost rule.*primitives/"):
        lower(g, Limits())


def test_fusion_classes_are_the_rows_fields():
    """The sets fusion and the cost model test against hold what the rows say (and the
    passes' own ops); pad is free (no FLOPs) yet costs its bounds test when recomputed."""
    from webgrad.codegen import kinds
    assert kinds.KERNEL_OPS == ({n for n, p in PRIMS.items() if p.kernel}
                                | {n for n, (low, _) in kinds.CODEGEN_OPS.items() if low != EXPR})
    assert kinds.LEAF_OPS == {"input", "param", "state"}
    assert kinds.VIEW_OPS == {n for n, p in PRIMS.items() if p.cost.view}
    assert {n for n, p in PRIMS.items() if p.cost.free} >= kinds.VIEW_OPS | kinds.LEAF_OPS
    assert kinds.cost_of("pad").free and kinds.cost_of("pad").recompute == 1
    assert not kinds.cost_of("exp").free and kinds.cost_of("exp").recompute == 4


def test_every_primitive_has_a_shape_rule_and_reference():
    problems = []
    for name, p in PRIMS.items():
        if not callable(p.shape):
            problems.append(f"{name}: no shape rule (defprim(..., shape=...))")
        if name not in LEAVES and not callable(p.ref):
            problems.append(f"{name}: no numpy reference (defprim(..., ref=...))")
    assert not problems, "primitives/:\n  " + "\n  ".join(problems)


def test_every_primitive_decides_its_gradient():
    problems = []
    for name, p in PRIMS.items():
        if p.grad is None and name not in NONDIFF:
            problems.append(f"{name}: grad=None but it is not in NONDIFF; write its derivative "
                            "rule in its family's module under primitives/, or add it to NONDIFF "
                            "in tests/test_registry.py if it truly has none")
        if p.grad is not None and (name in NONDIFF or not callable(p.grad)):
            problems.append(f"{name}: has a grad rule but NONDIFF lists it (or it is not callable)")
    assert not problems, "\n".join(problems)


def test_every_primitive_has_a_torch_lowering():
    pytest.importorskip("torch")
    from webgrad.backends.torch_backend import TORCH_IMPLS
    missing = sorted(set(PRIMS) - LEAVES - set(TORCH_IMPLS))
    assert not missing, (f"backends/torch_backend.py: TORCH_IMPLS has no lowering for {missing}")
    stale = sorted(set(TORCH_IMPLS) - set(PRIMS))
    assert not stale, f"backends/torch_backend.py: TORCH_IMPLS has ops that are not primitives: {stale}"


def test_every_primitive_has_an_onnx_lowering():
    # leaves become the model's inputs or initializers; every other op needs a rule
    from webgrad.onnx import LOWERINGS
    from webgrad.onnx.lower import LEAVES as ONNX_LEAVES
    missing = sorted(set(PRIMS) - set(ONNX_LEAVES) - set(LOWERINGS))
    assert not missing, f"webgrad/onnx/lower.py: LOWERINGS has no lowering for {missing}"
    stale = sorted(set(LOWERINGS) - set(PRIMS))
    assert not stale, f"webgrad/onnx/lower.py: LOWERINGS has ops that are not primitives: {stale}"


def test_every_primitive_has_a_wgsl_lowering():
    # codegen/ registers one emit rule per op; a primitive without one cannot run on WebGPU
    from webgrad.codegen import LOWERED_OPS
    missing = sorted(set(PRIMS) - set(LOWERED_OPS))
    assert not missing, f"codegen/: no WGSL lowering for {missing}"


def test_oracle_exercises_every_primitive():
    seen: dict[str, list[str]] = {}
    for record in oracle.RECORDS:
        c, _ = oracle.compile_record(record, "reference")
        for node in c.ir.nodes:
            seen.setdefault(node.op, []).append(record.name)
        c.destroy()
    missing = sorted(set(PRIMS) - LEAVES - set(seen))
    assert not missing, (f"no record in tests/oracle.py produces the primitives {missing} in its "
                         "compiled graph; add a record (rec(...)) that uses them")


def _public(module, module_name):
    return {n for n, v in vars(module).items() if not n.startswith("_") and callable(v)
            and getattr(v, "__module__", None) == module_name}


def test_oracle_covers_every_public_op():
    used = set()
    for r in oracle.RECORDS:
        used |= {f"ops.{m}" for m in re.findall(r"\bops\.(\w+)", r.wg_src)}
        used |= {f"nn.{m}" for m in re.findall(r"\bnn\.(\w+)", r.wg_src)}
    public = ({f"ops.{n}" for n in _public(ops, "webgrad.ops")}
              | {f"nn.{n}" for n in _public(nn, "webgrad.nn")})
    missing = sorted(public - used)
    assert not missing, f"public ops with no record in tests/oracle.py: {missing}"


# ---------------------------------------------------------------- IR snapshot

IR_SNAPSHOT = """\
%0: f32[3,2] = param {name='W'}
%1: f32[2] = param {name='b'}
%2: f32[] = state {name='step'}
%3: f32[4,3] = input {name='x'}
%4: f32[4,2] = matmul %3, %0
%5: f32[4,2] = add %4, %1
%6: f32[4,2] = relu %5
%7: f32[] = sum %6 {axes=(0, 1)}
%8: f32[] = const {value=0.125}
%9: f32[] = mul %7, %8
%10: f32[] = const {value=1}
%11: f32[] = mul %10, %8
%12: f32[1,1] = reshape %11 {shape=(1, 1)}
%13: f32[4,2] = broadcast_to %12 {shape=(4, 2)}
%14: f32[] = const {value=0}
%15: f32[4,2] = greater %5, %14
%16: f32[4,2] = mul %13, %15
%17: f32[2] = sum %16 {axes=(0,)}
%18: f32[3,4] = transpose %3 {perm=(1, 0)}
%19: f32[3,2] = matmul %18, %16
%20: f32[] = const {value=0.1}
%21: f32[3,2] = mul %20, %19
%22: f32[3,2] = sub %0, %21
%23: f32[2] = mul %20, %17
%24: f32[2] = sub %1, %23
%25: f32[] = add %2, %10
output loss = %9
writeback grad/W <- %19
writeback grad/b <- %17
writeback W <- %22
writeback b <- %24
writeback step <- %25"""


def test_ir_snapshot():
    """relu(x @ W + b), mean loss, SGD: the whole compiled step as text. When a pass change
    alters it on purpose, check the diff reads right and paste the new text above."""
    class Tiny(Module):
        def __init__(self):
            super().__init__()
            self.W = self.param([3, 2], init=init.literal([[0.1, -0.2], [0.3, 0.4], [-0.5, 0.6]]))
            self.b = self.param([2], init="zeros")

    def loss_fn(m, inp):
        return ops.mean_all(ops.relu(inp["x"] @ m.W + m.b))

    c = wg.compile_module(Tiny, loss_fn, inputs={"x": ([4, 3], "f32")},
                          optimizer=optim.SGD(lr=0.1), backend="reference")
    got = str(c.ir)
    if got != IR_SNAPSHOT:
        diff = "\n".join(difflib.unified_diff(IR_SNAPSHOT.splitlines(), got.splitlines(),
                                              "snapshot", "now", lineterm=""))
        pytest.fail(f"the printed IR changed (tests/test_registry.py IR_SNAPSHOT):\n{diff}")


def test_oracle_webgrad_side_needs_neither_numpy_nor_torch():
    """The browser suite runs the records' webgrad half in Pyodide: importing the table and
    tracing every record must work with numpy and torch absent."""
    tests = Path(__file__).resolve().parent
    code = (
        "import sys; sys.modules['numpy'] = None; sys.modules['torch'] = None\n"
        f"sys.path[:0] = [{str(tests.parent / 'pkg')!r}, {str(tests)!r}]\n"
        "import oracle\n"
        "from webgrad.compile import build_train_graph, parse_inputs\n"
        "for r in oracle.RECORDS:\n"
        "    factory, loss_fn, inputs, feed = oracle.build_record(r)\n"
        "    build_train_graph(factory, loss_fn, parse_inputs(inputs), None)\n"
        "print(len(oracle.RECORDS))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) == len(oracle.RECORDS)
