"""The op oracle: one table of records, each an op checked against torch through the whole
compile path, shared by every executor's test suite (reference, torch, webgpu, browser).

A record is plain data: a webgrad function as *source text* (`wg_src`, a lambda evaluated in
`namespace()`: `ops`, `nn`, `init`, `math`, `wg` and `with_params`), an equivalent torch
function written with torch's own ops, argument specs (shape + kind) and tolerances.

How a record runs (`run_webgrad`): its f32 arguments become the parameters of a Module
(`init.literal`), its i32 arguments become feeds, and the loss is
`sum_all(f(*args) * R)` for fixed pseudo-random weights R (so every gradient is
non-trivial); `compile_module(..., optimizer=None)` builds the program, `run` and `step`
return the output (`capture("out", y)`) and `download_param_grads()` the gradients.
`torch_reference` computes the same output and gradients with torch autograd in float64,
and `check_result` compares them within the record's tolerances
(`|got - want| <= atol + rtol |want|`).
`check(record, backend)` does all three.

Reuse by other suites:
  * `check(record, backend)` takes any backend spec ("webgpu", "torch:cuda", ...);
  * everything a record needs on the webgrad side is pure Python: inputs and R come from
    `random.Random(<record name>)` (`make_inputs`, `loss_weights`), so the same numbers can
    be regenerated anywhere without numpy, and this module imports neither numpy nor torch
    at the top (torch is loaded by `torch_reference` only; tests/test_registry.py checks
    that every record traces with both absent);
  * a browser suite writes this file into Pyodide's filesystem, imports it there, awaits
    `run_records_collect(names, "webgpu")` (plain lists come back, or a record's traceback
    as text), and finishes on the CPython side with `check_collected(results, names, where)`.
Records whose result is random (dropout, rand_uniform, categorical) add a `stat_check`
(structure and statistics; deterministic given the seed) and may compare against a torch
computation that reuses webgrad's own random draw (`torch_takes_out`).
"""
from __future__ import annotations

import array
import math
import random
import struct
from dataclasses import dataclass
from typing import Callable

import webgrad as wg
from webgrad import init, nn, ops
from webgrad.compiled import run_blocking
from webgrad.module import Module

torch = None  # bound by _load_torch(): the torch lambdas below resolve these at call time
F = None

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5


# ---------------------------------------------------------------- the table's data types

@dataclass(frozen=True)
class Arg:
    """One argument: its shape and how its values are drawn.
    kinds: normal N(0,1) | unit U(-1,1) | positive U(0.5,2) | away +-U(0.5,2) |
           grid multiples of 0.5 in [-2,2] (exact zeros) | coarse -1/0/1 (many ties) |
           zeros | large +-10^U(3,12) | special (NaN, +-inf, +-0, +-1 and ordinary values, cycled) | i32 in [lo, hi)."""
    shape: tuple[int, ...]
    kind: str = "normal"
    lo: int = 0
    hi: int = 0

    @property
    def dtype(self) -> str:
        return "i32" if self.kind == "i32" else "f32"


@dataclass(frozen=True)
class Record:
    name: str                         # unique: "<op>/<case>"
    wg_src: str                       # lambda source, evaluated in namespace()
    torch_fn: Callable | None         # same math in torch (float64 / int64 arguments)
    args: tuple[Arg, ...]
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL
    torch_takes_out: bool = False     # torch_fn(out, *args): reuses webgrad's random draw
    stat_check: Callable | None = None  # fn(record, got, inputs) for random ops
    check_grads: bool = True          # False: values only (NaN/inf inputs, where gradients
                                      # are not specified)

    @property
    def arg_names(self) -> list[str]:
        return [chr(ord("a") + k) for k in range(len(self.args))]


def f32(*shape, kind="normal") -> Arg:
    return Arg(tuple(shape), kind)


def i32(shape, lo, hi) -> Arg:
    return Arg(tuple(shape), "i32", lo, hi)


# ---------------------------------------------------------------- deterministic data


def _round_f32(values) -> list[float]:
    return array.array("f", values).tolist()


def make_inputs(record: Record) -> list[list]:
    """Flat value lists, one per argument (f32 values already rounded to float32)."""
    rng = random.Random(f"webgrad-oracle:{record.name}")
    out = []
    for a in record.args:
        n = math.prod(a.shape)
        if a.kind == "i32":
            out.append([rng.randrange(a.lo, a.hi) for _ in range(n)])
            continue
        if a.kind == "special":
            vals = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.0, 3.0]
            out.append(_round_f32(vals[k % len(vals)] for k in range(n)))
            continue
        draw = {
            "normal": lambda: rng.gauss(0.0, 1.0),
            "unit": lambda: rng.uniform(-1.0, 1.0),
            "positive": lambda: rng.uniform(0.5, 2.0),
            "away": lambda: rng.choice((-1.0, 1.0)) * rng.uniform(0.5, 2.0),
            "grid": lambda: rng.randrange(-4, 5) * 0.5,
            "coarse": lambda: float(rng.randrange(-1, 2)),
            "zeros": lambda: 0.0,
            "zero_or_positive": lambda: rng.choice((0.0, rng.uniform(0.5, 2.0))),
            "exponent": lambda: rng.choice((0.0, 1.0, 1.5, 2.0, 3.0)),
            "large": lambda: rng.choice((-1.0, 1.0)) * 10.0 ** rng.uniform(3.0, 12.0),
        }[a.kind]
        out.append(_round_f32(draw() for _ in range(n)))
    return out


def loss_weights(shape, name: str) -> list[float]:
    """The fixed weights R of loss = sum(f(...) * R), flat, float32-rounded."""
    rng = random.Random(f"webgrad-oracle-R:{name}")
    return _round_f32(rng.uniform(-1.0, 1.0) for _ in range(math.prod(shape)))


# ---------------------------------------------------------------- the webgrad side


def with_params(module, **tensors):
    """Point an nn module's parameters at given Tensors (the record's inputs), so that the
    module's own forward code is what gets tested."""
    for k, v in tensors.items():
        setattr(module, k, v)
    return module


def namespace() -> dict:
    """The names a record's wg_src may use."""
    return {"ops": ops, "nn": nn, "init": init, "math": math, "wg": wg, "with_params": with_params}


def _flat(v) -> list:
    v = v.tolist() if hasattr(v, "tolist") else v
    out: list = []

    def walk(e):
        if isinstance(e, (list, tuple)):
            for x in e:
                walk(x)
        else:
            out.append(e)
    walk(v)
    return out


def build_record(record: Record):
    """(factory, loss_fn, inputs, feed) for compile_module: f32 args are params holding the
    record's values, i32 args are feeds; pure Python (no numpy), as in the browser."""
    fn = eval(record.wg_src, namespace())
    values = make_inputs(record)
    names = record.arg_names

    def factory():
        m = Module()
        for name, a, v in zip(names, record.args, values):
            if a.dtype == "f32":
                setattr(m, name, m.param(a.shape, init=init.literal(v)))
        return m

    def loss_fn(m, feeds):
        xs = [getattr(m, n) if a.dtype == "f32" else feeds[n] for n, a in zip(names, record.args)]
        y = fn(*xs)
        ops.capture("out", y)
        r = ops.constant(loss_weights(y.shape, record.name), shape=y.shape)
        return ops.sum_all(ops.cast(y, "f32") * r)

    inputs = {n: (a.shape, "i32") for n, a in zip(names, record.args) if a.dtype == "i32"}
    feed = {n: v for n, a, v in zip(names, record.args, values) if a.dtype == "i32"}
    return factory, loss_fn, inputs, feed


def compile_record(record: Record, backend="reference", *, compile_module=None, seed: int = 0,
                   kernel_options=None):
    """(CompiledModule with optimizer=None, feed) for a record. kernel_options: the
    codegen.KernelOptions its kernels are generated with (None: the defaults)."""
    factory, loss_fn, inputs, feed = build_record(record)
    kw = {} if kernel_options is None else {"kernel_options": kernel_options}
    c = (compile_module or wg.compile_module)(factory, loss_fn, inputs=inputs, optimizer=None,
                                              backend=backend, seed=seed, **kw)
    return c, feed


async def run_webgrad_async(record: Record, backend="reference", *, compile_module=None,
                            kernel_options=None) -> dict:
    """Run a record through webgrad; returns plain data (lists), so it can cross from Pyodide."""
    c, feed = compile_record(record, backend, compile_module=compile_module,
                             kernel_options=kernel_options)
    try:
        loss_run, caps_run = await c.run_async(feed, with_captures=True)
        loss, caps = await c.step_async(feed, with_captures=True)
        grads = await c.download_param_grads_async()
        ir = c.ir
        out_node = ir[ir.outputs["capture:out"]]
        return {
            "name": record.name,
            "loss": float(loss), "loss_run": float(loss_run),
            "out": _flat(caps["out"]), "out_run": _flat(caps_run["out"]),
            "out_shape": list(out_node.shape), "out_dtype": out_node.dtype,
            "grads": {n: _flat(g) for n, g in grads.items()},
            "ops": sorted({n.op for n in ir.nodes}),
            "rand": [[n.attrs["seed"], list(n.shape)] for n in ir.nodes if n.op == "rand_uniform"],
        }
    finally:
        c.destroy()


def run_webgrad(record: Record, backend="reference", *, compile_module=None,
                kernel_options=None) -> dict:
    return run_blocking(run_webgrad_async(record, backend, compile_module=compile_module,
                                          kernel_options=kernel_options))


async def run_webgrad_by_name(name: str, backend="webgpu", kernel_options=None) -> dict:
    """Entry point for a browser worker: look the record up and run it (async)."""
    return await run_webgrad_async(BY_NAME[name], backend, kernel_options=kernel_options)


