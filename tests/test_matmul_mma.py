"""codegen/matmul_mma.py, the subgroup-matrix f16 matmul, where no adapter has subgroup
matrices (CI: lavapipe, SwiftShader): its WGSL is run by a small emulator here (each
subgroup one Python generator, barriers where all of them yield, invocations as numpy
vectors of 32 lanes, subgroup matrices as numpy blocks with f32 accumulation) and compared
with numpy's product of the same f16 inputs, for every copy mode, prefetch, double buffering
and f16 output. The emulator runs only the statement forms that the generator writes and
fails on any other, so it checks the kernel's index arithmetic, slab schedule and barriers,
not Tint. On the GPU the same kernels are checked against float64 products by
bench/matmul_f16.py (H200 through Dawn; figures in bench/README.md); that run is not part of
CI, which has no adapter with chromium-experimental-subgroup-matrix.
"""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

import backends

from webgrad.backends.gpu_host import FeatureMissingError, check_features, wgsl_features
from webgrad.codegen.matmul_mma import MmaTiling, config_for, mma_matmul_wgsl


# ---------------------------------------------------------------- the emulator

def _expr(e: str) -> str:
    e = re.sub(r"subgroupMatrixLoad<subgroup_matrix_(left|right|result)<[^>]*>>\(", r"_load('\1', ", e)
    e = re.sub(r"subgroup_matrix_(left|right|result)<[^>]*>\(\)", r"_zero('\1')", e)
    e = e.replace("subgroupMatrixMultiplyAccumulate(", "_mma(")
    e = e.replace("bitcast<vec2<f16>>(", "_unpack(")
    e = e.replace("pack2x16float(vec2<f32>(", "_pack((")    # two halves as a word (f16 C's out_vec)
    e = re.sub(r"vec[24]<u32>\(", "_words(", e).replace("f16(", "_f16(").replace("f32(", "_f32(")
    e = e.replace("select(", "_select(")
    e = re.sub(r"&(\w+)", r"\1", e)
    e = re.sub(r"\b(\d+)u\b", r"\1", e).replace("/", "//")
    e = re.sub(r"\.(xy|zw)\b", lambda m: "[..., 0:2]" if m.group(1) == "xy" else "[..., 2:4]", e)
    e = re.sub(r"\.([xyzw])\b", lambda m: f"[..., {'xyzw'.index(m.group(1))}]", e)
    return e.replace("false", "False").replace("true", "True")


def _python(wgsl: str, epi: str | None = None) -> tuple[str, dict]:
    """The kernel body as a generator function, and its workgroup arrays {name: (dtype, n)};
    `epi(...)` statements (the group's epilogue) call the emulator's `_epi`."""
    shared, out, depth = {}, ["def _subgroup(sg, li, lane, wg):", "  yield None"], 1
    body = wgsl[wgsl.index("fn main"):]
    body = body[body.index("{", body.index(") {")) + 1:]
    for m in re.finditer(r"var<workgroup> (\w+): array<(\w+), (\d+)>;", wgsl):
        shared[m.group(1)] = (m.group(2), int(m.group(3)))
    for line in body.splitlines():
        line = line.split("//")[0].strip()
        f = re.fullmatch(r"for \(var (\w+) = (\w+); \w+ < (\w+); \w+(\+\+| \+= (\w+))\) \{", line)
        if f:
            step = _expr(f.group(5)) if f.group(5) else "1"
            out.append("  " * depth + f"for {f.group(1)} in range({_expr(f.group(2))}, {_expr(f.group(3))}, {step}):")
            depth += 1
            continue
        f = re.fullmatch(r"if \((.*)\) \{", line)
        if f:
            out.append("  " * depth + f"if {_expr(f.group(1))}:")
            depth += 1
            continue
        for stmt in re.split(r";|(?<=\{)|(?=\})", line):
            stmt = stmt.strip()
            if not stmt:
                continue
            if stmt == "{":
                out.append("  " * depth + "if True:")
                depth += 1
            elif stmt == "}":
                out.append("  " * depth + "pass")
                depth -= 1
            elif stmt == "workgroupBarrier()":
                out.append("  " * depth + "yield 'barrier'")
            elif epi is not None and stmt.startswith(f"{epi}("):
                out.append("  " * depth + "_epi(" + _expr(stmt[len(epi) + 1:]))
            elif stmt.startswith("subgroupMatrixStore("):
                out.append("  " * depth + "_store(" + _expr(stmt[len("subgroupMatrixStore("):]))
            elif re.fullmatch(r"var \w+: (vec[24]<u32>|u32)", stmt):
                out.append("  " * depth + f"{stmt.split()[1][:-1]} = None")
            elif (m := re.fullmatch(r"(?:let |var )?(\w+(?:\[.*\])?) = (.*)", stmt)):
                out.append("  " * depth + f"{_expr(m.group(1))} = {_expr(m.group(2))}")
            else:
                raise AssertionError(f"emulator: unknown WGSL statement {stmt!r}")
    assert depth == 0, "unbalanced braces"
    return "\n".join(out), shared


def _select(f, t, c):
    """WGSL's select(f, t, c), per lane (c one bool a lane, f and t maybe vectors)."""
    c = np.asarray(c)
    return np.where(c.reshape(c.shape + (1,) * (np.ndim(t) - c.ndim)), t, f)


def emulate(wgsl: str, groups, t: MmaTiling, A16, B16, *, names=("A", "B", "C"), epi=None,
            c_size: int | None = None):
    """Run the kernel over the grid `groups`; returns C (flat, of the kernel's type).
    A16, B16: the f16 operands (any shape: their bytes are what the bindings hold); epi:
    (name, fn) where the kernel calls an epilogue, fn(flat, v) getting each lane's index and
    value; c_size: C's elements (M x N by default)."""
    M, N = A16.shape[0], B16.shape[1]
    code, shared = _python(wgsl, epi and epi[0])
    dims = {"left": (t.m, t.k), "right": (t.k, t.n), "result": (t.m, t.n)}
    mats = t.copy == "matrix"
    # u32 words of A's binding (a thread copy's width, or vec4 read for width 4)
    bound = re.search(rf"var<storage, read> {names[0]}: array<(vec4<u32>|vec2<u32>|u32|f16)>", wgsl)
    words = {"vec4<u32>": 4, "vec2<u32>": 2}.get(bound.group(1), 1)
    shape = (-1, words) if words > 1 else (-1,)
    A = A16.reshape(-1) if mats else A16.view(np.uint32).reshape(shape)
    B = B16.reshape(-1) if mats else B16.view(np.uint32).reshape(shape)
    C = np.zeros(c_size or M * N, np.float32 if t.out == "f32" else np.float16)

    def at(off, shape, stride, col_major=False):   # element (r, c): row r, column c
        r, c = shape
        assert np.ndim(off) == 0, "a matrix offset that differs between lanes (not uniform)"
        rows, cols = np.arange(r)[:, None], np.arange(c)[None, :]
        return off + (cols * stride + rows if col_major else rows * stride + cols)

    def load(kind, arr, off, col_major, stride):
        return arr[at(off, dims[kind], stride, col_major)].astype(np.float32)

    def store(arr, off, v, col_major, stride):
        assert not col_major
        arr[at(off, v.shape, stride)] = v

    def unpack(u):
        return np.ascontiguousarray(u, dtype="<u4").view(np.float16).reshape(np.shape(u) + (2,))

    def pack(halves):   # pack2x16float(vec2<f32>(x, y)) of f16-exact x and y, per lane
        lo, hi = (np.asarray(h, np.float16).view(np.uint16).astype(np.uint32) for h in halves)
        return lo | (hi << np.uint32(16))

    # f16 C bound as words (out_vec): a view of C's halves, so its stores land in C
    cw = re.search(rf"var<storage, read_write> {names[2]}: array<(vec4<u32>|vec2<u32>|u32)>", wgsl)
    cview = C
    if cw:
        k = {"vec4<u32>": 4, "vec2<u32>": 2}.get(cw.group(1), 1)
        cview = C.view(np.uint32).reshape((-1, k) if k > 1 else (-1,))
    env = {names[0]: A, names[1]: B, names[2]: cview, "_load": load, "_store": store, "_unpack": unpack,
           "_pack": pack, "_words": lambda *ws: np.stack([np.asarray(w) for w in ws], -1),
           "_epi": epi and (lambda flat, v, *loaded: epi[1](flat, v)),   # loaded: epi_ld's
           **({f"{epi[0]}_ld": lambda *flat: None} if epi else {}),
           "_zero": lambda kind: np.zeros(dims[kind], np.float32),
           "_select": _select,
           "_mma": lambda a, b, c: c + a.astype(np.float32) @ b.astype(np.float32),
           "_f16": lambda x: np.asarray(x).astype(np.float16),
           "_f32": lambda x: np.asarray(x).astype(np.float32)}
    nsg = t.sg_m * t.sg_n
    for gx, gy, gz in ((x, y, z) for z in range(groups[2]) for y in range(groups[1])
                       for x in range(groups[0])):
        if True:
            for name, (ty, n) in shared.items():   # workgroup memory: fresh each workgroup
                env[name] = np.full(n, np.nan, np.float16 if ty == "f16" else np.float32)
            exec(code, env)
            subs = [env["_subgroup"](sg, sg * t.subgroup_size + np.arange(t.subgroup_size),
                                     np.arange(t.subgroup_size), np.array([gx, gy, gz])) for sg in range(nsg)]
            for s in subs:
                next(s)
            live = True
            while live:   # every subgroup runs to its next barrier; all must get there
                ends = []
                for s in subs:
                    try:
                        ends.append(next(s))
                    except StopIteration:
                        ends.append("end")
                assert len(set(ends)) == 1, f"subgroups disagree at a barrier: {ends}"
                live = ends[0] != "end"
    return C


