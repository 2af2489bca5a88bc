// The surprisal page: the text is tokenised and scored in the worker by GPT2.surprisal_tracker()
// (webgrad/models/gpt2.py), which recomputes only from the first changed token, through the KV
// cache on the GPU. Each token becomes a <span> coloured by its bits, titled with the model's
// own top guess there and its probability. Requests are serialised: an edit made while one is
// scoring is scored right after it (the latest text wins).
const PY = `
import os
from webgrad.models import gpt2
_surprisal = {}

def surprisal_load(blob, encoder=None, vocab=None):
    m = gpt2.GPT2.from_safetensors(bytes(blob), backend="webgpu")
    tok = None
    if encoder is not None and vocab is not None:
        os.makedirs("/home/pyodide/surprisal", exist_ok=True)
        paths = ["/home/pyodide/surprisal/encoder.json", "/home/pyodide/surprisal/vocab.bpe"]
        for path, data in zip(paths, (encoder, vocab)):
            with open(path, "wb") as f:
                f.write(bytes(data))
        tok = gpt2.Tokenizer.from_files(*paths)
    elif m.cfg.vocab_size != 256:
        raise ValueError(f"this model has {m.cfg.vocab_size} tokens: pick its encoder.json and vocab.bpe")
    _surprisal.update(model=m, tok=tok, tracker=m.surprisal_tracker())
    c = m.cfg
    return {"n_layer": c.n_layer, "n_embd": c.n_embd, "vocab": c.vocab_size, "n_ctx": c.n_ctx}

def _piece(tok, i):
    return tok.decode([i]) if tok is not None else bytes([i]).decode("latin-1")

async def surprisal_score(text):
    m, tok, tr = _surprisal["model"], _surprisal["tok"], _surprisal["tracker"]
    ids = (tok.encode(text) if tok is not None else list(text.encode()))[:m.cfg.n_ctx]
    s = await tr.update_async(ids)
    return {"tokens": [_piece(tok, i) for i in ids], "bits": s.bits,
            "top": [_piece(tok, t) if t >= 0 else "" for t in s.top], "top_p": s.top_p,
            "recomputed": tr.recomputed}
`;

import { startWebgrad } from "./webgrad.mjs";

const $ = (id) => document.getElementById(id);
const webgrad = startWebgrad();
window.webgrad = webgrad;   // the API the CPython driver and the tests use (see webgrad.mjs)
const setStatus = (text, kind) => { $("status").textContent = text; $("status").className = kind; };
let loaded = false, busy = false, again = false;

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
    `recomputed ${r.recomputed}`;
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
    setStatus("Ready", "ok");
  } catch (error) {
    setStatus(`${error.type || "Error"}: ${error.message}`, "error");
  } finally {
    busy = false;
  }
}

const bytesOf = async (input) => input.files.length
  ? new Uint8Array(await input.files[0].arrayBuffer()) : null;

async function load() {
  if (!$("model").files.length) return;
  setStatus("Loading the model…", "busy");
  try {
    const info = await webgrad.call("surprisal_load",
      [await bytesOf($("model")), await bytesOf($("encoder")), await bytesOf($("vocab"))]);
    loaded = true;
    setStatus(`Model: ${info.n_layer} layers, n_embd ${info.n_embd}, ${info.vocab} tokens`, "ok");
    $("view").dataset.model = JSON.stringify(info);
    await score();
  } catch (error) {
    loaded = false;
    setStatus(`${error.type || "Error"}: ${error.message}`, "error");
  }
}

webgrad.ready.then(async () => {
  await webgrad.run(PY);
  setStatus("Pick a GPT-2 model.safetensors", "ok");
  document.body.dataset.ready = "1";
  for (const id of ["model", "encoder", "vocab"]) $(id).addEventListener("change", load);
  $("text").addEventListener("input", score);
}, (error) => setStatus(`Python failed to start: ${error.message}`, "error"));
