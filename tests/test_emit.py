"""The emitter's index arithmetic (codegen/emit.py): an index made by ravel and read back
through unravel, in the same shape or another one of the same size (a reshape), against
numpy's ravel_multi_index / unravel_index, by evaluating the emitted WGSL lets."""
from __future__ import annotations

import re

import numpy as np
import pytest

from webgrad.codegen.emit import Emitter

CASES = [  # (shape raveled, shape unraveled)
    ((8, 512, 50257), (8, 512, 50257)),
    ((8, 512, 50257), (4096, 50257)),
    ((4096, 50257), (8, 512, 50257)),
    ((8, 12, 512, 64), (8, 12, 32768)),
    ((6, 10), (4, 15)),             # no run of axes lines up: ravel, then unravel
    ((2, 1, 3, 4), (1, 6, 2, 2)),   # size-1 axes on both sides
    ((5, 7), (35,)),
]


def _evaluate(lines, env):
    for line in lines:
        m = re.fullmatch(r"\s*let (\w+) = (.*);", line)
        assert m, line
        env[m[1]] = eval(re.sub(r"(\d+)u\b", r"\1", m[2]).replace("/", "//"), {}, env)
    return env


@pytest.mark.parametrize("src,dst", CASES)
def test_unravel_of_a_raveled_index(src, dst):
    em = Emitter(None, None, None)
    names = [f"d{k}" for k in range(len(src))]
    flat = em.ravel(names, src)
    dims = em.unravel(flat, dst)
    # the same shape: the dims themselves, not one division
    if src == dst:  # the dims themselves, not one division
        assert [d for d, s in zip(dims, src) if s != 1] == [n for n, s in zip(names, src) if s != 1]
        assert not any("/" in ln for ln in em.lines), em.lines
    rng = np.random.default_rng(0)
    for _ in range(20):
        at = [int(rng.integers(0, s)) for s in src]
        env = _evaluate(em.lines, {**dict(zip(names, at))})
        got = [0 if d == "0u" else env[d] for d in dims]
        want = np.unravel_index(np.ravel_multi_index(at, src), dst)
        assert got == [int(w) for w in want], (src, dst, at, em.lines)


def test_a_value_is_its_own_name_by_data_not_by_its_text():
    """let() names a value as it is only where it is a name the emitter made or was told of
    (fresh, declare, the entry point's builtins) or a literal of wgsl.py's helpers: text
    that merely looks like a name or a number still gets a `let`."""
    from webgrad.codegen.wgsl import f32_lit, u32_lit
    em = Emitter(None, None, None)
    em.declare("row")
    made = em.fresh()
    for given in (made, "row", "lid", u32_lit(7), f32_lit(-2.5), f32_lit(0.0)):
        assert em.let(given) == given and em.lines == [], (given, em.lines)
    assert f32_lit(float("inf")) == "bitcast<f32>(wg_pinf_bits)"  # an expression: named
    for text in ("v99", "7u", "(-2.5f)", f32_lit(float("inf"))):
        name = em.let(text)
        assert name != text and em.lines[-1].strip() == f"let {name} = {text};"
