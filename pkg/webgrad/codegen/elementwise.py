"""Elementwise ops: their WGSL formulas, and the fused elementwise kernel.

Each elementwise primitive is one expression rule (emit.EXPR_RULES): the value at an index
from its inputs' values at the broadcast index. Fusion needs nothing more: a group of
elementwise nodes (chosen by fusion.py) becomes ONE kernel whose threads evaluate every
output of the group at an element's flat index (ELEMS elements a thread), sharing common
subexpressions, and stores them all (the Adam update of a parameter writes m, v and p from
one kernel). Numerics that WGSL leaves loose are pinned here:
  tanh   our own f32 formula (below, tanh_f), within ~2 ulp, no inf/inf; WGSL's tanh
         made GELU's matmul epilogues slow on an H200 (bench/README.md)
  pow    integer exponents by multiplication / |x|^p with the sign fixed (WGSL's pow is
         exp2(p log2 x): NaN for x < 0); p = +-0.5 as sqrt / inverseSqrt
  erf    our own f32 approximation (below), max relative error ~1.7e-7 (3 ulp)
  i32 /  WGSL truncates toward zero, as numpy's trunc(x / y) does
  NaN    WGSL leaves max/min/clamp/sign of NaN undefined (lavapipe: relu(NaN) = 0,
         tanh(NaN) = -1, max(inf, NaN) = inf; SwiftShader: exp(NaN) = inf), which would hide
         a NaN loss; these ops test for NaN on the bits (isnan_f: a compiler may fold
         `x != x` away) and follow torch: relu/tanh/maximum/minimum/exp/log/sqrt/rsqrt/
         sigmoid/erf propagate NaN, sign(NaN) = 0
"""
from __future__ import annotations

from math import prod

from .emit import Emitter, Idx, rule
from .layout import swaps_last_two
from .wgsl import WG, Literal, f32_lit, lit, wgsl_type

# erf(x) for |x| < 0.75 is x * P(x^2); for 0.75 <= |x| < 4 it is 1 - exp(-x^2) Q(s), where
# Q approximates erfc(x) exp(x^2) in s = (1/x - 0.79167) / 0.54167 in [-1, 1]; beyond 4,
# erfc(x) < 1.6e-8 is below half an ulp of 1. P (degree 6 in x^2) and Q (degree 11) are
# least-squares fits on Chebyshev nodes against math.erf/erfc in double precision, with the
# coefficients rounded to f32; evaluated in f32 the result is within 1.7e-7 relative of erf.
_ERF_P = (9.473000682191923e-05, -0.0008357358165085316, 0.005216816905885935,
          -0.026864780113101006, 0.1128377839922905, -0.37612637877464294, 1.128379225730896)
_ERF_Q = (9.641810720495414e-06, -1.554706977913156e-05, -1.516406518931035e-05,
          7.479099440388381e-05, -0.0001993217010749504, 0.0004818224406335503,
          -0.0007836109143681824, -0.00013569001748692244, 0.0078864935785532,
          -0.043530456721782684, 0.1780710518360138, 0.3650936484336853)
_ERF_MID, _ERF_INVHALF = 0.7916666865348816, 1.8461538553237915


def _horner(coeffs, v) -> str:
    e = f32_lit(coeffs[0])
    for c in coeffs[1:]:
        e = f"fma({e}, {v}, {f32_lit(c)})"
    return e


ERF_WGSL = f"""fn erf_f(x: f32) -> f32 {{
  let a = abs(x);
  if (a < 0.75f) {{
    let t = a * a;
    return x * {_horner(_ERF_P, "t")};
  }}
  if (a >= 4.0f) {{
    return sign(x);
  }}
  let s = (1.0f / a - {f32_lit(_ERF_MID)}) * {f32_lit(_ERF_INVHALF)};
  let r = 1.0f - exp(-(a * a)) * {_horner(_ERF_Q, "s")};
  return select(r, -r, x < 0.0f);
}}
"""


# tanh(x) for |x| < 0.75 is x + x^3 P(x^2) (P: degree 5, least squares on Chebyshev nodes
# in x^2 against numpy's tanh in double precision, relative weights, coefficients rounded to
# f32; 0.72 ulp evaluated in f32); beyond, 1 - 2 / (1 + exp(2|x|)) with the sign of x,
# where the subtraction loses nothing (tanh >= 0.63) and |x| is clamped to 15 (tanh(15)
# rounds to 1) so exp stays finite on every backend. Both sides are computed and one
# selected: GELU's argument puts both in one warp anyway. On an H200 through Dawn WGSL's
# tanh cost ~0.05 ms per 12.6M values inside a matmul epilogue (bench/README.md,
# 2026-11-30: the GPT-2 MLP up-projection with its GELU 0.534-0.541 ms -> 0.519, a product
# with three tanh in its epilogue 0.706-0.727 -> 0.617).
_TANH_P = (0.0017302967607975006, -0.007645958568900824, 0.02144482545554638,
           -0.05389061197638512, 0.1333266645669937, -0.3333331346511841)
