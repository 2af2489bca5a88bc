// webgrad's page API: starts the Pyodide worker (worker/worker.mjs) and talks to it. The
// playground (main.mjs) builds its UI on this; the CPython driver (pkg/webgrad/browser.py) and
// the browser tests use the same object as `window.webgrad`:
//
//   webgrad.ready          Promise<{python_version, webgrad_version, jspi, boot}>
//   webgrad.warm           Promise<boot>: the worker's warm-up after ready is done (compiler
//                          imported, GPU device there); boot: ms at the end of each phase
//   webgrad.run(code, {name, show})  Promise<value of the code's last expression>; name:
//                          what tracebacks call the code (else <run-N>); show: the value as
//                          Python's repr (a string; null for None)
//   webgrad.call(name, args)  Promise<return value of global Python function `name`>
//   webgrad.stdout / .stderr  the last lines of output, at least MAX_LINES of them and at most a
//                          quarter more (a partial line is kept aside until its newline comes);
//                          .dropped = {stdout, stderr} counts lines that fell off the front;
//                          .progress: the last MAX_PROGRESS progress events
//   webgrad.onEvent(fn)    fn(message) for every unsolicited worker message
//   webgrad.interrupt()    stop the running Python code with a KeyboardInterrupt: it lands in
//                          the request's own code (a blocking training loop stops after the
//                          current step) and cuts awaits short (asyncio.sleep, time.sleep);
//                          returns false where the page is not cross-origin isolated (awaits
//                          are still cut, computing code is not)
//   webgrad._terminate()   test hook: kill the worker as if it had crashed
//
// A rejected promise carries {type, message, traceback}. If the worker fails to boot, raises an
// `error`/`messageerror` event, or is terminated, every pending call rejects and so do later ones.

export const MAX_PROGRESS = 1000;
export const MAX_LINES = 10000;

/** Output lines of one stream, bounded: chunks of text in, whole lines kept, oldest dropped. */
class Lines extends Array {
  static get [Symbol.species]() { return Array; }  // slice()/map() give plain arrays
  constructor() { super(); this.partial = ""; this.dropped = 0; }
  add(text) {
    const parts = (this.partial + text).split("\n");
    this.partial = parts.pop();
    for (const line of parts) this.push(line);
    if (this.length > MAX_LINES + (MAX_LINES >> 2)) {  // trim in batches: O(1) per line
      const extra = this.length - MAX_LINES;
      this.dropped += extra;
      this.splice(0, extra);
    }
  }
}

export function startWebgrad(workerURL = new URL("../worker/worker.mjs", import.meta.url)) {
  const worker = new Worker(workerURL, { type: "module" });
  const pending = new Map();
  const listeners = new Set();
  const stdout = new Lines(), stderr = new Lines(), progress = [];
  let nextId = 1;
  let dead = null;
  let settleReady;
  const ready = new Promise((resolve, reject) => { settleReady = { resolve, reject }; });
  ready.catch(() => {});  // callers see the rejection; keep the console free of "unhandled"
  let settleWarm;
  const warm = new Promise((resolve, reject) => { settleWarm = { resolve, reject }; });
  warm.catch(() => {});
  // Shared memory needs cross-origin isolation, which serve.py's COOP/COEP headers give.
  const interruptBuffer = globalThis.crossOriginIsolated
    ? new Uint8Array(new SharedArrayBuffer(1)) : null;
  // The last request id an interrupt was meant for: a request still queued in the worker when
  // it came (the worker booting, or busy with another) is then answered as interrupted
  // instead of run, and the worker's reset of interruptBuffer cannot lose it.
  const interruptedUpTo = globalThis.crossOriginIsolated
    ? new Int32Array(new SharedArrayBuffer(4)) : null;
  // A worker that dies without an `error` event (closed itself, killed for memory) would leave
  // calls waiting forever. It holds a Web Lock for as long as it lives: when the lock comes
  // free, the worker is gone, and every pending call fails.
  const lifeLock = globalThis.navigator?.locks ? `webgrad-worker-${crypto.randomUUID()}` : null;
  worker.postMessage({ type: "init", interruptBuffer, interruptedUpTo, lifeLock });

  function die(error) {
    if (dead) return;
    dead = error;
    settleReady.reject(error);
    settleWarm.reject(error);
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
    if (data.type === "stdout") stdout.add(data.text);
    else if (data.type === "stderr") stderr.add(data.text);
    else if (data.type === "progress" && progress.push(data) > MAX_PROGRESS) progress.shift();
    else if (data.type === "ready") settleReady.resolve(data);
    else if (data.type === "warm") settleWarm.resolve(data.boot);
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
    ready, warm, stdout, stderr, progress,
    get dropped() { return { stdout: stdout.dropped, stderr: stderr.dropped }; },
    run: (code, options = {}) => request({ ...options, type: "run", code }),
    call: (name, args = []) => request({ type: "call", name, args }),
    ping: () => request({ type: "ping" }),
    get busy() { return pending.size > 0; },
    onEvent(fn) { listeners.add(fn); return () => listeners.delete(fn); },
    interrupt() {
      if (dead) return false;
      const upTo = nextId - 1;  // every request made so far, running or still queued
      if (interruptedUpTo) Atomics.store(interruptedUpTo, 0, upTo);  // before the flag
      if (interruptBuffer) interruptBuffer[0] = 2;  // SIGINT: seen by code that computes
      worker.postMessage({ type: "interrupt", upTo });  // and by the worker, for code that awaits
      return interruptBuffer !== null;
    },
    get dead() { return dead; },
    _terminate() {
      worker.terminate();
      die({ type: "WorkerTerminated", traceback: "", message: "the worker was terminated" });
    },
  };
}
