"""The primitive registry stays complete: every rule a primitive needs has a home.

Fails when a primitive in primitives.PRIMS lacks a shape rule, a numpy reference, a torch
lowering or a decision about its derivative, or when the op oracle (tests/oracle.py) has no
record exercising it — and when a public op or nn building block has no oracle record.
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
from webgrad.primitives import PRIMS

# read from the feed or the persistent store by the executor itself: no rules to run
LEAVES = {"input", "param", "state"}
# primitives that are deliberately not differentiable (grad=None); a new op whose grad was
# forgotten is not in this set and fails test_every_primitive_decides_its_gradient
NONDIFF = LEAVES | {"const", "arange", "sign", "less", "greater", "equal", "argmax_last",
                    "one_hot", "rand_uniform", "dequantize"}


def test_every_primitive_has_a_shape_rule_and_reference():
    problems = []
    for name, p in PRIMS.items():
        if not callable(p.shape):
            problems.append(f"{name}: no shape rule (defprim(..., shape=...))")
        if name not in LEAVES and not callable(p.ref):
            problems.append(f"{name}: no numpy reference (defprim(..., ref=...))")
    assert not problems, "primitives.py:\n  " + "\n  ".join(problems)


def test_every_primitive_decides_its_gradient():
    problems = []
    for name, p in PRIMS.items():
        if p.grad is None and name not in NONDIFF:
            problems.append(f"{name}: grad=None but it is not in NONDIFF; write its derivative "
                            "rule in primitives.py, or add it to NONDIFF in tests/test_registry.py "
                            "if it truly has none")
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