TANH_WGSL = f"""fn tanh_f(x: f32) -> f32 {{
  let a = abs(x);
  let s = a * a;
  let p = x * fma(s, {_horner(_TANH_P, "s")}, 1.0f);  // x * (...): keeps -0
  let r = 1.0f - 2.0f / (1.0f + exp(2.0f * min(a, 15.0f)));
  return select(select(r, -r, x < 0.0f), p, a < 0.75f);
}}
"""


def _pow(x: str, p: float) -> str:
    if p == 0:
        return f32_lit(1.0)
    if p == int(p) and abs(p) <= 4:
        n = int(abs(p))
        e = " * ".join([x] * n)
        return f"({e})" if p > 0 else f"(1.0f / ({e}))"
    if p == 0.5:
        return f"sqrt({x})"
    if p == -0.5:
        return f"inverseSqrt({x})"
    if p == int(p):
        s = f"pow(abs({x}), {f32_lit(p)})"
        return f"select({s}, -{s}, {x} < 0.0f)" if int(p) % 2 else s
    return f"pow({x}, {f32_lit(p)})"


# sin/cos: WGSL only promises 2^-11 absolute error (SwiftShader is off by ~2e-4), so they are
# ours. For |x| <= 8192: k = round(x 2/pi), r = x - k pi/2 with pi/2 split in three parts
# (Cody-Waite; the first has 8 significant bits, so k * part is exact for |k| < 2^16; the
# error stays ~1e-7 up to 8192 and grows beyond, to 1e-6 at 1e5 and 1e-2 at 1e9), so
# larger arguments take the Payne-Hanek reduction: x = m 2^e with a 24-bit integer m, and
# x 2/pi mod 4 is m times a 96-bit window of the bits of 2/pi starting at bit e - 2 (earlier
# bits only add multiples of 4), done in u32 words (a 32x32 -> 64 bit product from 16-bit
# halves). Its top 2 bits are the quadrant, the other 94 the fraction, negated in the
# integer domain when >= 1/2 so that nothing cancels in f32; r = fraction * pi/2 is exact
# to f32 rounding for every finite f32 x. Then the f32 minimax polynomials for sin and cos
# on [-pi/4, pi/4] (Cephes' sinf/cosf coefficients) and the quadrant k mod 4. inf and NaN
# give NaN, as torch.
TWO_OVER_PI_WORDS = (0x0, 0xA2F9836E, 0x4E441529, 0xFC2757D1, 0xF534DDC0, 0xDB629599,
                     0x3C439041, 0xFE5163AB, 0xDEBBC561)  # a zero word, then 2/pi's bits 1..256

