"""Convolution windows: unfold2d (im2col) and its adjoint fold2d, with the window geometry.

ops.conv2d and ops.max_pool2d are compositions over unfold2d. `conv_out_size`, `Window`,
`window` and `window_rows` are the geometry that ops.py, codegen/conv.py, the torch backend
and onnx/lower.py share; fold2d is a kernel of its own (kind "fold").
"""
from __future__ import annotations

from dataclasses import dataclass

from .registry import ELEMENT, ShapeError, defprim, ops_module as _O


def conv_out_size(n, k, s, p, d=1, ceil=False):
    """Output length of a window of k taps spaced d apart, stride s, padding p on both
    sides (torch's rule). ceil: round up, but a window must start inside the input or
    its left padding (torch's ceil_mode)."""
    span = d * (k - 1) + 1
    if not ceil:
        return (n + 2 * p - span) // s + 1
    out = -(-(n + 2 * p - span) // s) + 1
    if (out - 1) * s >= n + p:
        out -= 1
    return out


@dataclass(frozen=True)
class Window:
    """The geometry of an unfold2d/fold2d node: taps (kh, kw) spaced (dh, dw), stride,
    padding and output grid (oh, ow) over an H x W image."""
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    oh: int
    ow: int


def window(attrs, H: int, W: int) -> Window:
    (kh, kw), (sh, sw), (ph, pw) = attrs["kernel"], attrs["stride"], attrs["padding"]
    dh, dw = attrs.get("dilation", (1, 1))
    ceil = attrs.get("ceil", False)
    return Window(kh, kw, sh, sw, ph, pw, dh, dw, conv_out_size(H, kh, sh, ph, dh, ceil),
                  conv_out_size(W, kw, sw, pw, dw, ceil))


def window_rows(np, w: Window):
    """(rows [kh, oh], cols [kw, ow]): the image coordinate each tap reads (may be outside)."""
    rows = np.arange(w.oh)[None, :] * w.sh + np.arange(w.kh)[:, None] * w.dh - w.ph
    cols = np.arange(w.ow)[None, :] * w.sw + np.arange(w.kw)[:, None] * w.dw - w.pw
    return rows, cols


def _unfold_shape(ins, attrs):
    x = ins[0]
    if len(x.shape) != 4:
        raise ShapeError("expects [N, C, H, W]")
    N, C, H, W = x.shape
    w = window(attrs, H, W)
    if w.oh < 1 or w.ow < 1:
        raise ShapeError(f"a {w.kh}x{w.kw} window (dilation {w.dh},{w.dw}) does not fit in "
                         f"{H}x{W} with padding {w.ph},{w.pw}")
    return (N, C, w.kh * w.kw, w.oh * w.ow), x.dtype


def _unfold_ref(np, a, x):
    # out[n, c, i*kw + j, oy*ow + ox] = x[n, c, rows[i, oy], cols[j, ox]], pad_value outside
    N, C, H, W = x.shape
    w = window(a, H, W)
    rows, cols = window_rows(np, w)
    r = rows[:, None, :, None]
    c = cols[None, :, None, :]
    inside = (r >= 0) & (r < H) & (c >= 0) & (c < W)
    v = x[:, :, np.clip(r, 0, H - 1), np.clip(c, 0, W - 1)]  # [N, C, kh, kw, oh, ow]
    out = np.where(inside, v, np.asarray(a["pad_value"], x.dtype)).astype(x.dtype)
    return out.reshape(N, C, w.kh * w.kw, w.oh * w.ow)


def _fold_shape(ins, attrs):
    N, C, _, _ = ins[0].shape
    return (N, C, attrs["size"][0], attrs["size"][1]), ins[0].dtype


def _fold_ref(np, a, g):
    # the adjoint: every window entry that lies inside the image is added back to its pixel
    N, C = g.shape[:2]
    H, W = a["size"]
    w = window(a, H, W)
    rows, cols = window_rows(np, w)
    r = np.broadcast_to(rows[:, None, :, None], (w.kh, w.kw, w.oh, w.ow))
    c = np.broadcast_to(cols[None, :, None, :], (w.kh, w.kw, w.oh, w.ow))
    inside = (r >= 0) & (r < H) & (c >= 0) & (c < W)
    out = np.zeros((N, C, H * W), g.dtype)
    vals = g.reshape(N, C, w.kh, w.kw, w.oh, w.ow)[:, :, inside]
    np.add.at(out, (slice(None), slice(None), (r * W + c)[inside]), vals)
    return out.reshape(N, C, H, W)


def _window(a):
    return {k: a[k] for k in ("kernel", "stride", "padding", "dilation", "ceil") if k in a}


defprim("unfold2d", "conv", shape=_unfold_shape, ref=_unfold_ref, cost=ELEMENT,
        grad=lambda g, i, o, a: [_O().fold2d(g, size=i[0].shape[2:], **_window(a))],
        doc="sliding windows [N,C,H,W] -> [N,C,kh*kw,OH*OW] (im2col), so conv2d is a "
            "matmul and max_pool2d a max_last; pad_value fills the border")
defprim("fold2d", "conv", shape=_fold_shape, ref=_fold_ref, cost=ELEMENT, lowering="fold",
        grad=lambda g, i, o, a: [_O().unfold2d(g, pad_value=0.0, **_window(a))],
        doc="the adjoint of unfold2d: window entries summed back into the image")
