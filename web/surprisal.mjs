// The surprisal page: the text is tokenised and scored in the worker by GPT2.surprisal_tracker()
// (webgrad/models/gpt2.py), which recomputes only from the first changed token, through the KV
// cache on the GPU (where the browser has no WebGPU, or only a software adapter, on the CPU:
// backend "auto" picks "wasm", and the status line says so). Each token becomes a <span> coloured by its bits, titled with
// the model's own top guess there and its probability. Requests are serialised: an edit made while one is
// scoring is scored right after it (the latest text wins).
//
// The model: a file picked from disk or a URL on the server, loaded through the browser's model
// cache (webgrad.models.gpt2_cache over webgrad.io.modelcache in the worker, modelcache.mjs here: the second load of the same
// file is an upload, without download or parse), an entry of that cache (a Llama the chat page
// kept too: models/llama_cache.py, its tokenizer with it), or a small GPT-2
// trained here on pydoc_data.topics (trained in chunks of steps the page asks for, so Stop
// ends it after the current chunk; then kept in the cache too). Any of them downloads as
// safetensors. The worker reports loading progress as {type: "progress", what: "model",
// phase, done, total} events.
//
// For tests and the console: window.webgrad (webgrad.mjs) and window.modelCache (modelcache.mjs);
// #view's data-model holds the current model's config and load info (cached, seconds, phases).
const PY = `
import os
import webgrad_worker
from webgrad.models import gpt2
from webgrad.models import gpt2_cache
from webgrad.models import llama_cache
_surprisal = {}
_train = {}

def _loading(p):
    webgrad_worker.progress(p, what="model")

def _use(m, info, encoder=None, vocab=None, tok=None):
    if tok is not None:       # a Llama kept by the chat page brings its own tokenizer
        pass
    elif encoder is not None and vocab is not None:
        os.makedirs("/home/pyodide/surprisal", exist_ok=True)
        paths = ["/home/pyodide/surprisal/encoder.json", "/home/pyodide/surprisal/vocab.bpe"]
        for path, data in zip(paths, (encoder, vocab)):
            with open(path, "wb") as f:
                f.write(bytes(data))
        tok = gpt2.Tokenizer.from_files(*paths)
    elif m.cfg.vocab_size != 256:
        raise ValueError(f"this model has {m.cfg.vocab_size} tokens: pick its encoder.json and vocab.bpe")
    old = _surprisal.get("model")
    if old is not None and old is not m and old.backend is not getattr(_train.get("c"), "backend", None):
        old.backend.destroy()   # its GPU buffers; the one a training run shares stays
    _surprisal.update(model=m, tok=tok, tracker=m.surprisal_tracker(), info=info)
    c = m.cfg
    layers, width = (c.n_layer, c.n_embd) if hasattr(c, "n_layer") else (c.num_hidden_layers, c.hidden_size)
    return {"n_layer": layers, "n_embd": width, "vocab": c.vocab_size, "n_ctx": c.n_ctx,
            "backend": m.backend.name, **info}

async def surprisal_load(source, encoder=None, vocab=None):
    """source: a URL, a File picked from disk, or {"key": k, "model": family} of a cached model."""
    if isinstance(source, dict) and source.get("model") == "llama":
        item, info = await llama_cache.load_key_async(source["key"], backend="auto", progress=_loading)
        return _use(item.model, info, tok=item.tokenizer())
    if isinstance(source, dict):
        m, info = await gpt2_cache.load_key_async(source["key"], backend="auto", progress=_loading)
    else:
        m, info = await gpt2_cache.load_gpt2_async(source, backend="auto", progress=_loading)
    return _use(m, info, encoder, vocab)

def _piece(tok, i):
    return tok.decode([i]) if tok is not None else bytes([i]).decode("latin-1")

def sliding_windows(length, n):
    """Windows (start, first) over tokens n.. of a text of length tokens that a model of
    context n cannot see at once: each window is n tokens long and scores its tokens from
    first on, each of which sees at least n - n // 2 tokens before it; the windows move
    n // 2 tokens at a time, the last ends at the text's end."""
    hop, out, first = max(1, n // 2), [], n
    while first < length:
        start = min(first - (n - hop), length - n)
        out.append((start, first))
        first = start + n
    return out

async def surprisal_score(text):
    m, tok, tr = _surprisal["model"], _surprisal["tok"], _surprisal["tracker"]
    n = m.cfg.n_ctx
    ids = tok.encode(text) if tok is not None else list(text.encode())
    s = await tr.update_async(ids[:n])
    bits, top, top_p = list(s.bits), list(s.top), list(s.top_p)
    for start, first in sliding_windows(len(ids), n):   # past the context: sliding windows
        w = await m.surprisal_async(ids[start:start + n])
        k = first - start
        bits += w.bits[k:]; top += w.top[k:]; top_p += w.top_p[k:]
    return {"tokens": [_piece(tok, i) for i in ids], "bits": bits,
            "top": [_piece(tok, t) if t >= 0 else "" for t in top], "top_p": top_p,
            "recomputed": tr.recomputed, "context": n, "windowed": max(0, len(ids) - n)}

async def surprisal_save():
    m = _surprisal["model"]
    name = _surprisal["info"].get("name", "model").rsplit(".", 1)[0]
    return {"name": name.replace("/", "_") + ".safetensors", "data": await m.save_safetensors_async()}

def train_start(n_layer, n_embd, n_ctx, seed=0):
    import random
    import webgrad as wg
    from webgrad import optim
    text = _corpus
    cut = int(len(text) * 0.9)
    cfg = gpt2.GPT2Config(n_layer=n_layer, n_head=max(1, n_embd // 32), n_embd=n_embd,
                          n_ctx=n_ctx, vocab_size=256)
    B, L = 16, n_ctx
    def batches(src, seed):
        rng = random.Random(seed)
        while True:
            xs, ys = [], []
            for _ in range(B):
                i = rng.randrange(len(src) - L - 1)
                xs.append(list(src[i:i + L])); ys.append(list(src[i + 1:i + L + 1]))
            yield {"tokens": xs, "targets": ys}
    old = _train.get("c")
    if old is not None and (_surprisal.get("model") is None or _surprisal["model"].backend is not old.backend):
        old.destroy()
    c = wg.compile_module(lambda: gpt2.GPT2Module(cfg), gpt2.lm_loss,
                          inputs={"tokens": ([B, L], "i32"), "targets": ([B, L], "i32")},
                          optimizer=optim.Adam(lr=5e-3), backend="auto", seed=seed)
    _train.clear()
    _train.update(c=c, cfg=cfg, data=batches(text[:cut], seed), held=batches(text[cut:], seed + 1),
                  train=text[:cut], heldtext=text[cut:], step=0)
    return {"bytes": len(text)}

async def train_steps(k):
    t = _train
    loss = None
    for _ in range(k):
        loss = await t["c"].step_async(next(t["data"]))
        t["step"] += 1
    return {"step": t["step"], "loss": loss}

async def train_finish():
    import math
    from collections import Counter
    t = _train
    c, cfg = t["c"], t["cfg"]
    held = sum([await c.run_async(next(t["held"])) for _ in range(4)]) / 4
    cnt, n = Counter(t["train"]), len(t["train"])
    base = -sum(math.log((cnt[b] + 1) / (n + 256)) for b in t["heldtext"]) / len(t["heldtext"])
    m = gpt2.GPT2.from_compiled(c, cfg)      # the trained buffers themselves: no copy
    name = f"pydoc topics, {cfg.n_layer}x{cfg.n_embd}, ctx {cfg.n_ctx}, {t['step']} steps"
    try:
        info = await gpt2_cache.store_async(m, name=name, kind="trained", progress=_loading)
    except Exception as e:    # a full disk: the model is used all the same
        info = {"key": None, "name": name, "kind": "trained", "cached": False, "seconds": 0.0,
                "not_kept": str(e)}
    return {**_use(m, info), "held": held, "base": base, "step": t["step"]}
`;