async def run_records_collect(names, backend="webgpu", kernel_options=None) -> dict:
    """Entry point for a browser worker running several records in one round trip: name ->
    {"ok": True, "got": run_webgrad's result} or {"ok": False, "error": the traceback}.
    A record that raises does not stop the others; its traceback (the innermost frames, where
    webgrad failed) crosses back as text, and `check_collected` on the host fails with it
    under the record's name. kernel_options: the codegen.KernelOptions a test forces (kernel
    forms, tilings) for every record."""
    import traceback
    results = {}
    for name in names:
        try:
            results[name] = {"ok": True, "got": await run_webgrad_by_name(name, backend, kernel_options)}
        except Exception:
            results[name] = {"ok": False, "error": traceback.format_exc(limit=-4)}
    return results


# ---------------------------------------------------------------- the torch side


def _load_torch():
    global torch, F
    if torch is None:
        import torch as _torch
        import torch.nn.functional as _F
        torch, F = _torch, _F
    return torch


def torch_reference(record: Record, got: dict | None = None) -> dict:
    """Output and gradients by torch autograd in float64 (None output: no torch forward)."""
    _load_torch()
    values = make_inputs(record)
    ts = []
    for a, v in zip(record.args, values):
        if a.dtype == "f32":
            ts.append(torch.tensor(v, dtype=torch.float64).reshape(a.shape).requires_grad_(True))
        else:
            ts.append(torch.tensor(v, dtype=torch.int64).reshape(a.shape))
    leaves = [(n, t) for n, a, t in zip(record.arg_names, record.args, ts) if a.dtype == "f32"]
    zeros = {n: [0.0] * t.numel() for n, t in leaves}
    if record.torch_fn is None:
        return {"out": None, "out_shape": None, "grads": zeros, "loss": None}
    if record.torch_takes_out:
        out = torch.tensor(got["out"], dtype=torch.float64).reshape(got["out_shape"])
        y = record.torch_fn(out, *ts)
    else:
        y = record.torch_fn(*ts)
    r = torch.tensor(loss_weights(tuple(y.shape), record.name), dtype=torch.float64).reshape(y.shape)
    loss = (y.to(torch.float64) * r).sum()
    grads = dict(zeros)
    if loss.requires_grad:
        gs = torch.autograd.grad(loss, [t for _, t in leaves], allow_unused=True)
        grads.update({n: g.reshape(-1).tolist() for (n, _), g in zip(leaves, gs) if g is not None})
    return {"out": y.detach().reshape(-1).tolist(), "out_shape": list(y.shape),
            "out_dtype": "f32" if y.dtype.is_floating_point else "i32", "grads": grads,
            "loss": float(loss.detach())}


# ---------------------------------------------------------------- comparison


def _close(what, got, want, rtol, atol, ctx, shape=None):
    if len(got) != len(want):
        raise AssertionError(f"{ctx}: {what} has {len(got)} values, torch has {len(want)}")
    worst, at = 0.0, -1
    for k, (g, w) in enumerate(zip(got, want)):
        err = abs(g - w)
        excess = err - (atol + rtol * abs(w))
        if math.isnan(g) and math.isnan(w):  # both NaN: they agree (records of special values)
            continue
        if g == w:  # equal infinities
            continue
        if not excess <= 0 or math.isnan(g) != math.isnan(w):  # one NaN counts as a failure
            if at < 0 or excess > worst or math.isnan(excess):
                worst, at = excess, k
    if at >= 0:
        g, w = got[at], want[at]
        nbad = sum(1 for x, y in zip(got, want) if not (abs(x - y) <= atol + rtol * abs(y) or x == y
                                                        or (math.isnan(x) and math.isnan(y))))
        raise AssertionError(
            f"{ctx}: {what}{' ' + str(list(shape)) if shape is not None else ''} differs from "
            f"torch (float64) at {nbad} of {len(got)} values; worst at flat index {at}: got {g!r}, "
            f"want {w!r} (|err| {abs(g - w):.3g} > atol {atol:g} + rtol {rtol:g} * |want|)")


def check_result(record: Record, got: dict, backend: str = "?") -> None:
    """Compare a run_webgrad result with torch; raise AssertionError naming what differs."""
    ctx = f"oracle record {record.name!r} [{record.wg_src}] on backend {backend!r}"
    rtol, atol = record.rtol, record.atol
    exact = got["out_dtype"] == "i32"
    # run() and step() see the same parameters and step counter: same output
    if exact:
        if got["out_run"] != got["out"]:
            raise AssertionError(f"{ctx}: run() and step() outputs differ (i32)")
    else:
        _close("run() output vs step() output", got["out_run"], got["out"], rtol, atol, ctx)
    want = torch_reference(record, got)
    if want["out"] is not None:
        if got["out_shape"] != want["out_shape"]:
            raise AssertionError(f"{ctx}: output shape {got['out_shape']}, torch gives "
                                 f"{want['out_shape']}")
        if exact:
            bad = [k for k, (g, w) in enumerate(zip(got["out"], want["out"])) if g != w]
            if bad or want["out_dtype"] != "i32":
                raise AssertionError(f"{ctx}: i32 output differs from torch at flat indices "
                                     f"{bad[:10]} (torch dtype {want['out_dtype']})")
        else:
            _close("output", got["out"], want["out"], rtol, atol, ctx, got["out_shape"])
        n = max(len(got["out"]), 1)
        _close("loss", [got["loss"]], [want["loss"]], rtol, atol * n, ctx)
    if set(got["grads"]) != set(want["grads"]):
        raise AssertionError(f"{ctx}: gradients for {sorted(got['grads'])}, expected "
                             f"{sorted(want['grads'])}")
    shapes = {n: a.shape for n, a in zip(record.arg_names, record.args)}
    for name in want["grads"] if record.check_grads else ():
        _close(f"gradient of argument {name!r}", got["grads"][name], want["grads"][name],
               rtol, atol, ctx, shapes[name])
    if record.stat_check is not None:
        record.stat_check(record, got, make_inputs(record))


def check_collected(results: dict, names, backend: str) -> None:
    """The host's side of `run_records_collect`: every record in `names` must have a result
    (a missing one fails, so a batch that ran nothing cannot pass), a record that raised in
    the worker fails with its name and the worker's traceback, and each result is compared
    with torch (`check_result`). `backend` says where and how the records ran."""
    import pytest
    for name in names:
        if name not in results:
            pytest.fail(f"oracle record {name!r}: no result from {backend!r} (got results for "
                        f"{sorted(results)})", pytrace=False)
        result = results[name]
        if not result["ok"]:
            pytest.fail(f"oracle record {name!r} failed on backend {backend!r}; the worker's "
                        f"traceback:\n{result['error']}", pytrace=False)
        check_result(BY_NAME[name], result["got"], backend)


def check(record: Record, backend: str, kernel_options=None) -> None:
    """Run `record` through the full compile path on `backend` (its kernels generated with
    `kernel_options`, a codegen.KernelOptions, where given) and compare with torch."""
    check_result(record, run_webgrad(record, backend, kernel_options=kernel_options), backend)


# ---------------------------------------------------------------- statistical checks


def _dropout_check(p: float):
    def stat(record, got, inputs):
        x, y = inputs[0], got["out"]
        scale = 1.0 / (1.0 - p)
        dropped = 0
        for k, (xi, yi) in enumerate(zip(x, y)):
            if yi == 0.0:
                dropped += 1
            elif abs(yi / xi - scale) > 1e-5 * scale:
                raise AssertionError(f"dropout {record.name}: mask value {yi / xi!r} at {k} is "
                                     f"neither 0 nor 1/(1-p) = {scale!r}")
        n = len(x)
        bound = 5 * math.sqrt(p * (1 - p) / n)  # 5 binomial standard deviations
        if abs(dropped / n - p) > bound:
            raise AssertionError(f"dropout {record.name}: dropped fraction {dropped / n:.4f}, "
                                 f"expected {p} +- {bound:.4f}")
    return stat


def _rand_check(record, got, inputs):
    from webgrad.primitives import M32, lowbias32
    u = got["out"]
    if len(got["rand"]) != 1:
        raise AssertionError(f"{record.name}: expected one rand_uniform node, got {got['rand']}")
    seed, _ = got["rand"][0]
    # the spec (primitives.rand_bits) in Python ints, at step counter 0
    key = lowbias32(None, (seed + lowbias32(None, 0)) & M32)
    want = [(lowbias32(None, k + key) >> 8) * 2.0 ** -24 for k in range(len(u))]
    bad = [k for k, (a, b) in enumerate(zip(u, want)) if a != b]
    if bad:
        raise AssertionError(f"{record.name}: rand_uniform bits differ from primitives.rand_bits "
                             f"at {len(bad)} of {len(u)} values (first {bad[0]}: {u[bad[0]]!r} "
                             f"vs {want[bad[0]]!r})")
    n = len(u)
    mean = sum(u) / n
    if not all(0.0 <= v < 1.0 for v in u) or abs(mean - 0.5) > 5 * math.sqrt(1 / 12 / n):
        raise AssertionError(f"{record.name}: values outside [0, 1) or mean {mean} far from 0.5")


def _categorical_check(temperature: float, n_samples: int):
    def stat(record, got, inputs):
        logits = [v / temperature for v in inputs[0]]
        m = max(logits)
        e = [math.exp(v - m) for v in logits]
        probs = [v / sum(e) for v in e]
        counts = [0] * len(probs)
        for s in got["out"]:
            if not 0 <= s < len(probs):
                raise AssertionError(f"{record.name}: sample {s} outside [0, {len(probs)})")
            counts[s] += 1
        chi2 = sum((c - n_samples * p) ** 2 / (n_samples * p) for c, p in zip(counts, probs))
        # chi-square with V-1 degrees of freedom; the bound is far in the tail (p < 1e-5 for
        # V = 5), so a correct sampler passes and a biased one (e.g. no temperature) fails
        bound = 10.0 + 6.0 * (len(probs) - 1)
        if chi2 > bound:
            raise AssertionError(f"{record.name}: sample frequencies {counts} do not match "
                                 f"softmax probabilities {[round(p, 4) for p in probs]} "
                                 f"(chi2 {chi2:.1f} > {bound})")
    return stat


# ---------------------------------------------------------------- torch helpers used below


def _t_causal(t, s):
    return torch.ones(t, s, dtype=torch.bool).tril(s - t)


