"""Python half of webgrad's Pyodide worker (worker.mjs writes this file into Pyodide's site-packages).

worker.mjs hands every request to ``handle`` and posts back what it returns. Keeping the request
logic in Python means errors become ``{type, message, traceback}`` with the user's frames only, and
results become plain structured-cloneable JS values in one place (``to_plain`` then ``to_js``).

Code running in the worker can also import this module to talk to the page:
``webgrad_worker.progress({"step": 3, "loss": 0.25})`` posts ``{type: "progress", step, loss}``.

Interrupts. The page stops running code by writing SIGINT into Pyodide's interrupt buffer, and
Python raises KeyboardInterrupt at the next bytecode *whatever code that is*. Between a user's
steps that is often not the user's code but the event loop's own (the callback that ends an
``asyncio.sleep``, or the one that wakes the task waiting on a GPU read-back); an exception there
loses the wake-up, the request never finishes and the worker is stuck for good. So ``_on_sigint``
raises only inside the request's own call stack (the frames under ``_run``/``_call``), where the
request's ``except`` turns it into an error reply. Anywhere else it re-arms the buffer, and the
interrupt lands at the next bytecode of the request's code: a blocking ``c.step()`` loop stops
at the end of the current step, with the parameters of that completed step. Code that waits long
without running (``await asyncio.sleep(20)``, ``time.sleep``) never reaches a bytecode, so the
worker also cancels the tasks such a request awaits (``cancel_awaits``, on the page's interrupt
message), which ends the wait with the same KeyboardInterrupt.
"""
from __future__ import annotations

import __main__
import asyncio
import inspect
import json
import linecache
import os
import re
import signal
import struct
import sys
import traceback
from collections.abc import Mapping

import js
from pyodide.code import eval_code_async
from pyodide.ffi import JsProxy, jsnull, to_js

_runs = 0


class _Request:
    """What the interrupt logic needs to know about the request being handled."""
    active = False        # the user's code (run source or called function) is executing
    task = None           # the asyncio Task of that request
    tasks_before = set()  # tasks alive when it started: cancel_awaits leaves these alone
    interrupted = False   # an interrupt arrived during it (CancelledError is reported as one)
    rearm = None          # JS function writing SIGINT into the interrupt buffer again


def setup(rearm=None) -> None:
    """Called once by worker.mjs after boot: signal handler, line-buffered output."""
    _Request.rearm = rearm
    signal.signal(signal.SIGINT, _on_sigint)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)  # print() output streams as lines are done
    _watch_new_models()
    _watch_compiles()


def _on_sigint(signum, frame) -> None:
    if not _Request.active:
        return  # nothing of a request runs: the interrupt came too late, drop it
    _Request.interrupted = True
    f = frame
    while f is not None:
        if f.f_code in _REQUEST_CODES:
            raise KeyboardInterrupt
        f = f.f_back
    if _Request.rearm is not None:
        _Request.rearm()  # event-loop code: deliver at the request's next bytecode instead


def cancel_awaits() -> bool:
    """Cancel what the running request waits on (worker.mjs calls this after an interrupt).

    A request awaiting (``await asyncio.sleep(20)``) has its task cancelled at that await; one
    blocked in synchronous code on a promise (``time.sleep``, ``c.step()``: JSPI's run_sync)
    has the tasks it waits on cancelled, which raises in its frame.
    """
    if not _Request.active or _Request.task is None:
        return False
    _Request.interrupted = True
    task = _Request.task
    if getattr(task, "_fut_waiter", None) is not None:  # suspended at an await
        return task.cancel()
    cancelled = False
    for t in asyncio.all_tasks(task.get_loop()):
        if t is not task and t not in _Request.tasks_before and \
                getattr(t, "_fut_waiter", None) is not None:
            cancelled = t.cancel() or cancelled
    return cancelled
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
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    flush = getattr(js, "webgradFlushOutput", None)
    if flush is not None:
        flush()  # output printed before this event reaches the page before it
    post({**(data or {}), **fields, "type": "progress"})


