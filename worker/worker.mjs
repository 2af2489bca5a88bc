// webgrad's Pyodide worker: runs Python (and through it WebGPU) off the page's main thread.
//
// Start it as a *module* worker:  new Worker("/worker/worker.mjs", {type: "module"}).
// It boots Pyodide from /assets/pyodide/, installs the micropip and webgrad wheels named in
// /assets/manifest.json, and installs webgrad_worker.py (the Python half of this file).
//
// Message protocol (all values are plain structured-cloneable data):
//   requests from the page, answered one at a time in arrival order (except ping):
//     {id, type: "run", code}        run Python source in __main__ (top-level await allowed);
//                                    the value is that of the source's last expression
//     {id, type: "call", name, args} call the global Python function `name` with args (an array);
//                                    a coroutine result is awaited
//     {id, type: "ping"}             answered at once with value "pong", even during boot
//     {type: "interrupt", upTo}      answered by nothing; the running request gets a
//                                    KeyboardInterrupt where it awaits (asyncio.sleep, a GPU
//                                    read-back, time.sleep) -- the interrupt buffer (below)
//                                    reaches code that computes. The page sends both. Queued
//                                    requests with id <= upTo are answered with a
//                                    KeyboardInterrupt error when their turn comes, not run.
//     {type: "init", interruptBuffer, interruptedUpTo, lifeLock}  optional, first.
//                                    interruptBuffer: a Uint8Array on a SharedArrayBuffer; the
//                                    page writes 2 into it to raise KeyboardInterrupt in the
//                                    running code (needs a cross-origin isolated page);
//                                    interruptedUpTo: an Int32Array on one, where the page
//                                    writes `upTo` first. lifeLock: a Web Lock name the worker holds
//                                    while it lives, answered by {type: "alive", lifeLock}; the
//                                    page waits on the same lock to learn of a silent death
//   replies:
//     {id, ok: true, value}
//     {id, ok: false, error: {type, message, traceback}}
//   events the worker sends on its own:
//     {type: "stdout" | "stderr", text}            Python output as written: one write, or
//                                                  many merged during a flood (see OUTPUT_MS);
//                                                  a request's output always ends with a
//                                                  newline (added if the code left a partial
//                                                  line)
//     {type: "progress", ...}                      from webgrad_worker.progress(dict) in Python
//     {type: "tracing"}                            webgrad_worker: compile_module or
//                                                  compile_forward started tracing
//     {type: "compile", kernels, pipelines}        while a request compiles: distinct kernels
//                                                  (WGSL texts) it has generated so far, and
//                                                  how many of their pipelines are made
//     {type: "boot", phase, text}                 while booting, as each phase begins (phase:
//                                                  "python", "install", "import"; text: what
//                                                  it is doing, in words)
//     {type: "weights", used}                      a run's new model started from the
//                                                  weights loaded on the page (webgrad_worker)
//     {type: "ready", python_version, webgrad_version, jspi, boot}   booted; requests now run
//                                                  (boot: ms at the end of each boot phase;
//                                                  from_snapshot: a cached snapshot was used)
//     {type: "warm", boot}                         the warm-up after ready is done (the
//                                                  compiler imported, the GPU device there):
//                                                  boot as in ready, with its phases added
//     {type: "snapshot", state, at, ...}            the snapshot for the next boots (below), made
//                                                  after a boot that found none, while the
//                                                  worker is idle; state: "making" (the maker
//                                                  started), "stopped" (a request came: it was
//                                                  terminated, and starts again at the next idle
//                                                  time), "stored" (with bytes and ms: the
//                                                  maker's phases, snapshot.mjs), "skipped"
//                                                  (with reason; busy: another page is making
//                                                  one, so it tries again when idle), "failed"
//                                                  (with error; not tried again); at: ms
//                                                  since the worker started
//     {type: "fatal", error: {type, message, traceback}}       boot failed or Pyodide died;
//                                                  every later request is answered with an error
// Values: None/bool/int/float/str/list/tuple/dict(str keys) become JS values, bytes/bytearray a
// Uint8Array, a memoryview the TypedArray of its format; anything else arrives as its repr string.
//
// Python runs inside runPythonAsync, so JSPI is on: pyodide.ffi.can_run_sync() is true and
// pyodide.ffi.run_sync(promise) can wait for WebGPU promises from synchronous Python code.

