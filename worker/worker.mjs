// webgrad's Pyodide worker: runs Python (and through it WebGPU) off the page's main thread.
//
// Start it as a *module* worker:  new Worker("/worker/worker.mjs", {type: "module"}).
// It boots Pyodide from /assets/pyodide/, loads the micropip wheel, installs the webgrad wheel
// named in /assets/manifest.json, and installs webgrad_worker.py (the Python half of this file).
//
// Message protocol (all values are plain structured-cloneable data):
//   requests from the page, answered one at a time in arrival order (except ping):
//     {id, type: "run", code}        run Python source in __main__ (top-level await allowed);
//                                    the value is that of the source's last expression
//     {id, type: "call", name, args} call the global Python function `name` with args (an array);
//                                    a coroutine result is awaited
//     {id, type: "ping"}             answered at once with value "pong", even during boot
//     {type: "init", interruptBuffer, lifeLock}  optional, first. interruptBuffer: a Uint8Array
//                                    on a SharedArrayBuffer; the page writes 2 into it to raise
//                                    KeyboardInterrupt in the running code (needs a cross-origin
//                                    isolated page). lifeLock: a Web Lock name the worker holds
//                                    while it lives, answered by {type: "alive", lifeLock}; the
//                                    page waits on the same lock to learn of a silent death
//   replies:
//     {id, ok: true, value}
//     {id, ok: false, error: {type, message, traceback}}
//   events the worker sends on its own:
//     {type: "stdout" | "stderr", text}            one line of Python output
//     {type: "progress", ...}                      from webgrad_worker.progress(dict) in Python
//     {type: "ready", python_version, webgrad_version, jspi}   booted; requests now run
//     {type: "fatal", error: {type, message, traceback}}       boot failed or Pyodide died;
//                                                  every later request is answered with an error
// Values: None/bool/int/float/str/list/tuple/dict(str keys) become JS values, bytes/bytearray a
// Uint8Array, a memoryview the TypedArray of its format; anything else arrives as its repr string.
//
// Python runs inside runPythonAsync, so JSPI is on: pyodide.ffi.can_run_sync() is true and
// pyodide.ffi.run_sync(promise) can wait for WebGPU promises from synchronous Python code.

const here = (path) => new URL(path, import.meta.url).href;
const post = (message) => self.postMessage(message);

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
let fatal = null;  // set once boot fails or Pyodide dies; later requests get it as their error

async function boot() {
  const manifest = await (await fetchOk(here("../assets/manifest.json"))).json();
  const { loadPyodide } = await import(here("../assets/pyodide/pyodide.mjs"));
  pyodide = await loadPyodide({ indexURL: here("../assets/pyodide/") });
  if (interruptBuffer) pyodide.setInterruptBuffer(interruptBuffer);
  pyodide.setStdout({ batched: (text) => post({ type: "stdout", text }) });
  pyodide.setStderr({ batched: (text) => post({ type: "stderr", text }) });

  await pyodide.loadPackage(here(`../assets/wheels/${manifest.micropip_wheel}`),
                            { messageCallback: () => {} });
  const helper = await (await fetchOk(here("./webgrad_worker.py"))).text();
  const sitePackages = pyodide.runPython("import sysconfig; sysconfig.get_path('purelib')");
  pyodide.FS.writeFile(`${sitePackages}/webgrad_worker.py`, helper);

  const ns = pyodide.toPy({ url: here(`../assets/wheels/${manifest.webgrad_wheel}`) });
  try {
    const info = await pyodide.runPythonAsync(`
import importlib.metadata, sys, micropip, pyodide.ffi
await micropip.install(url)
[sys.version.split()[0], importlib.metadata.version("webgrad"), pyodide.ffi.can_run_sync()]
`, { globals: ns });
    const [python_version, webgrad_version, jspi] = info.toJs();
    info.destroy();
    post({ type: "ready", python_version, webgrad_version, jspi });
  } finally {
    ns.destroy();
  }
}

const booted = boot().catch((e) => {
  fatal = errorOf(e);
  post({ type: "fatal", error: fatal });
});

async function handle(request) {
  await booted;
  if (fatal) return { id: request.id, ok: false, error: fatal };
  if (interruptBuffer) interruptBuffer[0] = 0;  // forget an interrupt meant for an earlier request
  // runPythonAsync (not a direct PyProxy call) so that the code runs with JSPI available.
  const ns = pyodide.toPy({});
  ns.set("request", request);
  try {
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
    ns.destroy();
  }
}

let queue = Promise.resolve();
self.addEventListener("message", (event) => {
  const request = event.data;
  if (request?.type === "ping") {
    post({ id: request.id, ok: true, value: "pong" });
    return;
  }
  if (request?.type === "init") {
    interruptBuffer = request.interruptBuffer ?? null;
    if (pyodide && interruptBuffer) pyodide.setInterruptBuffer(interruptBuffer);
    if (request.lifeLock && navigator.locks) {  // held until this worker is gone (see main.mjs)
      navigator.locks.request(request.lifeLock, () => {
        post({ type: "alive", lifeLock: request.lifeLock });
        return new Promise(() => {});
      });
    }
    return;
  }
  queue = queue.then(() => handle(request)).then((reply) => {
    try {
      post(reply);
    } catch (e) {  // e.g. DataCloneError: say so instead of leaving the caller waiting
      post({ id: request.id, ok: false, error: errorOf(e) });
    }
  });
});
