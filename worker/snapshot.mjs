// webgrad's snapshot maker: a short-lived module worker that boots a Pyodide of its own, unpacks
// the wheels, runs the imports it is given, makes a memory snapshot of that Python and keeps it
// in Cache Storage, where worker.mjs's next boots find it (worker.mjs, "The snapshot").
//
// worker.mjs starts it as a nested worker when a boot found no snapshot, once the worker has
// been idle for a while, and terminates it as soon as a request comes: making a snapshot is a
// second initialization of Python (seconds of CPU), which must not compete with a run. It is
// a worker of its own because the Pyodide that made a snapshot is not fit for use afterwards,
// and because a first visit then boots without `_makeSnapshot` and goes ready sooner.
//
// Protocol: one message in,
//   {indexURL, wheels: [ArrayBuffer], imports, cache, key, lock}
//     indexURL: Pyodide's files; wheels: pure-Python wheels, unpacked into site-packages;
//     imports: Python source run before the snapshot (it may leave no JS object in Python);
//     cache, key: where to store it (the cache's other entries are deleted: one per origin);
//     lock: a Web Lock name, so that two pages of the origin never make one at the same time
// and one message out:
//   {type: "stored", bytes, ms}   ms: {pyodide, imported, made, stored}, ms since this worker
//                                 started at the end of each phase
//   {type: "skipped", reason, busy}  the key is stored already, or (busy: true) another page
//                                 of the origin is making one
//   {type: "failed", error}       error: the message, in words
// worker.mjs terminates this worker when the answer comes.

const started = performance.now();
const ms = {};
const mark = (phase) => { ms[phase] = Math.round(performance.now() - started); };

async function make({ indexURL, wheels, imports, cache: cacheName, key }) {
  const cache = await caches.open(cacheName);
  if (await cache.match(key)) {
    return { type: "skipped", reason: "a snapshot is stored already", busy: false };
  }
  const { loadPyodide } = await import(new URL("pyodide.mjs", indexURL).href);
  const pyodide = await loadPyodide({ indexURL, _makeSnapshot: true });
  mark("pyodide");
  // Nothing may hand Python a JS object before the snapshot (loadPackage does: hence
  // unpackArchive); strings and numbers coming back are fine.
  const sitePackages = pyodide.runPython("import sysconfig; sysconfig.get_path('purelib')");
  for (const bytes of wheels) pyodide.unpackArchive(bytes, "wheel", { extractDir: sitePackages });
  pyodide.runPython(imports);
  mark("imported");
  const bytes = pyodide.makeMemorySnapshot();
  mark("made");
  for (const old of await cache.keys()) await cache.delete(old);
  await cache.put(key, new Response(bytes, {
    headers: { "Content-Type": "application/octet-stream" } }));
  mark("stored");
  return { type: "stored", bytes: bytes.byteLength, ms };
}

self.addEventListener("message", async ({ data }) => {
  let answer;
  try {
    answer = !navigator.locks ? await make(data) : await navigator.locks.request(
      data.lock, { ifAvailable: true },
      (lock) => lock ? make(data)
        : { type: "skipped", reason: "another page is making one", busy: true });
  } catch (e) {
    answer = { type: "failed", error: String(e?.message ?? e) };
  }
  self.postMessage(answer);
}, { once: true });