const here = (path) => new URL(path, import.meta.url).href;
const post = (message) => self.postMessage(message);
// The IndexedDB model cache (web/modelcache.mjs, served at /), for webgrad.io.modelcache in
// Python: `await js.webgradModelCache()` imports it on first use.
self.webgradModelCache = () => import(here("../modelcache.mjs"));
// ONNX Runtime Web (worker/ort.mjs), the CPU backend's engine, imported on first use
self.webgradOrt = () => import(here("./ort.mjs"));

function errorOf(e) {
  if (e && typeof e === "object" && "message" in e) {
    const type = e.type || e.name || "Error";  // PythonError carries the exception name in .type
    return { type, message: String(e.message), traceback: String(e.stack || e.message || "") };
  }
  return { type: "Error", message: String(e), traceback: "" };
}

async function fetchOk(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}; is serve.py serving?`);
  return response;
}

let pyodide = null;
let interruptBuffer = null;
// The last request id the page interrupted (webgrad.mjs): shared memory where the page is
// cross-origin isolated, and the interrupt messages' `upTo` (for pages that are not).
let interruptedUpTo = null;
let interruptedUpToSent = 0;

function interruptedBeforeStart(id) {
  const shared = interruptedUpTo ? Atomics.load(interruptedUpTo, 0) : 0;
  return id <= Math.max(shared, interruptedUpToSent);
}
let fatal = null;  // set once boot fails or Pyodide dies; later requests get it as their error
let running = null;  // id of the request being handled, or null
let worker_py = null;  // the webgrad_worker module (a PyProxy), once booted
let extraWheels = {};  // module -> wheel URL: stdlib parts Pyodide's core leaves out
const loadedExtras = new Set();

// Installs the extra wheels that a run's source imports (e.g. pydoc_data), once each.
async function loadExtras(code) {
  for (const [module, url] of Object.entries(extraWheels)) {
    if (!loadedExtras.has(module) && new RegExp(`\\b(import|from)\\s+${module}\\b`).test(code)) {
      await pyodide.loadPackage(url, { messageCallback: () => {} });
      loadedExtras.add(module);
    }
  }
}

// --- Output: Python's writes are decoded and posted as they come while they are few; a flood
// (more than OUTPUT_BURST writes within OUTPUT_MS) is merged into one message per OUTPUT_MS or
// OUTPUT_BYTES. 100k lines as 100k messages, each one a DOM update in the page, took minutes.
// Posting happens inside the write itself, because while Python computes no timer of this
// worker can fire: a single print before a long computation is posted at once; the tail of a
// flood followed by computation waits for the next write, a pause, or the end of the request.
const OUTPUT_MS = 40;
const OUTPUT_BURST = 64;
const OUTPUT_BYTES = 1 << 16;
const output = { chunks: [], bytes: 0, windowStart: 0, writes: 0, timer: null,
                 ended: { stdout: true, stderr: true } };  // ended: last text posted ends a line

function flushOutput(endOfRequest = false) {
  if (output.timer !== null) { clearTimeout(output.timer); output.timer = null; }
  for (const [type, text] of output.chunks) {
    post({ type, text });
    output.ended[type] = text.endsWith("\n");
  }
  output.chunks = [];
  output.bytes = 0;
  if (endOfRequest) {  // a partial last line must not be glued to the next request's output
    for (const type of ["stdout", "stderr"]) {
      if (!output.ended[type]) { post({ type, text: "\n" }); output.ended[type] = true; }
    }
  }
}

function writer(type) {
  const decoder = new TextDecoder();
  return {
    isatty: false,
    write(buffer) {
      const text = decoder.decode(buffer, { stream: true });
      if (!text) return buffer.length;
      const lastChunk = output.chunks[output.chunks.length - 1];
      if (lastChunk && lastChunk[0] === type) lastChunk[1] += text;
      else output.chunks.push([type, text]);
      output.bytes += text.length;
      const now = performance.now();
      if (now - output.windowStart >= OUTPUT_MS) { output.windowStart = now; output.writes = 0; }
      if (++output.writes <= OUTPUT_BURST || output.bytes >= OUTPUT_BYTES) {
        flushOutput();
      } else if (output.timer === null) {
        output.timer = setTimeout(() => { output.timer = null; flushOutput(); }, OUTPUT_MS);
      }
      return buffer.length;
    },
  };
}
self.webgradFlushOutput = () => flushOutput();  // Python's progress() keeps output in order

// --- Boot. Most of a cold start is Pyodide initializing Python (tens of seconds on a loaded
// 2-core machine); loading a memory snapshot of an initialized Python costs a fraction of that.
// So the origin keeps one in Cache Storage, under a key that changes with Pyodide's version
// and the wheels' bytes (manifest.boot_key); boots (a reload, the next visit) start from it.
// A boot that finds none initializes Python itself and goes ready; the snapshot is made after
// it, off the first visit's critical path, by a worker of its own (snapshot.mjs, started
// below once this worker is idle). The snapshot may hold no reference to a JS object
// (loadPackage makes one, so the wheels are unpacked by unpackArchive instead): it is made
// after Pyodide's own initialization, the wheels' unpacking and the import of the modules a
// first run needs (SNAPSHOT_IMPORTS). The files do not live in it (the file system is on the
// JS side), so every boot unpacks the wheels again.
const SNAPSHOT_CACHE = "webgrad-pyodide-snapshot";
// Imported before the snapshot is taken (webgrad's compiler and WebGPU backend, and the
// standard modules webgrad_worker.py and the examples import; none of them touches a JS
// object on import). Only wheel code: webgrad_worker.py itself can change without the
// boot_key changing. SNAPSHOT_CONTENT names this list in the snapshot's key: change it with
// the list.
const SNAPSHOT_IMPORTS = `
import array, asyncio, inspect, json, linecache, math, random, re, signal, traceback
import importlib.metadata
import webgrad, webgrad.compile, webgrad.playground, webgrad.init
import webgrad.backends.hosts, webgrad.backends.webgpu, webgrad.backends.webgpu_browser
import webgrad.codegen.initparams
`;
const SNAPSHOT_CONTENT = "webgrad-imported-1";
const bootTimes = {};  // phase -> ms since the worker started (bench/cold_start.py)
const mark = (phase) => { bootTimes[phase] = Math.round(performance.now()); };
const booting = (phase, text) => post({ type: "boot", phase, text });

async function snapshotCache() {
  try { return await caches.open(SNAPSHOT_CACHE); } catch { return null; }  // no Cache Storage
}

async function loadSnapshot(key) {
  const cache = await snapshotCache();
  const hit = cache && await cache.match(key).catch(() => undefined);
  return hit ? new Uint8Array(await hit.arrayBuffer()) : null;
}

// --- The snapshot, made while the worker is idle. After a boot that found no snapshot, once
// the warm-up is done and no request has been running or queued for SNAPSHOT_IDLE_MS, a
// nested worker (snapshot.mjs) boots a second Pyodide, makes the snapshot and stores it under
// this boot's key; the next boot on the origin loads it, as if this boot had made it. Making
// one costs about a Python initialization of CPU (3-4 s on a quiet 2-core machine), so it
// never runs beside a request: a request that arrives terminates the maker at once, and the
// next idle time starts it again. One maker at a time per origin (a Web Lock in snapshot.mjs);
// none where the key is stored already, where Cache Storage or nested workers are missing,
// or after one failed.
const SNAPSHOT_IDLE_MS = 2000;
const snapshotJob = {
  wanted: false,      // this boot found no snapshot, and has what the maker needs
  key: null, wheels: null, indexURL: null,
  timer: null,        // the idle countdown
  maker: null,        // the running maker (a Worker), or null
};
let warmDone = false;  // the warm-up after ready has finished (or failed)
let requestsInFlight = 0;  // requests received and not yet answered

const postSnapshot = (state, extra = {}) =>
  post({ type: "snapshot", state, at: Math.round(performance.now()), ...extra });

function scheduleSnapshot() {
  if (!snapshotJob.wanted || snapshotJob.maker || !warmDone || requestsInFlight > 0) return;
  clearTimeout(snapshotJob.timer);
  snapshotJob.timer = setTimeout(() => {
    snapshotJob.timer = null;
    startSnapshotMaker().catch((e) => {  // e.g. no nested workers
      Object.assign(snapshotJob, { wanted: false, wheels: null });
      postSnapshot("failed", { error: String(e?.message ?? e) });
    });
  }, SNAPSHOT_IDLE_MS);
}

function stopSnapshotMaker() {
  clearTimeout(snapshotJob.timer);
  snapshotJob.timer = null;
  if (!snapshotJob.maker) return;
  snapshotJob.maker.terminate();  // the Web Lock it held goes with it
  snapshotJob.maker = null;
  postSnapshot("stopped");
}

async function startSnapshotMaker() {
  const cache = await snapshotCache();
  const stored = cache && await cache.match(snapshotJob.key).catch(() => undefined);
  if (!cache || stored) {  // no Cache Storage, or another page stored it meanwhile
    Object.assign(snapshotJob, { wanted: false, wheels: null });
    postSnapshot("skipped", { reason: cache ? "a snapshot is stored already" : "no Cache Storage" });
    return;
  }
  if (requestsInFlight > 0 || snapshotJob.maker || !snapshotJob.wanted) return;  // came meanwhile
  const maker = new Worker(here("./snapshot.mjs"), { type: "module", name: "webgrad-snapshot" });
  snapshotJob.maker = maker;
  const finish = (answer) => {
    if (snapshotJob.maker !== maker) return;  // stopped already
    maker.terminate();
    snapshotJob.maker = null;
    const { type, ...rest } = answer;
    // skipped because another page is making one: look again at the next idle time
    snapshotJob.wanted = type === "skipped" && rest.busy === true;
    if (!snapshotJob.wanted) snapshotJob.wheels = null;
    postSnapshot(type, rest);
    scheduleSnapshot();
  };
  maker.addEventListener("message", ({ data }) => finish(data));
  maker.addEventListener("error", (event) => {
    event.preventDefault();
    finish({ type: "failed", error: event.message || "the snapshot worker failed to load" });
  });
  maker.postMessage({ indexURL: snapshotJob.indexURL, wheels: snapshotJob.wheels,
                      imports: SNAPSHOT_IMPORTS, cache: SNAPSHOT_CACHE, key: snapshotJob.key,
                      lock: SNAPSHOT_CACHE });
  postSnapshot("making");
}

// --- The GPU side of a cold start. The worker's WebGPU device is requested the moment the
// worker starts (replay.mjs's sharedDevice, which webgpu_browser.request_device() later
// returns), and the pipelines the last session on this origin compiled are compiled again
// right away (Replay.prewarm), in the GPU process, while Pyodide boots: creating pipelines is
// most of a first compile (seconds on a CPU rasterizer), and a plan loaded later with the same
// WGSL finds them made. The WGSL texts are kept in Cache Storage under the manifest's
// boot_key (a new webgrad drops them) with the adapter they were made for; a different
// adapter's texts are not prewarmed. Stored: this session's texts in order of first use,
// then older ones, at most PIPELINE_CACHE_BYTES in all.
const PIPELINE_CACHE = "webgrad-pipelines";
const PIPELINE_CACHE_BYTES = 4 << 20;
const gpuModule = import(here("./replay.mjs"));
const gpuDevice = gpuModule.then((m) => m.sharedDevice());
gpuDevice.then(() => mark("device_js"), () => {});  // no WebGPU: Python says so when asked
let pipelineKey = null;  // the Cache Storage key of this boot_key's texts
let pipelinesStored = [null, 0];  // [Replay, how many of its used texts are stored]

async function cachedPipelines(key) {
  try {
    const hit = await (await caches.open(PIPELINE_CACHE)).match(key);
    return hit ? await hit.json() : null;
  } catch { return null; }  // no Cache Storage, or a damaged entry: prewarm nothing
}

// --- Compile progress: every pipeline a request asks for (lowering hands each new kernel over
// as it is emitted, BrowserHost.prefetch; load() asks for all of the plan's) is counted once
// per request, and counted as made when it is (one prewarmed or made by an earlier request at
// once). Posted as {type: "compile"} at most every COMPILE_MS, and always when all are made.
// A pipeline finishes only when Python waits (load() waits for the plan's), so "made" rises
// after the kernels are generated.
const COMPILE_MS = 50;
const compiling = { entries: new Set(), made: 0, posted: 0 };

function onPipeline(entry) {
  if (running === null || compiling.entries.has(entry)) return;
  const entries = compiling.entries;
  entries.add(entry);
  if (entry.pipeline) compiling.made++;
  else entry.check.then(() => { if (compiling.entries === entries) { compiling.made++; postCompile(); } });
  postCompile();
}

function postCompile() {
  const now = performance.now();
  const all = compiling.made === compiling.entries.size;
  if (!all && now - compiling.posted < COMPILE_MS) return;
  compiling.posted = now;
  post({ type: "compile", kernels: compiling.entries.size, pipelines: compiling.made });
}

async function prewarm(key) {
  const [replay, cached] = await Promise.all([gpuDevice.catch(() => null), cachedPipelines(key)]);
  if (replay) replay.onUsed = storePipelines;
  if (replay) replay.onPipeline = onPipeline;
  if (replay && cached && cached.adapter === replay.info && Array.isArray(cached.wgsl)) {
    bootTimes.prewarmed = replay.prewarm(cached.wgsl);
    mark("prewarm");
  }
}

// Stores the texts of the pipelines used so far if there are new ones: as soon as a plan
// used new ones (Replay.onUsed; the tab may be closed any time after), and after each
// request. A device renewed after a loss keeps both listeners (replay.mjs). One store at a time.
let storing = Promise.resolve();
function storePipelines() {
  storing = storing.then(storePipelinesNow)
    .catch((e) => console.warn("webgrad worker: pipelines not stored", e));
  return storing;
}

async function storePipelinesNow() {
  const replay = pipelineKey && (await gpuModule.catch(() => null))?.currentDevice();
  if (!replay || (pipelinesStored[0] === replay && pipelinesStored[1] === replay.used.length)) return;
  pipelinesStored = [replay, replay.used.length];
  const cache = await caches.open(PIPELINE_CACHE);
  const old = await cachedPipelines(pipelineKey);
  const texts = [...replay.used];
  if (old && old.adapter === replay.info && Array.isArray(old.wgsl)) {
    texts.push(...old.wgsl.filter((w) => !replay.usedSet.has(w)));
  }
  let bytes = 0;
  const kept = texts.filter((w) => (bytes += w.length) <= PIPELINE_CACHE_BYTES);
  for (const other of await cache.keys()) {  // one boot_key's texts per origin
    if (other.url !== pipelineKey) await cache.delete(other);
  }
  await cache.put(pipelineKey, new Response(JSON.stringify({ adapter: replay.info, wgsl: kept }),
                                            { headers: { "Content-Type": "application/json" } }));
}

async function boot() {
  // Everything that does not need Python is fetched while Pyodide boots: the manifest, then
  // the wheels and this worker's Python half. The wheels are unpacked by loadPackage directly
  // (no micropip import: it costs a few hundred ms and nothing here needs it; micropip's wheel
  // is still installed, for code that wants it).
  mark("start");
  const manifestReady = fetchOk(here("../assets/manifest.json")).then((r) => r.json());
  const helperReady = fetchOk(here("./webgrad_worker.py")).then((r) => r.text());
  const pyodideModule = import(here("../assets/pyodide/pyodide.mjs"));
  pyodideModule.catch(() => {});  // reported through the manifest's failure if both fail
  const manifest = await manifestReady;
  // "webgpu": backend='auto' keeps a software fallback adapter (SwiftShader) instead of the
  // CPU backend (pkg/webgrad/backends/__init__.py); webgrad.browser's test sessions serve it
  if (manifest.auto) self.webgradAuto = manifest.auto;
  for (const [module, file] of Object.entries(manifest.extra_wheels || {})) {
    extraWheels[module] = here(`../assets/wheels/${file}`);
  }
  const wheels = [manifest.micropip_wheel, manifest.webgrad_wheel].map(
    (file) => here(`../assets/wheels/${file}`));
  // fetched while Pyodide boots, unpacked into site-packages once it is up
  const wheelBytes = wheels.map((url) => fetchOk(url).then((r) => r.arrayBuffer()));
  for (const w of wheelBytes) w.catch(() => {});
  if (manifest.boot_key) {
    pipelineKey = here(`../assets/pipelines/${manifest.boot_key}.json`);
    prewarm(pipelineKey).catch((e) => console.warn("webgrad worker: no pipelines prewarmed", e));
  }
  const snapshotKey = here(`../assets/snapshot/${manifest.boot_key || "none"}-${SNAPSHOT_CONTENT}.bin`);
  const snapshot = manifest.boot_key ? await loadSnapshot(snapshotKey).catch(() => null) : null;
  const { loadPyodide } = await pyodideModule;
  const indexURL = here("../assets/pyodide/");
  booting("python", snapshot ? "Starting Python (Pyodide, from this browser's snapshot)…"
    : "Starting Python (Pyodide)…");
  if (snapshot) {
    try {
      pyodide = await loadPyodide({ indexURL, _loadSnapshot: snapshot });
      bootTimes.from_snapshot = true;
    } catch (e) {  // a snapshot this Pyodide cannot take: forget it, boot as usual
      console.warn("webgrad worker: the Pyodide snapshot did not load; booting without it", e);
      (await snapshotCache())?.delete(snapshotKey);
      pyodide = null;
    }
  }
  if (!pyodide) pyodide = await loadPyodide({ indexURL });
  mark("pyodide");
  const sitePackages = pyodide.runPython("import sysconfig; sysconfig.get_path('purelib')");
  const wheelData = await Promise.all(wheelBytes);
  const kB = Math.round(wheelData.reduce((n, b) => n + b.byteLength, 0) / 1024);
  booting("install", `Installing webgrad (${kB} kB)…`);
  // pure-Python wheels: unpacking is all an install is (loadPackage's bookkeeping took
  // seconds on a loaded machine, and makes the snapshot impossible, see above)
  for (const bytes of wheelData) pyodide.unpackArchive(bytes, "wheel", { extractDir: sitePackages });
  mark("wheels");
  if (!bootTimes.from_snapshot && manifest.boot_key) {  // made once this worker is idle
    Object.assign(snapshotJob, { wanted: true, key: snapshotKey, wheels: wheelData, indexURL });
  }
  pyodide.setStdout(writer("stdout"));
  pyodide.setStderr(writer("stderr"));
  pyodide.FS.writeFile(`${sitePackages}/webgrad_worker.py`, await helperReady);
  mark("helper");

  if (!bootTimes.from_snapshot) booting("import", "Importing webgrad…");  // (a snapshot has it)
  // webgrad's version from the module the snapshot imported, else from the METADATA of the
  // wheel just unpacked: importlib.metadata's search of the path took 1.2 s on the first
  // Python run after a snapshot load, and 0.4-4.7 s on a first visit (loaded machine)
  const info = await pyodide.runPythonAsync(`