def _error(exc: BaseException, filename: str | None = None) -> dict:
    """{type, message, traceback, line}: the traceback starts at the first frame of the user's
    code and leaves out the frames inside webgrad, Pyodide and asyncio (what the user wrote
    calls into them; the message says what went wrong); ``line`` is the line of the request's
    source where it failed (its deepest frame there), for the page to mark in the editor.

    A SyntaxError in the user's source has no such frame (compiling happens in Pyodide's code):
    it shows the user's line and caret alone. A cancellation caused by an interrupt reads as the
    KeyboardInterrupt it stands for. Sources the page named (``run`` with ``name``) are shown
    under that name instead of ``<run-N>``.
    """
    if isinstance(exc, asyncio.CancelledError) and _Request.interrupted:
        exc = KeyboardInterrupt().with_traceback(exc.__traceback__)
    if isinstance(exc, SyntaxError) and filename and exc.filename == filename:
        text = "".join(traceback.format_exception_only(type(exc), exc))
        return {"type": type(exc).__name__, "message": _named(str(exc)),
                "traceback": _named(text), "line": exc.lineno}
    tb = exc.__traceback__
    while filename and tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    line = None
    t = tb
    while filename and t is not None:
        if t.tb_frame.f_code.co_filename == filename:
            line = t.tb_lineno
        t = t.tb_next
    report = traceback.TracebackException(type(exc), exc, tb or exc.__traceback__)
    if filename:
        _trim(report)
    text = "".join(report.format())
    message = str(exc) or ("interrupted" if isinstance(exc, KeyboardInterrupt) else "")
    return {"type": type(exc).__name__, "message": _named(message), "traceback": _named(text),
            "line": line}


def _internal_dirs() -> tuple[str, ...]:
    import webgrad
    dirs = [os.path.dirname(webgrad.__file__), os.path.dirname(asyncio.__file__)]
    try:
        import _pyodide
        import pyodide
        dirs += [os.path.dirname(pyodide.__file__), os.path.dirname(_pyodide.__file__)]
    except ImportError:
        pass
    return tuple(d + os.sep for d in dirs) + (__file__,)


def _trim(report: traceback.TracebackException) -> None:
    """Drop the internal frames of a traceback (and of the exceptions chained to it), keeping
    at least one frame: a failure that is internal through and through keeps them all."""
    internal = _internal_dirs()
    seen = set()
    while report is not None and id(report) not in seen:
        seen.add(id(report))
        kept = [f for f in report.stack if not f.filename.startswith(internal)]
        if kept:
            report.stack = traceback.StackSummary.from_list(kept)
        report = report.__cause__ or report.__context__


_names: dict[str, str] = {}  # "<run-N>" -> the name the page gave that run's source


def _named(text: str) -> str:
    """<run-N> in a traceback or message -> the name the page gave that source, if any."""
    return re.sub(r"<run-\d+>", lambda m: _names.get(m.group(0), m.group(0)), text)


_MAX_REPR = 20_000  # characters of a run's value shown (`show`): a whole tensor would flood


def _repr(value) -> str | None:
    if value is None:
        return None
    text = repr(value)
    if len(text) > _MAX_REPR:
        text = f"{text[:_MAX_REPR]}… ({len(text)} characters)"
    return text


def _begin() -> None:
    try:
        _Request.task = asyncio.current_task()
    except RuntimeError:  # no running loop: nothing to cancel, the buffer still works
        _Request.task = None
    loop = _Request.task.get_loop() if _Request.task is not None else None
    _Request.tasks_before = set(asyncio.all_tasks(loop)) if loop is not None else set()
    _Request.interrupted = False
    _Request.active = True


_KEEP_SOURCES = 64


async def _run(code: str, name: str | None = None, show: bool = False):
    """Run the source; name: what tracebacks call it (else <run-N>); show: the value as its
    repr (the playground prints it the way Python's prompt would)."""
    global _runs
    _runs += 1
    filename = f"<run-{_runs}>"
    if name:
        _names[filename] = name
    _names.pop(f"<run-{_runs - _KEEP_SOURCES}>", None)
    # Registering the source lets tracebacks quote the failing line.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    # ...but only the latest _KEEP_SOURCES runs: a session of thousands of runs would
    # otherwise hold every source it ever ran (tracebacks from functions defined in an
    # older run then show no source line, nothing worse).
    linecache.cache.pop(f"<run-{_runs - _KEEP_SOURCES}>", None)
    try:
        _begin()
        value = await eval_code_async(code, __main__.__dict__, filename=filename)
        _Request.active = False
        return {"ok": True, "value": _repr(value) if show else value}
    except BaseException as e:
        _Request.active = False
        return {"ok": False, "error": _error(e, filename)}
    finally:
        _Request.active = False


def _lookup(name: str):
    """A global of __main__, or ``module.attr`` of an importable module (``webgrad_worker.x``)."""
    if "." not in name:
        return __main__.__dict__.get(name)
    import importlib
    module, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr, None)
    except ImportError:
        return None


async def _call(name: str, args: list):
    fn = _lookup(name)
    if not callable(fn):
        err = NameError(f"no global Python function named {name!r}; define it with a run request")
        return {"ok": False, "error": _error(err)}
    try:
        _begin()
        value = fn(*args)
        if inspect.isawaitable(value):
            value = await value
        _Request.active = False
        return {"ok": True, "value": value}
    except BaseException as e:
        _Request.active = False
        tb = e.__traceback__.tb_next if e.__traceback__ else None  # drop this frame
        return {"ok": False, "error": _error(e.with_traceback(tb))}
    finally:
        _Request.active = False


