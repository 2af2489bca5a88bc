// ONNX Runtime Web in the Pyodide worker: the engine of webgrad's CPU backend "wasm"
// (pkg/webgrad/backends/onnx_runtime.py, whose _BrowserRuntime is the only caller).
//
// Python exports a program to ONNX (webgrad/onnx) and hands the model's bytes to create(),
// with the store's tensors of the parameters the program only reads (the model's external
// initializers: copied into onnxruntime's heap once, here, not on every run); each step it
// passes the feeds and the other persistent buffers as tensors made by tensor() and gets
// the requested outputs back as ort.Tensors (.data, .dims), which it keeps as the store's
// buffers: parameters stay in JS between steps, only what a step returns is copied to
// Python. The WebAssembly files come from /assets/ort/ (serve.py provisions the npm
// package); threads are used where the page is cross-origin isolated.
//
//   await load()                      import the runtime (once); its description
//   engine()                          "onnxruntime-web 1.30.0 (WebAssembly, SIMD, 4 threads)"
//   tensor(dtype, bytes, dims)        a tensor of "f32"/"i32" values from their raw bytes
//   await create(modelBytes, paths, tensors)   a session id; tensors[i]: the bytes of the
//                                     model's external data location paths[i]
//   await run(id, inNames, inValues, outNames)   [ort.Tensor] of the outputs outNames
//   await runRows(id, inNames, inValues, outNames, caches, readNames, writeNames, slots, at)
//                                     run() for a decode step whose KV caches go by rows:
//                                     input readNames[i] is the first at[i] rows of
//                                     caches[slots[i]] (a view: no copy); output writeNames[j]
//                                     is written into caches[slots[r + j]] from row
//                                     at[r + j] on, in place (r = readNames.length; rows past
//                                     a cache's end are dropped); returns outNames' tensors
//   release(id)                       drop a session

const here = (path) => new URL(path, import.meta.url).href;
let ort = null;
let loading = null;
const sessions = new Map();
let nextId = 1;

export async function load() {
  if (!loading) {
    loading = import(here("../assets/ort/ort.wasm.min.mjs")).then((m) => {
      ort = m.default ?? m;
      ort.env.wasm.wasmPaths = here("../assets/ort/");
      ort.env.wasm.proxy = false;  // already off the main thread
      // threads: as many as webgrad.backends.onnx_runtime.set_threads(n) asked before this
      // first load (globalThis.webgradOrtThreads), else half the cores, at most 4; without
      // cross-origin isolation (no SharedArrayBuffer) always one
      const asked = Math.floor(Number(self.webgradOrtThreads) || 0);
      ort.env.wasm.numThreads = !self.crossOriginIsolated ? 1 : asked > 0 ? asked :
        Math.max(1, Math.min(4, (self.navigator.hardwareConcurrency || 2) >> 1));
      ort.env.logLevel = "error";
      return engine();
    });
  }
  return loading;
}

export function available() {
  return ort !== null;
}

export function engine() {
  if (!ort) return "onnxruntime-web (not loaded)";
  return `onnxruntime-web ${ort.env.versions?.web ?? "?"} (WebAssembly, SIMD, ` +
    `${ort.env.wasm.numThreads} thread${ort.env.wasm.numThreads === 1 ? "" : "s"})`;
}

export function tensor(dtype, bytes, dims) {
  const buf = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
  const data = dtype === "f32" ? new Float32Array(buf) : new Int32Array(buf);
  return new ort.Tensor(dtype === "f32" ? "float32" : "int32", data, Array.from(dims));
}

export async function create(model, paths = [], tensors = []) {
  await load();
  const externalData = paths.map((path, i) => {
    const d = tensors[i].data;
    return { path, data: new Uint8Array(d.buffer, d.byteOffset, d.byteLength) };
  });
  const session = await ort.InferenceSession.create(model, {
    executionProviders: ["wasm"], graphOptimizationLevel: "all", logSeverityLevel: 3,
    externalData,
  });
  const id = nextId++;
  sessions.set(id, session);
  return id;
}

export async function run(id, inNames, inValues, outNames) {
  // arrays, not objects: one crossing from Python per argument, whatever the model's size
  const session = sessions.get(id);
  const feeds = {};
  for (let i = 0; i < inNames.length; i++) feeds[inNames[i]] = inValues[i];
  const res = await session.run(feeds, outNames);
  return outNames.map((n) => res[n]);
}

export function release(id) {
  const s = sessions.get(id);
  sessions.delete(id);
  if (s) s.release();
}

export async function runRows(id, inNames, inValues, outNames, caches, readNames, writeNames,
                              slots, at) {
  // one crossing from Python a step: the caches' rows are fed and written here
  const session = sessions.get(id);
  const feeds = {};
  for (let i = 0; i < inNames.length; i++) feeds[inNames[i]] = inValues[i];
  const r = readNames.length;
  for (let i = 0; i < r; i++) feeds[readNames[i]] = head(caches[slots[i]], at[i]);
  const res = await session.run(feeds, [...outNames, ...writeNames]);
  for (let j = 0; j < writeNames.length; j++)
    writeRows(caches[slots[r + j]], res[writeNames[j]], at[r + j]);
  return outNames.map((n) => res[n]);
}

function width(t) {
  return t.dims.slice(1).reduce((a, b) => a * b, 1);
}

function head(t, rows) {   // a tensor of t's first rows (a view: no copy)
  return new ort.Tensor(t.type, t.data.subarray(0, rows * width(t)), [rows, ...t.dims.slice(1)]);
}

function writeRows(t, rows, at) {   // t's rows at.. replaced by those of rows, in place
  const w = width(t);
  const room = Math.max(0, t.data.length - at * w);
  const src = rows.data.length > room ? rows.data.subarray(0, room) : rows.data;
  t.data.set(src, at * w);
}