# ---------------------------------------------------------------- the tests

TILINGS = [
    MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2),
    MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, prefetch=False, swizzle=2),
    MmaTiling(bm=64, bn=128, bk=32, sg_m=2, sg_n=2, double_buffer=True),
    MmaTiling(bm=64, bn=64, bk=16, sg_m=1, sg_n=2, copy="matrix"),
    MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, copy="matrix", double_buffer=True),
    MmaTiling(bm=32, bn=64, bk=32, sg_m=2, sg_n=1, out="f16"),
    MmaTiling(bm=32, bn=128, bk=32, sg_m=1, sg_n=2, out="f16", stage=2),   # two rounds a row
    MmaTiling(bm=64, bn=32, bk=32, sg_m=2, sg_n=1, m=16, n=8, k=16),   # a 16x8x16 configuration
    # bench/matmul_f16.py --sweep's variants: fragments a row of products at a time, more
    # subgroups and larger K slabs, with and without double buffering
    MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, frag="row"),
    MmaTiling(bm=128, bn=64, bk=64, sg_m=2, sg_n=1, frag="row", double_buffer=True),
    MmaTiling(bm=128, bn=256, bk=32, sg_m=2, sg_n=4, frag="row", pad=16),
    MmaTiling(bm=64, bn=128, bk=32, sg_m=2, sg_n=2, frag="row", out="f16", swizzle=2),
    MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, peel=True),
    MmaTiling(bm=64, bn=64, bk=16, sg_m=1, sg_n=2, frag="row", peel=True, out="f16"),
    MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, width=2),
    MmaTiling(bm=64, bn=128, bk=32, sg_m=2, sg_n=2, width=4, frag="row", double_buffer=True),
    MmaTiling(bm=64, bn=64, bk=16, sg_m=2, sg_n=2, width=2, peel=True, out="f16"),
    MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, out="f16", out_vec=8),   # f16 C in words
    MmaTiling(bm=32, bn=128, bk=32, sg_m=1, sg_n=2, out="f16", stage=2, out_vec=2),
    MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, out="f16", stage=1, out_vec=4),
]


@pytest.mark.parametrize("t", TILINGS, ids=lambda t: f"{t.bm}x{t.bn}x{t.bk}:{t.sg_m}x{t.sg_n}"
                         f"{':db' if t.double_buffer else ''}{'' if t.prefetch else ':nopre'}"
                         f":{t.copy}:{t.out}:{t.m}x{t.n}x{t.k}:{t.frag}:pad{t.pad}{':peel' if t.peel else ''}:w{t.width}"
                         f":o{t.out_vec}")
def test_emulated_kernel_equals_numpy(t):
    M, N, K = 2 * t.bm, 3 * t.bn, 3 * t.bk     # several workgroups, an odd number of slabs
    rng = np.random.default_rng(1)
    A16 = rng.standard_normal((M, K)).astype(np.float16)
    B16 = rng.standard_normal((K, N)).astype(np.float16)
    wgsl, groups = mma_matmul_wgsl(M, N, K, t)
    assert groups == (N // t.bn, M // t.bm, 1)
    got = emulate(wgsl, groups, t, A16, B16).reshape(M, N).astype(np.float64)
    want = A16.astype(np.float64) @ B16.astype(np.float64)
    tol = 2e-3 if t.out == "f16" else 1e-5     # f16 output: one rounding to 11 bits
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def _stored_as_tiling_says(t, M, N, K, seed):
    """(WGSL, workgroups, the emulated product, numpy's float64 one, (A16, B16), (A, B) as
    stored) of random f16 operands, each stored transposed where t.a_t / t.b_t say."""
    rng = np.random.default_rng(seed)
    A16 = rng.standard_normal((M, K)).astype(np.float16)
    B16 = rng.standard_normal((K, N)).astype(np.float16)
    As = np.ascontiguousarray(A16.T) if t.a_t else A16
    Bs = np.ascontiguousarray(B16.T) if t.b_t else B16
    wgsl, groups = mma_matmul_wgsl(M, N, K, t)
    got = emulate(wgsl, groups, t, As, Bs, c_size=M * N).reshape(M, N).astype(np.float64)
    return wgsl, groups, got, A16.astype(np.float64) @ B16.astype(np.float64), (A16, B16), (As, Bs)


@pytest.mark.parametrize("t", [MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, a_t=True),
                               MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, b_t=True),
                               MmaTiling(bm=64, bn=128, bk=32, sg_m=2, sg_n=2, a_t=True, b_t=True,
                                         double_buffer=True),
                               MmaTiling(bm=64, bn=64, bk=16, sg_m=1, sg_n=2, a_t=True, b_t=True,
                                         frag="row", peel=True, out="f16", stage=1),
                               MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, b_t=True, width=4,
                                         prefetch=False),
                               MmaTiling(bm=32, bn=64, bk=32, sg_m=2, sg_n=1, a_t=True, width=2)],
                         ids=lambda t: repr(t)[9:-1].replace(", ", ":"))
def test_emulated_kernel_with_transposed_operands_equals_numpy(t):
    """A stored [K, M] (a_t: x^T of a weight gradient) and / or B stored [N, K] (b_t: W^T
    of an input gradient): the slabs copied as stored, the matrices loaded column-major;
    numpy's product of the same f16 values. The slabs' workgroup memory is theirs
    (workgroup_bytes), and a transposed operand needs copy="threads"."""
    M, N, K = 2 * t.bm, 3 * t.bn, 3 * t.bk
    wgsl, groups, got, want, (A16, B16), (As, Bs) = _stored_as_tiling_says(t, M, N, K, 19)
    assert ("true, " in wgsl) and groups == (N // t.bn, M // t.bm, 1)
    tol = 2e-3 if t.out == "f16" else 1e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    # the wrong orientation gives another product: the test can fail
    wrong = emulate(wgsl, groups, t, A16 if t.a_t else As, B16 if t.b_t else Bs, c_size=M * N)
    assert not np.allclose(wrong.reshape(M, N), want, rtol=1e-2, atol=1e-1)
    slabs = sum(r * (c + t.pad) for r, c in t.slab_rows())
    assert t.workgroup_bytes() == 2 * slabs * (2 if t.double_buffer else 1) + (
        4 * t.m * t.n * t.staged * t.sg_m * t.sg_n if t.out == "f16" else 0)
    assert re.search(rf"var<workgroup> As0: array<f16, {t.slab_rows()[0][0] * (t.slab_rows()[0][1] + t.pad)}>", wgsl)
    with pytest.raises(ValueError, match="copied by the threads"):
        mma_matmul_wgsl(M, N, K, replace(t, copy="matrix"))


@pytest.mark.parametrize("t", [MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, a_x=True),
                               MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, b_x=True),
                               MmaTiling(bm=64, bn=128, bk=32, sg_m=2, sg_n=2, a_x=True, b_x=True,
                                         double_buffer=True),
                               MmaTiling(bm=64, bn=64, bk=16, sg_m=1, sg_n=2, a_x=True, b_t=True,
                                         frag="row", peel=True, out="f16", stage=1),
                               MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, a_t=True, a_x=True,
                                         b_x=True, width=4),
                               MmaTiling(bm=32, bn=64, bk=32, sg_m=2, sg_n=1, b_t=True, b_x=True,
                                         width=2, prefetch=False)],
                         ids=lambda t: repr(t)[9:-1].replace(", ", ":"))
def test_emulated_kernel_with_transposing_copies_equals_numpy(t):
    """The copy transposing a slab on its way to workgroup memory (a_x / b_x: each
    invocation's halves to rows of their own, the matrices loaded with the other major),
    alone, with an operand stored transposed (a_t with a_x: row-major loads again) and with
    the other kernel forms: numpy's product of the same f16 values, the workgroup memory
    the transposed slabs' (shared_rows), and the f16 stores of a subgroup in consecutive
    halves (no two invocations on one bank)."""
    M, N, K = 2 * t.bm, 3 * t.bn, 3 * t.bk
    wgsl, groups, got, want, _, _ = _stored_as_tiling_says(t, M, N, K, 23)
    tol = 2e-3 if t.out == "f16" else 1e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    (ra, ca), (rb, cb) = t.slab_rows()
    assert t.shared_rows() == ((ca, ra) if t.a_x else (ra, ca), (cb, rb) if t.b_x else (rb, cb))
    for name, (r, c) in zip("AB", t.shared_rows()):
        assert re.search(rf"var<workgroup> {name}s0: array<f16, {r * (c + t.pad)}>", wgsl)
    # the loads' major follows stored layout XOR copy: column-major where exactly one is set
    majors = set(re.findall(r"subgroupMatrixLoad<subgroup_matrix_left<[^;]*, (true|false), \d+u\);", wgsl))
    assert majors == {"true" if t.a_t != t.a_x else "false"}
    # a transposing copy: a subgroup's 32 invocations store 32 consecutive halves
    stride = t.shared_rows()[0][1] + t.pad
    if t.a_x:
        assert re.search(rf"let o = \(i / {ra}u\) \* {t.width * stride}u \+ i % {ra}u;", wgsl)
        assert ra % t.subgroup_size == 0 or t.subgroup_size % ra == 0
    with pytest.raises(ValueError, match="copied by the threads"):
        mma_matmul_wgsl(M, N, K, replace(t, copy="matrix"))