def _t_rope(x, base=10000.0, offset=0):
    """Rotate-half rope, written from the definition."""
    t, d = x.shape[-2], x.shape[-1]
    half = d // 2
    inv = base ** (-2.0 * torch.arange(half, dtype=torch.float64) / d)
    ang = (torch.arange(t, dtype=torch.float64) + offset)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _t_attention(q, k, v, heads):
    B, T, D = q.shape
    split = lambda z: z.reshape(B, T, heads, D // heads).permute(0, 2, 1, 3)  # noqa: E731
    s = split(q) @ split(k).transpose(-1, -2) / math.sqrt(D // heads)
    s = s.masked_fill(~_t_causal(T, T), float("-inf"))
    return (torch.softmax(s, -1) @ split(v)).permute(0, 2, 1, 3).reshape(B, T, D)


def _t_sdpa(q, k, v, scale, keep=None):
    """softmax(scale q k^T, masked to `keep` [T, S]) v, written with torch's own ops."""
    s = q @ k.transpose(-1, -2) * scale
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1) @ v


def _t_split(x, heads):
    B, T, D = x.shape
    return x.reshape(B, T, heads, D // heads).permute(0, 2, 1, 3)


# ---------------------------------------------------------------- the table

MM = dict(atol=1e-4)    # matmul / conv: float32 dot products of a few terms vs float64
RED = dict(atol=2e-5)   # reductions: float32 summation order

RECORDS: list[Record] = []


def rec(name, wg_src, torch_fn, *args, **kw):
    RECORDS.append(Record(name, wg_src, torch_fn, tuple(args), **kw))


# -- elementwise, unary
for op, tfn, kind in [
    ("neg", lambda x: -x, "normal"),
    ("exp", lambda x: torch.exp(x), "normal"),
    ("log", lambda x: torch.log(x), "positive"),
    ("sqrt", lambda x: torch.sqrt(x), "positive"),
    ("rsqrt", lambda x: torch.rsqrt(x), "positive"),
    ("tanh", lambda x: torch.tanh(x), "normal"),
    ("sigmoid", lambda x: torch.sigmoid(x), "normal"),
    ("relu", lambda x: torch.relu(x), "grid"),        # grid: exact zeros, relu'(0) = 0
    ("gelu", lambda x: F.gelu(x, approximate="tanh"), "normal"),
    ("silu", lambda x: F.silu(x), "normal"),
    ("erf", lambda x: torch.erf(x), "normal"),
    ("abs", lambda x: torch.abs(x), "grid"),          # abs'(0) = 0
    ("sign", lambda x: torch.sign(x), "grid"),
    ("sin", lambda x: torch.sin(x), "normal"),
    ("cos", lambda x: torch.cos(x), "normal"),
]:
    rec(f"{op}/2d", f"lambda x: ops.{op}(x)", tfn, f32(3, 4, kind=kind))
    rec(f"{op}/scalar", f"lambda x: ops.{op}(x)", tfn, f32(kind=kind))
rec("sin/large", "lambda x: ops.sin(x)", lambda x: torch.sin(x), f32(40, kind="large"))
rec("cos/large", "lambda x: ops.cos(x)", lambda x: torch.cos(x), f32(40, kind="large"))
rec("sigmoid/large", "lambda x: ops.sigmoid(x * 30.0)", lambda x: torch.sigmoid(x * 30), f32(2, 5))
rec("gelu/3d", "lambda x: ops.gelu(x)", lambda x: F.gelu(x, approximate="tanh"), f32(2, 3, 2))
# wide inputs, where tanh saturates (its exp under- or overflows)
rec("gelu/wide", "lambda x: ops.gelu(x * 12.0)", lambda x: F.gelu(x * 12, approximate="tanh"),
    f32(4, 10), atol=1e-4)  # (the gradient's terms cancel where x * 12 is about -3: f32 rounding)
rec("pow/cube", "lambda x: ops.pow(x, 3)", lambda x: x ** 3, f32(3, 4))
rec("pow/half", "lambda x: ops.pow(x, 0.5)", lambda x: x ** 0.5, f32(3, 4, kind="positive"))
rec("pow/neg_frac", "lambda x: x ** -1.5", lambda x: x ** -1.5, f32(2, 3, kind="positive"))
rec("pow/square", "lambda x: x ** 2", lambda x: x ** 2, f32(4))
rec("pow/zero", "lambda x: ops.pow(x, 0)", lambda x: x ** 0, f32(4))
for op in ("floor", "trunc", "round"):  # grid: halves, where round goes to even
    rec(f"{op}/grid", f"lambda x: ops.{op}(x * 1.5)", (lambda op: lambda x: getattr(torch, op)(x * 1.5))(op),
        f32(3, 6, kind="grid"))
    rec(f"{op}/normal", f"lambda x: ops.{op}(x * 3.0) * x", (lambda op: lambda x: getattr(torch, op)(x * 3) * x)(op),
        f32(10))
    rec(f"{op}/special", f"lambda x: ops.{op}(x)", (lambda op: lambda x: getattr(torch, op)(x))(op),
        f32(10, kind="special"), check_grads=False)
rec("pow/tensor", "lambda x, y: ops.pow(x, y)", lambda x, y: torch.pow(x, y),
    f32(3, 4, kind="positive"), f32(3, 4))
rec("pow/tensor_bcast", "lambda x, y: x ** y", lambda x, y: x ** y, f32(2, 1, 3, kind="positive"),
    f32(4, 1, kind="unit"))
rec("pow/tensor_int_exponents", "lambda x, y: ops.pow(x, ops.round(y * 3.0))",  # negative bases
    lambda x, y: torch.pow(x, torch.round(y * 3)), f32(3, 5, kind="away"), f32(3, 5, kind="unit"),
    atol=1e-4)
rec("pow/tensor_zero_base", "lambda x, y: ops.pow(x, y)",  # 0^y: 0, 1 or inf; no dy at 0
    lambda x, y: torch.pow(x, y), f32(8, kind="zeros"), f32(8, kind="grid"), check_grads=False)
# the gradient's guards at a zero base, against torch: no dx where y = 0 (0 * 0^-1 would be
# NaN), no dy where x = 0 and y >= 0 (0^y log 0 would be NaN); exponents whose gradients are
# finite at 0, and bases 0 or positive
rec("pow/zero_base_grads", "lambda x, y: ops.pow(x, y)", lambda x, y: torch.pow(x, y),
    f32(4, 5, kind="zero_or_positive"), f32(4, 5, kind="exponent"))
rec("pow/reflected", "lambda x: 2.0 ** x", lambda x: 2.0 ** x, f32(2, 3))
rec("pow/special", "lambda x: ops.pow(x, x * 0.5)", lambda x: torch.pow(x, x * 0.5),
    f32(10, kind="special"), check_grads=False)
rec("stop_gradient", "lambda x, y: ops.stop_gradient(x) * y + x",
    lambda x, y: x.detach() * y + x, f32(3, 2), f32(3, 2))


# -- elementwise, binary (with broadcasting, scalars and Python numbers)
for op, tfn in [("add", lambda a, b: a + b), ("sub", lambda a, b: a - b),
                ("mul", lambda a, b: a * b), ("div", lambda a, b: a / b)]:
    kb = "away" if op == "div" else "normal"
    rec(f"{op}/same", f"lambda a, b: ops.{op}(a, b)", tfn, f32(3, 4), f32(3, 4, kind=kb))
    rec(f"{op}/bcast", f"lambda a, b: ops.{op}(a, b)", tfn, f32(4, 1, 3), f32(2, 3, kind=kb))
    rec(f"{op}/scalar", f"lambda a, b: ops.{op}(a, b)", tfn, f32(), f32(2, 3, kind=kb))
    rec(f"{op}/scalar_rhs", f"lambda a, b: ops.{op}(a, b)", tfn, f32(2, 3), f32(kind=kb))
rec("add/operator_number", "lambda a: a + 2.5", lambda a: a + 2.5, f32(3))
rec("sub/reflected_number", "lambda a: 2.0 - a", lambda a: 2.0 - a, f32(3))
rec("mul/operator", "lambda a, b: a * b * 3.0", lambda a, b: a * b * 3.0, f32(2, 1), f32(3))
rec("div/reflected_number", "lambda a: 1.0 / a", lambda a: 1.0 / a, f32(2, 3, kind="away"))
for op in ("maximum", "minimum"):
    # coarse values: many ties, where torch splits the gradient in half
    tfn = (lambda op: lambda a, b: getattr(torch, op)(a, b))(op)
    rec(f"{op}/ties", f"lambda a, b: ops.{op}(a, b)", tfn,
        f32(4, 5, kind="coarse"), f32(4, 5, kind="coarse"))
    rec(f"{op}/bcast", f"lambda a, b: ops.{op}(a, b)", tfn,
        f32(3, 1, kind="coarse"), f32(1, 4, kind="coarse"))
    rec(f"{op}/number", f"lambda a: ops.{op}(a, 1.0)", (lambda op: lambda a: getattr(torch, op)(
        a, torch.tensor(1.0, dtype=torch.float64)))(op), f32(2, 4, kind="coarse"))
for op, tfn in [("less", lambda a, b: (a < b).double()), ("greater", lambda a, b: (a > b).double()),
                ("equal", lambda a, b: (a == b).double()),
                ("less_equal", lambda a, b: (a <= b).double()),
                ("greater_equal", lambda a, b: (a >= b).double())]:
    rec(f"{op}/ties", f"lambda a, b: ops.{op}(a, b)", tfn,
        f32(4, 5, kind="coarse"), f32(4, 5, kind="coarse"))
    rec(f"{op}/bcast", f"lambda a, b: ops.{op}(a, b)", tfn, f32(3, 1, kind="grid"), f32(4, kind="grid"))
rec("less/operator", "lambda a: a < 0.5", lambda a: (a < 0.5).double(), f32(5, kind="grid"))
rec("not_equal/ties", "lambda a, b: ops.not_equal(a, b)", lambda a, b: (a != b).double(),
    f32(4, 5, kind="coarse"), f32(4, 5, kind="coarse"))
rec("less_equal/operator", "lambda a: a <= 1.0", lambda a: (a <= 1.0).double(),  # holds a 1.0
    f32(5, kind="grid"))
rec("greater_equal/operator", "lambda a, b: a >= b", lambda a, b: (a >= b).double(),
    f32(3, 4, kind="coarse"), f32(4, kind="coarse"))
rec("equal/operator", "lambda a: a == 0.0", lambda a: (a == 0.0).double(), f32(6, kind="grid"))
rec("not_equal/operator", "lambda a, b: a != b", lambda a, b: (a != b).double(),
    f32(3, 4, kind="coarse"), f32(3, 4, kind="coarse"))
rec("abs/operator", "lambda a: abs(a) * 2.0", lambda a: abs(a) * 2.0, f32(5, kind="grid"))
# NaN, infinities and signed zeros: every executor follows torch (NaN propagates through
# relu, tanh, maximum, minimum, max; comparisons with NaN are false except !=; sign(NaN) = 0)
for op, src, tfn in [
    ("relu", "ops.relu(x)", lambda x: torch.relu(x)),
    ("tanh", "ops.tanh(x)", lambda x: torch.tanh(x)),
    ("sigmoid", "ops.sigmoid(x)", lambda x: torch.sigmoid(x)),
    ("sign", "ops.sign(x)", lambda x: torch.sign(x)),
    ("abs", "ops.abs(x)", lambda x: torch.abs(x)),
    ("exp", "ops.exp(x)", lambda x: torch.exp(x)),
    ("log", "ops.log(x)", lambda x: torch.log(x)),
    ("sqrt", "ops.sqrt(x)", lambda x: torch.sqrt(x)),
    ("rsqrt", "ops.rsqrt(x)", lambda x: torch.rsqrt(x)),
    ("erf", "ops.erf(x)", lambda x: torch.erf(x)),
    ("sin", "ops.sin(x)", lambda x: torch.sin(x)),
    ("cos", "ops.cos(x)", lambda x: torch.cos(x)),
    ("softmax", "ops.softmax_last(ops.reshape(x, (2, 5)))", lambda x: torch.softmax(x.reshape(2, 5), -1)),
    ("log_softmax", "ops.log_softmax_last(ops.reshape(x, (5, 2)))",
     lambda x: torch.log_softmax(x.reshape(5, 2), -1)),
    ("gelu", "ops.gelu(x)", lambda x: F.gelu(x, approximate="tanh")),
    ("maximum", "ops.maximum(x, x * -1.0)",
     lambda x: torch.maximum(x, x * -1.0)),
    ("minimum", "ops.minimum(x, x * -1.0)", lambda x: torch.minimum(x, x * -1.0)),
    ("maximum_inf", "ops.maximum(x, float('inf'))", lambda x: torch.maximum(x, torch.tensor(math.inf, dtype=x.dtype))),
    ("less_equal", "ops.less_equal(x, 0.5)", lambda x: (x <= 0.5).double()),
    ("greater_equal", "ops.greater_equal(x, 0.5)", lambda x: (x >= 0.5).double()),
    ("equal", "ops.equal(x, x)", lambda x: (x == x).double()),
    ("not_equal", "ops.not_equal(x, x)", lambda x: (x != x).double()),
    ("where", "ops.where(ops.greater(x, 0.0), x, 0.0)", lambda x: torch.where(x > 0, x, 0.0)),
]:
    rec(f"{op}/special", f"lambda x: {src}", tfn, f32(10, kind="special"), check_grads=False)
rec("max_last/special", "lambda x: ops.max_last(x)", lambda x: x.amax(-1), f32(3, 4, kind="special"),
    check_grads=False)
rec("argmax_last/special", "lambda x: ops.argmax_last(x)", lambda x: torch.argmax(x, -1),
    f32(5, 4, kind="special"), check_grads=False)

rec("greater/operator", "lambda a: a > 0.5", lambda a: (a > 0.5).double(), f32(5, kind="grid"))
rec("where/mask", "lambda c, x, y: ops.where(c, x, y)",  # nonzero (also negative) = true
    lambda c, x, y: torch.where(c != 0, x, y), f32(3, 4, kind="grid"), f32(3, 4), f32(3, 4))
rec("where/bcast_number", "lambda c, x: ops.where(c, x, -1.5)",
    lambda c, x: torch.where(c != 0, x, -1.5), f32(3, 1, kind="grid"), f32(3, 4))
rec("where/compare", "lambda a, b: ops.where(ops.less(a, b), a * 2.0, b)",
    lambda a, b: torch.where(a < b, a * 2, b), f32(2, 5), f32(5))
rec("cast/f32_to_i32", "lambda x: ops.cast(x * 1.5, 'i32')",  # truncation toward zero
    lambda x: (x * 1.5).to(torch.int32), f32(3, 4, kind="grid"))
rec("i32/arith", "lambda x, i, j: x * ops.cast(ops.div(i * j - i, j) + (i - j), 'f32')",
    lambda x, i, j: x * (torch.div(i * j - i, j, rounding_mode="trunc") + (i - j)).double(),
    f32(3, 4), i32((3, 4), -6, 6), i32((3, 4), 1, 4))
rec("i32/sum", "lambda x, i: x * ops.cast(ops.sum_last(i, keepdims=True), 'f32')",
    lambda x, i: x * i.sum(-1, keepdim=True).double(), f32(3, 4), i32((3, 5), -100, 100))
rec("i32/sum_wide", "lambda x, i: x * ops.cast(ops.sum_last(i, keepdims=True), 'f32')",
    lambda x, i: x * i.sum(-1, keepdim=True).double(), f32(3, 4), i32((3, 301), -100, 100))
rec("constant", "lambda x: x * ops.constant([[1.0, -2.0, 0.5]])",
    lambda x: x * torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64), f32(2, 3))
rec("capture", "lambda x: ops.capture('mid', ops.exp(x)) * 2.0", lambda x: torch.exp(x) * 2, f32(3))

# -- reductions
rec("sum_last/2d", "lambda x: ops.sum_last(x)", lambda x: x.sum(-1), f32(3, 5), **RED)
rec("sum_last/keepdims", "lambda x: ops.sum_last(x, keepdims=True)",
    lambda x: x.sum(-1, keepdim=True), f32(2, 3, 4), **RED)
rec("sum_last/1d", "lambda x: ops.sum_last(x)", lambda x: x.sum(-1), f32(6), **RED)
rec("sum/axes", "lambda x: ops.sum(x, (0, 2))", lambda x: x.sum((0, 2)), f32(2, 3, 4), **RED)
rec("sum_all/2d", "lambda x: ops.sum_all(x)", lambda x: x.sum(), f32(3, 4), **RED)
rec("sum_all/scalar", "lambda x: ops.sum_all(x)", lambda x: x.sum(), f32(), **RED)
rec("mean_last/3d", "lambda x: ops.mean_last(x)", lambda x: x.mean(-1), f32(2, 3, 4), **RED)
rec("mean_last/keepdims", "lambda x: ops.mean_last(x, keepdims=True)",
    lambda x: x.mean(-1, keepdim=True), f32(3, 5), **RED)
rec("mean_all/2d", "lambda x: ops.mean_all(x)", lambda x: x.mean(), f32(3, 4), **RED)
rec("max_last/2d", "lambda x: ops.max_last(x)", lambda x: x.amax(-1), f32(3, 5))
rec("max_last/ties", "lambda x: ops.max_last(x)", lambda x: x.amax(-1),  # shared gradient
    f32(4, 6, kind="coarse"))
rec("max_last/keepdims", "lambda x: ops.max_last(x, keepdims=True)",
    lambda x: x.amax(-1, keepdim=True), f32(2, 3, 4))
rec("argmax_last", "lambda x: ops.argmax_last(x)", lambda x: torch.argmax(x, -1), f32(4, 6))
# -- reductions over any axes (compositions over sum / max_last / argmax_last)
rec("mean/axes", "lambda x: ops.mean(x, (0, 2))", lambda x: x.mean((0, 2)), f32(2, 3, 4), **RED)
rec("mean/all_keepdims", "lambda x: ops.mean(x, keepdims=True)", lambda x: x.mean().reshape(1, 1),
    f32(3, 5), **RED)
rec("mean/axis_neg", "lambda x: ops.mean(x, -2)", lambda x: x.mean(-2), f32(2, 3, 4), **RED)
rec("max/axis0", "lambda x: ops.max(x, 0)", lambda x: x.amax(0), f32(4, 5))
rec("max/axes_ties", "lambda x: ops.max(x, (0, 2), keepdims=True)",  # ties share the gradient
    lambda x: x.amax((0, 2), keepdim=True), f32(3, 2, 4, kind="coarse"))
rec("max/all", "lambda x: ops.max(x)", lambda x: x.amax(), f32(3, 4, kind="coarse"))
rec("min/axis1", "lambda x: ops.min(x, 1)", lambda x: x.amin(1), f32(2, 5, 3, kind="coarse"))
rec("logsumexp/last", "lambda x: ops.logsumexp(x, -1)", lambda x: torch.logsumexp(x, -1),
    f32(3, 5), **RED)
rec("logsumexp/axes_keepdims", "lambda x: ops.logsumexp(x * 30.0, (0, 1), keepdims=True)",
    lambda x: torch.logsumexp(x * 30, (0, 1), keepdim=True), f32(2, 3, 4), atol=1e-4)
rec("logsumexp/inf", "lambda x: ops.logsumexp(x, 1)", lambda x: torch.logsumexp(x, 1),
    f32(5, 4, kind="special"), check_grads=False)
rec("argmax/axis0", "lambda x: ops.argmax(x, 0)", lambda x: torch.argmax(x, 0), f32(5, 3))
rec("argmax/flat", "lambda x: ops.argmax(x)", lambda x: torch.argmax(x), f32(3, 4))
rec("argmax/keepdims_ties", "lambda x: ops.argmax(x, 1, keepdims=True)",
    lambda x: torch.argmax(x, 1, keepdim=True), f32(2, 6, 3, kind="coarse"))
# -- zero-size dimensions
rec("sum/empty_axis", "lambda x: ops.sum(x, 0)", lambda x: x.sum(0), f32(0, 3))
rec("matmul/empty_k", "lambda a, b: a @ b", lambda a, b: a @ b, f32(3, 0), f32(0, 2))
rec("concat/empty", "lambda a, b: ops.concat([a, b], 0) * 2.0", lambda a, b: torch.cat([a, b], 0) * 2,
    f32(0, 3), f32(2, 3))
rec("relu/empty", "lambda x: ops.relu(x)", lambda x: torch.relu(x), f32(2, 0, 3))


# -- layout
rec("reshape/2d", "lambda x: ops.reshape(x, (3, 4))", lambda x: x.reshape(3, 4), f32(2, 6))
rec("reshape/infer", "lambda x: ops.reshape(x, (6, -1))", lambda x: x.reshape(6, -1), f32(2, 3, 4))
rec("reshape/scalar", "lambda x: ops.reshape(x, (1, 1))", lambda x: x.reshape(1, 1), f32())
rec("reshape/method", "lambda x: x.reshape(4, 3)", lambda x: x.reshape(4, 3), f32(3, 4))
rec("transpose/perm", "lambda x: ops.transpose(x, (2, 0, 1))", lambda x: x.permute(2, 0, 1),
    f32(2, 3, 4))
rec("transpose/default", "lambda x: ops.transpose(x)", lambda x: x.permute(2, 1, 0), f32(2, 3, 4))
rec("transpose/T", "lambda x: x.T", lambda x: x.T, f32(3, 4))
rec("swap_axes/last", "lambda x: ops.swap_axes(x, -1, -2)", lambda x: x.transpose(-1, -2), f32(2, 3, 4))
rec("swap_axes/outer", "lambda x: ops.swap_axes(x, 0, 2)", lambda x: x.transpose(0, 2), f32(2, 3, 4))
rec("unsqueeze", "lambda x: ops.unsqueeze(x, 1)", lambda x: x.unsqueeze(1), f32(3, 4))
rec("broadcast_to/middle", "lambda x: ops.broadcast_to(x, (2, 3, 4))",
    lambda x: x.expand(2, 3, 4), f32(3, 1))
rec("broadcast_to/scalar", "lambda x: ops.broadcast_to(x, (2, 3))", lambda x: x.expand(2, 3), f32())
rec("broadcast_to/rows", "lambda x: ops.broadcast_to(x, (3, 4))", lambda x: x.expand(3, 4), f32(4))
rec("concat/last", "lambda a, b: ops.concat([a, b], -1)", lambda a, b: torch.cat([a, b], -1),
    f32(2, 3), f32(2, 4))
rec("concat/three_axis0", "lambda a, b, c: ops.concat([a, b, c], 0)",
    lambda a, b, c: torch.cat([a, b, c], 0), f32(1, 3), f32(2, 3), f32(3, 3))
rec("slice_last_range", "lambda x: ops.slice_last_range(x, 1, 4)", lambda x: x[..., 1:4], f32(2, 5))
rec("slice/axis0", "lambda x: ops.slice(x, 0, 1, 3)", lambda x: x[1:3], f32(4, 3))
rec("pad/axis0", "lambda x: ops.pad(x, 0, 1, 2)", lambda x: F.pad(x, (0, 0, 1, 2)), f32(2, 3))

# -- matmul (dot products of 4 terms)
rec("matmul/2d", "lambda a, b: ops.matmul(a, b)", lambda a, b: a @ b, f32(3, 4), f32(4, 5), **MM)
rec("matmul/batch_bcast", "lambda a, b: ops.matmul(a, b)", lambda a, b: a @ b,
    f32(2, 1, 3, 4), f32(3, 4, 2), **MM)
rec("matmul/batch_rhs2d", "lambda a, b: a @ b", lambda a, b: a @ b, f32(2, 3, 4), f32(4, 2), **MM)
rec("matmul/vec_mat", "lambda a, b: ops.matmul(a, b)", lambda a, b: a @ b, f32(4), f32(4, 3), **MM)
rec("matmul/mat_vec", "lambda a, b: ops.matmul(a, b)", lambda a, b: a @ b, f32(3, 4), f32(4), **MM)
rec("matmul/vec_vec", "lambda a, b: ops.matmul(a, b)", lambda a, b: a @ b, f32(4), f32(4), **MM)
rec("matmul_batched", "lambda a, b: ops.matmul_batched(a, b)", lambda a, b: torch.bmm(a, b),
    f32(2, 3, 4), f32(2, 4, 5), **MM)
# shapes that divide no tile, and a K long enough for K chunks of real work (split-K)
rec("matmul/odd_long_k", "lambda a, b: ops.matmul(a, b)", lambda a, b: a @ b,
    f32(7, 600), f32(600, 13), atol=2e-3, rtol=1e-4)
# several tiles per axis, none dividing them (the H200's tilings and tile order, forced in
# tests/test_webgpu.py): 150 x 270 over 16 x 16 tiles is 10 x 17 of them
rec("matmul/tiles_odd", "lambda a, b: ops.matmul(a, b)", lambda a, b: a @ b,
    f32(150, 37), f32(37, 270), atol=1e-3)
rec("matmul/batched_odd", "lambda a, b: ops.matmul_batched(a, ops.swap_axes(b, -1, -2))",
    lambda a, b: torch.bmm(a, b.transpose(-1, -2)), f32(3, 70, 21), f32(3, 90, 21), atol=1e-3)
# 4-aligned shapes (vec4 loads) with an epilogue that reads an operand
rec("matmul/aligned_epilogue", "lambda a, b: ops.matmul(a, b) + a", lambda a, b: a @ b + a,
    f32(12, 8), f32(8, 8), atol=1e-3)
# a GELU MLP on shapes no tile divides: bias + GELU epilogue, and in the gradient the
# product fused with GELU's derivative, which loads the pre-activation and the bias
rec("matmul/gelu_mlp_odd", "lambda x, w1, b1, w2: ops.matmul(ops.gelu(ops.matmul(x, w1) + b1), w2)",
    lambda x, w1, b1, w2: F.gelu(x @ w1 + b1, approximate="tanh") @ w2,
    f32(37, 29), f32(29, 45), f32(45), f32(45, 23), atol=1e-3)
# a Linear's bias gradient beside its weight gradient, over [B, T, C] (the weight gradient's
# K runs over batch and rows: its kernel sums the bias gradient from the tiles it stages,
# fusion.operand_sums), with W as [in, out] and as [out, in] (read through swap_axes)
rec("matmul/linear_bias_3d", "lambda x, w, b: ops.tanh(ops.matmul(x, w) + b)",
    lambda x, w, b: torch.tanh(x @ w + b), f32(3, 37, 29), f32(29, 45), f32(45), atol=1e-3)
rec("matmul/linear_bias_wt", "lambda x, w, b: ops.tanh(ops.matmul(x, ops.swap_axes(w, -1, -2)) + b)",
    lambda x, w, b: torch.tanh(x @ w.T + b), f32(2, 41, 29), f32(45, 29), f32(45), atol=1e-3)
# ... and the column sums of A's rows (A = g^T: the sum of g over K), taken by the product
rec("matmul/operand_sum_a",
    "lambda g, x: ops.concat([ops.reshape(ops.matmul(ops.swap_axes(g, -1, -2), x), [45 * 29]),"
    " ops.sum(g, 0)], 0)",
    lambda g, x: torch.cat([(g.T @ x).reshape(-1), g.sum(0)]), f32(37, 45), f32(37, 29), atol=1e-3)
# ... and the column sums of expressions of a product's output (a layer norm's weight and
# bias gradients from the next Linear's input gradient), taken by the product's epilogue
rec("matmul/output_sums",
    "lambda x, w, y: (lambda m: ops.concat([ops.reshape(m, [3 * 37 * 45]),"
    " ops.sum(m * y, (0, 1)), ops.sum(m, (0, 1))], 0))(ops.matmul(x, w))",
    lambda x, w, y: (lambda m: torch.cat([m.reshape(-1), (m * y).sum((0, 1)), m.sum((0, 1))]))(x @ w),
    f32(3, 37, 29), f32(29, 45), f32(3, 37, 45), atol=1e-3)
rec("matmul/wgrad_odd", "lambda x, g: ops.sum(ops.matmul(ops.swap_axes(x, -1, -2), g), 0)",
    lambda x, g: (x.transpose(-1, -2) @ g).sum(0), f32(3, 77, 9), f32(3, 77, 35), atol=1e-3)

# -- indices
rec("one_hot", "lambda x, i: x * ops.one_hot(i, 4)", lambda x, i: x * F.one_hot(i, 4).double(),
    f32(2, 3, 4), i32((2, 3), 0, 4))
rec("one_hot/out_of_range", "lambda x, i: x * ops.one_hot(i - 2, 3)",  # computed -2..3:
    lambda x, i: x * ((i - 2)[..., None] == torch.arange(3)).double(),   # zero rows outside
    f32(12, 3), i32((12,), 0, 6))
rec("arange/i32", "lambda x: x * ops.cast(ops.arange(5), 'f32')",
    lambda x: x * torch.arange(5, dtype=torch.float64), f32(3, 5))
rec("arange/f32", "lambda x: x + ops.arange(4, dtype='f32')",
    lambda x: x + torch.arange(4, dtype=torch.float64), f32(2, 4))
rec("embedding", "lambda w, i: ops.embedding(w, i)", lambda w, i: F.embedding(i, w),
    f32(6, 3), i32((2, 4), 0, 6))
rec("embedding/padding_idx", "lambda w, i: ops.embedding(w, i, padding_idx=2)",
    lambda w, i: F.embedding(i, w, padding_idx=2), f32(5, 3), i32((3, 4), 0, 5))
rec("embedding/padding_idx_negative", "lambda w, i: ops.embedding(w, i, padding_idx=-1)",
    lambda w, i: F.embedding(i, w, padding_idx=-1), f32(4, 2), i32((6,), 0, 4))
rec("gather_rows/repeats", "lambda w, i: ops.gather_rows(w, i)", lambda w, i: w[i],
    f32(3, 2), i32((5,), 0, 3))
rec("scatter_add_rows", "lambda v, i: ops.scatter_add_rows(v, i, 5)",
    lambda v, i: torch.zeros(5, 3, dtype=torch.float64).index_add(0, i, v), f32(4, 3), i32((4,), 0, 3))
# computed indices outside [0, n): gather_rows reads zeros, scatter_add_rows drops them,
# negative ones never wrap (fed indices are refused before the step: webgrad/bounds.py)
rec("gather_rows/computed_out_of_range", "lambda w, i: ops.gather_rows(w, i - 2)",
    lambda w, i: torch.where(((i - 2 >= 0) & (i - 2 < 4))[:, None], w[(i - 2).clamp(0, 3)], 0.0),
    f32(4, 3), i32((8,), 0, 8))
rec("scatter_add_rows/computed_out_of_range", "lambda v, i: ops.scatter_add_rows(v, i - 2, 4)",
    lambda v, i: torch.zeros(4, 2, dtype=torch.float64).index_add(
        0, (i - 2)[(i >= 2) & (i < 6)], v[(i >= 2) & (i < 6)]), f32(9, 2), i32((9,), 0, 8))
rec("scatter_add_rows/many_rows", "lambda v, i: ops.scatter_add_rows(v, i, 300)",
    lambda v, i: torch.zeros(300, 3, dtype=torch.float64).index_add(0, i, v), f32(40, 3),
    i32((40,), 0, 300))
rec("scatter_add_rows/repeats", "lambda v, i: ops.scatter_add_rows(v, i, 3)",
    lambda v, i: torch.zeros(3, 2, 2, dtype=torch.float64).index_add(0, i.reshape(-1), v.reshape(-1, 2, 2)),
    f32(4, 5, 2, 2), i32((4, 5), 0, 2))


def _t_dequantize_q8_0(x, w):
    # webgrad.quants' Q8_0 layout written out independently: words 0-7 hold the 32 int8
    # quants (4 a word, little-endian), word 8's low half the f16 scale
    u = w.to(torch.int64) & 0xFFFFFFFF
    q = torch.stack([(u[:8] >> (8 * k)) & 255 for k in range(4)], -1).reshape(32)
    q = torch.where(q >= 128, q - 256, q).double()
    d = struct.unpack("<e", struct.pack("<H", int(u[8]) & 0xFFFF))[0]
    return x @ (d * q).reshape(1, 32).T


# words below 0x3C00: every f16 half finite (< 1), quants in bytes 0 and 1 of each word
rec("dequantize/q8_0", "lambda x, w: ops.matmul(x, ops.swap_axes(ops.dequantize(w, 'Q8_0', (1, 32)), 0, 1))",
    _t_dequantize_q8_0, f32(3, 32), i32((9,), 0, 0x3C00))


def _t_write_rows(b, v, s):
    out, s, n = b.clone(), int(torch.as_tensor(s).reshape(-1)[0]), b.shape[0]
    lo, hi = max(s, 0), min(s + v.shape[0], n)
    if lo < hi:
        out[lo:hi] = v[lo - s:hi - s]
    return out


rec("write_rows/fed_start", "lambda b, v, s: ops.write_rows(b, v, s)", _t_write_rows,
    f32(5, 3), f32(2, 3), i32((1,), 0, 4))
rec("write_rows/past_the_end", "lambda b, v: ops.write_rows(b, v, 4)",
    lambda b, v: _t_write_rows(b, v, 4), f32(5, 2, 3), f32(3, 2, 3))
rec("write_rows/before_the_start", "lambda b, v: ops.write_rows(b, v, -1)",
    lambda b, v: _t_write_rows(b, v, -1), f32(4, 3), f32(2, 3))
rec("take_along_last", "lambda x, i: ops.take_along_last(x, i)",
    lambda x, i: torch.gather(x, -1, i), f32(3, 5), i32((3, 2), 0, 5))

# -- softmax family and masks
rec("softmax_last/2d", "lambda x: ops.softmax_last(x)", lambda x: torch.softmax(x, -1), f32(3, 5))
# rows wide enough for the workgroup strategy (a shared-memory tree of NaN-propagating maxes)
rec("softmax_last/wide_rows", "lambda x: ops.softmax_last(x)", lambda x: torch.softmax(x, -1),
    f32(3, 700))
rec("log_softmax_last/wide_rows", "lambda x: ops.log_softmax_last(x)",
    lambda x: torch.log_softmax(x, -1), f32(3, 700))
rec("softmax_last/3d", "lambda x: ops.softmax_last(x * 4.0)", lambda x: torch.softmax(x * 4, -1),
    f32(2, 3, 4))
rec("log_softmax_last/2d", "lambda x: ops.log_softmax_last(x)", lambda x: torch.log_softmax(x, -1),
    f32(3, 5))
rec("log_softmax_last/wide_range", "lambda x: ops.log_softmax_last(x * 30.0)",
    lambda x: torch.log_softmax(x * 30, -1), f32(2, 4), atol=1e-4)
rec("softmax_causal_last", "lambda x: ops.softmax_causal_last(x)",
    lambda x: torch.softmax(x.masked_fill(~_t_causal(4, 4), float("-inf")), -1), f32(2, 4, 4))
rec("where_causal/square", "lambda x: ops.where_causal(x)",
    lambda x: torch.where(_t_causal(4, 4), x, -1e9), f32(4, 4))
rec("where_causal/cache", "lambda x: ops.where_causal(x, 0.0)",  # 3 queries over 5 keys
    lambda x: torch.where(_t_causal(3, 5), x, 0.0), f32(2, 3, 5))
rec("causal_mask", "lambda x: x * ops.causal_mask(3, 5)", lambda x: x * _t_causal(3, 5).double(),
    f32(3, 5))
rec("layer_norm_last", "lambda x: ops.layer_norm_last(x)", lambda x: F.layer_norm(x, (8,)), f32(3, 8))
rec("layer_norm_last/eps", "lambda x: ops.layer_norm_last(x * 0.01, eps=1e-3)",
    lambda x: F.layer_norm(x * 0.01, (5,), eps=1e-3), f32(2, 2, 5))

# -- random: statistics and structure; deterministic given the seed
rec("dropout/p0.3", "lambda x: ops.dropout(x, 0.3)",
    lambda out, x: x * (out != 0).double() / 0.7,  # the same mask, read back from webgrad's output
    f32(40, 50, kind="away"), torch_takes_out=True, stat_check=_dropout_check(0.3))
rec("dropout/p0.75_seed", "lambda x: ops.dropout(x, 0.75, seed=7)",
    lambda out, x: x * (out != 0).double() / 0.25,
    f32(8, 16, 16, kind="away"), torch_takes_out=True, stat_check=_dropout_check(0.75))
rec("rand_uniform", "lambda x: x + ops.rand_uniform(x.shape, seed=3)",
    lambda out, x: x + out.detach(), f32(4, 250, kind="zeros"), torch_takes_out=True,
    stat_check=_rand_check)
rec("categorical", "lambda l: ops.categorical(ops.broadcast_to(l, (4000, 5)), seed=1)", None,
    f32(1, 5, kind="unit"), stat_check=_categorical_check(1.0, 4000))
rec("categorical/temperature", "lambda l: ops.categorical(ops.broadcast_to(l, (4000, 4)), "
    "temperature=0.5)", None, f32(1, 4, kind="unit"), stat_check=_categorical_check(0.5, 4000))

# -- rope
rec("rope", "lambda x: ops.rope(x)", lambda x: _t_rope(x), f32(2, 4, 6))
rec("rope/offset_base", "lambda x: ops.rope(x, base=100.0, offset=3)",
    lambda x: _t_rope(x, 100.0, 3), f32(1, 2, 3, 4))

# -- convolution windows
rec("conv2d/basic", "lambda x, w, b: ops.conv2d(x, w, b)", lambda x, w, b: F.conv2d(x, w, b),
    f32(2, 3, 5, 5), f32(4, 3, 3, 3), f32(4), **MM)
rec("conv2d/stride_pad", "lambda x, w: ops.conv2d(x, w, stride=2, padding=1)",
    lambda x, w: F.conv2d(x, w, stride=2, padding=1), f32(1, 2, 6, 6), f32(3, 2, 3, 3), **MM)
rec("conv2d/groups", "lambda x, w, b: ops.conv2d(x, w, b, padding=1, groups=2)",
    lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=2),
    f32(1, 4, 5, 5), f32(6, 2, 3, 3), f32(6), **MM)
