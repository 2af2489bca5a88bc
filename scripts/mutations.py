"""Plant known bugs in the op semantics and check that the test suite catches each one.

    python3 scripts/mutations.py            # all mutations (a few minutes on 2 cores)
    python3 scripts/mutations.py M1 M8      # some

Each mutation is one text replacement in one file of pkg/webgrad. It is applied to a copy
of pkg/ and tests/ in a temporary directory (the checkout is never touched), then the tests
named beside it run there; the mutation is *caught* when they fail. The run ends with a
table, and a non-zero exit status if any mutation survived or no longer applies (the text
it replaces changed: update it here). docs/reliability-mutations.md lists the results.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# id, what it breaks, file under pkg/webgrad, old text, new text, pytest arguments
MUTATIONS = [
    ("M1", "max_last gradient to the first maximum only (torch.max's rule, not amax's)",
     "primitives.py",
     "    return [O.unsqueeze(g, -1) * hit / O.sum_last(hit, keepdims=True)]",
     "    return [O.unsqueeze(g, -1) * O.one_hot(O.argmax_last(i[0]), i[0].shape[-1])]",
     ["tests/test_ops.py", "-k", "max and reference"]),
    ("M2", "max_last gradient to every tied maximum, undivided",
     "primitives.py",
     "    return [O.unsqueeze(g, -1) * hit / O.sum_last(hit, keepdims=True)]",
     "    return [O.unsqueeze(g, -1) * hit]",
     ["tests/test_ops.py", "-k", "max and reference"]),
    ("M3", "maximum/minimum ties: the first operand takes the whole gradient",
     "primitives.py",
     "        m = win + 0.5 * O.equal(i[0], i[1])",
     "        m = win + 1.0 * O.equal(i[0], i[1])",
     ["tests/test_ops.py", "-k", "imum and reference"]),
    ("M4", "max_pool2d through max (ties share the gradient; torch routes it to one)",
     "ops.py",
     "    out = sum_last(where(one_hot(at, kh * kw), cols, 0.0))",
     "    out = max_last(cols)",
     ["tests/test_ops.py", "-k", "max_pool2d and reference"]),
    ("M5", "mean divides by n + 1",
     "ops.py",
     "def mean_last(x, *, keepdims=False): return sum_last(x, keepdims=keepdims) * (1.0 / x.shape[-1])",
     "def mean_last(x, *, keepdims=False): return sum_last(x, keepdims=keepdims) * (1.0 / (x.shape[-1] + 1))",
     ["tests/test_ops.py", "-k", "mean and reference"]),
    ("M6", "sum's gradient broadcast along the wrong axes (kept axes as 1)",
     "primitives.py",
     "    keep = tuple(1 if k in a[\"axes\"] else d for k, d in enumerate(x.shape))",
     "    keep = tuple(d if k in a[\"axes\"] else 1 for k, d in enumerate(x.shape))",
     ["tests/test_ops.py", "-k", "sum and reference"]),
    ("M7", "WGSL max reductions ignore NaN (plain max)",
     "codegen/reduce.py",
     "    return f\"select(select(max({a}, {b}), {b}, isnan_f({b})), {a}, isnan_f({a}))\"",
     "    return f\"max({a}, {b})\"",
     ["tests/test_webgpu.py", "-k", "test_oracle and special"]),
    ("M8", "WGSL split reductions drop the last partial",
     "codegen/reduce.py",
     "    with em.block(f\"for (var p = 0u; p < {P}u; p++)\"):",
     "    with em.block(f\"for (var p = 0u; p + 1u < {P}u; p++)\"):",
     ["tests/test_semantics.py", "-k", "i32_sums and webgpu"]),
    ("M9", "WGSL argmax keeps the last maximum of a row",
     "codegen/reduce.py",
     "        with em.block(f\"if ({v} > {acc} || (isnan_f({v}) && !isnan_f({acc})))\"):",
     "        with em.block(f\"if ({v} >= {acc} || (isnan_f({v}) && !isnan_f({acc})))\"):",
     ["tests/test_webgpu.py", "-k", "test_oracle and argmax"]),
    ("M10", "less_equal as 1 - greater (1 for NaN)",
     "ops.py",
     "def less_equal(a, b): return less(a, b) + equal(a, b)",
     "def less_equal(a, b): return 1.0 - greater(a, b)",
     ["tests/test_ops.py", "-k", "less_equal and reference"]),
    ("M11", "`<=` bound to less",
     "tensor.py",
     "    def __le__(self, o): return _ops().less_equal(self, o)",
     "    def __le__(self, o): return _ops().less(self, o)",
     ["tests/test_ops.py", "tests/test_semantics.py", "-k", "operator and reference"]),
    ("M12", "WGSL greater as >=",
     "codegen/elementwise.py",
     "    \"greater\": lambda x, y: f\"select(0.0f, 1.0f, {x} > {y})\",",
     "    \"greater\": lambda x, y: f\"select(0.0f, 1.0f, {x} >= {y})\",",
     ["tests/test_webgpu.py", "-k", "test_oracle and greater"]),
    ("M13", "WGSL relu drops NaN (max(x, 0))",
     "codegen/elementwise.py",
     "    \"relu\": lambda x, a: f\"select(max({x}, 0.0f), {x}, isnan_f({x}))\",",
     "    \"relu\": lambda x, a: f\"max({x}, 0.0f)\",",
     ["tests/test_webgpu.py", "-k", "test_oracle and relu"]),
    ("M14", "fed indices not range-checked",
     "bounds.py",
     "        if lo >= 0 and hi < b.n:\n            continue",
     "        if True:\n            continue",
     ["tests/test_semantics.py", "-k", "out_of_range and reference"]),
    ("M15", "WGSL gather wraps negative rows again",
     "codegen/index.py",
     "    ok = em.let(f\"{r} >= 0i && {r} < {rows}i\")\n    row = em.let(f\"u32(clamp({r}, 0i, {max(rows - 1, 0)}i))\")",
     "    ok = \"true\"\n    row = em.let(f\"u32(select({r}, {r} + {rows}i, {r} < 0i))\")",
     ["tests/test_webgpu.py", "-k", "test_oracle and computed_out_of_range"]),
    ("M16", "scatter_add_rows sums each row in placement (atomic) order, not index order",
     "codegen/index.py",
     "        em.emit(f\"{od}[{V + 1}u + a + rank] = j;\")",
     "        em.emit(f\"{od}[{V + 1}u + q] = j;\")",
     ["tests/test_semantics.py", "-k", "50k and webgpu"]),
    ("M17", "sign(NaN) = NaN in the reference (numpy's rule, not torch's)",
     "primitives.py",
     "_unary(\"sign\", lambda np, a, x: np.where(np.isnan(x), np.zeros_like(x), np.sign(x)), None)",
     "_unary(\"sign\", lambda np, a, x: np.sign(x), None)",
     ["tests/test_ops.py", "-k", "sign and reference"]),
]


def run(mutation) -> tuple[str, str]:
    mid, what, rel, old, new, args = mutation
    with tempfile.TemporaryDirectory(prefix=f"webgrad-{mid}-") as tmp:
        tmp = Path(tmp)
        for part in ("pkg", "tests"):
            shutil.copytree(ROOT / part, tmp / part, ignore=shutil.ignore_patterns("__pycache__"))
        for extra in ("pyproject.toml", "pytest.ini", "setup.cfg"):
            if (ROOT / extra).exists():
                shutil.copy(ROOT / extra, tmp / extra)
        target = tmp / "pkg" / "webgrad" / rel
        text = target.read_text()
        if text.count(old) != 1:
            return "STALE", f"the text to replace occurs {text.count(old)} times in {rel}"
        target.write_text(text.replace(old, new))
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                               *args], cwd=tmp, capture_output=True, text=True, timeout=900)
        last = (done.stdout.strip().splitlines() or ["?"])[-1]
        if done.returncode == 1:
            return "caught", last
        if done.returncode == 0:
            return "SURVIVED", last
        return "ERROR", last + "\n" + done.stderr[-2000:]


def main(argv) -> int:
    chosen = [m for m in MUTATIONS if not argv or m[0] in argv]
    bad = 0
    for m in chosen:
        status, detail = run(m)
        bad += status != "caught"
        print(f"{m[0]:4} {status:8} {m[1]}\n     {' '.join(m[5])}: {detail}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