TRIG_WGSL = """var<private> trig_2opi: array<u32, 9> = array<u32, 9>(""" + ", ".join(
    f"0x{w:08x}u" for w in TWO_OVER_PI_WORDS) + """);

fn trig_mul64(a: u32, b: u32) -> vec2<u32> {
  let a0 = a & 0xffffu; let a1 = a >> 16u; let b0 = b & 0xffffu; let b1 = b >> 16u;
  let p00 = a0 * b0; let p01 = a0 * b1; let p10 = a1 * b0; let p11 = a1 * b1;
  let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
  return vec2<u32>((p00 & 0xffffu) | (mid << 16u), p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}

fn trig_window(q: u32) -> u32 {
  let i = q >> 5u;
  let s = q & 31u;
  let lo = select(trig_2opi[i + 1u] >> ((32u - s) & 31u), 0u, s == 0u);
  return (trig_2opi[i] << s) | lo;
}

fn trig_f(x: f32, quarter_turns: i32) -> f32 {
  var r: f32;
  var k: i32;
  let bits = bitcast<u32>(x);
  if (abs(x) <= 8192.0f) {
    let kf = round(x * 0.636619772f);
    r = ((x - kf * 1.5703125f) - kf * 4.837512969970703e-4f) - kf * 7.549789954891882e-8f;
    k = i32(kf);
  } else if ((bits & 0x7f800000u) == 0x7f800000u) {
    return bitcast<f32>(wg_nan_bits);
  } else {
    let m = (bits & 0x7fffffu) | 0x800000u;
    let p = ((bits >> 23u) & 0xffu) + 32u - 152u;
    let f2w = trig_window(p);
    let p0 = trig_mul64(m, trig_window(p + 64u));
    let p1 = trig_mul64(m, trig_window(p + 32u));
    var w0 = p0.x;
    var w1 = p0.y + p1.x;
    let w2 = p1.y + m * f2w + select(0u, 1u, w1 < p0.y);
    var q = w2 >> 30u;
    var f0 = w2 & 0x3fffffffu;
    var sgn = 1.0f;
    if ((f0 & 0x20000000u) != 0u) {
      q = q + 1u;
      sgn = -1.0f;
      w0 = ~w0 + 1u;
      let c1 = select(0u, 1u, w0 == 0u);
      w1 = ~w1 + c1;
      let c2 = select(0u, 1u, c1 == 1u && w1 == 0u);
      f0 = (~f0 & 0x3fffffffu) + c2;
    }
    let v = (f32(f0) * 9.313225746154785e-10f + f32(w1) * 2.168404344971009e-19f)
            + f32(w0) * 5.048709793414476e-29f;
    r = sgn * v * 1.5707963705062866f;
    k = i32(q & 3u);
    if (x < 0.0f) {
      r = -r;
      k = -k;
    }
  }
  let z = r * r;
  let s = ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f) * z * r + r;
  let c = ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f) * z * z
          - 0.5f * z + 1.0f;
  let q = (k + quarter_turns) & 3;
  return select(select(select(-c, -s, q == 2), c, q == 1), s, q == 0);
}"""


# NaN by its bits, which no float optimisation can assume away
ISNAN_WGSL = """fn isnan_f(x: f32) -> bool {
  return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}
"""

_NAN_SAFE = {"relu", "tanh", "sign", "maximum", "minimum",  # need isnan_f
             "exp", "log", "sqrt", "rsqrt", "sigmoid", "erf"}


def _keep_nan(x: str, e: str) -> str:
    # SwiftShader's exp(NaN) is inf (so sigmoid(NaN) = 0); its transcendental functions
    # are bit tricks that need not pass NaN through, so NaN is passed on explicitly
    return f"select({e}, {x}, isnan_f({x}))"

# x ** y for two tensors, as torch.pow: WGSL's pow is exp2(y log2 x), undefined for x <= 0.
# Here |x|^y = exp2(y log2 |x|) with the sign of an odd integer y, NaN for a negative base
# and a non-integer y, x^0 = 1 (also for NaN), and 0^y = 0 / inf by the sign of y (signed
# like the base for odd y), 1^y = 1 (also for NaN y), NaN otherwise when either is NaN.
POW_WGSL = """fn pow_f(x: f32, y: f32) -> f32 {
  if (y == 0.0f || x == 1.0f) { return 1.0f; }
  if (isnan_f(x) || isnan_f(y)) { return bitcast<f32>(wg_nan_bits); }
  let yint = trunc(y) == y;
  let odd = yint && abs(y) < 16777216.0f && (i32(y) & 1) == 1;
  var m: f32;
  if (x == 0.0f) {
    m = select(bitcast<f32>(wg_pinf_bits), 0.0f, y > 0.0f);
  } else {
    m = exp2(y * log2(abs(x)));
  }
  if (x < 0.0f) {
    if (!yint) { return bitcast<f32>(wg_nan_bits); }
    return select(m, -m, odd);
  }
  if (odd && (bitcast<u32>(x) & 0x80000000u) != 0u) { return -m; }  // -0 ** odd
  return m;
}
"""

