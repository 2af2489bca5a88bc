"""The torch executor: the reference interpreter's walk, with torch ops on any torch device.

`backend="torch"` runs on the CPU, `"torch:cuda"` (or any torch device string) elsewhere.
Every primitive has one lowering in `TORCH_IMPLS`, `fn(attrs, *tensors)`, that reproduces
the primitive's numpy `ref` rule exactly: float32 values, i32 stays int32 (torch would
widen sums and indices to int64), comparisons return float32 0/1, `where` selects on
cond != 0, and `rand_uniform` yields the same bits as `primitives.rand_bits` (the 32-bit
hash runs in int64 lanes with masking, as the spec does). Only the summation order of
reductions and matmuls may differ from numpy, within float32 rounding.

This module is imported only when a torch backend is asked for (backends.get_backend), so
`import webgrad` never needs torch.
"""
from __future__ import annotations

import ctypes
from math import prod

from ..arrays import HostArray
from ..primitives import lowbias32, rand_key, window, window_rows
from .interpreter import Interpreter

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    raise ImportError("backend='torch' needs PyTorch (pip install torch); use "
                      "backend='reference' (numpy) or 'webgpu' instead") from None


def torch_dtype(dtype: str):
    """The torch dtype of an IR dtype ("f32", "f16" or "i32"); io/torch_interop.py uses it too."""
    return {"f32": torch.float32, "f16": torch.float16}.get(dtype, torch.int32)


# ---------------------------------------------------------------- elementwise

def _div(a, x, y):
    if x.dtype.is_floating_point:
        return x / y
    return torch.div(x, y, rounding_mode="trunc")  # numpy ref: trunc(x / y) for integers


def _pow(a, x):
    return torch.pow(x, torch.tensor(a["p"], dtype=x.dtype, device=x.device))


def _cmp(fn):
    return lambda a, x, y: fn(x, y).to(torch.float32)


def _where(a, c, x, y):
    return torch.where(c != 0, x, y)


def _cast(a, x):
    return x.to(torch_dtype(a["dtype"]))


def _matmul(a, x, y):
    # f16 x f16 accumulates in f32 (primitives/matmul.py's _matmul_ref): the products of two
    # f16 values are exact in f32, and torch's CPU float16 matmul would round its result to f16
    if x.dtype == torch.float16:
        return torch.matmul(x.float(), y.float())
    return torch.matmul(x, y)


# ---------------------------------------------------------------- leaves


def _const(device):
    # called once per node, when the interpreter prepares a graph (not every step)
    return lambda a: torch.tensor(a["value"], dtype=torch_dtype(a["dtype"]),
                                  device=device).reshape(a["shape"])


def _arange(device):
    return lambda a: torch.arange(a["n"], dtype=torch_dtype(a["dtype"]), device=device)


# ---------------------------------------------------------------- reductions


def _sum(a, x):
    axes = tuple(a["axes"])
    if not axes:  # numpy: sum over no axes is the identity (torch would reduce everything)
        return x.clone()
    return torch.sum(x, dim=axes, dtype=x.dtype)  # dtype: torch widens int32 sums to int64


def _layer_norm(a, x):
    # biased variance and eps inside the square root, as the ref rule and F.layer_norm
    return F.layer_norm(x, (x.shape[-1],), eps=a["eps"])


# ---------------------------------------------------------------- layout


def _pad(a, x):
    ax = a["axis"]
    parts = []
    for n in (a["before"], None, a["after"]):
        if n is None:
            parts.append(x)
        elif n:
            shape = list(x.shape)
            shape[ax] = n
            parts.append(x.new_zeros(shape))
    return torch.cat(parts, dim=ax)


# ---------------------------------------------------------------- indices


def _one_hot(a, i):
    # a comparison, not F.one_hot: out-of-range indices give a zero row, as in the ref rule
    n = a["n"]
    return (i.unsqueeze(-1) == torch.arange(n, dtype=i.dtype, device=i.device)).to(torch.float32)


def _gather_rows(a, w, i):
    # as the ref rule: rows outside [0, n) read as zeros, no negative wrap
    ok = (i >= 0) & (i < w.shape[0])
    rows = w[torch.where(ok, i, 0).long()]
    return torch.where(ok.reshape(ok.shape + (1,) * (w.dim() - 1)), rows, rows.new_zeros(()))