@pytest.mark.parametrize("a_t, b_t", [(True, False), (False, True), (True, True)])
def test_split_chunks_of_transposed_operands(a_t, b_t):
    """A split product's chunks (matmul._build_mma_split) of operands stored transposed:
    chunk z of K reads A's rows z*Kc.. of [K, M] (a_base wg.z * Kc * M) and B's columns
    z*Kc.. of [N, K] (b_base wg.z * Kc, ldb K), and writes its partial product at z."""
    t = MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, a_t=a_t, b_t=b_t)
    M, N, K, S = 64, 128, 256, 4
    Kc = K // S
    rng = np.random.default_rng(21)
    A16 = rng.standard_normal((M, K)).astype(np.float16)
    B16 = rng.standard_normal((K, N)).astype(np.float16)
    As = np.ascontiguousarray(A16.T) if a_t else A16
    Bs = np.ascontiguousarray(B16.T) if b_t else B16
    wgsl, groups = mma_matmul_wgsl(M, N, Kc, t, batch=S, a_base=f"wg.z * {Kc * M if a_t else Kc}u",
                                   b_base=f"wg.z * {Kc if b_t else Kc * N}u",
                                   lda=None if a_t else K, ldb=K if b_t else None)
    got = emulate(wgsl, groups, t, As, Bs, c_size=S * M * N).reshape(S, M, N).astype(np.float64)
    for z in range(S):
        want = A16[:, z * Kc:(z + 1) * Kc].astype(np.float64) @ B16[z * Kc:(z + 1) * Kc].astype(np.float64)
        np.testing.assert_allclose(got[z], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_emulator_catches_a_wrong_index():
    """A kernel whose second row of left matrices reads the first one's gives another product."""
    t = TILINGS[0]
    rng = np.random.default_rng(2)
    A16 = rng.standard_normal((128, 96)).astype(np.float16)
    B16 = rng.standard_normal((96, 128)).astype(np.float16)
    wgsl, groups = mma_matmul_wgsl(128, 128, 96, t)
    bad = wgsl.replace("(sm + 16u) * 40u", "(sm + 0u) * 40u")
    assert bad != wgsl
    got = emulate(bad, groups, t, A16, B16).reshape(128, 128)
    assert not np.allclose(got, A16.astype(np.float64) @ B16.astype(np.float64), rtol=1e-3, atol=1e-2)


def test_emulator_catches_a_wrong_index_in_a_variant():
    """The "row" fragment order with its last right matrix read one column of matrices early
    (the column of j - 1), and a u32 copy storing its halves over each other, give other
    products: the variants' tests can fail."""
    t = MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, frag="row")
    rng = np.random.default_rng(3)
    A16 = rng.standard_normal((64, 64)).astype(np.float16)
    B16 = rng.standard_normal((64, 128)).astype(np.float16)
    wgsl, groups = mma_matmul_wgsl(64, 128, 64, t)
    bad = wgsl.replace("sn + 16u, false, 72u)", "sn + 0u, false, 72u)")
    assert bad != wgsl
    want = A16.astype(np.float64) @ B16.astype(np.float64)
    np.testing.assert_allclose(emulate(wgsl, groups, t, A16, B16).reshape(64, 128), want,
                               rtol=1e-5, atol=1e-5 * np.abs(want).max())
    got = emulate(bad, groups, t, A16, B16).reshape(64, 128)
    assert not np.allclose(got, want, rtol=1e-3, atol=1e-2)
    # u32 copies (width 2) whose workgroup stores overlap (one half apart, not two)
    t = MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, width=2)
    wgsl, groups = mma_matmul_wgsl(64, 128, 64, t)
    bad = wgsl.replace("(i % 16u) * 2u;", "(i % 16u) * 1u;")
    assert bad != wgsl
    np.testing.assert_allclose(emulate(wgsl, groups, t, A16, B16).reshape(64, 128), want,
                               rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert not np.allclose(emulate(bad, groups, t, A16, B16).reshape(64, 128), want, rtol=1e-3,
                           atol=1e-2)


def test_default_variant_fields_leave_the_kernel_as_it_was():
    """MmaTiling's later fields (frag, peel) at their defaults emit the same kernel, first line
    included (its repr leaves them out), and "row" changes only the order of the statements
    of the products."""
    t = MmaTiling()
    wgsl, _ = mma_matmul_wgsl(512, 512, 256, t)
    assert "frag" not in wgsl.splitlines()[0]
    row, _ = mma_matmul_wgsl(512, 512, 256, MmaTiling(frag="row"))
    assert row != wgsl and sorted(row.splitlines()[1:]) == sorted(wgsl.splitlines()[1:])
    peel, _ = mma_matmul_wgsl(512, 512, 256, MmaTiling(peel=True))
    assert "if (s + 1u < 8u)" in wgsl and "if (s + 1u" not in peel and "s < 7u" in peel
    with pytest.raises(ValueError, match="frag must be"):
        mma_matmul_wgsl(512, 512, 256, MmaTiling(frag="col"))


def test_wgsl_form_features_and_errors():
    t = MmaTiling()
    wgsl, groups = mma_matmul_wgsl(4096, 4096, 4096, t)
    assert groups == (32, 32, 1)
    assert f"@workgroup_size({t.threads})" in wgsl and t.threads == 128
    assert wgsl_features(wgsl) == {"shader-f16", "subgroups", "chromium-experimental-subgroup-matrix"}
    # Tint wants matrix offsets uniform: none may come from the invocation's index
    for call in re.findall(r"subgroupMatrix(?:Load|Store)[^;]*;", wgsl):
        assert not re.search(r"\b(li|lane|ia\d|ib\d)\b", call), call
    assert t.workgroup_bytes() == 2 * (128 * 40 + 32 * 136)
    with pytest.raises(ValueError, match="multiple of bm 128"):
        mma_matmul_wgsl(4000, 4096, 4096, t)
    with pytest.raises(ValueError, match="workgroup memory"):
        mma_matmul_wgsl(4096, 4096, 4096, MmaTiling(double_buffer=True, bk=64), 32768)
    # the adapter's configurations: H200's f16 ones, as Dawn listed them on 2026-12-02
    h200 = [("f16", "f16", 16, 16, 16, 32, 32), ("f16", "f32", 16, 8, 16, 32, 32),
            ("f16", "f32", 16, 16, 16, 32, 32), ("i8", "i32", 16, 16, 32, 32, 32)]
    assert config_for(h200) == (16, 16, 16, 32)
    assert config_for([c for c in h200 if c[1] != "f32"]) is None
    # a program whose kernels need a feature the device lacks is refused, naming it
    check_features([wgsl], {"shader-f16", "subgroups", "chromium-experimental-subgroup-matrix"}, "x")
    with pytest.raises(FeatureMissingError, match="chromium-experimental-subgroup-matrix"):
        check_features([wgsl, "fn main() {}"], {"shader-f16", "subgroups"}, "lavapipe")


def test_tiling_from_the_adapter_limits():
    """Kernel selection reads the features and configurations recorded on Limits; without
    them (SwiftShader, lavapipe, a browser without the flag) there is no f16 kernel."""
    from webgrad.codegen.matmul_mma import tiling_for
    from webgrad.codegen.wgsl import Limits
    plain = Limits()
    assert not plain.shader_f16 and plain.subgroup_matrix == ()
    assert tiling_for(plain, 4096, 4096, 4096) is None
    h200 = Limits(shader_f16=True, max_compute_workgroup_storage_size=49152,
                  max_compute_invocations_per_workgroup=1024,
                  subgroup_matrix=(("f16", "f32", 16, 8, 16, 32, 32), ("f16", "f32", 16, 16, 16, 32, 32)))
    t = tiling_for(h200, 4096, 4096, 4096)
    assert (t.bm, t.bn, t.bk, t.sg_m, t.sg_n, t.m, t.n, t.k) == (128, 128, 32, 2, 2, 16, 16, 16)
    assert tiling_for(h200, 192, 192, 64).bm == 64        # a smaller tile where 128 does not divide
    assert tiling_for(h200, 100, 128, 64) is None          # no tile divides 100 rows
    assert tiling_for(Limits(shader_f16=False, subgroup_matrix=h200.subgroup_matrix), 4096, 4096, 4096) is None
    # KernelOptions.mma_tiling: a variant where it divides the shape and fits, else the table
    from dataclasses import replace
    from webgrad.codegen import KernelOptions
    wide = replace(h200, options=KernelOptions(mma_tiling=(("bn", 256), ("sg_n", 4), ("frag", "row"))))
    t = tiling_for(wide, 4096, 4096, 4096)
    assert (t.bm, t.bn, t.sg_m, t.sg_n, t.frag, t.threads) == (128, 256, 2, 4, "row", 256)
    assert tiling_for(wide, 4096, 4224, 4096).bn == 128       # 4224 = 33 x 128: not 256
    assert tiling_for(wide, 192, 192, 64).bm == 64
    big = replace(h200, options=KernelOptions(mma_tiling=(("bk", 128), ("double_buffer", True))))
    assert tiling_for(big, 4096, 4096, 4096).bk == 32          # 2 x 2 x 128 x 136 x 2 bytes: too big
    # the compiler binds its operands as vec4<u32>: no narrower copies there
    assert tiling_for(replace(h200, options=KernelOptions(mma_tiling=(("width", 2),))), 4096, 4096,
                      4096).width == 8
    with pytest.raises(ValueError, match="own bindings"):
        mma_matmul_wgsl(128, 128, 64, MmaTiling(width=2), header=[])
    with pytest.raises(KeyError, match="cannot be set"):
        tiling_for(replace(h200, options=KernelOptions(mma_tiling=(("m", 8),))), 4096, 4096, 4096)


@pytest.mark.webgpu
@pytest.mark.skipif(not backends.webgpu_available(), reason="no native WebGPU adapter")
def test_native_host_refuses_a_kernel_for_a_missing_feature():
    """The native host records what its device was made with, copies it onto the backend's
    Limits, and a plan needing subgroup matrices on a device without them (lavapipe) fails
    at load with the missing feature named, before any buffer is made."""
    from webgrad.backends.webgpu import WebGPUBackend
    from webgrad.backends.webgpu_native import NativeHost
    host = NativeHost()
    limits = WebGPUBackend(host).limits
    assert limits.shader_f16 == ("shader-f16" in host.features)
    have_mma = "chromium-experimental-subgroup-matrix" in host.features
    assert bool(limits.subgroup_matrix) == have_mma == bool(host.subgroup_matrix_configs)
    if have_mma and "shader-f16" in host.features:
        pytest.skip("this adapter has subgroup matrices: bench/matmul_f16.py checks the kernel")
    wgsl, groups = mma_matmul_wgsl(128, 128, 64, MmaTiling())
    plan = {"buffers": [{"size": 128 * 64 * 2}, {"size": 64 * 128 * 2}, {"size": 128 * 128 * 4}],
            "pipelines": [{"wgsl": wgsl}],
            "commands": [{"op": "dispatch", "pipeline": 0, "bindings": [0, 1, 2], "workgroups": list(groups)}]}
    with pytest.raises(FeatureMissingError, match="chromium-experimental-subgroup-matrix"):
        host.load(plan)


# ---------------------------------------------------------------- selection by the compiler

class _PlanHost:
    """A host that names its adapter, features and subgroup-matrix configurations, and
    keeps the plan it is given instead of loading it."""
    limits = None

    def __init__(self, features, configs=()):
        self.info, self.features = "NVIDIA H200 (DiscreteGPU)", frozenset(features)
        self.subgroup_matrix_configs = list(configs)
        self.plan = None

    def load(self, plan):
        self.plan = plan
        raise _Planned


class _Planned(Exception):
    pass


_MMA_FEATURES = ("shader-f16", "subgroups", "chromium-experimental-subgroup-matrix")
_F16_CONFIG = {"component_type": "f16", "result_component_type": "f32", "m": 16, "n": 16,
               "k": 16, "min_subgroup_size": 32, "max_subgroup_size": 32}


def _mixed_plan(host, rows: int, epilogue: bool = False):
    import webgrad as wg
    from webgrad import Module, ops
    from webgrad.backends.webgpu import WebGPUBackend

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.W = self.param([64, 128])
            self.b = self.param([128], init="zeros")

        def __call__(self, x):
            y = ops.matmul(x, self.W) + self.b  # the bias is added after the f16 rounding
            # gelu: the output, written by the matmul's epilogue; softmax: a kernel of its own
            return ops.gelu(y) if epilogue else ops.softmax_last(y)
    with pytest.raises(_Planned):
        wg.compile_forward(Net, lambda m, f: m(f["x"]), inputs={"x": [rows, 64]},
                           backend=WebGPUBackend(host), precision="mixed")
    return host.plan


def _mma_pipelines(plan):
    return [(c, plan["pipelines"][c["pipeline"]]["wgsl"]) for c in plan["commands"]
            if c["op"] == "dispatch" and plan["pipelines"][c["pipeline"]]["wgsl"].startswith(
                "// webgrad mma matmul")]


def _names(wgsl):
    """The kernel's binding names in binding order."""
    return re.findall(r"@binding\(\d+\) var<storage, [\w_]+> (\w+):", wgsl)


def _tiling(wgsl):
    """The MmaTiling named in the kernel's first line."""
    return eval(wgsl.splitlines()[0].split(": ", 1)[1], {"MmaTiling": MmaTiling})


def test_compiler_selects_the_mma_kernel_where_offered():
    """A precision="mixed" product with f16 operands and no epilogue (its f16 result read by
    a softmax) takes the subgroup-matrix kernel on an adapter whose Limits offer f16 x f16 ->
    f32 at 16x16x16: C is its f16 buffer (2 bytes an element), and the WGSL the compiler
    emitted, run by the emulator, is numpy's product. Without the feature (lavapipe,
    SwiftShader), without an f32-accumulating configuration, or with a shape no tiling
    divides, the tiled kernel stays."""
    host = _PlanHost(_MMA_FEATURES, [_F16_CONFIG])
    plan = _mixed_plan(host, 64)
    (cmd, wgsl), = _mma_pipelines(plan)
    assert "-> f16" in wgsl.splitlines()[0]
    a, b, c = cmd["bindings"]
    assert [plan["buffers"][k]["size"] for k in (a, b, c)] == [2 * 64 * 64, 2 * 64 * 128, 2 * 64 * 128]
    # 16 KB of workgroup memory: a row of f16 staging matrices does not fit beside the slabs
    t = MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, out="f16", stage=1)
    assert f"{t}" in wgsl.splitlines()[0]
    rng = np.random.default_rng(4)
    A16 = rng.standard_normal((64, 64)).astype(np.float16)
    B16 = rng.standard_normal((64, 128)).astype(np.float16)
    got = emulate(wgsl, tuple(cmd["workgroups"]), t, A16, B16, names=_names(wgsl))
    got = got.reshape(64, 128).astype(np.float64)
    want = A16.astype(np.float64) @ B16.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())
    # the fallbacks: no subgroup matrices, no f16 -> f32 configuration, 60 rows
    for h, rows in ((_PlanHost(("shader-f16",)), 64),
                    (_PlanHost(_MMA_FEATURES, [dict(_F16_CONFIG, result_component_type="f16")]), 64),
                    (_PlanHost(_MMA_FEATURES, [_F16_CONFIG]), 60)):
        plan = _mixed_plan(h, rows)
        assert not _mma_pipelines(plan), rows
        assert any("array<f16>" in p["wgsl"] and "matmul" in p["wgsl"].splitlines()[0]
                   for p in plan["pipelines"])


