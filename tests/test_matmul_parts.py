"""The tiled matmul kernel's parts (codegen/matmul_tiled.py, matmul_epilogue.py), each
against an independent emulation: the index arithmetic they emit is evaluated for every
thread and compared with numpy's view of the same tile, and the epilogue's prefetching
form is evaluated against numpy and against the unsplit function. Device-free: the WGSL
lets, selects and stores these parts emit are evaluated here in Python (u32 literals as
ints, `/` as floor division)."""
from __future__ import annotations

import math
import re
from types import SimpleNamespace

import numpy as np
import pytest

import webgrad.codegen  # noqa: F401  (registers the expression rules)
from webgrad.codegen.emit import Emitter, Epilogue, Idx, Storage
from webgrad.codegen.layout import batch_base
from webgrad.codegen.matmul_config import Config, tile_of
from webgrad.codegen.matmul_epilogue import epilogue_loads, prefetch_epilogue
from webgrad.codegen.matmul_tiled import (Read, global_read, load_modes, thread_offsets,
                                          tile_elements, tile_order, vec_axis)
from webgrad.codegen.wgsl import Kernel, Limits
from webgrad.ir import Graph


def _select(f, t, c):
    return t if c else f


def ev(expr: str, env: dict):
    """A WGSL expression of these kernels' index arithmetic and values, in Python."""
    py = re.sub(r"\b(\d+)u\b", r"\1", expr).replace("/", "//").replace("&&", " and ")
    py = py.replace("vec4<f32>(0.0f)", "ZERO4").replace("0.0f", "0.0")
    return eval(py, {"select": _select, "min": min, "ZERO4": np.zeros(4), "exp": math.exp,
                     "isnan_f": math.isnan}, env)


def run_lines(lines, env):
    """Evaluate `let` and store lines in order (into env)."""
    for line in lines:
        line = line.strip()
        if m := re.fullmatch(r"let (\w+) = (.*);", line):
            env[m[1]] = ev(m[2], env)
        elif m := re.fullmatch(r"(\w+)\[(.*)\] = (.*);", line):
            env[m[1]][ev(m[2], env)] = ev(m[3], env)
        else:
            raise AssertionError(f"not a let or a store: {line!r}")
    return env


# ---------------------------------------------------------------- a thread's rows and columns

@pytest.mark.parametrize("T,vec,W", [(1, False, 16), (2, False, 8), (4, True, 16), (8, True, 16),
                                     (8, False, 4), (16, True, 8), (8, True, 8)])
def test_thread_offsets_cover_the_tile_once(T, vec, W):
    """Thread t's rows are m0 + offsets with m0 = t * (4 if vec else T) (build_tiled): over
    the W threads of an axis they are the tile's W*T rows, each once; with vec, 4-wide
    groups of adjacent rows (one vec4 of the staged tile)."""
    offs = thread_offsets(T, vec, W)
    v = vec and T >= 4
    rows = np.array([t * (4 if v else T) + o for t in range(W) for o in offs])
    assert np.array_equal(np.sort(rows), np.arange(W * T))
    if v:
        assert all(offs[i + 1] - offs[i] == 1 for i in range(len(offs)) if i % 4 != 3)


# ---------------------------------------------------------------- the tile order

@pytest.mark.parametrize("tiles_m,tiles_n,group", [(5, 7, 0), (5, 7, 2), (6, 4, 3), (7, 1, 4),
                                                   (3, 9, 8), (1, 5, 2)])