_UNARY = {
    "neg": lambda x, a: x.negated() if isinstance(x, Literal) else f"(-{x})",
    "exp": lambda x, a: _keep_nan(x, f"exp({x})"),
    # SwiftShader's log(-2) is log(2) and log(-0) is -88: zeros and negatives explicitly
    "log": lambda x, a: (f"select(select(log({x}), bitcast<f32>(wg_ninf_bits), {x} == 0.0f), "
                         f"bitcast<f32>(wg_nan_bits), {x} < 0.0f || isnan_f({x}))"),
    "sqrt": lambda x, a: _keep_nan(x, f"sqrt({x})"),
    "rsqrt": lambda x, a: _keep_nan(x, f"inverseSqrt({x})"),
    "tanh": lambda x, a: _keep_nan(x, f"tanh_f({x})"),
    "sigmoid": lambda x, a: _keep_nan(x, f"(1.0f / (1.0f + exp(-{x})))"),
    "relu": lambda x, a: f"select(max({x}, 0.0f), {x}, isnan_f({x}))",
    "erf": lambda x, a: _keep_nan(x, f"erf_f({x})"),
    "abs": lambda x, a: f"abs({x})",
    "sign": lambda x, a: f"select(sign({x}), 0.0f, isnan_f({x}))",
    "sin": lambda x, a: f"trig_f({x}, 0)",
    "cos": lambda x, a: f"trig_f({x}, 1)",  # cos x = sin(x + pi/2)
    "pow": lambda x, a: _pow(x, float(a["p"])),
    "floor": lambda x, a: f"floor({x})",
    "trunc": lambda x, a: f"trunc({x})",
    "round": lambda x, a: f"round({x})",  # half to even, as torch.round
    "stop_gradient": lambda x, a: x,
}

_BINARY = {
    "add": lambda x, y: f"({x} + {y})",
    "sub": lambda x, y: f"({x} - {y})",
    "mul": lambda x, y: f"({x} * {y})",
    "div": lambda x, y: f"({x} / {y})",
    # the NaN operand itself (not x + y: a driver may fold x + (-x) to 0 under NaN-unsafe
    # algebra, lavapipe does)
    "maximum": lambda x, y: f"select(select(max({x}, {y}), {y}, isnan_f({y})), {x}, isnan_f({x}))",
    "minimum": lambda x, y: f"select(select(min({x}, {y}), {y}, isnan_f({y})), {x}, isnan_f({x}))",
    "less": lambda x, y: f"select(0.0f, 1.0f, {x} < {y})",
    "greater": lambda x, y: f"select(0.0f, 1.0f, {x} > {y})",
    "equal": lambda x, y: f"select(0.0f, 1.0f, {x} == {y})",
    "power": lambda x, y: f"pow_f({x}, {y})",
}

@rule(*_UNARY)
def _unary_rule(em: Emitter, node, idx: Idx) -> str:
    if node.op == "erf":
        em.k.helper("erf_f", ERF_WGSL)
    if node.op in ("sin", "cos"):
        em.k.helper("trig_f", TRIG_WGSL)
    if node.op == "tanh":
        em.k.helper("tanh_f", TANH_WGSL)
    if node.op in _NAN_SAFE:
        em.k.helper("isnan_f", ISNAN_WGSL)
    return _UNARY[node.op](em.arg(node, 0, idx), node.attrs)


@rule(*_BINARY)
def _binary_rule(em: Emitter, node, idx: Idx) -> str:
    x, y = em.arg(node, 0, idx), em.arg(node, 1, idx)
    if node.op == "power":
        em.k.helper("isnan_f", ISNAN_WGSL)
        em.k.helper("pow_f", POW_WGSL)
    if node.op in _NAN_SAFE and node.dtype == "i32":  # integers have no NaN
        return f"{node.op[:3]}({x}, {y})"
    if node.op in _NAN_SAFE:
        em.k.helper("isnan_f", ISNAN_WGSL)
    return _BINARY[node.op](x, y)


@rule("where")
def _where_rule(em, node, idx):
    c, x, y = (em.arg(node, k, idx) for k in range(3))
    return f"select({y}, {x}, {c} != 0.0f)"


# f32 -> nearest f16 (ties to even) as an f32, from the bits. Every f16 rounding held in a
# register takes it, also where the device has shader-f16: NVIDIA's compiler folds
# f32(f16(x)) to x (H200 through Dawn, 2026-12-02: no value of test_precision's rounding
# check was rounded), and WGSL leaves the rounding of such a conversion to the
# implementation. Past 65504 + half an ulp: inf; below 2^-14 the f16 subnormals' quantum
# 2^-24, rounded by round() (half to even); inf and NaN pass through. Values stored in f16
# buffers are rounded by this first, so the store's own conversion is exact. Every case is
# computed and one selected, no branch: the fused attention kernels on subgroup matrices,
# which round three or four times a score, ran 1.11 -> 0.79 ms a layer (H200, 2026-12-04).
ROUND_F16_WGSL = """fn wg_round_f16(x: f32) -> f32 {
  let b = bitcast<u32>(x);
  let a = b & 0x7fffffffu;
  let n = select((a + 0xfffu + ((a >> 13u) & 1u)) & 0xffffe000u, 0x7f800000u, a >= 0x477ff000u);
  let t = bitcast<u32>(round(bitcast<f32>(a) * 16777216.0f) * 5.9604644775390625e-8f);
  return bitcast<f32>((b & 0x80000000u) | select(select(n, t, a < 0x38800000u), a, a >= 0x7f800000u));
}"""