def _plan(fn, inputs, host=None, **kw):
    """The WebGPU plan of a precision="mixed" forward program on an H200-like adapter."""
    import webgrad as wg
    from webgrad.backends.webgpu import WebGPUBackend
    host = host or _PlanHost(_MMA_FEATURES, [_F16_CONFIG])
    with pytest.raises(_Planned):
        wg.compile_forward(*fn, inputs=inputs, backend=WebGPUBackend(host), precision="mixed", **kw)
    return host.plan


def _run_epilogue_kernel(cmd, wgsl, A16, B16, c_size):
    """Emulate a kernel that hands its results to the epilogue: {flat index: value}, each
    index called once."""
    seen = {}

    def epi(flat, v):
        for f, x in zip(np.broadcast_to(flat, (32,)).tolist(), np.broadcast_to(v, (32,)).tolist()):
            assert f not in seen, f"element {f} handed to the epilogue twice"
            seen[f] = x
    fn = re.search(r"\b(epi(?:_\d+_\d+)?)(?:_ld)?\(", wgsl.split("fn main")[1]).group(1)
    assert re.search(rf"fn {fn}\(f: u32, v: f32(, p: EpiLoads)?\)", wgsl)
    emulate(wgsl, tuple(cmd["workgroups"]), _tiling(wgsl), A16, B16, names=_names(wgsl),
            epi=(fn, epi), c_size=c_size)
    assert sorted(seen) == list(range(c_size)), "every result element handed over once"
    return np.array([seen[f] for f in range(c_size)])