def _scatter_add_rows(a, g, i):
    rest = tuple(g.shape[i.dim():])
    out = g.new_zeros((a["n"],) + rest)
    flat = i.reshape(-1)
    ok = (flat >= 0) & (flat < a["n"])  # out-of-range rows are dropped
    return out.index_add_(0, flat[ok].long(), g.reshape((-1,) + rest)[ok])


def _dequantize(a, w):
    # the blocks are decoded by the formats' own formulas (webgrad/quants) on the host; the
    # values are exact (f16 scales times small integers), so nothing is lost in the trip
    import numpy as np
    from ..quants import dequantize_numpy
    x = dequantize_numpy(np, a["qtype"], w.detach().to("cpu").numpy(), a["shape"])
    return torch.from_numpy(x).to(w.device)


def _write_rows(a, base, vals, start):
    out = base.clone()
    s, n = int(start.reshape(-1)[0]), base.shape[0]
    lo, hi = max(s, 0), min(s + vals.shape[0], n)  # rows outside the target are dropped
    if lo < hi:
        out[lo:hi] = vals[lo - s:hi - s]
    return out


# ---------------------------------------------------------------- random


def _rand_uniform(a, counter):
    # the generator's spec (primitives.rand_bits): the key is hashed with Python ints, the
    # lanes in int64, where multiplications wrap mod 2^64 and masking keeps the low 32 bits
    # exact, so the bits equal the numpy reference and the WGSL u32 kernels
    key = rand_key(int(counter.reshape(-1)[0].item()), a["seed"])
    n = prod(a["shape"])
    h = lowbias32(None, torch.arange(n, dtype=torch.int64, device=counter.device) + key)
    return ((h >> 8).to(torch.float32) * (2.0 ** -24)).reshape(a["shape"])


# ---------------------------------------------------------------- convolution windows


def _taps(a, H, W, device):
    """(window, flat pixel index [kh, kw, oh, ow] (clamped), inside mask): the same index
    arrays as primitives/conv.py's _unfold_ref, in torch."""
    w = window(a, H, W)
    rows, cols = window_rows(torch, w)
    r = rows[:, None, :, None].expand(w.kh, w.kw, w.oh, w.ow)
    c = cols[None, :, None, :].expand(w.kh, w.kw, w.oh, w.ow)
    inside = (r >= 0) & (r < H) & (c >= 0) & (c < W)
    flat = r.clamp(0, H - 1) * W + c.clamp(0, W - 1)
    return w, flat.to(device), inside.to(device)


def _unfold2d(a, x):
    # an index gather (not F.unfold: max_pool2d pads with pad_value, ceil_mode overhangs)
    N, C, H, W = x.shape
    w, flat, inside = _taps(a, H, W, x.device)
    v = x.reshape(N, C, H * W)[:, :, flat]
    out = torch.where(inside, v, torch.tensor(a["pad_value"], dtype=x.dtype, device=x.device))
    return out.reshape(N, C, w.kh * w.kw, w.oh * w.ow)


def _fold2d(a, g):
    N, C = g.shape[:2]
    H, W = a["size"]
    w, flat, inside = _taps(a, H, W, g.device)
    out = g.new_zeros((N, C, H * W))
    vals = g.reshape(N, C, w.kh, w.kw, w.oh, w.ow)[:, :, inside]
    out.index_add_(2, flat[inside], vals)
    return out.reshape(N, C, H, W)