rec("conv2d/depthwise", "lambda x, w: ops.conv2d(x, w, stride=2, groups=3)",
    lambda x, w: F.conv2d(x, w, stride=2, groups=3), f32(1, 3, 4, 4), f32(3, 1, 2, 2), **MM)
rec("conv2d/rect", "lambda x, w: ops.conv2d(x, w, stride=(1, 2), padding=(1, 0))",
    lambda x, w: F.conv2d(x, w, stride=(1, 2), padding=(1, 0)), f32(1, 2, 5, 6), f32(2, 2, 2, 3), **MM)
rec("max_pool2d/2x2", "lambda x: ops.max_pool2d(x, 2)", lambda x: F.max_pool2d(x, 2), f32(1, 2, 4, 4))
rec("max_pool2d/pad", "lambda x: ops.max_pool2d(x, 3, stride=1, padding=1)",
    lambda x: F.max_pool2d(x, 3, stride=1, padding=1), f32(1, 1, 5, 5))
rec("max_pool2d/rect", "lambda x: ops.max_pool2d(x, (2, 3), stride=(2, 1))",
    lambda x: F.max_pool2d(x, (2, 3), stride=(2, 1)), f32(2, 1, 4, 5))
rec("max_pool2d/ties", "lambda x: ops.max_pool2d(x, 2)",  # torch routes to the first maximum
    lambda x: F.max_pool2d(x, 2), f32(1, 2, 4, 6, kind="coarse"))