@pytest.mark.parametrize("stage", [0, 1])
def test_mma_kernel_with_an_epilogue_and_a_merged_batch(stage):
    """gelu(x @ W + b) of x [2, 32, 64] under precision="mixed": the product of a batch over
    one shared weight is one 64-row product, and its kernel hands every result (the f32
    product, before the f16 rounding, bias and GELU that the epilogue does) to the group's
    epilogue exactly once, from workgroup memory, a row of result matrices staged a round or
    (KernelOptions.mma_epi_stage 1) one matrix. The epilogue itself is the tiled kernel's
    (program.epilogue_fn); the H200 checks the whole program against torch
    (bench/mma_check.py)."""
    from webgrad import Module, ops
    from webgrad.codegen import KernelOptions

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.W = self.param([64, 128])
            self.b = self.param([128], init="zeros")

    plan = _plan((Net, lambda m, f: ops.gelu(ops.matmul(f["x"], m.W) + m.b)), {"x": [2, 32, 64]},
                 kernel_options=KernelOptions(mma_epi_stage=stage))
    (cmd, wgsl), = _mma_pipelines(plan)
    head = wgsl.splitlines()[0]
    assert "64x64 @ 64x128 -> epilogue" in head and "out='f32'" in head, head
    assert f"stage={stage}" in head and wgsl.count("subgroupMatrixStore(&Cs") == 4
    rng = np.random.default_rng(6)
    A16 = rng.standard_normal((64, 64)).astype(np.float16)
    B16 = rng.standard_normal((64, 128)).astype(np.float16)
    got = _run_epilogue_kernel(cmd, wgsl, A16, B16, 64 * 128).reshape(64, 128)
    want = A16.astype(np.float64) @ B16.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("stage, ahead", [(0, False), (1, False), (0, True), (1, True), (2, True)])
def test_a_streaming_epilogue_takes_its_own_stage(stage, ahead):
    """r + x @ W (a residual add: the epilogue streams r, a tensor of the output's size, its
    loads issued first) is staged by KernelOptions.mma_epi_load_stage and, with
    mma_epi_ahead, has each round's loads issued before the round ahead of it is handed over
    (round 0's before its staging); gelu(x @ W + b) (a broadcast bias) keeps mma_epi_stage
    and no loads ahead; both on the same tile, every element reaching the epilogue once with
    the product's value (emulated against numpy)."""
    from webgrad import Module, ops
    from webgrad.codegen import KernelOptions
    other = 0 if stage else 1
    opts = KernelOptions(mma_epi_stage=other, mma_epi_load_stage=stage, mma_epi_ahead=ahead)

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.W = self.param([64, 128])
            self.b = self.param([128], init="zeros")

    host = _PlanHost(_MMA_FEATURES, [_F16_CONFIG])
    host.limits = {"max_compute_workgroup_storage_size": 49152}   # the H200's: stage 0 fits
    rng = np.random.default_rng(16)
    cases = [((Net, lambda m, f: f["r"] + ops.matmul(f["x"], m.W)), {"x": [128, 64], "r": [128, 128]},
              stage, ahead),
             ((Net, lambda m, f: ops.gelu(ops.matmul(f["x"], m.W) + m.b)), {"x": [2, 64, 64]}, other, False)]
    tiles = set()
    for fn, inputs, want_stage, want_ahead in cases:
        (cmd, wgsl), = _mma_pipelines(_plan(fn, inputs, host, kernel_options=opts))
        t = _tiling(wgsl)
        assert (t.stage, t.epi_ahead) == (want_stage, want_ahead) and "-> epilogue" in wgsl.splitlines()[0]
        body = wgsl.split("fn main")[1]
        assert ("_ld(" in body) == (fn is cases[0][0])   # the streamed load, issued first
        if want_ahead:
            rounds = t.tm // t.epi_rows * (t.tn // t.staged)
            assert rounds > 1 and f"let p{rounds - 1}_0 = " in body and f"p{rounds}_0" not in body
            assert body.index("let p1_0 = ") < body.index(", p0_0);")   # round 1's loads first
        tiles.add((t.bm, t.bn, t.bk))
        X16 = rng.standard_normal((128, 64)).astype(np.float16)
        W16 = rng.standard_normal((64, 128)).astype(np.float16)
        got = _run_epilogue_kernel(cmd, wgsl, X16, W16, 128 * 128).reshape(128, 128)
        want = X16.astype(np.float64) @ W16.astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert len(tiles) == 1


def test_mma_kernel_over_a_batch_of_both_operands():
    """x [3, 64, 64] @ y [3, 64, 128] (both batched, as attention's products are): the batch
    element is workgroup_id.z, each operand's offset from it; the f16 results equal numpy's
    per-element products."""
    from webgrad import Module, ops

    plan = _plan((Module, lambda m, f: ops.softmax_last(ops.matmul(f["x"], f["y"]))),
                 {"x": [3, 64, 64], "y": [3, 64, 128]})
    (cmd, wgsl), = _mma_pipelines(plan)
    assert "3 x 64x64 @ 64x128 -> f16" in wgsl.splitlines()[0] and cmd["workgroups"][2] == 3
    rng = np.random.default_rng(7)
    A16 = rng.standard_normal((3, 64, 64)).astype(np.float16)
    B16 = rng.standard_normal((3, 64, 128)).astype(np.float16)
    got = emulate(wgsl, tuple(cmd["workgroups"]), _tiling(wgsl), A16.reshape(-1, 64),
                  B16.reshape(-1, 128), names=_names(wgsl), c_size=3 * 64 * 128)
    want = A16.astype(np.float64) @ B16.astype(np.float64)
    np.testing.assert_allclose(got.reshape(3, 64, 128).astype(np.float64), want, rtol=2e-3,
                               atol=2e-3 * np.abs(want).max())
    # two batch axes, the second broadcast in y (attention's [B, H] has two): element z of
    # x is (z / 3, z % 3), of y (z / 3)
    plan = _plan((Module, lambda m, f: ops.softmax_last(ops.matmul(f["x"], f["y"]))),
                 {"x": [2, 3, 64, 64], "y": [2, 1, 64, 128]})
    (cmd2, wgsl2), = _mma_pipelines(plan)
    assert cmd2["workgroups"][2] == 6
    X16 = rng.standard_normal((2, 3, 64, 64)).astype(np.float16)
    Y16 = rng.standard_normal((2, 1, 64, 128)).astype(np.float16)
    got = emulate(wgsl2, tuple(cmd2["workgroups"]), _tiling(wgsl2), X16.reshape(-1, 64),
                  Y16.reshape(-1, 128), names=_names(wgsl2), c_size=6 * 64 * 128)
    want2 = X16.astype(np.float64) @ Y16.astype(np.float64)
    np.testing.assert_allclose(got.reshape(2, 3, 64, 128).astype(np.float64), want2, rtol=2e-3,
                               atol=2e-3 * np.abs(want2).max())
    # the same kernel with every batch offset dropped reads element 0's matrices three times
    bad = wgsl.replace("let ab = (wg.z * 4096u) / 8u;", "let ab = 0u;")
    assert bad != wgsl
    got = emulate(bad, tuple(cmd["workgroups"]), _tiling(bad), A16.reshape(-1, 64),
                  B16.reshape(-1, 128), names=_names(bad), c_size=3 * 64 * 128)
    assert not np.allclose(got.reshape(3, 64, 128), want, rtol=1e-2, atol=1e-1)


def _f16_backend():
    """This machine's webgpu backend; the test skips where its adapter has no shader-f16."""
    import webgrad as wg
    be = wg.backends.get_backend("webgpu")
    if "shader-f16" not in (getattr(be.host, "features", None) or ()):
        pytest.skip("this adapter has no shader-f16")
    return be


@pytest.mark.webgpu
@pytest.mark.skipif(not backends.webgpu_available(), reason="no native WebGPU adapter")
def test_native_adapter_without_subgroup_matrices_keeps_the_tiled_kernel():
    """This machine's adapter (lavapipe: shader-f16, no subgroup matrices) never picks the
    subgroup-matrix kernel for the same program, and computes the reference's values."""
    import webgrad as wg
    from webgrad import nn, ops
    be = _f16_backend()
    if be.limits.subgroup_matrix:
        pytest.skip("this adapter has subgroup matrices (a GPU, not lavapipe)")
    x = np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32)
    outs = {}
    for backend in ("reference", "webgpu"):
        prog = wg.compile_forward(lambda: nn.Linear(64, 128, bias=False),
                                  lambda m, f: ops.softmax_last(m(f["x"])), inputs={"x": [64, 64]},
                                  backend=backend, precision="mixed")
        outs[backend] = np.asarray(prog.run({"x": x}))
        if backend == "webgpu":
            assert not any("mma" in n for n in prog._prog.exe.kernel_names)
    np.testing.assert_allclose(outs["webgpu"], outs["reference"], rtol=1e-5, atol=1e-6)