def torch_impls(device) -> dict:
    """op name -> fn(attrs, *tensors); leaves that create tensors get the device. The torch
    executor's rules, also the forward of io/torch_interop.py's torch.nn.Module."""
    return {
        "neg": lambda a, x: -x,
        "exp": lambda a, x: torch.exp(x),
        "log": lambda a, x: torch.log(x),
        "sqrt": lambda a, x: torch.sqrt(x),
        "rsqrt": lambda a, x: 1 / torch.sqrt(x),  # as the ref rule (torch.rsqrt rounds differently)
        "tanh": lambda a, x: torch.tanh(x),
        "sigmoid": lambda a, x: torch.sigmoid(x),
        "relu": lambda a, x: torch.relu(x),
        "erf": lambda a, x: torch.erf(x),
        "abs": lambda a, x: torch.abs(x),
        "sign": lambda a, x: torch.sign(x),
        "sin": lambda a, x: torch.sin(x),
        "cos": lambda a, x: torch.cos(x),
        "pow": _pow,
        "power": lambda a, x, y: torch.pow(x, y),
        "floor": lambda a, x: torch.floor(x),
        "trunc": lambda a, x: torch.trunc(x),
        "round": lambda a, x: torch.round(x),
        "stop_gradient": lambda a, x: x,
        "add": lambda a, x, y: x + y,
        "sub": lambda a, x, y: x - y,
        "mul": lambda a, x, y: x * y,
        "div": _div,
        "maximum": lambda a, x, y: torch.maximum(x, y),
        "minimum": lambda a, x, y: torch.minimum(x, y),
        "less": _cmp(torch.lt),
        "greater": _cmp(torch.gt),
        "equal": _cmp(torch.eq),
        "where": _where,
        "cast": _cast,
        "const": _const(device),
        "arange": _arange(device),
        "sum": _sum,
        "max_last": lambda a, x: torch.amax(x, dim=-1),
        # torch.argmax returns the first maximal index, as np.argmax
        "argmax_last": lambda a, x: torch.argmax(x, dim=-1).to(torch.int32),
        "softmax_last": lambda a, x: torch.softmax(x, dim=-1),
        "log_softmax_last": lambda a, x: torch.log_softmax(x, dim=-1),
        "layer_norm_last": _layer_norm,
        "reshape": lambda a, x: x.reshape(a["shape"]),
        "transpose": lambda a, x: x.permute(*a["perm"]),
        "broadcast_to": lambda a, x: x.expand(*a["shape"]).contiguous(),
        "concat": lambda a, *xs: torch.cat(xs, dim=a["axis"]),
        "slice": lambda a, x: x.narrow(a["axis"], a["start"], a["stop"] - a["start"]),
        "pad": _pad,
        "matmul": _matmul,
        "one_hot": _one_hot,
        "gather_rows": _gather_rows,
        "scatter_add_rows": _scatter_add_rows,
        "write_rows": _write_rows,
        "rand_uniform": _rand_uniform,
        "unfold2d": _unfold2d,
        "fold2d": _fold2d,
        "dequantize": _dequantize,
    }


TORCH_IMPLS: dict = torch_impls("cpu")


class TorchBackend(Interpreter):
    name = "torch"

    def __init__(self, device: str = "cpu"):
        super().__init__()
        try:
            self.device = torch.device(device)
            torch.empty(0, device=self.device)
        except (RuntimeError, AssertionError) as e:
            raise ValueError(f"backend='torch:{device}': torch cannot use device "
                             f"{device!r} ({e})") from None
        self.impls = TORCH_IMPLS if self.device.type == "cpu" else torch_impls(self.device)

    def from_numpy(self, x):
        return torch.from_numpy(x).to(self.device)

    def like_held(self, x, held):
        if held is not None and held.dtype == torch.float16 and x.dtype != held.dtype:
            return x.to(torch.float16)
        return x

    def from_host(self, h: HostArray):
        dt = torch_dtype(h.dtype)
        if len(h) == 0:
            return torch.zeros(h.shape, dtype=dt, device=self.device)
        t = torch.frombuffer(bytearray(h), dtype=dt)  # a copy: the HostArray stays the caller's
        return t.reshape(h.shape).to(self.device)

    def to_host(self, x, dtype):
        dtype = "f32" if dtype == "f16" else dtype  # an f16 value reaches the host as f32
        x = x.detach().to("cpu", torch_dtype(dtype)).contiguous()
        out = HostArray(dtype, shape=tuple(x.shape))
        if x.numel():
            # one memcpy of the contiguous CPU tensor (bytes(untyped_storage()) iterates
            # byte by byte: seconds for a megabyte)
            out.frombytes(ctypes.string_at(x.data_ptr(), x.numel() * x.element_size()))
        return out

    def zeros(self, shape, dtype):
        return torch.zeros(tuple(shape), dtype=torch_dtype(dtype), device=self.device)
