// webgrad's page: starts the Pyodide worker (worker/worker.mjs), shows its status, and runs the
// Python snippet in the text box. It also exposes `window.webgrad`, the API that the CPython
// driver (pkg/webgrad/browser.py) and the browser tests use:
//
//   window.webgrad.ready          Promise<{python_version, webgrad_version, jspi}>
//   window.webgrad.run(code)      Promise<value of the code's last expression>
//   window.webgrad.call(name, args)  Promise<return value of global Python function `name`>
//   window.webgrad.stdout / .stderr  arrays of output lines; .progress: recent progress events
//   window.webgrad.onEvent(fn)    fn(message) for every unsolicited worker message
//   window.webgrad.interrupt()    raise KeyboardInterrupt in the running Python code (returns
//                                 false where the page is not cross-origin isolated)
//   window.webgrad._terminate()   test hook: kill the worker as if it had crashed
//
// A rejected promise carries {type, message, traceback}. If the worker fails to boot, raises an
// `error`/`messageerror` event, or is terminated, every pending call rejects and so do later ones.

// The snippet the page starts with: change it to show something else.
export const DEFAULT_SNIPPET = `# An MLP learns sin(x) on this page's GPU (WebGPU), from Python running in a worker.
import math, random, time
import webgrad as wg
from webgrad import Module, ops, init, optim

B = 256

class Linear(Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W = self.param([d_in, d_out], init=init.kaiming())
        self.b = self.param([d_out], init="zeros")

class MLP(Module):
    def __init__(self):
        super().__init__()
        self.layers = [Linear(1, 64), Linear(64, 64), Linear(64, 1)]

def forward(m, x):
    for i, layer in enumerate(m.layers):
        x = x @ layer.W + layer.b
        x = ops.relu(x) if i < 2 else x
    return x

def loss_fn(m, inputs):
    d = forward(m, inputs["x"]) - inputs["y"]
    return ops.sum_all(d * d) / B

c = wg.compile_module(MLP, loss_fn, inputs={"x": ([B, 1], "f32"), "y": ([B, 1], "f32")},
                      optimizer=optim.Adam(lr=0.005), backend="webgpu")
print(f"compiled: {c.kernel_count} kernels per training step")
rng = random.Random(0)
t0 = time.perf_counter()
for step in range(1000):
    xs = [rng.uniform(-math.pi, math.pi) for _ in range(B)]
    loss = c.step({"x": xs, "y": [math.sin(x) for x in xs]})
    if step % 100 == 0:
        print(f"step {step:4d}  loss {loss:.6f}")
    if loss < 1e-3:
        break
ms = 1e3 * (time.perf_counter() - t0) / (step + 1)
print(f"step {step:4d}  loss {loss:.6f}  ({ms:.1f} ms/step)")
{"steps": step + 1, "loss": loss, "ms_per_step": ms}
`;

const MAX_PROGRESS = 1000;