@pytest.mark.webgpu
@pytest.mark.skipif(not backends.webgpu_available(), reason="no native WebGPU adapter")
def test_streaming_epilogues_compute_the_same_on_the_adapter():
    """r + x @ W under precision="mixed" on this machine's adapter, the subgroup-matrix
    kernel in plain WGSL (KernelOptions.mma_emulate), its streamed epilogue (r) staged a
    matrix a round or two, its loads issued a round ahead or not (mma_epi_load_stage,
    mma_epi_ahead): every form's values equal the default form's bit for bit (only the order
    of loads and barriers differs), and the reference executor's within the f16 rounding."""
    import webgrad as wg
    from webgrad import Module, ops
    from webgrad.codegen import KernelOptions
    _f16_backend()

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.W = self.param([64, 64])

    rng = np.random.default_rng(18)
    feed = {"x": rng.standard_normal((64, 64)).astype(np.float32),
            "r": rng.standard_normal((64, 64)).astype(np.float32)}
    forms = [KernelOptions(mma_emulate=True),
             KernelOptions(mma_emulate=True, mma_epi_ahead=True),
             KernelOptions(mma_emulate=True, mma_epi_ahead=True, mma_epi_load_stage=2)]
    got = []
    for backend, opts in [("reference", None)] + [("webgpu", o) for o in forms]:
        kw = {} if opts is None else {"kernel_options": opts}
        prog = wg.compile_forward(Net, lambda m, f: f["r"] + ops.matmul(f["x"], m.W),
                                  inputs={"x": [64, 64], "r": [64, 64]}, backend=backend,
                                  precision="mixed", seed=3, **kw)
        if opts is not None:
            heads = [p["wgsl"].splitlines()[0] for p in prog._prog.exe.plan["pipelines"]
                     if " mma " in p["wgsl"].splitlines()[0]]
            assert len(heads) == 1 and "-> epilogue" in heads[0], heads
            assert ("epi_ahead=True" in heads[0]) == opts.mma_epi_ahead, heads[0]
        got.append(np.asarray(prog.run(feed), dtype=np.float64))
    ref, first, *rest = got
    for g in rest:
        np.testing.assert_array_equal(g, first)
    np.testing.assert_allclose(first, ref, rtol=2.0 ** -10, atol=2.0 ** -10 * np.abs(ref).max())


def _two_mixed_steps(opts, third=False):
    """Two precision="mixed" AdamW steps of two linear layers (third: and a third, whose
    weight gradient reads the second's output transposed) on this machine's adapter with
    kernel options `opts`: (losses, parameters, the pipelines' first lines, the kernels'
    names)."""
    import webgrad as wg
    from webgrad import Module, ops, optim

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.W1 = self.param([64, 64])
            self.W2 = self.param([64, 64])
            if third:
                self.W3 = self.param([64, 64])

    def loss(m, f):
        h = ops.matmul(ops.relu(ops.matmul(f["x"], m.W1)), m.W2)
        return ops.mean_all(((ops.matmul(h, m.W3) if third else h) - f["y"]) ** 2.0)

    rng = np.random.default_rng(20)
    feed = {"x": rng.standard_normal((64, 64)).astype(np.float32),
            "y": rng.standard_normal((64, 64)).astype(np.float32)}
    c = wg.compile_module(Net, loss, inputs={"x": [64, 64], "y": [64, 64]},
                          optimizer=optim.AdamW(lr=1e-2), backend="webgpu",
                          precision="mixed", seed=4, kernel_options=opts)
    losses = [float(c.step(feed)) for _ in range(2)]
    heads = [p["wgsl"].splitlines()[0] for p in c._train.exe.plan["pipelines"]]
    return (losses, {k: np.asarray(v) for k, v in c.download_params().items()}, heads,
            c._train.exe.kernel_names)


@pytest.mark.webgpu
@pytest.mark.skipif(not backends.webgpu_available(), reason="no native WebGPU adapter")
@pytest.mark.parametrize("mode", ["weights", True, "all"])
def test_mixed_step_reads_its_f16_copies_transposed(mode):
    """KernelOptions.mma_transposed: a precision="mixed" training step (linear layers,
    AdamW) whose input gradient reads W2's f16 copy transposed (b_t; "weights", "all")
    and whose weight gradients read x's and relu's output's f16 copies transposed (a_t;
    "all") or (True, three layers) the second layer's output's, which nothing else in the
    backward keeps, on this machine's adapter with the subgroup-matrix kernels in plain
    WGSL (mma_emulate): those rounded copies of transposes are gone, and two steps give
    the same losses and parameters, bit for bit, as the program that makes them (the same
    f16 values, the same sums in the same order)."""
    from webgrad.codegen import KernelOptions
    _f16_backend()
    third = mode is True
    runs = {views: _two_mixed_steps(KernelOptions(mma_emulate=True, mma_transposed=views), third)
            for views in (False, mode)}
    (l0, p0, h0, k0), (l1, p1, h1, k1) = runs[False], runs[mode]
    assert l1 == l0 and all(np.array_equal(p1[k], p0[k]) for k in p0)
    # the rounded copies of W2^T (and x^T, relu's h^T; True: the second output's) are
    # elementwise kernels; the products stay
    gone = {"weights": 1, True: 1, "all": 3}[mode]
    assert k1.count("elementwise") == k0.count("elementwise") - gone, (k0, k1)
    assert sum(" mma " in k for k in k1) == sum(" mma " in k for k in k0) == (8 if third else 5)
    mma = [h for h in h1 if " mma " in h]
    assert any("a_t=True" in h for h in mma) == (mode != "weights"), mma
    assert any("b_t=True" in h for h in mma) == (mode != True), mma
    assert not any("a_t=True" in h or "b_t=True" in h for h in h0)


@pytest.mark.webgpu
@pytest.mark.skipif(not backends.webgpu_available(), reason="no native WebGPU adapter")
def test_mixed_step_takes_the_views_where_its_products_run_on_subgroup_matrices():
    """mma_transposed=None: the backend decides (Backend.transposed_views): True where the
    products run on subgroup matrices (here the emulated kernels), so the step is True's;
    False on this adapter without them (the tiled kernels), so the step is False's, kernel
    for kernel; the reference executor takes none."""
    import webgrad as wg
    from webgrad.codegen import KernelOptions
    _f16_backend()
    auto, on = (_two_mixed_steps(KernelOptions(mma_emulate=True, mma_transposed=v), third=True)
                for v in (None, True))
    assert auto[0] == on[0] and auto[2] == on[2] and auto[3] == on[3]
    assert any("a_t=True" in h for h in auto[2])
    plain, off = (_two_mixed_steps(KernelOptions(mma_transposed=v)) for v in (None, False))
    assert plain[0] == off[0] and plain[3] == off[3] and not any(" mma " in k for k in plain[3])
    be = wg.backends.get_backend("webgpu")
    assert be.transposed_views(KernelOptions(mma_emulate=True, mma_transposed=None)) is True
    assert be.transposed_views(KernelOptions(mma_transposed=None)) is False
    assert be.transposed_views(KernelOptions(mma_transposed="all")) == "all"
    assert wg.backends.get_backend("reference").transposed_views(KernelOptions(mma_transposed="all")) is False


@pytest.mark.webgpu
@pytest.mark.skipif(not backends.webgpu_available(), reason="no native WebGPU adapter")
@pytest.mark.parametrize("views", [False, True])
def test_mixed_step_with_transposing_copies_is_the_same_step(views):
    """The slab copies that transpose into workgroup memory (MmaTiling.a_x / b_x, for
    every product: KernelOptions.mma_xcopy, or through mma_tiling's fields), with operands
    read as stored and
    (views) transposed: every product of the mixed step takes them, and two steps give
    the same losses and parameters, bit for bit, as the plain copies (the same f16 values
    in the same matrices, the same sums)."""
    from webgrad.codegen import KernelOptions
    _f16_backend()
    base = KernelOptions(mma_emulate=True, mma_transposed=views)
    l0, p0, h0, _ = _two_mixed_steps(base)
    over = (("bm", 64), ("bn", 64), ("a_x", True), ("b_x", True))   # (the layers are 64 wide)
    for opts in (replace(base, mma_xcopy=True), replace(base, mma_tiling=over)):
        l1, p1, h1, _ = _two_mixed_steps(opts)
        assert l1 == l0 and all(np.array_equal(p1[k], p0[k]) for k in p0)
        mma = [h for h in h1 if " mma " in h]
        assert len(mma) == len([h for h in h0 if " mma " in h]) > 0
        assert all("a_x=True" in h and "b_x=True" in h for h in mma), mma
    assert not any("a_x=True" in h or "b_x=True" in h for h in h0)
    _, _, ha, _ = _two_mixed_steps(replace(base, mma_xcopy="a"))
    mma = [h for h in ha if " mma " in h]
    assert all("a_x=True" in h and "b_x=True" not in h for h in mma), mma