const CORPUS_PY = `
import pydoc_data.topics
_corpus = "".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)).encode()
len(_corpus)
`;

import { startWebgrad } from "./webgrad.mjs";
import * as modelCache from "./modelcache.mjs";

const $ = (id) => document.getElementById(id);
const webgrad = startWebgrad();
window.webgrad = webgrad;   // the API the CPython driver and the tests use (see webgrad.mjs)
window.modelCache = modelCache;
const setStatus = (text, kind) => { $("status").textContent = text; $("status").className = kind; };
// Errors in words: a JavaScript exception surfacing through Python (JsException) says only
// what it was, not its type's name.
const failed = (error, words = null) => {
  $("load-line").hidden = true;   // no progress line left over from the attempt
  const type = !error.type || error.type === "JsException" ? "" : `${error.type}: `;
  setStatus(words ?? `${type}${error.message}`, "error");
};
// The text and the model of the last visit come back after a reload (localStorage).
const SAVED = "webgrad.surprisal";
const saved = () => { try { return JSON.parse(localStorage.getItem(SAVED)) || {}; } catch { return {}; } };
const save = (fields) => { try { localStorage.setItem(SAVED, JSON.stringify({ ...saved(), ...fields })); } catch { /* private mode */ } };
let loaded = false, busy = false, again = false, working = false, stopRequested = false;

