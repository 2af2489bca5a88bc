"""The weights of a model's cache image, and back: what the GPU holds after a load, one tensor
per parameter, for the browser's model cache (io/modelcache.py). gpt2_cache.py and
llama_cache.py build their images on it; each adds its config and tokenizer to meta.

A tensor is whole (a device that splits a token table into row blocks joins it here and
splits it again on restore, so an image serves every device), in the model's parameter
names: dtype "f32", its values; or dtype "words" with quant {qtype, shape, transposed} (a
quants.QuantSpec), the GPU words of a weight held quantized (quants/words.py's layout, the
file's size). Restoring writes the bytes as they are: no parse, no transcode, no kernel; on
WebGPU they go up in one plan of buffers (WebGPUBackend.upload), from the JS bytes the cache
read without a copy through Python.

    entries, parts = await tensors_async(model, shapes, chunks)   # [{name, dtype, shape,
                                            # nbytes, quant?}], one bytes-like per tensor
    got, quant = check(tensors, shapes, size, fail, extra=("tokenizer.json",))  # every field
    write(model, shapes, got, quant, data, write_f32=..., progress=fn)

`model` is a decoding.CausalLM holding `backend`, `shapes` (the backend's parameters),
`quant_full` / `quant` (QuantSpecs of whole tensors / of parameters) and write_blocks.
"""
from __future__ import annotations

from math import prod

from ..arrays import HostArray
from ..quants import FORMATS, QuantSpec, raw_blocks, transcode
from .decoding import block_names


async def tensors_async(model, shapes: dict, chunks: int) -> tuple[list, list]:
    """The image's entries (without offsets) and bytes of every parameter in `shapes`
    ({whole name: declared shape}), read from the model's backend; chunks: how many row
    blocks a table split on this device has."""
    entries, parts = [], []
    for name, shape in shapes.items():
        q = model.quant_full.get(name)
        if q is None:
            view = memoryview(await _f32(model, name, chunks)).cast("B")
            entry = {"name": name, "dtype": "f32", "shape": list(shape)}
        else:
            view = memoryview(await _words(model, name, q, chunks)).cast("B")
            entry = {"name": name, "dtype": "words", "shape": list(shape),
                     "quant": {"qtype": q.qtype, "shape": list(q.shape),
                               "transposed": bool(q.transposed)}}
        entries.append({**entry, "nbytes": view.nbytes})
        parts.append(view)
    return entries, parts


async def _f32(model, name, chunks):
    """The f32 values of parameter `name` (a split table joined), as a HostArray."""
    if name in model.shapes:
        return await model.backend.read(name)
    table = HostArray("f32")
    for pn in block_names(name, chunks):     # blocks of rows: one after the other
        table.extend(await model.backend.read(pn))
    return table


async def _words(model, name, q, chunks):
    """The GPU words of the whole quantized tensor `name`. A table split into row blocks
    holds each block in its own layout (Q8_0/Q4_0/Q6_K put the blocks' scales after all
    their quants), so the blocks go back to GGUF's blocks, are joined and transcoded as one."""
    if name in model.shapes:
        return await model.backend.read(name)        # its buffer: a copy saved, not made
    raw = b""
    for pn in block_names(name, chunks):
        raw += raw_blocks(q.qtype, (await model.backend.read(pn)).tobytes(),
                          prod(model.quant[pn].shape))
    return transcode(q.qtype, raw)


def check(tensors, shapes: dict, size: int, fail, *, extra: tuple = ()) -> tuple[dict, dict]:
    """({name: entry}, {name: QuantSpec}) of an image's tensors list, every field checked
    against `shapes` and the `size` bytes of data before anything is built: names (each
    parameter once; `extra`: the names of dtype "bytes" parts that must be there too),
    dtypes, shapes, quant specs, sizes and 4-aligned offsets. fail(field, msg) raises."""
    if not isinstance(tensors, list) or not all(isinstance(t, dict) for t in tensors):
        fail("tensors", "expected a list of {name, dtype, shape, offset, nbytes}")
    got = {t.get("name"): t for t in tensors}
    want = set(shapes) | set(extra)
    missing, unknown = sorted(want - set(got)), sorted(set(got) - want, key=str)
    if missing or unknown or len(got) != len(tensors):
        fail("tensors", f"missing {missing[:5]}, unknown {unknown[:5]}, "
                        f"{len(tensors) - len(got)} duplicated")
    quant = {}
    for name in [*shapes, *extra]:
        t = got[name]
        field = f"tensors[{name!r}]"
        off, n = t.get("offset"), t.get("nbytes")
        if name in extra:
            if t.get("dtype") != "bytes":
                fail(f"{field}.dtype", f"{t.get('dtype')!r}; expected 'bytes'")
            need = n if isinstance(n, int) and n >= 0 else None
            what = "bytes"
        else:
            shape = shapes[name]
            if t.get("dtype") not in ("f32", "words"):
                fail(f"{field}.dtype", f"{t.get('dtype')!r}; expected 'f32' or 'words'")
            if list(t.get("shape") or ()) != list(shape):
                fail(f"{field}.shape", f"{t.get('shape')}; the config needs {list(shape)}")
            if t["dtype"] == "words":
                q = quant[name] = quant_spec(t.get("quant"), shape, f"{field}.quant", fail)
                need, what = 4 * q.words, f"{q.qtype}{list(q.shape)}'s words"
            else:
                need, what = 4 * prod(shape), f"f32{list(shape)}"
        if not (isinstance(off, int) and isinstance(n, int)) or n != need:
            fail(f"{field}.nbytes", f"{n!r}; {what} need {need}")
        if off < 0 or (off % 4 and name not in extra) or off + n > size:
            fail(f"{field}.offset", f"{off!r} (+{n} bytes) is not a 4-aligned range "
                                    f"inside the {size} bytes of data")
    return got, quant