_REQUEST_CODES = {_run.__code__, _call.__code__}


async def handle(request):
    """Run one ``run``/``call`` request (a JsProxy); returns the reply as a plain JS object."""
    kind, rid = getattr(request, "type", None), getattr(request, "id", None)
    if kind == "run":
        name = getattr(request, "name", None)
        reply = await _run(str(getattr(request, "code", "")), str(name) if name else None,
                           bool(getattr(request, "show", False)))
    elif kind == "call":
        args = _from_js(getattr(request, "args", None)) or []
        reply = await _call(str(getattr(request, "name", "")), list(args))
    else:
        reply = {"ok": False, "error": {"type": "ValueError", "traceback": "",
                                        "message": f"unknown request type {kind!r}"}}
    reply["id"] = rid
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # worker.mjs then posts what is left and ends a partial last line
    try:
        return _js(reply)
    except Exception as e:  # a value to_js cannot convert: report it rather than dying
        return _js({"id": rid, "ok": False, "error": _error(e)})


# --- What the playground page asks about the user's models --------------------------------

async def warm_up() -> dict:
    """The first compile's fixed costs, paid while the page waits for a click: importing the
    compiler and the WebGPU backend, and requesting the worker's shared GPU device. Returns
    when each part ended (ms on the worker's clock, for bench/cold_start.py)."""
    marks = {}
    now = js.performance.now
    import webgrad.compile  # noqa: F401
    marks["import_compile"] = now()
    from webgrad.backends import webgpu, webgpu_browser  # noqa: F401
    marks["import_webgpu"] = now()
    try:
        await webgpu_browser.request_device()
    except Exception:
        pass  # no WebGPU here: the page says so, and compile reports it when asked
    marks["device"] = now()
    return {k: round(v) for k, v in marks.items()}


def _compiled_modules() -> list[tuple[str, object]]:
    """Live (not destroyed) CompiledModules: those named by a global of __main__ first (in the
    order the code bound them), then any other still alive, each with a display name."""
    import gc
    from webgrad.compiled import CompiledModule
    # issubclass(type(o)), not isinstance: isinstance may ask a (destroyed) JsProxy for __class__
    named = [(k, v) for k, v in __main__.__dict__.items() if issubclass(type(v), CompiledModule)]
    seen = {id(v) for _, v in named}
    others = [o for o in gc.get_objects()
              if issubclass(type(o), CompiledModule) and id(o) not in seen]
    out = named + [(f"compiled module {i + 1}", o) for i, o in enumerate(others)]
    return [(k, c) for k, c in out if not getattr(c, "_destroyed", False)]


def _current():
    modules = _compiled_modules()
    if not modules:
        raise LookupError("no compiled model here yet: run an example (or code that calls "
                          "webgrad.compile_module) first")
    return max(modules, key=lambda m: getattr(m[1], "serial", -1))  # the newest compiled


def describe_compiled() -> list[dict]:
    """The newest live compiled module (the one the last run built): backend, parameters,
    the printed IR and each dispatch of its training step (kernel name, pipeline,
    workgroups, WGSL), for the page's kernel panel. Older ones left in the worker by earlier
    code are not listed; one that cannot be described (a lost device) is passed over."""
    newest_first = sorted(_compiled_modules(), key=lambda m: -getattr(m[1], "serial", -1))
    for name, c in newest_first:
        try:
            return [_describe(name, c)]
        except Exception:
            continue
    return []


def _describe(name: str, c) -> dict:
    """One module's entry in the kernel panel."""
    train = c._train
    plan = getattr(train.exe, "plan", None) if train is not None else None
    kernels = []
    if plan:  # one entry per dispatch of the step, in order, named by the codegen
        names = list(getattr(train.exe, "kernel_names", None) or [])
        dispatches = [cmd for cmd in plan.get("commands", []) if cmd.get("op") == "dispatch"]
        for i, cmd in enumerate(dispatches):
            kernels.append({"label": names[i] if i < len(names) else f"kernel {i}",
                            "pipeline": cmd["pipeline"], "workgroups": cmd["workgroups"],
                            "wgsl": plan["pipelines"][cmd["pipeline"]]["wgsl"]})
    return {"name": name, "backend": getattr(c.backend, "name", "?"),
            "params": {k: list(v) for k, v in c.param_shapes.items()},
            "kernel_count": c.kernel_count, "kernels": kernels,
            "ir": str(c.ir) if train is not None else ""}


