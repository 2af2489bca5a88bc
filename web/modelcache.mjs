// webgrad's model cache: weights already transcoded to what the GPU takes, kept in IndexedDB,
// so that loading the same model again needs neither its download nor its parsing.
//
// This module is the storage half and runs in the page and in the Pyodide worker alike (both
// see the same database). The Python half, webgrad.io.modelcache, makes the images (a loaded
// model's parameters as f32 bytes, quantized weights as their GPU words, with their names and
// shapes) and restores them; in the worker it reaches this module through `webgradModelCache`
// (worker/worker.mjs). The surprisal page lists, removes and clears entries with it directly.
//
// Database "webgrad-models", object store "models", one record per model:
//   key       keyFor(name, size, version): the file's name and size and what it holds:
//             version "etag:…" for a URL (from a HEAD request, so a hit downloads nothing;
//             serve.py sends one per file) or "sha256:…" of the bytes (a file picked from disk,
//             a server without ETags, a model trained in the worker)
//   name, size, version, kind ("safetensors" | "gguf" | "trained"), created (ms since 1970)
//   source    "url:<absolute URL>" | "file:<name>" | "trained:<key>": storing a new version
//             of a source drops the older ones (a file that changed on the server)
//   meta      webgrad.io.modelcache's image description: {format, model, config,
//             tensors: [{name, dtype, shape, offset, nbytes, quant?}], nbytes}
//   data      a Blob of the tensors back to back. A Blob is kept out of line by the browser:
//             listing reads no tensor bytes, and a 500 MB model is not one structured clone
//
// API (every function returns a Promise):
//   list()                     records without `data`, newest first
//   entry(key)                 one record without `data`, or null
//   remove(key), clear()
//   usage()                    navigator.storage.estimate(): {usage, quota} in bytes, or null
//   lookup(source, onProgress) source {url} | {file, name?} | {bytes, name}: its key and the
//                              cached record, without downloading where an ETag decides:
//                              {key, name, size, version, source, url, hit (record without
//                              data, or null), bytes (Uint8Array when already read, or null),
//                              unavailable (why the database could not be read, or null)}
//   download(url, onProgress)  the body as a Uint8Array
//   readData(key, onProgress)  a record's data as a Uint8Array
//   put(record, parts)         store record + parts (Uint8Arrays, in meta.tensors order)
//   keyFor(name, size, version), sha256(bytes) -> "sha256:<hex>"
//   showTable(table, {filter, columns, actions, note})   the pages' list of kept models (the
//                              surprisal and chat pages): one row per entry that filter(entry)
//                              keeps, a cell per column (entry) => text, a button per action
//                              [label, (entry) => …] (class: the label in lower case); the
//                              entries shown, or null when the cache is unavailable (then note's
//                              text says why and the table is left as it was)
// onProgress({phase, done, total}) hears "download", "hash" and "read", in bytes, at most
// every PROGRESS_MS and at the end of each phase.

const DB = "webgrad-models";
const STORE = "models";
const PROGRESS_MS = 100;

let opened = null;
function db() {
  if (!opened) {
    opened = new Promise((resolve, reject) => {
      const request = indexedDB.open(DB, 1);
      request.onupgradeneeded = () => request.result.createObjectStore(STORE, { keyPath: "key" });
      request.onsuccess = () => {
        const handle = request.result;
        handle.onversionchange = () => { handle.close(); opened = null; };  // deleted elsewhere
        resolve(handle);
      };
      request.onerror = () => { opened = null; reject(request.error); };
      request.onblocked = () => { opened = null; reject(new Error(`${DB}: blocked by another tab`)); };
    });
  }
  return opened;
}

// One request in its own transaction; resolves with its result once the transaction commits.
async function transact(mode, work) {
  const tx = (await db()).transaction(STORE, mode);
  const request = work(tx.objectStore(STORE));
  return new Promise((resolve, reject) => {
    tx.oncomplete = () => resolve(request?.result);
    tx.onerror = tx.onabort = () => reject(tx.error || request?.error || new Error(`${DB}: aborted`));
  });
}

const withoutData = ({ data, ...rest }) => rest;

export function keyFor(name, size, version) {
  return `${name} · ${size} bytes · ${version}`;
}

export async function list() {
  const all = await transact("readonly", (store) => store.getAll());
  return all.map(withoutData).sort((a, b) => b.created - a.created);
}

export const remove = (key) => transact("readwrite", (store) => store.delete(key));
export const clear = () => transact("readwrite", (store) => store.clear());
const get = (key) => transact("readonly", (store) => store.get(key));
export const entry = async (key) => { const r = await get(key); return r ? withoutData(r) : null; };