def quant_spec(q, shape, field, fail):
    """The QuantSpec a tensor's meta describes, each field checked (fail names it)."""
    if not isinstance(q, dict):
        fail(field, f"expected {{qtype, shape, transposed}} for dtype 'words', got {q!r}")
    qtype, qshape, transposed = q.get("qtype"), q.get("shape"), q.get("transposed")
    if qtype not in FORMATS:
        fail(f"{field}.qtype", f"{qtype!r}; kept quantized are {', '.join(FORMATS)}")
    if not isinstance(transposed, bool):
        fail(f"{field}.transposed", f"{transposed!r}; expected true or false")
    if not (isinstance(qshape, list) and qshape
            and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in qshape)):
        fail(f"{field}.shape", f"{qshape!r}; expected a list of positive sizes")
    try:
        spec = QuantSpec(qtype, tuple(qshape), transposed)
    except ValueError as e:
        fail(f"{field}.shape", str(e))
    if spec.declared_shape != tuple(shape):
        # the stored shape fits the other way round: it is `transposed` that is wrong
        flipped = tuple(qshape) if transposed else tuple(reversed(qshape))
        which = "transposed" if flipped == tuple(shape) else "shape"
        fail(f"{field}.{which}", f"{qshape}{' transposed' if transposed else ''} is not the "
                                 f"parameter's {list(shape)}")
    return spec


def pieces(data):
    """(size, piece(offset, n)) of an image's data: a bytes-like, or in the worker the JS
    Uint8Array the cache read (piece gives a JS view of it then: nothing copied)."""
    if hasattr(data, "subarray"):     # a JS typed array (JsProxy)
        return int(data.length), lambda off, n: data.subarray(off, off + n)
    data = memoryview(data).cast("B")
    return data.nbytes, lambda off, n: data[off:off + n]


def as_bytes(piece) -> bytes:
    """A piece's bytes in Python (a JS view copied over)."""
    return piece.to_bytes() if hasattr(piece, "to_bytes") else piece


def write(model, shapes: dict, got: dict, quant: dict, piece, *, write_f32, progress=None):
    """Write the checked tensors (check's got and quant; piece from pieces) into `model`, a
    model of the same config and quant specs: on WebGPU every parameter held whole goes up
    as its bytes in one upload; elsewhere through the host; a table this device splits
    through write_f32(name, HostArray) or model.write_blocks (each block its own layout).
    progress(done, total) hears the bytes written."""
    done, total = 0, sum(got[n]["nbytes"] for n in shapes)
    if progress is not None:
        progress(0, total)
    direct = {}
    for name, shape in shapes.items():
        t, q = got[name], quant.get(name)
        raw = piece(t["offset"], t["nbytes"])
        if name in model.shapes and model.backend.runs_plans:
            direct[name] = raw
            continue
        if name in model.shapes:
            h = HostArray("f32" if q is None else "i32", shape=shape if q is None else (q.words,))
            h.frombytes(as_bytes(raw))
            model.backend.write(name, h)
        elif q is None:
            h = HostArray("f32", shape=shape)
            h.frombytes(as_bytes(raw))
            write_f32(name, h)
        else:
            model.write_blocks(name, raw_blocks(q.qtype, as_bytes(raw), prod(q.shape)))
        done += t["nbytes"]
        if progress is not None:
            progress(done, total)
    if direct:
        model.backend.upload(direct)
        if progress is not None:
            progress(total, total)


__all__ = ["tensors_async", "check", "quant_spec", "pieces", "as_bytes", "write"]