function colour(bits) {
  const t = Math.max(0, Math.min(1, bits / 12));
  return `hsl(0, 90%, ${100 - 45 * t}%)`;
}

function render(r) {
  const view = $("view");
  view.textContent = "";
  r.tokens.forEach((piece, i) => {
    const span = document.createElement("span");
    span.textContent = piece;
    span.dataset.bits = r.bits[i].toFixed(3);
    span.style.background = colour(r.bits[i]);
    span.title = i === 0 ? "first token: nothing precedes it"
      : `${r.bits[i].toFixed(2)} bits; the model's guess: ${JSON.stringify(r.top[i])} ` +
        `(p = ${r.top_p[i].toFixed(3)})`;
    view.appendChild(span);
  });
  const n = r.bits.length - 1;
  const mean = n > 0 ? r.bits.slice(1).reduce((a, b) => a + b, 0) / n : 0;
  $("stats").textContent = `${r.tokens.length} tokens, mean ${mean.toFixed(2)} bits/token; ` +
    `recomputed ${r.recomputed}` +
    (r.windowed ? `; the last ${r.windowed} lie past the model's context of ${r.context} ` +
      `tokens and were scored in sliding windows (each sees at least ` +
      `${r.context - Math.max(1, Math.floor(r.context / 2))} tokens before it)` : "");
  $("stats").dataset.windowed = r.windowed;
  $("stats").dataset.recomputed = r.recomputed;
}

async function score() {
  if (!loaded) return;
  if (busy) { again = true; return; }
  busy = true;
  try {
    do {
      again = false;
      render(await webgrad.call("surprisal_score", [$("text").value]));
    } while (again);
  } catch (error) {
    failed(error);
  } finally {
    busy = false;
  }
}

// --- loading, with progress -------------------------------------------------------------

const PHASES = { lookup: "Looking in the cache", hash: "Hashing", download: "Downloading",
                 parse: "Parsing", store: "Keeping in the cache", read: "Reading from the cache",
                 upload: "Uploading" };

function size(n) {
  return n >= 1e6 ? `${(n / 1e6).toFixed(1)} MB` : `${(n / 1e3).toFixed(1)} kB`;
}

webgrad.onEvent((msg) => {
  if (msg.type !== "progress" || msg.what !== "model") return;
  $("load-line").hidden = false;
  $("load-progress").max = msg.total || 1;
  $("load-progress").value = msg.done;
  $("load-text").textContent = `${PHASES[msg.phase] || msg.phase}: ${size(msg.done)}` +
    (msg.total ? ` of ${size(msg.total)}` : "");
});

function describe(info) {
  const secs = `${info.seconds.toFixed(2)} s`;
  const how = info.cached ? `from the cache in ${secs}`
    : info.kind === "trained" ? `trained here (${info.step} steps)${info.not_kept ? "" : " and kept"}`
    : `downloaded/read and parsed${info.not_kept ? "" : ", and kept in the cache,"} in ${secs}`;
  const layers = `${info.n_layer} layer${info.n_layer === 1 ? "" : "s"}`;
  const where = info.backend === "wasm" ? "; runs on the CPU (WebAssembly: this browser offers no WebGPU, or only a software one)"
    : info.backend === "webgpu" ? "" : `; runs on ${info.backend}`;
  return `Model: ${info.name} — ${layers}, n_embd ${info.n_embd}, ${info.vocab} tokens, ` +
    `context ${info.n_ctx}; ${how}` + (info.not_kept ? ` (not kept in the cache: ${info.not_kept})` : "") +
    where;
}