export async function usage() {
  if (!globalThis.navigator?.storage?.estimate) return null;
  const { usage, quota } = await navigator.storage.estimate();
  return { usage, quota };
}

export async function sha256(bytes) {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return "sha256:" + Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}

function reporter(onProgress, phase, total) {
  let last = 0;
  return (done, final = false) => {
    const now = performance.now();
    if (onProgress && (final || now - last >= PROGRESS_MS)) {
      last = now;
      onProgress({ phase, done, total });
    }
  };
}

export async function download(url, onProgress) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status} ${response.statusText}`);
  const total = Number(response.headers.get("Content-Length")) || 0;
  const report = reporter(onProgress, "download", total);
  report(0, true);
  const chunks = [];
  let done = 0;
  const reader = response.body.getReader();
  for (;;) {
    const { done: end, value } = await reader.read();
    if (end) break;
    chunks.push(value);
    done += value.length;
    report(done);
  }
  report(done, true);
  const out = new Uint8Array(done);
  let at = 0;
  for (const c of chunks) { out.set(c, at); at += c.length; }
  return out;
}

async function hashed(bytes, onProgress) {
  const report = reporter(onProgress, "hash", bytes.length);
  report(0, true);
  const version = await sha256(bytes);
  report(bytes.length, true);
  return version;
}

export async function lookup(source, onProgress) {
  let name, size, version, origin, url = null, bytes = null;
  if (source.url) {
    url = new URL(source.url, globalThis.location?.href).href;
    name = decodeURIComponent(new URL(url).pathname.split("/").pop() || "model");
    origin = `url:${url}`;
    const head = await fetch(url, { method: "HEAD" });
    if (!head.ok) throw new Error(`${url}: HTTP ${head.status} ${head.statusText}`);
    const etag = head.headers.get("ETag");
    size = Number(head.headers.get("Content-Length")) || 0;
    if (etag) {
      version = `etag:${etag}`;
    } else {  // nothing names the content: download it to hash it (the parse is still saved)
      bytes = await download(url, onProgress);
      size = bytes.length;
      version = await hashed(bytes, onProgress);
    }
  } else if (source.file) {
    name = source.name || source.file.name || "model";
    origin = `file:${name}`;
    bytes = new Uint8Array(await source.file.arrayBuffer());
    size = bytes.length;
    version = await hashed(bytes, onProgress);
  } else if (source.bytes) {
    name = source.name || "model";
    origin = `file:${name}`;
    bytes = source.bytes;
    size = bytes.length;
    version = await hashed(bytes, onProgress);
  } else {
    throw new Error("modelcache.lookup: the source needs url, file or bytes");
  }
  const key = keyFor(name, size, version);
  let record = null, unavailable = null;
  try {
    record = await get(key);
  } catch (error) {  // no IndexedDB here (a private window may refuse it): load uncached
    unavailable = String(error?.message || error);
  }
  return { key, name, size, version, source: origin, url,
           hit: record ? withoutData(record) : null, bytes, unavailable };
}

export async function readData(key, onProgress) {
  const record = await get(key);
  if (!record) throw new Error(`modelcache: no entry ${JSON.stringify(key)}`);
  const report = reporter(onProgress, "read", record.data.size);
  report(0, true);
  const out = new Uint8Array(await record.data.arrayBuffer());
  report(out.length, true);
  return out;
}

export async function put(record, parts) {
  const data = new Blob(parts);
  const old = (await list()).filter((r) => r.source === record.source && r.key !== record.key);
  await transact("readwrite", (store) => {
    for (const r of old) store.delete(r.key);
    return store.put({ ...record, created: Date.now(), nbytes: data.size, data });
  });
}

export async function showTable(table, { filter = () => true, columns, actions = [], note = null }) {
  let entries;
  try {
    entries = (await list()).filter(filter);
  } catch (error) {  // no IndexedDB here (a private window may refuse it)
    if (note) note.textContent = `The model cache is unavailable here: ${error?.message || error}`;
    return null;
  }
  const body = table.tBodies[0];
  body.textContent = "";
  for (const e of entries) {
    const row = body.insertRow();
    row.dataset.key = e.key;
    for (const column of columns) {
      const { text, className } = typeof column === "function" ? { text: column } : column;
      const cell = row.insertCell();
      cell.textContent = text(e);
      if (className) cell.className = className;
    }
    const cell = row.insertCell();
    for (const [label, act] of actions) {
      const b = Object.assign(document.createElement("button"),
                              { textContent: label, className: label.toLowerCase() });
      b.addEventListener("click", () => act(e));
      cell.append(b);
    }
  }
  if (!entries.length) body.insertRow().insertCell().textContent = "(none yet)";
  table.dataset.count = entries.length;
  return entries;
}