import os, sys, pyodide.ffi
def _version():
    if "webgrad" in sys.modules:
        return sys.modules["webgrad"].__version__
    site = ${JSON.stringify(sitePackages)}
    for name in os.listdir(site):
        if name.startswith("webgrad-") and name.endswith(".dist-info"):
            with open(os.path.join(site, name, "METADATA"), encoding="utf-8") as f:
                for line in f:
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
    import importlib.metadata
    return importlib.metadata.version("webgrad")
[sys.version.split()[0], _version(), pyodide.ffi.can_run_sync()]
`);
  const [python_version, webgrad_version, jspi] = info.toJs();
  info.destroy();
  mark("info");
  worker_py = pyodide.pyimport("webgrad_worker");
  worker_py.setup(interruptBuffer ? () => { interruptBuffer[0] = 2; } : null);
  // only now: an interrupt while the worker boots is meant for a call queued behind the boot
  // (answered as interrupted, interruptedBeforeStart), not for the boot's own Python
  if (interruptBuffer) pyodide.setInterruptBuffer(interruptBuffer);
  mark("ready");
  post({ type: "ready", python_version, webgrad_version, jspi, boot: bootTimes });
  // Then, before any request (they queue behind it): import the compiler and ask for the GPU
  // device, the first compile's fixed costs, while the person reads the page.
  queue = queue.then(async () => {
    if (interruptBuffer) interruptBuffer[0] = 0;  // an interrupt before now was for a queued call
    const marks = await pyodide.runPythonAsync("import webgrad_worker\nawait webgrad_worker.warm_up()");
    Object.assign(bootTimes, marks.toJs({ dict_converter: Object.fromEntries }));
    marks.destroy();
  }).catch((e) => console.warn("webgrad worker: warm-up failed", e)).then(() => {
    mark("warm");
    post({ type: "warm", boot: bootTimes });
    warmDone = true;
    scheduleSnapshot();
  });
}

const booted = boot().catch((e) => {
  fatal = errorOf(e);
  post({ type: "fatal", error: fatal });
});

async function handle(request) {
  await booted;
  if (fatal) return { id: request.id, ok: false, error: fatal };
  if (interruptBuffer) interruptBuffer[0] = 0;  // forget an interrupt meant for an earlier request
  // ... unless it was meant for this one, which has not started: it is answered, not run
  // (read after the reset: an interrupt that comes later sets the flag again, which the code
  // then sees as it starts)
  if (interruptedBeforeStart(request.id)) {
    return { id: request.id, ok: false, error: {
      type: "KeyboardInterrupt", traceback: "",
      message: "interrupted before it started (it was queued behind the worker's boot or an earlier call)" } };
  }
  // runPythonAsync (not a direct PyProxy call) so that the code runs with JSPI available.
  const ns = pyodide.toPy({});
  ns.set("request", request);
  running = request.id;
  compiling.entries = new Set();
  compiling.made = 0;
  try {
    if (request.type === "run") {
      // a wheel that fails to load leaves the import to fail in Python, with Python's message
      await loadExtras(String(request.code)).catch((e) => console.warn("webgrad worker:", e));
    }
    return await pyodide.runPythonAsync(
      "import webgrad_worker\nawait webgrad_worker.handle(request)", { globals: ns });
  } catch (e) {
    // webgrad_worker.handle catches the user's errors: anything else is a bug in it, or (not a
    // PythonError) Pyodide itself failing, after which nothing more can run.
    const error = errorOf(e);
    if (!(e instanceof pyodide.ffi.PythonError)) {
      fatal = error;
      post({ type: "fatal", error });
    }
    return { id: request.id, ok: false, error };
  } finally {
    running = null;
    if (interruptBuffer) interruptBuffer[0] = 0;  // an interrupt that found nothing to stop
    ns.destroy();
    flushOutput(true);
    storePipelines();
  }
}

// How long an interrupt may wait for the interrupt buffer to stop the code before the tasks it
// awaits are cancelled: code that computes sees the buffer within microseconds, and code that
// blocks on a GPU step sees it when the step returns; only long waits need cancelling.
const CANCEL_AFTER_MS = 150;

function interruptAwaits() {
  const id = running;
  if (id === null || fatal) return;
  setTimeout(() => {
    if (running !== id || !worker_py) return;
    try {
      worker_py.cancel_awaits();
    } catch (e) {
      console.warn("webgrad worker: cancelling the awaited tasks failed", e);
    }
  }, CANCEL_AFTER_MS);
}

let queue = Promise.resolve();
self.addEventListener("message", (event) => {
  const request = event.data;
  if (request?.type === "ping") {
    post({ id: request.id, ok: true, value: "pong" });
    return;
  }
  if (request?.type === "interrupt") {
    interruptedUpToSent = Math.max(interruptedUpToSent, request.upTo ?? 0);
    interruptAwaits();
    return;
  }
  if (request?.type === "init") {
    interruptBuffer = request.interruptBuffer ?? null;
    interruptedUpTo = request.interruptedUpTo ?? null;
    if (worker_py && interruptBuffer) pyodide.setInterruptBuffer(interruptBuffer);  // booted
    if (request.lifeLock && navigator.locks) {  // held until this worker is gone (see webgrad.mjs)
      navigator.locks.request(request.lifeLock, () => {
        post({ type: "alive", lifeLock: request.lifeLock });
        return new Promise(() => {});
      });
    }
    return;
  }
  requestsInFlight++;
  stopSnapshotMaker();  // a request has the CPU to itself
  queue = queue.then(() => handle(request)).then((reply) => {
    try {
      post(reply);
    } catch (e) {  // e.g. DataCloneError: say so instead of leaving the caller waiting
      post({ id: request.id, ok: false, error: errorOf(e) });
    }
  }).finally(() => {
    requestsInFlight--;
    scheduleSnapshot();
  });
});