def test_mma_kernel_takes_a_product_the_tiled_kernel_splits_over_k():
    """x [128, 2048] @ W [2048, 128] + r with the tiled kernel's configuration forced to a
    split over K into 4 chunks (as GPT-2's [4096, 3072] @ [3072, 768] splits on the H200's
    tiling row: scratch and a second kernel). With the kernel's own split off
    (mma_split_below=0) the plan gives it no scratch (matmul.mma_takes): the
    subgroup-matrix kernel walks the whole K in one workgroup and hands the sums, numpy's
    product, to the residual add's epilogue; without subgroup matrices the same program
    still splits."""
    from webgrad import Module, ops
    from webgrad.codegen import KernelOptions
    from webgrad.codegen.matmul import Config
    opts = KernelOptions(force_config=Config(8, 8, 8, splits=4), mma_split_below=0)

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.W = self.param([2048, 128])

    fn = (Net, lambda m, f: f["r"] + ops.matmul(f["x"], m.W))
    inputs = {"x": [128, 2048], "r": [128, 128]}
    plan = _plan(fn, inputs, kernel_options=opts)
    (cmd, wgsl), = _mma_pipelines(plan)
    assert "128x2048 @ 2048x128 -> epilogue" in wgsl.splitlines()[0]
    assert not any("split" in p["wgsl"].splitlines()[0] for p in plan["pipelines"])
    rng = np.random.default_rng(8)
    A16 = rng.standard_normal((128, 2048)).astype(np.float16)
    B16 = rng.standard_normal((2048, 128)).astype(np.float16)
    got = _run_epilogue_kernel(cmd, wgsl, A16, B16, 128 * 128).reshape(128, 128)
    want = A16.astype(np.float64) @ B16.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    plain = _plan(fn, inputs, _PlanHost(("shader-f16",)), kernel_options=opts)
    assert any(" split " in p["wgsl"].splitlines()[0] for p in plain["pipelines"])


def test_mma_kernel_splits_a_product_of_few_tiles_over_k():
    """x [128, 2048] @ W [2048, 128] + r is 4 tiles of 64 x 64, under mma_split_below's 256:
    the subgroup-matrix kernel computes 8 chunks of K = 256 (matmul_mma.mma_splits), chunk
    wg.z's partial product into scratch (A's rows read 2048 halves long, lda), and the
    split kernel's chunk sum (matmul_splitk.py) runs the residual add. The emulated
    partials are numpy's products of the chunks, and their sum numpy's whole product."""
    from webgrad import Module, ops

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.W = self.param([2048, 128])

    fn = (Net, lambda m, f: f["r"] + ops.matmul(f["x"], m.W))
    plan = _plan(fn, {"x": [128, 2048], "r": [128, 128]})
    (cmd, wgsl), = _mma_pipelines(plan)
    assert "8 x 128x256 @ 256x128 -> f32" in wgsl.splitlines()[0]
    assert cmd["workgroups"] == [2, 2, 8]
    assert any("sum of 8 K chunks" in p["wgsl"] for p in plan["pipelines"])
    rng = np.random.default_rng(9)
    A16 = rng.standard_normal((128, 2048)).astype(np.float16)
    B16 = rng.standard_normal((2048, 128)).astype(np.float16)
    part = emulate(wgsl, tuple(cmd["workgroups"]), _tiling(wgsl), A16, B16, names=_names(wgsl),
                   c_size=8 * 128 * 128).reshape(8, 128, 128)
    A, B = A16.astype(np.float64), B16.astype(np.float64)
    want = np.stack([A[:, k * 256:(k + 1) * 256] @ B[k * 256:(k + 1) * 256] for k in range(8)])
    np.testing.assert_allclose(part, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    np.testing.assert_allclose(part.sum(0), A @ B, rtol=1e-5, atol=1e-5 * np.abs(A @ B).max())


def test_compiler_takes_a_kernel_variant_from_the_options():
    """KernelOptions.mma_tiling reaches the compiler's kernels: a batch of both operands
    (x [3, 64, 64] @ y [3, 64, 128]) and an epilogue (gelu(x @ W + b)) on a double-buffered
    32 x 64 tile (16 KB of workgroup memory) with the "row" fragment order, each emulated
    against numpy; with the variant's bm = 128, which 64 rows do not divide, the table's
    tiling stays."""
    from webgrad import Module, ops
    from webgrad.codegen import KernelOptions
    var = KernelOptions(mma_tiling=(("bm", 32), ("bn", 64), ("bk", 16), ("sg_m", 1), ("sg_n", 2),
                                    ("frag", "row"), ("double_buffer", True), ("stage", 1)))
    plan = _plan((Module, lambda m, f: ops.softmax_last(ops.matmul(f["x"], f["y"]))),
                 {"x": [3, 64, 64], "y": [3, 64, 128]}, kernel_options=var)
    (cmd, wgsl), = _mma_pipelines(plan)
    t = _tiling(wgsl)
    assert (t.bm, t.bn, t.frag, t.double_buffer, t.out) == (32, 64, "row", True, "f16")
    rng = np.random.default_rng(10)
    A16 = rng.standard_normal((3, 64, 64)).astype(np.float16)
    B16 = rng.standard_normal((3, 64, 128)).astype(np.float16)
    got = emulate(wgsl, tuple(cmd["workgroups"]), t, A16.reshape(-1, 64), B16.reshape(-1, 128),
                  names=_names(wgsl), c_size=3 * 64 * 128)
    want = A16.astype(np.float64) @ B16.astype(np.float64)
    np.testing.assert_allclose(got.reshape(3, 64, 128).astype(np.float64), want, rtol=2e-3,
                               atol=2e-3 * np.abs(want).max())

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.W = self.param([64, 128])
            self.b = self.param([128], init="zeros")

    fn = (Net, lambda m, f: ops.gelu(ops.matmul(f["x"], m.W) + m.b))
    (cmd, wgsl), = _mma_pipelines(_plan(fn, {"x": [2, 32, 64]}, kernel_options=var))
    assert _tiling(wgsl).frag == "row" and "-> epilogue" in wgsl.splitlines()[0]
    X16 = rng.standard_normal((64, 64)).astype(np.float16)
    W16 = rng.standard_normal((64, 128)).astype(np.float16)
    got = _run_epilogue_kernel(cmd, wgsl, X16, W16, 64 * 128).reshape(64, 128)
    want = X16.astype(np.float64) @ W16.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    tall = KernelOptions(mma_tiling=(("frag", "row"),))    # 128 x 128: no divisor of 64 rows
    (cmd, wgsl), = _mma_pipelines(_plan(fn, {"x": [2, 32, 64]}, kernel_options=tall))
    # the table's, with the default epilogue rounds (KernelOptions.mma_epi_vec 4, one matrix
    # staged a round: mma_epi_stage 1, which lets the 64 x 64 tile fit 16 KB)
    assert _tiling(wgsl) == MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, epi_vec=4, stage=1)


def test_peeled_kernel_with_one_k_step():
    """peel with a single K step: the loop runs no iteration and the peeled step does it all
    (the split kernels' chunks can be one slab long)."""
    t = MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, peel=True, frag="row")
    rng = np.random.default_rng(11)
    A16 = rng.standard_normal((64, 32)).astype(np.float16)
    B16 = rng.standard_normal((32, 128)).astype(np.float16)
    wgsl, groups = mma_matmul_wgsl(64, 128, 32, t)
    assert "s < 0u" in wgsl
    want = A16.astype(np.float64) @ B16.astype(np.float64)
    np.testing.assert_allclose(emulate(wgsl, groups, t, A16, B16).reshape(64, 128), want,
                               rtol=1e-5, atol=1e-5 * np.abs(want).max())


# ---------------------------------------------------------------- the epilogue's rounds, width 4 from vec4

def _epilogue_values(wgsl, groups, t, A16, B16, c_size, names=("A", "B", "C"), fn="epi"):
    """{flat index: value} of every epilogue call of an emulated kernel, each index once."""
    seen = {}

    def epi(flat, v):
        for f, x in zip(np.broadcast_to(flat, (32,)).tolist(), np.broadcast_to(v, (32,)).tolist()):
            assert f not in seen, f"element {f} handed to the epilogue twice"
            seen[f] = x
    emulate(wgsl, groups, t, A16, B16, names=names, epi=(fn, epi), c_size=c_size)
    assert sorted(seen) == list(range(c_size)), "every result element handed over once"
    return np.array([seen[f] for f in range(c_size)])


@pytest.mark.parametrize("t,ld", [
    (MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, epi_vec=4), 0),
    (MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, epi_rows=2), 0),
    (MmaTiling(bm=64, bn=128, bk=32, sg_m=2, sg_n=2, epi_rows=2, epi_vec=2), 8),
    (MmaTiling(bm=128, bn=64, bk=16, sg_m=2, sg_n=1, epi_rows=2, epi_vec=8, frag="row"), 8),
    (MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, epi_vec=4, width=4), 2),
    (MmaTiling(bm=64, bn=32, bk=32, sg_m=2, sg_n=1, m=16, n=8, k=16, epi_vec=2, epi_rows=2), 4),
], ids=lambda x: repr(x) if isinstance(x, int) else
       f"{x.bm}x{x.bn}x{x.bk}:r{x.epi_rows}:v{x.epi_vec}:w{x.width}:{x.m}x{x.n}")
def test_epilogue_rounds_hand_over_numpys_product(t, ld):
    """epi_rows (rows of result matrices a round) and epi_vec (neighbours per invocation),
    with and without the split epilogue's loads first (epi_ld): every element of C reaches
    the epilogue once, at its flat index, with numpy's product; a lane's epi_vec elements
    are neighbours (flat f, f + 1, ...), and the rounds have two barriers each but the last."""
    M, N, K = 2 * t.bm, 2 * t.bn, 3 * t.bk
    rng = np.random.default_rng(12)
    A16 = rng.standard_normal((M, K)).astype(np.float16)
    B16 = rng.standard_normal((K, N)).astype(np.float16)
    wgsl, groups = mma_matmul_wgsl(M, N, K, t, epi="epi", epi_ld=ld)
    got = _epilogue_values(wgsl, groups, t, A16, B16, M * N).reshape(M, N)
    want = A16.astype(np.float64) @ B16.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    rounds = t.tm // t.epi_rows
    tail = wgsl[wgsl.rindex("acc0_0, false"):]
    assert tail.count("workgroupBarrier()") == 2 * rounds - 1
    assert f"* {t.epi_vec}u + {t.epi_vec - 1}u;" in tail
    if ld:
        assert "epi_ld(" in tail