def test_tile_order_is_a_permutation_in_runs(tiles_m, tiles_n, group):
    """tile_order's lines map the workgroups 0..tiles_m*tiles_n-1 onto every tile once; in
    runs of G tile rows the first G*tiles_n workgroups take only the first G rows, a
    column at a time (tm changes fastest)."""
    got = []
    for w in range(tiles_m * tiles_n):
        env = run_lines(tile_order(tiles_m, tiles_n, group), {"w": w})
        got.append((env["tm"], env["tn"]))
    assert sorted(got) == [(m, n) for m in range(tiles_m) for n in range(tiles_n)]
    G = min(group, tiles_m)
    if G > 1 and tiles_n > 1:
        first = got[:G * tiles_n]
        assert {m for m, _ in first} == set(range(G))
        assert [n for _, n in first] == sorted(n for _, n in first)  # column by column
    else:
        assert got == [(w // tiles_n, w % tiles_n) for w in range(tiles_m * tiles_n)]


# ---------------------------------------------------------------- the staged tile's elements

@pytest.mark.parametrize("rows,BK,NT,s_row,s_col,mode", [
    (64, 8, 64, 1, 64, None),      # x has stride 1: x fastest
    (64, 8, 64, 32, 1, None),      # k has stride 1
    (128, 16, 256, 1, 128, "x"),
    (128, 8, 256, 8, 1, "k"),
    (16, 16, 16, 16, 1, "k"),
    (32, 8, 64, 5, 7, None),       # neither stride 1: the smaller one fastest
])
def test_tile_elements_cover_the_tile_once(rows, BK, NT, s_row, s_col, mode):
    """Every (x, k) of a rows x BK tile is one thread's, once (a vec4 element covers 4
    along its axis); consecutive threads take consecutive elements along the axis of the
    smaller stride (coalesced global reads)."""
    count = np.zeros((rows, BK), int)
    first = []
    for lid in range(NT):
        for r, (_, xl, _, kl) in enumerate(tile_elements("a", rows, BK, NT, s_row, s_col, mode)):
            x, k = ev(xl, {"lid": lid}), ev(kl, {"lid": lid})
            if r == 0:
                first.append((x, k))
            for j in range(4 if mode else 1):
                count[x + j * (mode == "x"), k + j * (mode == "k")] += 1
    assert (count == 1).all()
    along_x = mode == "x" or (mode is None and (s_row == 1 or (s_col != 1 and s_row <= s_col)))
    fast = [x if along_x else k for x, k in first]
    assert fast[1] - fast[0] == (4 if mode else 1)


def _digits_addr_np(dims, idx):
    """Address of index tuple idx of a strided view (per axis (size, stride) digits)."""
    at = 0
    for digits, i in zip(dims, idx):
        for c, st in reversed(digits):
            at += (i % c) * st
            i //= c
    return at


VIEWS = [  # (dims of [x, k], offset) of an operand: row-major, transposed, merged digits
    ([[(12, 20)], [(20, 1)]], 0),
    ([[(12, 1)], [(20, 12)]], 4),
    ([[(3, 80), (4, 20)], [(20, 1)]], 8),
    ([[(12, 24)], [(5, 1), (4, 5)]], 0),
    ([[(12, 1)], [(18, 12)]], 3),
]


@pytest.mark.parametrize("dims,off", VIEWS)
def test_vec_axis_only_where_four_floats_are_one_aligned_vec4(dims, off):
    """Where vec_axis picks an axis, every aligned run of 4 along it is 4 consecutive
    addresses from a multiple of 4 (brute force over the view); row-major and transposed
    operands of multiples of 4 get their stride-1 axis."""
    X, K = (math.prod(c for c, _ in d) for d in dims)
    got = vec_axis(dims, off, X, K, rows=16, BK=8, NT=16)
    if got is not None:
        ax = 0 if got == "x" else 1
        for x in range(X):
            for k in range(K):
                i = (x, k)
                if i[ax] % 4:
                    continue
                run = [off + _digits_addr_np(dims, (x + j * (ax == 0), k + j * (ax == 1)))
                       for j in range(4)]
                assert run == list(range(run[0], run[0] + 4)) and run[0] % 4 == 0, (i, run)
    want = {0: "k", 1: "x", 2: "k", 3: None, 4: None}[VIEWS.index((dims, off))]
    assert got == want
    assert vec_axis(dims, off, X, K, rows=16, BK=8, NT=64) is None  # 32 vec4s, 64 threads


def test_load_modes_one_buffer_one_element_type():
    """An operand pair on one buffer is read both as vec4 or neither (one binding)."""
    A = Storage(0, 0, "f32", 4 * 2048, "a")
    opa = (A, 0, [[(64, 32)], [(32, 1)]], (64, 32))            # k has stride 1: vec4 along k
    opb_same = (A, 0, [[(32, 6)], [(6, 1)]], (32, 6))          # rows of 6: no vec4
    opb_other = (Storage(1, 0, "f32", 4 * 192, "b"),) + opb_same[1:]
    cfg = Config(2, 2, 8, wx=4, wy=4, vload=True)
    t = tile_of(cfg, 16384)
    assert load_modes(cfg, t, opa, opb_other) == ("k", None)
    assert load_modes(cfg, t, opa, opb_same) == (None, None)
    assert load_modes(Config(2, 2, 8, wx=4, wy=4), t, opa, opb_other) == (None, None)


@pytest.mark.parametrize("dims,off", VIEWS[:3])
@pytest.mark.parametrize("vec", [False, True])
def test_global_reads_stage_the_operands_tile(dims, off, vec):
    """A workgroup's reads (tile_elements + global_read) at an overhanging tile origin give
    numpy's tile of the operand, zero outside it (emulated for every thread), for the
    element-wise and the vec4 reads vec_axis allows."""
    X, K = (math.prod(c for c, _ in d) for d in dims)
    rows, BK, NT = 8, 8, 16
    buf = np.arange(off + 400, dtype=np.float64) + 0.5
    dense = np.array([[buf[off + _digits_addr_np(dims, (x, k))] for k in range(K)] for x in range(X)])
    mode = vec_axis(dims, off, X, K, rows, BK, NT) if vec else None
    assert mode is not None or not vec  # VIEWS[:3] each have a vec4 axis

    def load(at):
        return f"LD({at})"
    def vec4(a):  # a vec4 read: 16-byte aligned, or the kernel's `>> 2u` would be wrong
        assert a % 4 == 0, a
        return buf[a:a + 4].copy()
    env = {"LD": vec4 if mode else (lambda a: buf[a])}
    stride = [dims[0][-1][1], dims[1][-1][1]]
    for row0, k0 in [(0, 0), (8, 16)]:  # the second overhangs both X = 12 and K = 20
        tile = np.full((rows, BK), np.nan)
        for lid in range(NT):
            for xn, xl, kn, kl in tile_elements("a", rows, BK, NT, stride[0], stride[1], mode):
                e = {**env, "lid": lid, "row0": row0, "k0": k0}
                e[xn], e[kn] = ev(xl, e), ev(kl, e)
                rd = Read(load, f"{off}u", xn, kn, mode, dims[0], dims[1], True, X, "row0",
                          "As", rows + 4, False)
                v = np.atleast_1d(ev(global_read(rd, "k0", K, True), e))
                for j, val in enumerate(v):
                    tile[e[xn] + j * (mode == "x"), e[kn] + j * (mode == "k")] = val
        want = np.zeros((rows, BK))
        part = dense[row0:row0 + rows, k0:k0 + BK]
        want[:part.shape[0], :part.shape[1]] = part
        np.testing.assert_array_equal(tile, want)


def test_batch_base_addresses_a_broadcast_batch():
    """batch_base: the address of an operand's batch element, stride 0 on a broadcast axis
    (an operand of batch [1, 3] in C's batch [2, 3])."""
    em = Emitter(None, None, None)
    dims = [[(1, 0)], [(3, 40)], [(5, 8)], [(8, 1)]]
    base = batch_base(em, (2, 3), ["b0", "b1"], 4, dims, (1, 3, 5, 8))
    for b0 in range(2):
        for b1 in range(3):
            env = run_lines(em.lines, {"b0": b0, "b1": b1})
            assert ev(base, env) == 4 + 40 * b1


# ---------------------------------------------------------------- the epilogue's loads first

def _epilogue(outs):
    """The epilogue fn epi(f, v) of `outs` over a [4, 8] output whose main value is v:
    {name: (op, inputs)} over the inputs pre [4, 8] and bias [8]; returns (kernel,
    Epilogue, store buffer ids)."""
    g = Graph()
    ids = {"pre": g.add("input", [], (4, 8), "f32", {"name": "pre"}),
           "bias": g.add("input", [], (8,), "f32", {"name": "bias"}),
           "v": g.add("input", [], (4, 8), "f32", {"name": "main"})}
    for name, (op, args) in outs.items():
        ids[name] = g.add(op, [ids[a] for a in args], (4, 8), "f32")
    st = {ids["pre"]: Storage(0, 0, "f32", 128, "pre"), ids["bias"]: Storage(1, 0, "f32", 32, "bias")}
    final = [n for n in outs if n.startswith("out")]
    for k, n in enumerate(final):
        st[ids[n]] = Storage(2 + k, 16 * k, "f32", 256, n)
    kernel = Kernel(Limits(), "t")
    em = Emitter(kernel, g, st.get, compute={ids[n] for n in final})
    em.bound[ids["v"]] = ("f", "v")
    vals = [em.value(ids[n], Idx((4, 8), flat="f")) for n in final]
    for n, val in zip(final, vals):
        em.store(st[ids[n]], "f", val)
    epi = Epilogue("epi", "f: u32", "f32", tuple(em.stmts), "f", len(kernel.functions))
    kernel.functions.append(epi.function())
    return kernel, epi, [2 + k for k in range(len(final))]


def _body(fn: str) -> list[str]:
    return fn.rstrip().rstrip("}").rstrip().split("\n")[1:]


GELU_LIKE = {"e": ("exp", ["pre"]), "a": ("add", ["v", "bias"]), "out": ("mul", ["e", "a"])}


def test_epilogue_loads_first_computes_the_same():
    """prefetch_epilogue's epi_ld + epi(f, v, p) against numpy and against the unsplit
    epi(f, v), evaluated for every output: epi_ld loads the streamed pre-activation and
    the bias (what their indices need, nothing that depends on v), epi the rest."""
    rng = np.random.default_rng(0)
    pre, bias, v = rng.standard_normal((4, 8)), rng.standard_normal(8), rng.standard_normal((4, 8))
    want = np.exp(pre) * (v + bias)
    kernel, epi, (ob,) = _epilogue(GELU_LIKE)
    keep, loads = epilogue_loads(epi, 2)
    assert [s.at for s in loads][0] == "f" and len(loads) == 2
    assert not any("v" in s.deps for s in keep)
    whole = _body(kernel.functions[0])
    assert prefetch_epilogue(kernel, epi, 2)
    struct, ld, split = kernel.functions
    fields = re.findall(r"(\w+): f32", struct)
    ld_lines = _body(ld)
    assert ld_lines[-1].strip() == f"return EpiLoads({', '.join(fields)});"
    for form in ("whole", "split"):
        out = np.full(32, np.nan)
        for f in range(32):
            env = {"f": f, "v": v.flat[f], "b0": pre.ravel(), "b1": bias, f"b{ob}": out}
            if form == "whole":
                run_lines(whole, env)
            else:
                got = run_lines(ld_lines[:-1], {"f": f, "b0": pre.ravel(), "b1": bias})
                env["p"] = SimpleNamespace(**{n: got[n] for n in fields})
                run_lines(_body(split), env)
        np.testing.assert_allclose(out.reshape(4, 8), want, rtol=1e-12, err_msg=form)


def test_epilogue_loads_stay_where_none_streams_or_too_many():
    """No split where no load is at the output's index (a broadcast bias alone), where
    loads exceed max_loads, or where the body is not straight-line lets and stores."""
    kernel, epi, _ = _epilogue({"out": ("add", ["v", "bias"])})
    assert epilogue_loads(epi, 2) is None and not prefetch_epilogue(kernel, epi, 2)
    assert kernel.functions == [epi.function()]
    _, epi, _ = _epilogue(GELU_LIKE)
    assert epilogue_loads(epi, 1) is None and epilogue_loads(epi, 2) is not None
    blocky = Epilogue(epi.name, epi.params, epi.dtype,
                      epi.stmts + (type(epi.stmts[0])("  if (f < 3u) {"),), "f", 0)
    assert epilogue_loads(blocky, 2) is None


def test_stmt_deps_name_what_each_let_reads():
    """Every let and load the emitter records can be evaluated from the names in its
    deps alone (plus the buffers), so the split's closure over deps keeps what it needs."""
    _, epi, _ = _epilogue({**GELU_LIKE, "out2": ("add", ["pre", "bias"])})
    known = {}
    arrays = {"b0": np.arange(32.0), "b1": np.arange(8.0)}
    for s in epi.stmts:
        if s.kind not in ("let", "load"):
            continue
        env = {**arrays, "f": 13, "v": 0.25, **{d: known[d] for d in s.deps if d in known}}
        known[s.name] = ev(s.text.strip()[len(f"let {s.name} = "):-1], env)
