"""The CPU backend `wasm`: the program exported to ONNX (webgrad/onnx) and run by ONNX Runtime.

In the browser, where there is no WebGPU adapter and no numpy, the graph runs in ONNX
Runtime Web's WebAssembly build (npm `onnxruntime-web`, loaded into the Pyodide worker:
worker/ort.mjs; a notebook kernel imports the same module from the URL it sets and awaits
load_async()); in CPython the same model runs in the `onnxruntime` package (its native CPU
build), which is how the tests check this backend against the reference executor.

The store holds each persistent buffer as the runtime's own array (an ort.Tensor in the
browser, a numpy array in CPython): a step feeds the model its feeds and every buffer it
reads, and the model's `<name>:new` outputs replace the buffers it writes, after the run
(interpreter.py's rule: a step sees the values from before it). A KV cache under a decode
step's GroupQueryAttention node goes by rows (onnx/attention.py's row_states): the step
feeds the cache's rows below `pos` (a view, no copy) and writes the new row it returns into
the buffer in place, so a step costs the same at n_ctx 64 and 2048; in the browser both
happen in the JS call that runs the model (worker/ort.mjs runRows: one crossing a step). A
quantized parameter is decoded on the host once per write (quants.dequantize_words) and fed
as f32.

Parameters that a program only reads (the weights of a decode step, the frozen base of a
LoRA step) are resident instead: exported as initializers with external data (onnx
export_graph's `resident`), their bytes handed to the runtime once, when the session is
made. onnxruntime copies every fed tensor into its heap on each run (onnxruntime-web into
the WebAssembly memory), and pre-packs or folds (the head's transpose) only initializers,
so feeding them cost a decode step time in proportion to the weights. Every store write
stamps the buffer; a run whose session holds an older stamp of a resident buffer makes its
session again from the store, so a write (upload_params, another program's training step)
is seen by the next run. A buffer that made a program's session stale twice is fed by that
program from then on (a parameter trained between its runs), the rest stay resident.
"""
from __future__ import annotations

import sys

from ..arrays import HostArray
from ..onnx import export_graph
from .base import Backend


ORT_URL_GLOBAL = "webgradOrtURL"  # set globalThis[this] to load worker/ort.mjs from elsewhere
_ort = None  # worker/ort.mjs, loaded (load_async)


def in_pyodide() -> bool:
    return sys.platform == "emscripten"


def _ort_import():
    """The import of worker/ort.mjs (a Promise): the webgrad worker's own, or from the URL that
    a page without it (a notebook kernel) put at globalThis[ORT_URL_GLOBAL]; None if neither."""
    import js
    if hasattr(js, "webgradOrt"):
        return js.webgradOrt()
    url = getattr(js.globalThis, ORT_URL_GLOBAL, None)
    if url:
        from pyodide.code import run_js
        return run_js("(url) => import(url)")(str(url))
    return None


def _no_ort() -> RuntimeError | None:
    """The error to raise where worker/ort.mjs cannot be imported (neither the worker's own
    nor a URL at globalThis[ORT_URL_GLOBAL]), raised before any Promise is made: a failed
    coroutine under run_sync shows as a cell's error in a JupyterLite kernel even when caught."""
    import js
    if hasattr(js, "webgradOrt") or getattr(js.globalThis, ORT_URL_GLOBAL, None):
        return None
    return RuntimeError("backend='wasm' needs onnxruntime-web: webgrad's worker "
                        "(worker/worker.mjs) loads it from /assets/ort/; elsewhere set "
                        f"globalThis.{ORT_URL_GLOBAL} to the URL of worker/ort.mjs")