@rule("cast")
def _cast_rule(em, node, idx):
    if node.attrs["dtype"] == "f16":  # f16 rounding of a value held in f32 (f16_in_f32)
        return f"{em.k.helper('wg_round_f16', ROUND_F16_WGSL)}({em.arg(node, 0, idx)})"
    return f"{'f32' if node.dtype == 'f32' else 'i32'}({em.arg(node, 0, idx)})"


def const_fill(node):
    """The single value of a constant whose elements are all equal (inlined as a literal),
    else None (the constant gets a buffer)."""
    v = node.attrs["value"]
    if not isinstance(v, tuple):
        return v
    if len(v) and all(e == v[0] for e in v):
        return v[0]
    if not v:
        return 0
    return None


@rule("const")
def _const_rule(em, node, idx):
    v = const_fill(node)
    if v is None:
        raise AssertionError("a non-uniform constant must have storage")
    return lit(v, node.dtype)


@rule("arange")
def _arange_rule(em, node, idx):
    i = idx.dims(em)[0]
    return f"f32({i})" if node.dtype == "f32" else f"i32({i})"


# ---------------------------------------------------------------- the fused kernel

# Elements per thread of a large elementwise kernel (KernelOptions.elems, 4, once the domain has
# KernelOptions.elems_min, 1 << 18, elements or more): thread t
# of T takes t, t + T, t + 2T, ... (each load still coalesced across a warp), and loads all
# of them before it stores any (a GPU's compiler keeps a load after a store to a buffer that
# may alias it, so one element after another would wait out a memory latency each). H200
# through Dawn, 2026-12-01 (bench/README.md): the GPT-2 step's cross-entropy backward 0.707
# -> 0.420 ms (2.3 -> 3.9 TB/s), its elementwise kernels 1.24 -> 0.82 ms in all; 8 a thread
# no better.


# A copy through a transpose of the last two axes (the tied LM head's pad(wte^T), [768 x
# 50304] from wte [50257 x 768]) read one float per 3 KB of the source per thread: 0.34 ms
# for 2 x 154 MB on an H200, against 0.09 ms for the untied head's plain padded copy. On GPU
# adapters such a group is evaluated a TT x TT tile per workgroup: read along the source's
# rows (each warp one contiguous run), kept in workgroup memory (rows of TT + 1: both
# phases conflict-free), then stored along the output's rows. fusion_storage._transposed_reads
# stores large transposes that elementwise ops read (the tied head's weight gradient, for
# the token table's update) so that this kernel writes them. H200 through Dawn, 2026-12-01,
# the GPT2Module step at 8 x 512 (bench/README.md): the two copies 0.187 ms together, the
# token table's scatter kernel 0.82 -> 0.45 ms, the elementwise kernels 0.92 -> 0.59; the
# step 89.1 / 88.9 -> 88.3 / 88.4 ms. CPU adapters keep the flat kernel (a barrier there is
# a fiber switch per thread).
# (KernelOptions.tiled_transpose; KernelOptions.force_tiled_transpose, tests: True / False
# regardless of the adapter)
TT, TT_ROWS = 32, 8  # the tile's edge; threads per tile column (TT x TT_ROWS a workgroup)


def tiled_transposes(limits) -> bool:
    opts = limits.options
    if opts.force_tiled_transpose is not None:
        return opts.force_tiled_transpose
    return opts.tiled_transpose and not limits.cpu


def tileable(shape) -> bool:
    """Both of the last two axes at least a tile long (else the flat kernel does as well)."""
    return len(shape) >= 2 and min(shape[-2:]) >= TT


def transposing_copy(ctx) -> bool:
    """One stored output, computed from one stored tensor through pads and slices and a
    transpose of its last two axes (and nothing else but an f16 rounding: a cast to f16 of
    the output, the rounded copy of a transpose in a mixed step), both of those axes a tile
    long."""
    if (not tiled_transposes(ctx.limits) or len(ctx.outs) != 1 or ctx.writes_pieces
            or ctx.group.anchors != ctx.outs):
        return False
    g, n = ctx.g, ctx.outs[0]
    if not tileable(g[n].shape):
        return False
    x, swapped = n, False
    while x == n or x in ctx.compute or ctx.storage(x) is None:
        node = g[x]
        if swaps_last_two(node):
            swapped = not swapped
        elif node.op not in ("pad", "slice") and not (x == n and _rounds_f16(node)):
            return False
        x = node.inputs[0]
    return swapped