rec("max_pool2d/dilation", "lambda x: ops.max_pool2d(x, 2, stride=1, padding=1, dilation=2)",
    lambda x: F.max_pool2d(x, 2, stride=1, padding=1, dilation=2), f32(1, 2, 5, 6))
rec("max_pool2d/ceil_mode", "lambda x: ops.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True)",
    lambda x: F.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True), f32(2, 1, 6, 7))
rec("max_pool2d/ceil_mode_nopad", "lambda x: ops.max_pool2d(x, 2, ceil_mode=True)",
    lambda x: F.max_pool2d(x, 2, ceil_mode=True), f32(1, 2, 5, 5))
rec("max_pool2d/return_indices", "lambda x: ops.max_pool2d(x, (2, 3), stride=(2, 1), padding=1, "
    "dilation=(1, 2), ceil_mode=True, return_indices=True)[1]",
    lambda x: F.max_pool2d(x, (2, 3), stride=(2, 1), padding=1, dilation=(1, 2), ceil_mode=True,
                           return_indices=True)[1], f32(2, 2, 5, 7))
rec("max_pool2d/return_indices_values", "lambda x: ops.max_pool2d(x, 2, return_indices=True)[0]",
    lambda x: F.max_pool2d(x, 2, return_indices=True)[0], f32(1, 1, 4, 4, kind="coarse"))