def set_threads(n: int) -> None:
    """onnxruntime-web's WebAssembly threads for this worker, asked before it loads (the first
    backend='wasm' program; load_async): a cross-origin isolated page gets n, one that is not
    gets one whatever is asked (threads share memory: SharedArrayBuffer needs the isolation
    serve.py's headers give). Unset: half the cores, at most 4. engine() says what it got.
    In CPython, OnnxRuntimeBackend(threads=n) sets onnxruntime's intra-op threads instead."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 64:
        raise ValueError(f"set_threads: give a whole number of threads from 1 to 64, not {n!r}")
    if not in_pyodide():
        raise RuntimeError("set_threads is for onnxruntime-web in the browser; in CPython pass "
                           "OnnxRuntimeBackend(threads=n)")
    if _ort is not None:
        raise RuntimeError(f"set_threads({n}): onnxruntime-web is loaded already "
                           f"({_ort.engine()}); call it before the first backend='wasm' program")
    import js
    js.globalThis.webgradOrtThreads = n


async def load_async() -> str:
    """Import and load onnxruntime-web (worker/ort.mjs) without blocking; its description.
    backend='wasm' does this itself where Python may block on a Promise (JSPI, as in webgrad's
    worker); elsewhere (a notebook kernel) await this first (backends.prepare_async does)."""
    global _ort
    if _ort is None:
        if (missing := _no_ort()) is not None:
            raise missing
        module = await _ort_import()
        await module.load()
        _ort = module
    return str(_ort.engine())


class OnnxRuntimeBackend(Backend):
    name = "wasm"

    def __init__(self, *, threads: int = 1):
        """threads: onnxruntime's intra-op threads in CPython (1, as the browser's engine runs
        without cross-origin isolation; a thread pool per session also costs its creation).
        In the browser worker/ort.mjs picks them."""
        self.rt = _BrowserRuntime() if in_pyodide() else _PythonRuntime(threads)
        self.store: dict[str, object] = {}
        self.dtypes: dict[str, str] = {}
        self.shapes: dict[str, tuple] = {}   # ort.Tensor names its shape `dims`, numpy `shape`
        self._decoded: dict[str, dict] = {}   # name -> {(qtype, shape): its f32 decoding}
        self.stamps: dict[str, int] = {}  # buffer -> the count of store writes at its last write
        self._writes = 0
        self.resident: set[str] = set()   # the buffers some session holds
        self.resident_writes = 0          # writes to those: a session checks its stamps on change
        self.runs: list = []  # every prepared program, whose sessions destroy() releases

    @property
    def engine(self) -> str:
        """What runs the models: 'onnxruntime-web (WebAssembly)' or 'onnxruntime <version>'."""
        return self.rt.engine

    def ensure(self, name, shape, dtype):
        if name in self.store:
            return False
        self.write(name, HostArray(dtype, [0] * _size(shape), shape=tuple(shape)))
        return True

    def write(self, name, host):
        self.replace(name, self.rt.from_host(host))
        self.dtypes[name] = host.dtype
        self.shapes[name] = tuple(host.shape)

    def replace(self, name: str, value) -> None:
        """Put a new value of buffer `name` in the store (a write or a writeback): the
        sessions that hold it resident see the new stamp and are made again."""
        self.store[name] = value
        self._writes += 1
        self.stamps[name] = self._writes
        self._decoded.pop(name, None)
        if name in self.resident:
            self.resident_writes += 1

    def shape_of(self, name):
        return self.shapes.get(name) if name in self.store else None

    async def read(self, name):
        return await self.rt.to_host(self.store[name], self.dtypes[name])

    def prepare(self, graph, options=None):  # options: no kernels here to generate
        return _Run(self, graph)

    def decoded(self, name: str, qtype: str, shape) -> object:
        """The f32 values of quantized parameter `name`, decoded on the host (cached until
        the next write)."""
        known = self._decoded.setdefault(name, {})
        key = (qtype, tuple(shape))
        if key not in known:
            words = self.rt.host_words(self.store[name])
            known[key] = self.rt.from_host(_decode(qtype, words, shape))
        return known[key]

    def destroy(self):
        for run in self.runs:
            run.release()
        self.runs.clear()
        self.store.clear()
        self.shapes.clear()


def _decode(qtype: str, words: bytes, shape) -> HostArray:
    from ..quants import dequantize_words
    return HostArray("f32", dequantize_words(qtype, words, shape), shape=tuple(shape))


def _size(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class _Run:
    """A program on this backend: its model and the session that runs it, made on the first
    run (the parameters are written by then) and again when a resident buffer changed."""

    def __init__(self, backend: OnnxRuntimeBackend, graph):
        self.b, self.g = backend, graph
        # parameters this program only reads: resident in the session (the module header)
        self.readonly = [n.attrs["name"] for n in graph.nodes
                         if n.op == "param" and n.attrs["name"] not in graph.writebacks]
        self.stale_count: dict[str, int] = {}   # buffer -> sessions it made stale
        self.session = None
        self.held: dict[str, int] = {}          # resident buffer -> its stamp in the session
        self.seen = -1                          # backend.resident_writes at the last check
        self._export()
        backend.runs.append(self)

    def _export(self) -> None:
        fed = {k for k, c in self.stale_count.items() if c >= 2}
        self.ex = export_graph(self.g, name="webgrad_program",
                               resident=[n for n in self.readonly if n not in fed],
                               by_rows=True)
        self.kernel_count = self.ex.n_nodes  # what the runtime executes: the model's nodes

    def _current_session(self):
        b = self.b
        if self.session is not None and self.seen == b.resident_writes:
            return self.session   # no resident buffer of any session written since the last run
        self.seen = b.resident_writes
        stale = [n for n, st in self.held.items() if b.stamps.get(n) != st]
        if self.session is not None and not stale:
            return self.session
        if stale:
            for n in stale:
                self.stale_count[n] = self.stale_count.get(n, 0) + 1
            if any(self.stale_count[n] == 2 for n in stale):
                self._export()   # those buffers fed from now on
            self.release()
        externals = {}
        self.held = {}
        for loc, (kind, name, qtype, shape) in self.ex.resident.items():
            externals[loc] = b.store[name] if qtype is None else b.decoded(name, qtype, shape)
            self.held[name] = b.stamps.get(name)
        b.resident.update(self.held)
        self.session = b.rt.session(self.ex.model, externals)
        return self.session

    def release(self) -> None:
        if self.session is not None:
            self.b.rt.release(self.session)
            self.session = None

    async def run(self, feeds: dict[str, HostArray], fetch: list[str]) -> dict[str, HostArray]:
        b = self.b
        session = self._current_session()
        ex = self.ex
        ins = {k: b.rt.from_host(feeds[k]) for k in ex.feeds}
        ins.update({k: b.store[buf] for k, buf in ex.persistent.items()})
        for k, (kind, name, qtype, shape) in ex.dequantized.items():
            ins[k] = (b.decoded(name, qtype, shape) if kind != "input" else
                      b.rt.from_host(_decode(qtype, bytes(memoryview(feeds[name]).cast("B")), shape)))
        reads, writes = [], []   # KV caches exchanged by rows: (model name, buffer, row)
        for k, (buf, feed) in ex.row_reads.items():
            p = int(feeds[feed][0])
            n = b.shapes[buf][0]
            if not 0 <= p <= n:
                raise ValueError(f"feed {feed!r} is {p}: the cache {buf!r} has rows 0 to {n - 1}")
            reads.append((k, buf, p))   # the rows below p fed, no copy
        for o, (buf, feed) in ex.row_writes.items():
            writes.append((o, buf, int(feeds[feed][0])))   # in place; rows past the end dropped
        names = list(dict.fromkeys([*fetch, *ex.writebacks]))
        outs = await b.rt.run(session, ins, names, reads, writes, b.store)
        res = {k: await b.rt.to_host(outs[k], self.g[self.g.outputs[k]].dtype) for k in fetch}
        for o, buf in ex.writebacks.items():  # after every read: a step sees old values
            b.replace(buf, outs[o])
        for o, buf, _ in writes:
            b.replace(buf, outs.get(o, b.store[buf]))
        return res


class _PythonRuntime:
    """onnxruntime (PyPI) in CPython: numpy arrays in, numpy arrays out."""

    def __init__(self, threads: int):
        self.threads = threads
        try:
            import numpy as np
            import onnxruntime as ort
        except ImportError:
            raise ImportError("backend='wasm' in CPython runs the ONNX model in onnxruntime: "
                              "pip install onnxruntime (in the browser it is onnxruntime-web)") from None
        self.np, self.ort = np, ort
        self.engine = f"onnxruntime {ort.__version__} (CPU)"

    def session(self, model: bytes, externals: dict):
        """externals: {location: numpy array}, the bytes of the model's external initializers
        (copied by onnxruntime; the arrays are kept with the session all the same)."""
        opts = self.ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.log_severity_level = 3  # unused inputs (a program's declared feeds) are not news
        if externals:
            arrays = [self.np.ascontiguousarray(v) for v in externals.values()]
            opts.add_external_initializers_from_files_in_memory(
                list(externals), arrays, [a.nbytes for a in arrays])
        sess = self.ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        sess.webgrad_externals = externals
        return sess

    def from_host(self, h: HostArray):
        from ..arrays import to_numpy
        return to_numpy(self.np, h)

    async def to_host(self, x, dtype: str) -> HostArray:
        x = self.np.asarray(x, dtype=self.np.float32 if dtype == "f32" else self.np.int32, order="C")
        out = HostArray(dtype, shape=x.shape)
        out.frombytes(x.tobytes())
        return out

    def host_words(self, x) -> bytes:
        return self.np.ascontiguousarray(x, dtype="<i4").tobytes()

    async def run(self, session, ins: dict, names: list[str], reads=(), writes=(),
                  store=None) -> dict:
        """The outputs `names`; reads: (input, buffer, p), the first p rows of store[buffer]
        fed as input; writes: (output, buffer, at), the output's rows written into the
        buffer from row `at` on (those past its end dropped), the buffer in the result."""
        ins = dict(ins)
        for k, buf, p in reads:
            ins[k] = store[buf][:p]
        names_all = [*names, *(o for o, _, _ in writes)]
        out = dict(zip(names_all, session.run(names_all, ins)))
        for o, buf, at in writes:
            x = store[buf]
            if not (x.flags.writeable and x.flags.owndata):
                x = x.copy()   # a view of a caller's array (a write's HostArray): ours from now on
            k = max(0, min(len(out[o]), len(x) - at))
            x[at:at + k] = self.np.asarray(out[o])[:k]
            out[o] = x
        return out

    def release(self, session):
        pass  # dropped with its last reference


class _BrowserRuntime:
    """onnxruntime-web in the Pyodide worker, through worker/ort.mjs: ort.Tensors in, ort.Tensors
    out; only what a step returns is copied to Python."""

    def __init__(self):
        from .webgpu_browser import block
        if _ort is None:
            from pyodide.ffi import can_run_sync
            if (missing := _no_ort()) is not None:
                raise missing
            if not can_run_sync():
                raise RuntimeError(
                    "backend='wasm' has to load onnxruntime-web first, and this Python stack "
                    "cannot wait for it (no JSPI here): `await webgrad.backends.prepare_async()` "
                    "once before compiling")
            block(load_async(), "backend='wasm' (loading onnxruntime-web)")
        self.js = _ort
        self.engine = str(self.js.engine())

    def session(self, model: bytes, externals: dict):
        return _Session(self.js, model, externals)

    def from_host(self, h: HostArray):
        from pyodide.ffi import to_js
        return self.js.tensor(h.dtype, to_js(bytes(memoryview(h).cast("B"))), to_js(list(h.shape)))

    async def to_host(self, t, dtype: str) -> HostArray:
        out = HostArray(dtype, shape=tuple(t.dims.to_py()))
        out.frombytes(t.data.to_bytes())
        return out

    def host_words(self, t) -> bytes:
        return t.data.to_bytes()

    async def run(self, session, ins: dict, names: list[str], reads=(), writes=(),
                  store=None) -> dict:
        """As _PythonRuntime.run; the caches' rows are fed and written in JS, in the call
        that runs the model (their rows never pass through Python)."""
        return await session.run(ins, names, reads, writes, store)

    def release(self, session):
        if session.id is not None:
            self.js.release(session.id)
            session.id = None


class _Session:
    """A model's session in worker/ort.mjs, created on its first run. Names cross to JS once
    (cached per list of names); values cross as one array each way, and a decode step's
    caches as one array kept while the store holds the same tensors. externals: {location:
    ort.Tensor} of the model's external initializers, whose bytes JS hands to onnxruntime-web
    as they are (they do not pass through Python)."""

    def __init__(self, ort, model: bytes, externals: dict):
        self.ort, self.model, self.id = ort, model, None
        self.externals = externals
        self._names: dict[tuple, object] = {}
        self._caches: tuple = ((), None)   # (the store's tensors, the JS array of them)

    def _js_names(self, names) -> object:
        key = tuple(names)
        if key not in self._names:
            from pyodide.ffi import to_js
            self._names[key] = to_js(list(key))
        return self._names[key]

    def _js_caches(self, tensors: list) -> object:
        held, arr = self._caches
        if len(held) != len(tensors) or any(a is not b for a, b in zip(held, tensors)):
            from pyodide.ffi import to_js
            arr = to_js(tensors)
            self._caches = (tuple(tensors), arr)
        return arr

    async def run(self, ins: dict, names: list[str], reads=(), writes=(), store=None) -> dict:
        from pyodide.ffi import to_js
        if self.id is None:
            self.id = await self.ort.create(to_js(self.model), to_js(list(self.externals)),
                                            to_js(list(self.externals.values())))
            self.model = self.externals = None   # onnxruntime-web holds its own copies
        if not reads and not writes:
            res = await self.ort.run(self.id, self._js_names(ins), to_js(list(ins.values())),
                                     self._js_names(names))
            return dict(zip(names, res.to_py(depth=1)))
        bufs = list(dict.fromkeys([b for _, b, _ in reads] + [b for _, b, _ in writes]))
        slot = {b: i for i, b in enumerate(bufs)}
        res = await self.ort.runRows(
            self.id, self._js_names(ins), to_js(list(ins.values())), self._js_names(names),
            self._js_caches([store[b] for b in bufs]),
            self._js_names([k for k, _, _ in reads]), self._js_names([o for o, _, _ in writes]),
            to_js([slot[b] for _, b, _ in reads] + [slot[b] for _, b, _ in writes]),
            to_js([p for _, _, p in reads] + [a for _, _, a in writes]))
        return dict(zip(names, res.to_py(depth=1)))