def _rounds_f16(node) -> bool:   # a cast to f16 (held in f32 or stored as f16)
    return node.op == "cast" and node.attrs.get("dtype") == "f16" and not node.attrs.get("exact")


def build_transposing_copy(ctx) -> list:
    """transposing_copy's tile kernel: workgroup w takes output rows r0.. r0 + TT and
    columns c0.. c0 + TT of one matrix of the batch; lane (lx, ly) reads element (r0 + lx,
    c0 + ly + TT_ROWS k) (lx along the source's contiguous axis) into tile[col][row], then
    stores (r0 + ly + TT_ROWS k, c0 + lx). Edge tiles read clamped indices and store only
    what exists."""
    n = ctx.outs[0]
    shape, dtype = ctx.g[n].shape, ctx.g[n].dtype
    R, C = shape[-2:]
    tr, tc = -(-R // TT), -(-C // TT)
    kernel = ctx.kernel("transposing_copy")
    kernel.decls.append(f"var<workgroup> tile: array<{wgsl_type(dtype)}, {TT * (TT + 1)}>;")
    em = ctx.emitter(kernel)
    grid = kernel.workgroup_index(em, prod(shape[:-2]) * tr * tc, "w")  # uniform: barrier ok
    em.emit(f"let c0 = (w % {tc}u) * {TT}u;")
    em.emit(f"let r0 = ((w / {tc}u) % {tr}u) * {TT}u;")
    batch = em.unravel(em.let(f"w / {tr * tc}u"), shape[:-2]) if len(shape) > 2 else []
    em.emit(f"let lx = lid % {TT}u;")
    em.emit(f"let ly = lid / {TT}u;")
    for k in range(TT // TT_ROWS):
        r = em.let(f"min(r0 + lx, {R - 1}u)")
        c = em.let(f"min(c0 + ly + {k * TT_ROWS}u, {C - 1}u)")
        v = em.value(n, Idx(shape, dims=batch + [r, c]))
        em.emit(f"tile[(ly + {k * TT_ROWS}u) * {TT + 1}u + lx] = {v};")
    em.emit("workgroupBarrier();")
    for k in range(TT // TT_ROWS):
        r, c = em.let(f"r0 + ly + {k * TT_ROWS}u"), em.let("c0 + lx")
        with em.block(f"if ({r} < {R}u && {c} < {C}u)"):
            em.store(ctx.storage(n), em.ravel(batch + [r, c], shape),
                     f"tile[lx * {TT + 1}u + ly + {k * TT_ROWS}u]")
    return [ctx.dispatch(kernel, em.lines, grid, TT * TT_ROWS)]


def build_elementwise(ctx) -> list:
    """Threads over the elements of the group's domain; every output stored at its flat
    index. KernelOptions.elems elements a thread once the domain has elems_min."""
    if transposing_copy(ctx):
        return build_transposing_copy(ctx)
    kernel = ctx.kernel("elementwise")
    em = ctx.emitter(kernel)
    E, E_MIN = ctx.limits.options.elems, ctx.limits.options.elems_min
    n, V = ctx.numel, E if ctx.numel >= max(E_MIN, 2 * E) else 1
    if V == 1:
        grid = kernel.thread_index(em, n, "i")
        ctx.write_outputs(em, "i", None)
        return [ctx.dispatch(kernel, em.lines, grid, WG)]
    T = -(-n // V)
    grid = kernel.thread_index(em, T, "t")
    stores = []
    for j in range(V):
        whole = (j + 1) * T <= n  # every thread's j-th element exists
        # past the end: the index is clamped (a valid address to load), the stores guarded
        em.emit(f"let i{j} = {f't + {j * T}u' if whole else f'min(t + {j * T}u, {n - 1}u)'};")
        em.declare(f"i{j}")
        at = len(em.stmts)
        ctx.write_outputs(em, f"i{j}", None)
        stores.append((whole, j, em.take_stores(at)))
    for whole, j, mine in stores:
        if whole:
            em.lines += mine
        else:
            em.emit(f"if (t + {j * T}u < {n}u) {{")
            em.lines += ["  " + ln for ln in mine]
            em.emit("}")
    return [ctx.dispatch(kernel, em.lines, grid, WG)]