rec("conv2d/dilation", "lambda x, w, b: ops.conv2d(x, w, b, padding=2, dilation=2)",
    lambda x, w, b: F.conv2d(x, w, b, padding=2, dilation=2), f32(1, 2, 6, 5), f32(3, 2, 3, 3),
    f32(3), **MM)
rec("conv2d/dilation_rect", "lambda x, w: ops.conv2d(x, w, stride=(2, 1), dilation=(1, 3))",
    lambda x, w: F.conv2d(x, w, stride=(2, 1), dilation=(1, 3)), f32(2, 1, 5, 8), f32(2, 1, 2, 2),
    **MM)
rec("nn.Conv2d/dilation", "lambda x, w: with_params(nn.Conv2d(2, 2, 3, padding=2, dilation=2, "
    "bias=False), weight=w)(x)", lambda x, w: F.conv2d(x, w, padding=2, dilation=2),
    f32(1, 2, 5, 5), f32(2, 2, 3, 3), **MM)
rec("unfold2d/dilation_ceil", "lambda x: ops.unfold2d(x, kernel=2, stride=2, dilation=2, "
    "ceil=True, pad_value=-1.0)",
    lambda x: F.unfold(F.pad(x, (0, 1, 0, 1), value=-1.0), 2, dilation=2, stride=2)
    .reshape(1, 1, 4, 9), f32(1, 1, 6, 6))