def test_epilogue_rounds_catch_a_wrong_index():
    """The wide form with a lane's second element read from its first one's place in the
    staging gives other values (the test above can fail)."""
    t = MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, epi_vec=2, epi_rows=2)
    rng = np.random.default_rng(13)
    A16 = rng.standard_normal((64, 64)).astype(np.float16)
    B16 = rng.standard_normal((64, 64)).astype(np.float16)
    wgsl, groups = mma_matmul_wgsl(64, 64, 64, t, epi="epi")
    bad = wgsl.replace("let c1 = Cs[sg * 1024u + q1];", "let c1 = Cs[sg * 1024u + q0];")
    assert bad != wgsl
    got = _epilogue_values(bad, groups, t, A16, B16, 64 * 64).reshape(64, 64)
    assert not np.allclose(got, A16.astype(np.float64) @ B16.astype(np.float64), rtol=1e-3, atol=1e-2)


@pytest.mark.parametrize("t", [MmaTiling(bm=64, bn=64, bk=32, sg_m=2, sg_n=2, width=4),
                               MmaTiling(bm=64, bn=128, bk=32, sg_m=2, sg_n=2, width=4, peel=True,
                                         out="f16"),
                               MmaTiling(bm=64, bn=64, bk=16, sg_m=2, sg_n=2, width=4,
                                         double_buffer=True, frag="row")],
                         ids=lambda t: f"{t.bm}x{t.bn}x{t.bk}:{t.out}:db{int(t.double_buffer)}")
def test_width_4_copies_from_vec4_bindings(t):
    """Width 4 read from vec4<u32> operands (bound=8): each invocation takes the half of the
    vec4 holding its four halves, and the workgroup stores are width 4's (the same as with
    vec2 bindings); the product is numpy's. Taking the other half gives another product.
    (The compiler binds vec2<u32> for width 4: this form measured slower on the H200.)"""
    M, N, K = 2 * t.bm, 2 * t.bn, 3 * t.bk
    rng = np.random.default_rng(14)
    A16 = rng.standard_normal((M, K)).astype(np.float16)
    B16 = rng.standard_normal((K, N)).astype(np.float16)
    wgsl, groups = mma_matmul_wgsl(M, N, K, t, bound=8)
    own, _ = mma_matmul_wgsl(M, N, K, t)
    assert "var<storage, read> A: array<vec4<u32>>" in wgsl and "array<vec2<u32>>" in own
    stores = lambda text: [ln for ln in text.splitlines() if "let o = " in ln or "] = h" in ln]
    assert stores(wgsl) == stores(own)
    want = A16.astype(np.float64) @ B16.astype(np.float64)
    tol = 2e-3 if t.out == "f16" else 1e-5
    got = emulate(wgsl, groups, t, A16, B16).reshape(M, N).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    bad = wgsl.replace("== 1u);", "== 0u);")
    assert bad != wgsl
    got = emulate(bad, groups, t, A16, B16).reshape(M, N).astype(np.float64)
    assert not np.allclose(got, want, rtol=1e-2, atol=1e-1)
    with pytest.raises(ValueError, match="width 4 from vec4"):
        mma_matmul_wgsl(M, N, K, replace(t, width=2), bound=8)


def test_compiler_takes_the_epilogue_rounds_and_width_4_from_the_options():
    """KernelOptions.mma_width=4 (operands bound as vec2<u32>), mma_epi_rows, mma_epi_vec
    reach the compiler's kernels:
    gelu(x @ W + b) and a residual add r + x @ W (the epilogues GPT-2's MLP and projections
    get), and a plain f16 product; each emulated against numpy. Where epi_rows does not fit
    the workgroup memory (128 x 128 on the H200's 48 KB) the most rows that do are taken;
    the defaults leave the kernels as they were (no new field in their first lines)."""
    from webgrad import Module, ops
    from webgrad.codegen import KernelOptions
    on = KernelOptions(mma_width=4, mma_epi_rows=2, mma_epi_vec=4, mma_stage=0, mma_epi_stage=0)

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.W = self.param([64, 128])
            self.b = self.param([128], init="zeros")

    rng = np.random.default_rng(15)
    cases = [((Net, lambda m, f: ops.gelu(ops.matmul(f["x"], m.W) + m.b)), {"x": [2, 64, 64]}),
             ((Net, lambda m, f: f["r"] + ops.matmul(f["x"], m.W)), {"x": [128, 64], "r": [128, 128]})]
    for fn, inputs in cases:
        (cmd, wgsl), = _mma_pipelines(_plan(fn, inputs, kernel_options=on))
        t = _tiling(wgsl)
        assert (t.width, t.epi_rows, t.epi_vec) == (4, 2, 4) and "-> epilogue" in wgsl.splitlines()[0]
        a, b = _names(wgsl)[:2]     # width 4: the operands bound as vec2<u32>
        assert f"var<storage, read> {a}: array<vec2<u32>>" in wgsl and \
            f"var<storage, read> {b}: array<vec2<u32>>" in wgsl
        X16 = rng.standard_normal((128, 64)).astype(np.float16)
        W16 = rng.standard_normal((64, 128)).astype(np.float16)
        got = _run_epilogue_kernel(cmd, wgsl, X16, W16, 128 * 128).reshape(128, 128)
        want = X16.astype(np.float64) @ W16.astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        (_, plain), = _mma_pipelines(_plan(fn, inputs))
        assert "epi_rows" not in plain.splitlines()[0] and "width" not in plain.splitlines()[0]
        assert _tiling(plain).epi_vec == 4     # the default (KernelOptions.mma_epi_vec)
    (cmd, wgsl), = _mma_pipelines(_plan((Module, lambda m, f: ops.softmax_last(ops.matmul(f["x"], f["y"]))),
                                        {"x": [128, 64], "y": [64, 128]}, kernel_options=on))
    t = _tiling(wgsl)
    assert t.width == 4 and t.epi_rows == 1 and t.out == "f16"
    X16 = rng.standard_normal((128, 64)).astype(np.float16)
    Y16 = rng.standard_normal((64, 128)).astype(np.float16)
    got = emulate(wgsl, tuple(cmd["workgroups"]), t, X16, Y16, names=_names(wgsl)).reshape(128, 128)
    want = X16.astype(np.float64) @ Y16.astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


def test_tiling_options_fit_the_h200():
    """On the H200's limits (48 KB of workgroup memory) mma_epi_rows=4 leaves a 128 x 128 x 32
    tile at one row (two need 51712 bytes) and gives a 64 x 64 one both its rows; the options
    never change the tile itself."""
    from dataclasses import replace as rep
    from webgrad.codegen import KernelOptions
    from webgrad.codegen.matmul_mma import epilogue_staging_bytes, tiling_for
    from webgrad.codegen.wgsl import Limits
    h200 = Limits(shader_f16=True, max_compute_workgroup_storage_size=49152,
                  subgroup_matrix=(("f16", "f32", 16, 16, 16, 32, 32),))
    on = rep(h200, options=KernelOptions(mma_width=4, mma_epi_rows=4, mma_epi_vec=4,
                                         mma_epi_stage=0))   # a whole row staged a round
    t = tiling_for(on, 8192, 4096, 1024, epilogue=True)
    assert (t.bm, t.bn, t.bk, t.width, t.epi_rows, t.epi_vec) == (128, 128, 32, 4, 1, 4)
    t = tiling_for(on, 192, 192, 64, epilogue=True)
    assert (t.bm, t.epi_rows) == (64, 2)
    small = rep(on, options=KernelOptions(mma_epi_rows=2, mma_tiling=(("bk", 16),), mma_epi_stage=0))
    t = tiling_for(small, 8192, 4096, 1024, epilogue=True)
    assert (t.bm, t.bk, t.epi_rows) == (128, 16, 2) and t.workgroup_bytes() + 2 * 16384 <= 49152
    assert tiling_for(on, 8192, 4096, 1024).epi_rows == 1    # no epilogue: no staging rounds
    # the defaults: one matrix staged a round (mma_stage, mma_epi_stage), 23 KB a workgroup
    for out, epi in (("f16", False), ("f32", True)):
        t = tiling_for(h200, 8192, 4096, 1024, out=out, epilogue=epi)
        assert (t.bm, t.bn, t.stage) == (128, 128, 1)
        assert t.workgroup_bytes() + (epilogue_staging_bytes(t) if epi else 0) == 18944 + 4096
    t = tiling_for(rep(h200, options=KernelOptions(mma_epi_rows=4)), 8192, 4096, 1024, epilogue=True)
    assert t.epi_rows == 4 and epilogue_staging_bytes(t) == 16384   # four rows of one matrix