export function startWebgrad(workerURL = new URL("../worker/worker.mjs", import.meta.url)) {
  const worker = new Worker(workerURL, { type: "module" });
  const pending = new Map();
  const listeners = new Set();
  const stdout = [], stderr = [], progress = [];
  let nextId = 1;
  let dead = null;
  let settleReady;
  const ready = new Promise((resolve, reject) => { settleReady = { resolve, reject }; });
  ready.catch(() => {});  // callers see the rejection; keep the console free of "unhandled"
  // Shared memory needs cross-origin isolation, which serve.py's COOP/COEP headers give.
  const interruptBuffer = globalThis.crossOriginIsolated
    ? new Uint8Array(new SharedArrayBuffer(1)) : null;
  // A worker that dies without an `error` event (closed itself, killed for memory) would leave
  // calls waiting forever. It holds a Web Lock for as long as it lives: when the lock comes
  // free, the worker is gone, and every pending call fails.
  const lifeLock = globalThis.navigator?.locks ? `webgrad-worker-${crypto.randomUUID()}` : null;
  worker.postMessage({ type: "init", interruptBuffer, lifeLock });

  function die(error) {
    if (dead) return;
    dead = error;
    settleReady.reject(error);
    for (const { reject } of pending.values()) reject(error);
    pending.clear();
  }

  worker.addEventListener("message", ({ data }) => {
    if (data.id != null) {
      const call = pending.get(data.id);
      pending.delete(data.id);
      if (call) data.ok ? call.resolve(data.value) : call.reject(data.error);
      return;
    }
    if (data.type === "stdout") stdout.push(data.text);
    else if (data.type === "stderr") stderr.push(data.text);
    else if (data.type === "progress" && progress.push(data) > MAX_PROGRESS) progress.shift();
    else if (data.type === "ready") settleReady.resolve(data);
    else if (data.type === "fatal") die(data.error);
    else if (data.type === "alive") {
      navigator.locks.request(data.lifeLock, () => die({
        type: "WorkerDied", traceback: "",
        message: "the Python worker stopped (it crashed, ran out of memory or closed itself); " +
                 "reload the page to start a new one" }));
    }
    for (const fn of listeners) fn(data);
  });
  worker.addEventListener("error", (event) => {
    event.preventDefault();
    const where = event.filename ? ` (${event.filename}:${event.lineno})` : "";
    die({ type: "WorkerError", traceback: "",
          message: `${event.message || "the worker failed to load or crashed"}${where}` });
  });
  worker.addEventListener("messageerror", () => die({
    type: "MessageError", traceback: "", message: "a message from the worker could not be read" }));

  function request(message) {
    if (dead) return Promise.reject(dead);
    return new Promise((resolve, reject) => {
      const id = nextId++;
      pending.set(id, { resolve, reject });
      worker.postMessage({ ...message, id });
    });
  }

  return {
    ready, stdout, stderr, progress,
    run: (code) => request({ type: "run", code }),
    call: (name, args = []) => request({ type: "call", name, args }),
    ping: () => request({ type: "ping" }),
    onEvent(fn) { listeners.add(fn); return () => listeners.delete(fn); },
    interrupt() {
      if (!interruptBuffer) return false;
      interruptBuffer[0] = 2;  // SIGINT
      return true;
    },
    get dead() { return dead; },
    _terminate() {
      worker.terminate();
      die({ type: "WorkerTerminated", traceback: "", message: "the worker was terminated" });
    },
  };
}

function show(value) {
  if (typeof value === "string") return value;
  return JSON.stringify(value, (key, v) => ArrayBuffer.isView(v)
    ? `<${v.constructor.name}(${v.length}) ${Array.from(v.slice(0, 16)).join(" ")}${v.length > 16 ? " …" : ""}>`
    : typeof v === "bigint" ? v.toString() : v, 2);
}

function setUpPage(webgrad) {
  const $ = (id) => document.getElementById(id);
  const [status, code, button, output, result] =
    ["status", "code", "run", "output", "result"].map($);
  code.value = DEFAULT_SNIPPET;
  const setStatus = (text, kind) => { status.textContent = text; status.className = kind; };
  setStatus("Starting Python (Pyodide) in a worker…", "busy");
  webgrad.onEvent((message) => {
    if (message.type === "stdout" || message.type === "stderr") {
      output.textContent += message.text + "\n";
    } else if (message.type === "progress") {
      setStatus(`progress: ${JSON.stringify({ ...message, type: undefined })}`, "busy");
    }
  });
  webgrad.ready.then(
    (info) => {
      setStatus(`Ready: Python ${info.python_version}, webgrad ${info.webgrad_version}` +
                (info.jspi ? "" : " (no JSPI: WebGPU calls cannot block)"), "ok");
      button.disabled = false;
    },
    (error) => setStatus(`Python failed to start: ${error.message}`, "error"));
  button.addEventListener("click", async () => {
    button.disabled = true;
    output.textContent = "";
    result.textContent = "";
    result.className = "";
    setStatus("Running…", "busy");
    try {
      result.textContent = show(await webgrad.run(code.value));
      setStatus("Done", "ok");
    } catch (error) {
      result.textContent = error.traceback || error.message;
      result.className = "error";
      setStatus(`${error.type}: ${error.message}`, "error");
    } finally {
      button.disabled = !!webgrad.dead;
    }
  });
}

window.webgrad = startWebgrad();
if (document.getElementById("code")) setUpPage(window.webgrad);  // other pages (surprisal.html) bring their own UI