rec("fold2d/dilation", "lambda g: ops.fold2d(g, size=(4, 4), kernel=2, stride=1, padding=1, "
    "dilation=2)", lambda g: F.fold(g.reshape(1, 4, 16), (4, 4), 2, dilation=2, padding=1),
    f32(1, 1, 4, 16))
rec("unfold2d", "lambda x: ops.unfold2d(x, kernel=2, padding=1)",
    lambda x: F.unfold(x, 2, padding=1).reshape(1, 2, 4, 16), f32(1, 2, 3, 3))
rec("unfold2d/pad_value", "lambda x: ops.unfold2d(x, kernel=3, stride=2, padding=1, pad_value=-1.0)",
    lambda x: F.unfold(F.pad(x, (1, 1, 1, 1), value=-1.0), 3, stride=2).reshape(1, 1, 9, 6),
    f32(1, 1, 3, 5))
rec("fold2d", "lambda g: ops.fold2d(g, size=(3, 3), kernel=2, stride=1, padding=1)",
    lambda g: F.fold(g.reshape(1, 8, 16), (3, 3), 2, padding=1), f32(1, 2, 4, 16))

# -- nn modules and losses (the modules' own forward code, on the record's tensors)
rec("nn.Linear", "lambda x, W, b: with_params(nn.Linear(4, 5), W=W, b=b)(x)",
    lambda x, W, b: F.linear(x, W.T, b), f32(2, 3, 4), f32(4, 5), f32(5), **MM)
rec("nn.Linear/no_bias", "lambda x, W: with_params(nn.Linear(4, 2, bias=False), W=W)(x)",
    lambda x, W: x @ W, f32(3, 4), f32(4, 2), **MM)
rec("nn.LayerNorm", "lambda x, w, b: with_params(nn.LayerNorm(6), weight=w, bias=b)(x)",
    lambda x, w, b: F.layer_norm(x, (6,), w, b), f32(2, 3, 6), f32(6), f32(6))
rec("nn.RMSNorm", "lambda x, w: with_params(nn.RMSNorm(6), weight=w)(x)",
    lambda x, w: F.rms_norm(x, (6,), w, eps=1e-6), f32(3, 6), f32(6))
rec("nn.Embedding", "lambda w, i: with_params(nn.Embedding(5, 3), W=w)(i)",
    lambda w, i: F.embedding(i, w), f32(5, 3), i32((3, 2), 0, 5))
rec("nn.Embedding/padding_idx", "lambda w, i: with_params(nn.Embedding(5, 3, padding_idx=0), W=w)(i)",
    lambda w, i: F.embedding(i, w, padding_idx=0), f32(5, 3), i32((3, 2), 0, 5))
rec("nn.Conv2d", "lambda x, w, b: with_params(nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=2), "
    "weight=w, bias=b)(x)", lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=2),
    f32(1, 4, 5, 5), f32(4, 2, 3, 3), f32(4), **MM)
rec("nn.split_heads", "lambda x: nn.split_heads(x, 2)",
    lambda x: x.reshape(2, 3, 2, 4).permute(0, 2, 1, 3), f32(2, 3, 8))
rec("nn.merge_heads", "lambda x: nn.merge_heads(x)",
    lambda x: x.permute(0, 2, 1, 3).reshape(2, 3, 8), f32(2, 2, 3, 4))
rec("nn.cross_entropy_last", "lambda l, t: nn.cross_entropy_last(l, t)",
    lambda l, t: F.cross_entropy(l.reshape(-1, 5), t.reshape(-1)), f32(2, 3, 5), i32((2, 3), 0, 5))
rec("nn.cross_entropy_last/NCd", "lambda l, t: nn.cross_entropy_last(ops.swap_axes(l, 1, 2), t)",
    lambda l, t: F.cross_entropy(l, t), f32(2, 3, 1), i32((2, 1), 0, 3))
rec("nn.cross_entropy_last/NCd4", "lambda l, t: nn.cross_entropy_last(ops.swap_axes(l, 1, 2), t)",
    lambda l, t: F.cross_entropy(l, t), f32(2, 5, 4), i32((2, 4), 0, 5))
rec("log_softmax_last/transposed", "lambda x: ops.log_softmax_last(ops.transpose(x, (0, 2, 1)))",
    lambda x: torch.log_softmax(x.permute(0, 2, 1), -1), f32(2, 3, 1))
rec("nn.mse", "lambda p, t: nn.mse(p, t)", lambda p, t: F.mse_loss(p, t), f32(3, 4), f32(3, 4))
rec("attention", "lambda q, k, v: nn.merge_heads(ops.softmax_causal_last("
    "nn.split_heads(q, 2) @ ops.swap_axes(nn.split_heads(k, 2), -1, -2) * (1 / math.sqrt(4)))"
    " @ nn.split_heads(v, 2))", lambda q, k, v: _t_attention(q, k, v, 2),
    f32(1, 4, 8), f32(1, 4, 8), f32(1, 4, 8), **MM)
# fused on WebGPU (codegen/attention_match.py): the usual spellings of scale and mask, odd
# lengths, head dims 32 / 64 / 128, a query block at the end of a cache, one query
rec("attention/qkv_slices_T70_D32",
    "lambda x: nn.merge_heads(ops.softmax_last(ops.where_causal("
    "nn.split_heads(ops.slice_last_range(x, 0, 64), 2)"
    " @ ops.swap_axes(nn.split_heads(ops.slice_last_range(x, 64, 128), 2), -1, -2))"
    " * (1 / math.sqrt(32))) @ nn.split_heads(ops.slice_last_range(x, 128, 192), 2))",
    lambda x: _t_sdpa(*[_t_split(z, 2) for z in x.split(64, -1)], 1 / math.sqrt(32),
                      _t_causal(70, 70)).permute(0, 2, 1, 3).reshape(2, 70, 64),
    f32(2, 70, 192), atol=2e-4)
# q, k, v from one Linear: their gradients, padded into [B, T, 3C] and added, are the
# Linear's output gradient, which the attention backward kernels write in place
# (fusion_sums._assemble) and its weight and bias gradients read
rec("attention/qkv_linear_T37_D16",
    "lambda x, w, b: (lambda qkv: nn.merge_heads(ops.softmax_last(ops.where_causal("
    "nn.split_heads(ops.slice_last_range(qkv, 0, 32), 2)"
    " @ ops.swap_axes(nn.split_heads(ops.slice_last_range(qkv, 32, 64), 2), -1, -2))"
    " * (1 / math.sqrt(16))) @ nn.split_heads(ops.slice_last_range(qkv, 64, 96), 2)))"
    "(ops.matmul(x, w) + b)",
    lambda x, w, b: _t_sdpa(*[_t_split(z, 2) for z in (x @ w + b).split(32, -1)], 1 / math.sqrt(16),
                            _t_causal(37, 37)).permute(0, 2, 1, 3).reshape(2, 37, 32),
    f32(2, 37, 24, kind="unit"), f32(24, 96, kind="unit"), f32(96), atol=2e-4)
rec("attention/div_scale_D128",
    "lambda q, k, v: ops.softmax_causal_last(q @ ops.swap_axes(k, -1, -2) / math.sqrt(128)) @ v",
    lambda q, k, v: _t_sdpa(q, k, v, 1 / math.sqrt(128), _t_causal(5, 5)),
    f32(1, 1, 5, 128), f32(1, 1, 5, 128), f32(1, 1, 5, 128), atol=2e-4)