async def time_kernels() -> dict:
    """GPU time of each dispatch of the newest live model's training step, for the kernel
    panel: c.profile() on the feed of its last step, with the parameters, optimizer state and
    step counter put back afterwards (a profiled step trains), so the model is left as it
    was. {"name", "timing" ("timestamp" where the adapter has 'timestamp-query', else "wall"),
    "total_ms", "kernels": [ms per dispatch, in the panel's order]}."""
    name, c = _current()
    if c.last_feed is None:
        raise LookupError(f"{name} has not trained a step yet: the kernels are timed on the "
                          "feed of its last step")
    snapshot = c.save(optimizer=True)
    try:
        prof = await c.profile_async(c.last_feed)
    finally:
        c.load(snapshot)
    # the profile has a row per plan command; the panel lists the dispatches only
    plan = c._train.exe.plan
    ms = [None if r.seconds is None else 1e3 * r.seconds
          for r, cmd in zip(prof.rows, plan["commands"]) if cmd.get("op") == "dispatch"]
    total = prof.total_seconds
    return {"name": name, "timing": prof.timing, "kernels": ms,
            "total_ms": None if total is None else 1e3 * total}


def weights_save() -> dict:
    """The newest live model's checkpoint (params, optimizer state, step) as safetensors bytes."""
    name, c = _current()
    return {"name": name, "data": c.save(optimizer=True)}


# --- Weights the person loaded on the page, for the next model a run compiles ---------------
# "Load weights" keeps the file here (and loads it into the newest live model, if it fits):
# the page's Run compiles a new model from the example's code, so the weights are written
# into the first model that run compiles whose parameters they fit, right after its own
# initialisation and before its first step (the optimizer state and step counter too, so
# training continues where the saved model stopped). Used once; a file that fits no model of
# the run stays for the next.

class _Loaded:
    data: bytes | None = None
    label = ""


def _safetensors_names(data: bytes) -> list[str]:
    """The tensor names in a safetensors file's header, or ValueError saying what is wrong."""
    if len(data) < 8:
        raise ValueError(f"it is {len(data)} bytes long, too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    try:
        if n > len(data) - 8:
            raise ValueError
        header = json.loads(data[8:8 + n])
    except ValueError:
        raise ValueError("it is not a safetensors file (its header does not read as one); "
                         "load a file that Download weights wrote") from None
    return [k for k in header if k != "__metadata__"]


def weights_load(data: bytes, label: str = "the file") -> dict:
    """Keep a checkpoint written by weights_save (or any safetensors file of a model's
    parameters) for the next model a run compiles, and load it into the newest live model if
    it fits (a file that does not fit changes nothing there). Returns {name: the live model it
    went into or None, params, pending: True, misfit: why it did not fit the live model}."""
    data = bytes(data)
    names = _safetensors_names(data)
    _Loaded.data, _Loaded.label = data, label
    into, params, misfit = None, len(names), None
    if _compiled_modules():
        name, c = _current()
        try:
            c.load(data)
            into, params = name, len(c.param_names)
        except Exception as e:
            misfit = f"{type(e).__name__}: {e}"
    return {"name": into, "params": params, "pending": True, "misfit": misfit}


def weights_forget() -> bool:
    """Drop the loaded weights kept for the next run's model; True if there were some."""
    had, _Loaded.data = _Loaded.data is not None, None
    return had


def _use_loaded(c) -> None:
    """Called for every new CompiledModule: the loaded weights go into the first that a run
    compiles with a training step and parameters they fit."""
    if _Loaded.data is None or not _Request.active or getattr(c, "_train", None) is None:
        return
    try:
        c.load(_Loaded.data)
    except Exception as e:
        print(f"[the loaded weights {_Loaded.label} do not fit the model this code compiled "
              f"({e}); it starts from its own initial weights]", file=sys.stderr)
        return
    label, _Loaded.data = _Loaded.label, None
    print(f"[started from the loaded weights {label}]")
    post({"type": "weights", "used": label})


def _watch_compiles() -> None:
    """Post {type: "tracing"} as webgrad.compile_module / compile_forward start: the page's
    status then says the code is being traced, before the first kernel's compile event."""
    import webgrad
    import webgrad.compile as compile_
    for name in ("compile_module", "compile_forward"):
        original = getattr(compile_, name)
        if getattr(original, "_playground", False):
            continue

        def traced(*args, _original=original, **kwargs):
            post({"type": "tracing"})
            return _original(*args, **kwargs)

        traced._playground = True
        traced.__wrapped__ = original
        traced.__name__, traced.__doc__ = original.__name__, original.__doc__
        setattr(compile_, name, traced)
        setattr(webgrad, name, traced)


def _watch_new_models() -> None:
    """Have _use_loaded see each CompiledModule once it is built (its __init__ is wrapped)."""
    from webgrad.compiled import CompiledModule
    init = CompiledModule.__init__
    if getattr(init, "_playground", False):
        return

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _use_loaded(self)

    __init__._playground = True
    CompiledModule.__init__ = __init__
