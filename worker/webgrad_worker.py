"""Python half of webgrad's Pyodide worker (worker.mjs writes this file into Pyodide's site-packages).

worker.mjs hands every request to ``handle`` and posts back what it returns. Keeping the request
logic in Python means errors become ``{type, message, traceback}`` with the user's frames only, and
results become plain structured-cloneable JS values in one place (``to_plain`` then ``to_js``).

Code running in the worker can also import this module to talk to the page:
``webgrad_worker.progress({"step": 3, "loss": 0.25})`` posts ``{type: "progress", step, loss}``.
"""
from __future__ import annotations

import __main__
import inspect
import linecache
import traceback
from collections.abc import Mapping

import js
from pyodide.code import eval_code_async
from pyodide.ffi import JsProxy, jsnull, to_js

_runs = 0
# memoryview formats that map onto a JS TypedArray; anything else is sent as bytes.
_TYPED_FORMATS = set("bBhHiIlLqQfd")


def to_plain(value, _depth: int = 0):
    """Python value -> None/bool/int/float/str/bytes/memoryview/list/dict(str keys); else repr."""
    if _depth > 100:
        return repr(value)
    if value is jsnull:
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, memoryview):
        if value.c_contiguous and value.format.lstrip("@=<") in _TYPED_FORMATS:
            return value
        return value.tobytes()
    if isinstance(value, (list, tuple)):
        return [to_plain(v, _depth + 1) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: to_plain(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, JsProxy):
        py = value.to_py()
        return repr(value) if isinstance(py, JsProxy) else to_plain(py, _depth + 1)
    return repr(value)


def _js(value):
    """A plain Python value as a JS value (dicts become plain Objects, bytes a Uint8Array)."""
    return to_js(to_plain(value), dict_converter=js.Object.fromEntries, create_pyproxies=False)


def _from_js(value):
    """Request arguments (JsProxy) -> Python values; typed arrays become bytes, null None."""
    if value is jsnull:
        return None
    if isinstance(value, JsProxy):
        value = value.to_py()
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, list):
        return [_from_js(v) for v in value]
    if isinstance(value, dict):
        return {k: _from_js(v) for k, v in value.items()}
    if isinstance(value, JsProxy) and hasattr(value, "to_bytes"):
        return value.to_bytes()
    return value


def post(message: dict) -> None:
    """Post a plain message to the page (``to_plain`` decides how values travel)."""
    js.postMessage(_js(message))


def progress(data: Mapping | None = None, /, **fields) -> None:
    """Post ``{type: "progress", **data, **fields}`` to the page, e.g. per training step."""
    post({**(data or {}), **fields, "type": "progress"})


def _error(exc: BaseException, filename: str | None = None) -> dict:
    """{type, message, traceback}, the traceback starting at the first frame of the user's code."""
    tb = exc.__traceback__
    while filename and tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))
    return {"type": type(exc).__name__, "message": str(exc), "traceback": text}


async def _run(code: str):
    global _runs
    _runs += 1
    filename = f"<run-{_runs}>"
    # Registering the source lets tracebacks quote the failing line.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    try:
        return {"ok": True, "value": await eval_code_async(code, __main__.__dict__,
                                                           filename=filename)}
    except BaseException as e:
        return {"ok": False, "error": _error(e, filename)}


async def _call(name: str, args: list):
    fn = __main__.__dict__.get(name)
    if not callable(fn):
        err = NameError(f"no global Python function named {name!r}; define it with a run request")
        return {"ok": False, "error": _error(err)}
    try:
        value = fn(*args)
        if inspect.isawaitable(value):
            value = await value
        return {"ok": True, "value": value}
    except BaseException as e:
        tb = e.__traceback__.tb_next if e.__traceback__ else None  # drop this frame
        return {"ok": False, "error": _error(e.with_traceback(tb))}


async def handle(request):
    """Run one ``run``/``call`` request (a JsProxy); returns the reply as a plain JS object."""
    kind, rid = getattr(request, "type", None), getattr(request, "id", None)
    if kind == "run":
        reply = await _run(str(getattr(request, "code", "")))
    elif kind == "call":
        args = _from_js(getattr(request, "args", None)) or []
        reply = await _call(str(getattr(request, "name", "")), list(args))
    else:
        reply = {"ok": False, "error": {"type": "ValueError", "traceback": "",
                                        "message": f"unknown request type {kind!r}"}}
    reply["id"] = rid
    try:
        return _js(reply)
    except Exception as e:  # a value to_js cannot convert: report it rather than dying
        return _js({"id": rid, "ok": False, "error": _error(e)})