rec("attention/additive_mask_T33_D64",
    "lambda q, k, v: ops.softmax_last(q @ ops.swap_axes(k, -1, -2) * 0.125"
    " + (1.0 - ops.causal_mask(33, 33)) * -1e9) @ v",
    lambda q, k, v: _t_sdpa(q, k, v, 0.125, _t_causal(33, 33)),
    f32(1, 2, 33, 64), f32(1, 2, 33, 64), f32(1, 2, 33, 64), atol=2e-4)
rec("attention/cache_block_T3_S9",
    "lambda q, k, v: ops.softmax_last(ops.where(ops.causal_mask(3, 9),"
    " q @ ops.swap_axes(k, -1, -2) * 0.25, -1e30)) @ v",
    lambda q, k, v: _t_sdpa(q, k, v, 0.25, _t_causal(3, 9)),
    f32(1, 2, 3, 16), f32(1, 2, 9, 16), f32(1, 2, 9, 16), **MM)
rec("attention/decode_T1_S9",
    "lambda q, k, v: ops.softmax_causal_last(q @ ops.swap_axes(k, -1, -2) * 0.2) @ v",
    lambda q, k, v: _t_sdpa(q, k, v, 0.2, _t_causal(1, 9)),
    f32(2, 2, 1, 32), f32(2, 2, 9, 32), f32(2, 2, 9, 32), **MM)
rec("attention/cross_shared_kv_Dv12",  # no mask, k and v shared by the 3 heads, Dv != D
    "lambda q, k, v: ops.softmax_last(q @ ops.swap_axes(k, -1, -2) * 0.3) @ v",
    lambda q, k, v: _t_sdpa(q, k, v, 0.3),
    f32(2, 3, 6, 8), f32(2, 1, 11, 8), f32(2, 1, 11, 12), **MM)
rec("attention/table_mask_inf",
    "lambda q, k, v: ops.softmax_last(ops.where(ops.constant([[1.0 if j <= i else 0.0"
    " for j in range(7)] for i in range(7)]), q @ ops.swap_axes(k, -1, -2), float('-inf'))) @ v",
    lambda q, k, v: _t_sdpa(q, k, v, 1.0, _t_causal(7, 7)),
    f32(1, 1, 7, 8), f32(1, 1, 7, 8), f32(1, 1, 7, 8), **MM)
rec("attention/cache_position",  # 3 queries at a runtime position p of a 9-row cache
    "lambda q, k, v, p: ops.softmax_last(ops.where(ops.greater_equal(ops.reshape(ops.cast("
    "ops.arange(3) + p, 'f32'), (3, 1)), ops.reshape(ops.arange(9, dtype='f32'), (1, 9))),"
    " q @ ops.swap_axes(k, -1, -2) * 0.25, -1e30)) @ v",
    lambda q, k, v, p: _t_sdpa(q, k, v, 0.25, torch.arange(9)[None, :] <= torch.arange(3)[:, None] + p),
    f32(1, 2, 3, 16), f32(1, 2, 9, 16), f32(1, 2, 9, 16), i32((1,), 0, 7), **MM)
# the GPU's tiled kernels (codegen/attention_tiled.py): several row blocks each way, head
# dims that are not multiples of the 16-column groups (80, odd 33 and 7), a query block at
# the end of a 70-row cache (key blocks that start mid-way), no mask with S != T
rec("attention/tiled_T70_D80",
    "lambda q, k, v: ops.softmax_causal_last(q @ ops.swap_axes(k, -1, -2) / math.sqrt(80)) @ v",
    lambda q, k, v: _t_sdpa(q, k, v, 1 / math.sqrt(80), _t_causal(70, 70)),
    f32(1, 2, 70, 80), f32(1, 2, 70, 80), f32(1, 2, 70, 80), atol=2e-4)
rec("attention/tiled_odd_T37_D33_Dv7",
    "lambda q, k, v: ops.softmax_causal_last(q @ ops.swap_axes(k, -1, -2) * 0.2) @ v",
    lambda q, k, v: _t_sdpa(q, k, v, 0.2, _t_causal(37, 37)),
    f32(2, 1, 37, 33), f32(2, 1, 37, 33), f32(2, 1, 37, 7), atol=2e-4)
rec("attention/tiled_cache_T5_S70",
    "lambda q, k, v: ops.softmax_last(ops.where_causal(q @ ops.swap_axes(k, -1, -2) * 0.25)) @ v",
    lambda q, k, v: _t_sdpa(q, k, v, 0.25, _t_causal(5, 70)),
    f32(1, 2, 5, 16), f32(1, 2, 70, 16), f32(1, 2, 70, 16), **MM)
rec("attention/tiled_T128_D64",  # GPT-2's head dim, T a multiple of every block (no bounds tests)
    "lambda q, k, v: ops.softmax_causal_last(q @ ops.swap_axes(k, -1, -2) * 0.125) @ v",
    lambda q, k, v: _t_sdpa(q, k, v, 0.125, _t_causal(128, 128)),
    f32(1, 2, 128, 64), f32(1, 2, 128, 64), f32(1, 2, 128, 64), atol=2e-4)
rec("attention/tiled_T150_D64",  # ... T past 128 that divides no block
    "lambda q, k, v: ops.softmax_causal_last(q @ ops.swap_axes(k, -1, -2) * 0.125) @ v",
    lambda q, k, v: _t_sdpa(q, k, v, 0.125, _t_causal(150, 150)),
    f32(1, 1, 150, 64), f32(1, 1, 150, 64), f32(1, 1, 150, 64), atol=2e-4)
rec("attention/tiled_nomask_T20_S75_Dv5",
    "lambda q, k, v: ops.softmax_last(q @ ops.swap_axes(k, -1, -2) * 0.3) @ v",
    lambda q, k, v: _t_sdpa(q, k, v, 0.3),
    f32(1, 1, 20, 8), f32(1, 1, 75, 8), f32(1, 1, 75, 5), **MM)

# cross entropy and layer norm as row kernels on WebGPU (codegen/rowfuse_match.py)
rec("nn.cross_entropy_last/vocab_50257", "lambda l, t: nn.cross_entropy_last(l, t)",
    lambda l, t: F.cross_entropy(l, t), f32(2, 50257), i32((2,), 0, 50257), **RED)
rec("nn.cross_entropy_last/odd_rows", "lambda l, t: nn.cross_entropy_last(l * 3.0, t)",
    lambda l, t: F.cross_entropy(l.reshape(-1, 33) * 3.0, t.reshape(-1)),
    f32(3, 7, 33), i32((3, 7), 0, 33), **RED)
rec("one_hot/pick_computed_out_of_range",  # sum(x * one_hot(i - 2)): a stray index picks 0
    "lambda x, i: ops.sum_last(x * ops.one_hot(i - 2, 5))",
    lambda x, i: torch.where((i >= 2) & (i < 7), torch.gather(x, -1, (i - 2).clamp(0, 4)[:, None])[:, 0], 0.0),
    f32(6, 5), i32((6,), 0, 5))
rec("nn.LayerNorm/width_768", "lambda x, w, b: with_params(nn.LayerNorm(768), weight=w, bias=b)(x)",
    lambda x, w, b: F.layer_norm(x, (768,), w, b), f32(3, 768), f32(768), f32(768), **RED)
rec("layer_norm_last/odd_300", "lambda x: ops.layer_norm_last(x * 2.0 + 1.0)",
    lambda x: F.layer_norm(x * 2.0 + 1.0, (300,)), f32(5, 300), **RED)
# rows longer than a CPU adapter loops over in one thread, of a prime length, and a loss that
# sums 40022 elements: the workgroup row kernels and the two-pass (split) sum everywhere
rec("log_softmax_last/long_rows", "lambda x: ops.log_softmax_last(x)",
    lambda x: torch.log_softmax(x, -1), f32(2, 20011), **RED)

BY_NAME: dict[str, Record] = {r.name: r for r in RECORDS}
assert len(BY_NAME) == len(RECORDS), "oracle record names must be unique"


# ---------------------------------------------------------------- the records in half precision
# check_f16 runs a record compiled with precision="f16" (every value rounded to f16 where it
# is stored, the maths in f32: webgrad/precision.py) against the same float64 torch result,
# within tolerances per op: one f16 rounding is 2^-11 relative, so a record's output after a
# few rounded ops is within 1e-2; long dot products and chains of them get more.

F16_TOL = dict(rtol=1e-2, atol=1e-2)
F16_TOLS = {  # name -> tolerances where F16_TOL is too tight (each value measured, then doubled)
    "matmul/gelu_mlp_odd": dict(rtol=2e-2, atol=8e-2),    # two rounded products, K = 45 and 61
    "matmul/output_sums": dict(rtol=2e-2, atol=5e-2),     # sums of 111 rounded products
    "attention/qkv_linear_T37_D16": dict(rtol=2e-2, atol=5e-2),
}
F16_SKIP = {  # name -> why the record has no f16 form
    "sin/large": "its inputs (up to 1e12) are outside f16's range (65504): inf in, NaN out",
    "cos/large": "its inputs (up to 1e12) are outside f16's range (65504): inf in, NaN out",
    "where_causal/square": "its fill, -1e9, is -inf in f16 (softmax_causal_last uses it "
                           "inside, where the rounded -inf gives the same zeros)",
    "dropout/p0.3": "its check wants the scale 1/(1-p) exactly; f16 stores it rounded",
    "dropout/p0.75_seed": "its check wants the scale 1/(1-p) exactly; f16 stores it rounded",
    "rand_uniform": "its check wants the generator's f32 bits; f16 stores them rounded",
}


def f16_record(record: Record) -> Record:
    """The record with its f16 tolerances."""
    from dataclasses import replace
    return replace(record, **F16_TOLS.get(record.name, F16_TOL))


def check_f16(record: Record, backend: str) -> None:
    """Run `record` with precision="f16" on `backend` and compare with torch (float64)."""
    import functools
    rec = f16_record(record)
    got = run_webgrad(rec, backend, compile_module=functools.partial(wg.compile_module,
                                                                      precision="f16"))
    check_result(rec, got, f"{backend} (precision='f16')")