function shown(info) {
  loaded = true;
  if (info.key) save({ source: { key: info.key, model: info.model } });
  else if (typeof lastSource === "string") save({ source: lastSource });
  setStatus(describe(info), "ok");
  $("view").dataset.model = JSON.stringify(info);
  $("load-text").textContent = describe(info).split(" — ")[1];
}

// explain(): the failure in the user's words, or null for the error's own (asked before the
// status changes, so the page shows one error, not the loader's and then its explanation).
async function useModel(call, explain = async () => null) {
  if (working) return;
  working = true;
  setButtons();
  setStatus("Loading the model…", "busy");
  try {
    shown(await call());
    await score();
  } catch (error) {
    failed(error, await explain());
  } finally {
    working = false;
    setButtons();
    await showCache();
  }
}

const bytesOf = async (input) => input.files.length
  ? new Uint8Array(await input.files[0].arrayBuffer()) : null;
const tokenizer = async () => [await bytesOf($("encoder")), await bytesOf($("vocab"))];
let lastSource = null;   // reloaded when the tokenizer files arrive after the model

async function load(source, explain) {
  lastSource = source;
  await useModel(async () => webgrad.call("surprisal_load", [source, ...await tokenizer()]), explain);
}

function loadPicked() {
  if ($("model").files.length) load($("model").files[0]);
}

// Why a URL failed to load, in words, when the server is the reason (the loader's own error
// is a JavaScript exception from fetch, or a parse error of an HTML error page); null when
// the server has the file (the loader's error then says what is wrong with it).
async function serverAnswer(url) {
  let answer = null;
  try {
    answer = await fetch(url, { method: "HEAD" });
  } catch (error) {
    return `Cannot reach ${url}: ${error.message} (is the address right, and does that ` +
           "server allow this page to read it?)";
  }
  if (answer.ok) return null;
  return `The server has no model at ${url}: it answered ${answer.status}` +
         `${answer.statusText ? ` ${answer.statusText}` : ""}. Put the file under the ` +
         "served folder (models/ beside serve.py) or pick it from disk above.";
}

async function loadURL() {
  const text = $("model-url").value.trim();
  if (!text) return;
  let url;
  try {
    url = new URL(text, location.href).href;
  } catch {
    setStatus(`"${text}" is not a URL: give a path on this server (models/NAME.safetensors) ` +
              "or a full http(s) address", "error");
    return;
  }
  await load(url, () => serverAnswer(url));
}

// The colours' key: white for what the model expected, deep red for 12 bits and more.
function legend() {
  const box = $("legend");
  box.textContent = "bits: ";
  for (const bits of [0, 2, 4, 6, 8, 10, 12]) {
    const span = Object.assign(document.createElement("span"),
      { textContent: bits === 12 ? " 12+ " : ` ${bits} `, className: "swatch" });
    span.style.background = colour(bits);
    span.dataset.bits = bits;
    box.append(span);
  }
}

async function download() {
  try {
    const { name, data } = await webgrad.call("surprisal_save");
    const url = URL.createObjectURL(new Blob([data], { type: "application/octet-stream" }));
    const a = document.createElement("a");
    a.href = url;
    a.download = name;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
  } catch (error) {
    failed(error);
  }
}

// --- the cache table ------------------------------------------------------------------------

async function showCache() {
  const entries = await modelCache.showTable($("cache"), {
    columns: [(e) => e.name, (e) => e.kind, (e) => {
      const c = e.meta?.config || {};
      const [layers, width] = e.meta?.model === "llama" ? [c.num_hidden_layers, c.hidden_size]
        : [c.n_layer, c.n_embd];
      return `${layers}×${width}, ${c.vocab_size} tokens, ctx ${c.n_ctx}`;
    }, { text: (e) => size(e.nbytes), className: "num" }, (e) => new Date(e.created).toLocaleString()],
    actions: [["Load", (e) => load({ key: e.key, model: e.meta?.model })],
              ["Delete", async (e) => { await modelCache.remove(e.key); await showCache(); }]],
    note: $("cache-usage"),
  });
  if (!entries) return;
  const u = await modelCache.usage().catch(() => null);
  $("cache-usage").textContent = `${entries.length} kept` +
    (u ? `; this site uses ${size(u.usage)} of ${size(u.quota)} the browser allows` : "");
}

// --- training -----------------------------------------------------------------------------

const STEP_MS = 300;  // aim for calls this long: Stop answers within about that

async function train() {
  if (working) return;
  const num = (id) => Math.max(1, Math.floor(Number($(id).value)));
  const [layers, width, ctx, steps] = ["train-layers", "train-width", "train-ctx", "train-steps"].map(num);
  working = true;
  stopRequested = false;
  setButtons();
  $("train-line").hidden = false;
  const show = (text, done) => {
    $("train-text").textContent = text;
    $("train-progress").max = steps;
    if (done === null) $("train-progress").removeAttribute("value");
    else $("train-progress").value = done;
  };
  try {
    show("Reading pydoc_data.topics and compiling…", null);
    setStatus("Training…", "busy");
    await webgrad.run(CORPUS_PY);
    await webgrad.call("train_start", [layers, width, ctx]);
    let step = 0, perCall = 1;
    while (step < steps && !stopRequested) {
      const t0 = performance.now();
      const r = await webgrad.call("train_steps", [Math.min(perCall, steps - step)]);
      const ms = performance.now() - t0;
      perCall = Math.max(1, Math.min(100, Math.round(perCall * STEP_MS / Math.max(ms, 1))));
      step = r.step;
      show(`step ${step} of ${steps}, loss ${r.loss.toFixed(3)} nats/byte`, step);
      $("train-line").dataset.step = step;
    }
    if (step === 0) {
      show("Stopped before the first step: nothing to keep", 0);
      setStatus(loaded ? $("status").textContent : "Ready", "ok");
      return;
    }
    show(`${stopRequested ? "Stopped" : "Done"} at step ${step}; measuring the held-out loss…`, step);
    const info = await webgrad.call("train_finish");
    show(`${stopRequested ? "Stopped" : "Done"} at step ${info.step}: held-out loss ` +
         `${info.held.toFixed(3)} nats/byte (unigram baseline ${info.base.toFixed(3)})`, info.step);
    lastSource = info.key ? { key: info.key } : null;
    shown(info);
    $("train-line").dataset.done = "1";
    await score();
  } catch (error) {
    failed(error);
    show(`Training failed: ${error.message}`, 0);
  } finally {
    working = false;
    setButtons();
    await showCache();
  }
}

function setButtons() {
  for (const id of ["load-url", "train", "cache-clear", "model"]) $(id).disabled = working;
  $("stop").disabled = !working || stopRequested;
  $("download").disabled = working || !loaded;
}

webgrad.ready.then(async () => {
  await webgrad.run(PY);
  setStatus("Pick a GPT-2 model (.safetensors or .gguf), load one from the server or the " +
            "cache, or train one", "ok");
  $("model").addEventListener("change", loadPicked);
  for (const id of ["encoder", "vocab"]) {
    $(id).addEventListener("change", () => { if (lastSource) load(lastSource); });
  }
  $("load-url").addEventListener("click", loadURL);
  $("model-url").addEventListener("keydown", (e) => { if (e.key === "Enter") loadURL(); });
  $("download").addEventListener("click", download);
  $("train").addEventListener("click", train);
  $("stop").addEventListener("click", () => { stopRequested = true; setButtons(); });
  $("cache-clear").addEventListener("click", async () => { await modelCache.clear(); await showCache(); });
  $("text").addEventListener("input", () => { save({ text: $("text").value }); score(); });
  legend();
  setButtons();
  await showCache();
  const last = saved();
  if (typeof last.text === "string") $("text").value = last.text;
  document.body.dataset.ready = "1";
  if (last.source) {   // the last visit's model: from the cache, or the same URL again
    await load(last.source);
    if (!loaded) setStatus(`The last model could not be loaded again (${$("status").textContent}); ` +
                           "pick one below", "error");
  }
}, (error) => setStatus(`Python failed to start: ${error.message}`, "error"));
