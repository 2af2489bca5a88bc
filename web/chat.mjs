// The chat and fine-tune page. Python (below, run once in the worker) holds the model, its
// tokenizer and the fine-tune; this file only draws what it reports.
//
// Model: the demo model (webgrad.models.llama_demo: a tiny SmolLM2-shaped Llama from a seed,
// built on the page at start), or files picked from disk: a .gguf (Llama.from_gguf_async +
// Tokenizer.from_gguf) or a safetensors folder's files (written to the worker's file system,
// then Llama.from_pretrained + Tokenizer.from_pretrained). Picked GGUF files and folders and
// fine-tuned models are kept in the browser's model cache (models/llama_cache.py over
// io/modelcache.py, and modelcache.mjs here; a GGUF as the file itself, its tokenizer in it),
// listed under the model and loaded back from it; the demo model (built in a second) and
// models fine-tuned from a GGUF file are not.
//
// Chat: the conversation goes through the tokenizer's chat template (jinja2, shipped to the
// worker by serve.py); chat_reply streams the reply with generate_stream_async and posts each
// token as a {type: "progress", what: "chat", token, text} event, `text` being the new
// characters (held back while a UTF-8 sequence is incomplete). Stop interrupts the worker
// (webgrad.interrupt(): the await inside the decode loop ends with KeyboardInterrupt); the
// tokens that arrived stay in the conversation.
//
// Fine-tune: webgrad.models.finetune.FineTune (LoRA on every linear layer) on the pasted text
// or pydoc_data.topics, in calls of a few steps each (Stop ends it after the current call);
// the held-out loss before and after, then the chat uses the merged model.
//
// Every model is made on backend "auto": WebGPU, or in a browser without it (or with only a
// software adapter, SwiftShader) the CPU backend ("wasm", onnxruntime-web in the worker);
// #model-info says when it runs on the CPU.
//
// For tests: window.webgrad, window.chat = {state, messages, losses, held}; #messages'
// assistant elements carry data-ids (the reply's token ids), #status data-state.
const PY = `
import markupsafe   # the worker installs serve.py's wheels when code names them, one per line
import jinja2
import os
import webgrad_worker
import json
from webgrad.models import llama, llama_demo, llama_cache, finetune
_chat = {}

def _drop(*keys):
    seen = set()
    for k in keys:
        m = _chat.pop(k, None)
        if m is not None and id(m) not in seen:
            seen.add(id(m))
            m.destroy() if k == "ft" else m.backend.destroy()

def _use(m, tok, name, keep=None, info=None):
    """keep: (tokenizer.json bytes, tokenizer_config) to store the model in the cache with."""
    _drop("ft", "tuned", "model")
    _chat.update(model=m, tok=tok, name=name, keep=keep)
    return {**_describe(m, tok, name), **(info or {})}

def _describe(m, tok, name):
    c = m.cfg
    return {"name": name, "model_type": c.model_type, "layers": c.num_hidden_layers,
            "hidden": c.hidden_size, "vocab": c.vocab_size, "n_ctx": c.n_ctx,
            "quantized": len(m.quant_full), "template": tok.chat_template is not None,
            "backend": m.backend.name}

async def _keep(m, name):
    """Store m in the browser's model cache: {key, kept} or {not_kept: why}."""
    if _chat.get("keep") is None:
        return {"not_kept": "a model fine-tuned from a GGUF file is not kept in the cache yet"}
    try:
        info = await llama_cache.store_async(llama_cache.Chat(m, *_chat["keep"]), name=name)
        return {"key": info["key"], "kept": True}
    except Exception as e:   # a full disk, quantized weights: the model is used all the same
        return {"not_kept": str(e)}

def chat_demo(seed):
    m = llama_demo.model(seed, backend="auto")   # rebuilt in a second: not cached
    keep = (json.dumps(llama_demo.tokenizer_spec()).encode(), llama_demo.tokenizer_config())
    return _use(m, llama_demo.tokenizer(), f"demo model (seed {seed})", keep)

async def chat_load_files(files):
    files = {n: bytes(b) for n, b in files.items()}
    gguf = [n for n in files if n.endswith(".gguf")]
    if gguf:
        data = files[gguf[0]]
        m = await llama.Llama.from_gguf_async(data, backend="auto")
        out = _use(m, llama.Tokenizer.from_gguf(data), gguf[0])
        try:     # the file itself is the cache's image (models/llama_cache.py)
            info = await llama_cache.store_async(llama_cache.Chat(m, b"", {}, gguf=data),
                                                 name=gguf[0])
            return {**out, "key": info["key"], "kept": True}
        except Exception as e:   # a full disk: the model is used all the same
            return {**out, "not_kept": str(e)}
    need = ["config.json", "tokenizer.json"]
    if not all(n in files for n in need) or not any(n.endswith(".safetensors") for n in files):
        raise ValueError("pick a .gguf file, or a model folder's files together: config.json, "
                         "its .safetensors (and model.safetensors.index.json for shards), "
                         "tokenizer.json and tokenizer_config.json (for the chat template)")
    folder = "/home/pyodide/chat-model"
    os.makedirs(folder, exist_ok=True)
    for old in os.listdir(folder):
        os.remove(os.path.join(folder, old))
    for n, b in files.items():
        with open(os.path.join(folder, os.path.basename(n)), "wb") as f:
            f.write(b)
    m = llama.Llama.from_pretrained(folder, backend="auto")
    tok = llama.Tokenizer.from_pretrained(folder)
    keep = (files["tokenizer.json"], json.loads(files.get("tokenizer_config.json", b"{}")))
    c = m.cfg
    name = f"model folder: {c.model_type}, {c.num_hidden_layers} layers, hidden {c.hidden_size}"
    out = _use(m, tok, name, keep)
    return {**out, **await _keep(m, name)}

async def chat_load_key(key):
    item, info = await llama_cache.load_key_async(key, backend="auto")
    keep = None if item.gguf is not None else (item.tokenizer_json, item.tokenizer_config)
    return _use(item.model, item.tokenizer(), info["name"], keep, {"key": key, "cached": True})

async def chat_reply(messages, max_new_tokens, temperature, seed=0):
    m, tok = _chat["tuned"] if "tuned" in _chat else _chat["model"], _chat["tok"]
    if tok.chat_template is None:
        raise ValueError("this model's tokenizer has no chat template: pick its "
                         "tokenizer_config.json with the other files")
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
    ids = tok.encode(prompt, add_special_tokens=False)   # the template writes the specials
    if len(ids) >= m.cfg.n_ctx:
        raise ValueError(f"the conversation is {len(ids)} tokens, the model's context "
                         f"{m.cfg.n_ctx}: press Clear to start a new one")
    out, sent = [], ""
    async for t in m.generate_stream_async(ids, max_new_tokens, temperature, seed=seed):
        out.append(t)
        text = tok.decode(out, skip_special_tokens=True)
        if not text.endswith("\\ufffd"):     # a UTF-8 sequence still incomplete: wait
            webgrad_worker.progress(what="chat", token=t, text=text[len(sent):])
            sent = text
        else:
            webgrad_worker.progress(what="chat", token=t, text="")
    return {"ids": out, "text": tok.decode(out, skip_special_tokens=True), "prompt": len(ids)}

async def ft_start(text, lr, seed=0):
    _chat["ft_text"] = "pasted text" if text else "pydoc topics"
    m = _chat["tuned"] if "tuned" in _chat else _chat["model"]
    if m.quant_full:
        raise ValueError("this model holds quantized weights; fine-tuning over them (QLoRA) "
                         "is not on this page yet: load its f16/f32 safetensors instead")
    _drop("ft")
    ft = finetune.FineTune(m, _chat["tok"], text or finetune.pydoc_text(), backend="auto",
                           lr=lr, seed=seed)
    _chat["ft"] = ft
    await ft.load_base_async()
    return {"tokens": len(ft.train_ids), "held": await ft.held_loss_async()}

async def ft_steps(k):
    ft = _chat["ft"]
    losses = await ft.steps_async(k)
    return {"step": ft.step, "losses": losses}

async def ft_finish():
    ft = _chat["ft"]
    held = await ft.held_loss_async()
    tuned = await ft.merged_async(backend="auto")
    old = _chat.pop("tuned", None)
    _chat["tuned"] = tuned
    if old is not None:
        old.backend.destroy()
    name = f"{_chat['name']} + LoRA, {ft.step} steps on {_chat['ft_text']}"
    step = ft.step
    _drop("ft")      # its GPU buffers: the merged model is what the chat uses
    return {"held": held, "step": step, "name": name, **await _keep(tuned, name)}
`;

import { startWebgrad } from "./webgrad.mjs";
import { LossChart, loadUIBundle } from "./losschart.mjs";
import * as modelCache from "./modelcache.mjs";

const $ = (id) => document.getElementById(id);
const webgrad = startWebgrad();
window.webgrad = webgrad;
window.modelCache = modelCache;
const chart = new LossChart($("ft-chart"), $("ft-now"), { height: 180 });
const messages = [];      // {role, content}: what the chat template sees
let state = "booting", stopRequested = false, reply = null;
const held = {};

function setState(next, text, kind = "busy") {
  state = next;
  Object.assign($("status"), { textContent: text, className: kind });
  $("status").dataset.state = next;
  const idle = next === "ready";
  for (const id of ["send", "ft-train", "demo", "files", "clear"]) $(id).disabled = !idle;
  $("stop").disabled = next !== "chatting";
  $("ft-stop").disabled = next !== "training" || stopRequested;
}
const failed = (error) => setState(webgrad.dead ? "dead" : "ready",
                                   `${error.type || "Error"}: ${error.message}`, "error");

// --- the model ------------------------------------------------------------------------------
// Where it runs, when that is not WebGPU (backend "auto" picks "wasm" in a browser without it,
// or whose only adapter is a software one)
const where = (backend) => backend === "wasm"
  ? "; runs on the CPU (WebAssembly: this browser offers no WebGPU, or only a software one)"
  : backend === "webgpu" || !backend ? "" : `; runs on ${backend}`;

async function useModel(what, call) {
  setState("loading", `Loading ${what}…`);
  try {
    const m = await call();
    clearChat();
    chart.clear();
    $("ft-held").textContent = "";
    $("model-info").textContent = `${m.name}: ${m.model_type}, ${m.layers} layers, hidden ` +
      `${m.hidden}, ${m.vocab} tokens, context ${m.n_ctx}` +
      (m.quantized ? `, ${m.quantized} quantized weights` : "") +
      (m.template ? "" : " (no chat template: chat needs one)") + where(m.backend);
    $("model-info").dataset.model = JSON.stringify(m);
    setState("ready", `Ready: ${m.name}` + (m.cached ? " (from this browser's cache)" : "") +
             (m.not_kept && m.template ? ` (not kept in the cache: ${m.not_kept})` : ""), "ok");
  } catch (error) {
    failed(error);
  }
  await showCache();
}

// --- models kept in this browser (modelcache.mjs; the surprisal page lists them too) ---------
async function showCache() {
  const ready = (act) => (e) => { if (state === "ready") act(e); };
  await modelCache.showTable($("cache"), {
    filter: (e) => e.meta?.model === "llama",
    columns: [(e) => e.name,
              (e) => `${e.meta.config.num_hidden_layers}×${e.meta.config.hidden_size}, ` +
                     `${e.meta.config.vocab_size} tokens`,
              (e) => `${(e.size / 1e6).toFixed(1)} MB`, (e) => new Date(e.created).toLocaleString()],
    actions: [["Load", ready((e) => useModel(e.name, () => webgrad.call("chat_load_key", [e.key])))],
              ["Delete", ready(async (e) => { await modelCache.remove(e.key); await showCache(); })]],
    note: $("cache-note"),
  });
}

async function loadFiles() {
  const picked = [...$("files").files];
  if (!picked.length) return;
  const files = {};
  for (const f of picked) files[f.name] = new Uint8Array(await f.arrayBuffer());
  await useModel(picked.map((f) => f.name).join(", "), () => webgrad.call("chat_load_files", [files]));
  $("files").value = "";
}

// --- the chat -------------------------------------------------------------------------------
function bubble(role, text) {
  const el = Object.assign(document.createElement("div"), { className: `msg ${role}` });
  el.append(Object.assign(document.createElement("span"), { className: "role", textContent: role }),
            Object.assign(document.createElement("span"), { className: "text", textContent: text }));
  $("messages").append(el);
  return el;
}

function clearChat() {
  messages.length = 0;
  $("messages").textContent = "";
}

webgrad.onEvent((msg) => {
  if (msg.type !== "progress" || msg.what !== "chat" || !reply) return;
  reply.ids.push(msg.token);
  reply.el.dataset.ids = JSON.stringify(reply.ids);
  if (msg.text) reply.el.querySelector(".text").textContent += msg.text;
  const box = $("messages");
  box.scrollTop = box.scrollHeight;
});

async function send() {
  const text = $("prompt").value.trim();
  if (!text || state !== "ready") return;
  messages.push({ role: "user", content: text });
  bubble("user", text);
  $("prompt").value = "";
  reply = { ids: [], el: bubble("assistant", "") };
  reply.el.dataset.ids = "[]";
  setState("chatting", "Answering…");
  const max = Math.max(1, Math.floor(Number($("max-tokens").value)));
  const temperature = Math.max(0, Number($("temperature").value));
  try {
    const r = await webgrad.call("chat_reply", [messages, max, temperature]);
    reply.el.querySelector(".text").textContent = r.text;
    messages.push({ role: "assistant", content: r.text });
    reply.el.dataset.done = "1";
    setState("ready", `Answered: ${r.ids.length} tokens after a prompt of ${r.prompt}`, "ok");
  } catch (error) {
    if (error.type === "KeyboardInterrupt" && !webgrad.dead) {
      messages.push({ role: "assistant", content: reply.el.querySelector(".text").textContent });
      reply.el.classList.add("stopped");
      reply.el.dataset.done = "stopped";
      setState("ready", `Stopped after ${reply.ids.length} tokens`, "ok");
    } else {
      messages.pop();
      failed(error);
    }
  } finally {
    reply = null;
  }
}

function stopChat() {
  if (state !== "chatting") return;
  setState("stopping", "Stopping…");
  webgrad.interrupt();
}

// --- the fine-tune --------------------------------------------------------------------------
const STEP_MS = 400;  // aim for calls this long: Stop answers within about that

async function fineTune() {
  if (state !== "ready") return;
  const steps = Math.max(1, Math.floor(Number($("ft-steps").value)));
  const lr = Number($("ft-lr").value);
  stopRequested = false;
  chart.clear();
  $("ft-chart").dataset.step = 0;
  $("ft-held").dataset.done = "";
  setState("training", "Fine-tuning: tokenizing the text and compiling…");
  try {
    await webgrad.run("import pydoc_data");   // installs the pydoc_data wheel (worker.mjs)
    const start = await webgrad.call("ft_start", [$("ft-text").value, lr]);
    held.before = start.held;
    $("ft-held").textContent = `held-out loss before: ${start.held.toFixed(3)} nats/token ` +
      `(${start.tokens} training tokens)`;
    let step = 0, perCall = 1;
    while (step < steps && !stopRequested) {
      const t0 = performance.now();
      const r = await webgrad.call("ft_steps", [Math.min(perCall, steps - step)]);
      perCall = Math.max(1, Math.min(50, Math.round(perCall * STEP_MS /
                                                    Math.max(performance.now() - t0, 1))));
      for (const loss of r.losses) chart.add(++step, loss);
      setState("training", `Fine-tuning: step ${step} of ${steps}`);
      $("ft-chart").dataset.step = step;
    }
    if (step === 0) {
      $("ft-held").textContent += "; stopped before the first step: the model is unchanged";
      setState("ready", "Stopped before the first step", "ok");
      return;
    }
    const end = await webgrad.call("ft_finish");
    held.after = end.held;
    $("ft-held").textContent = `held-out loss: ${held.before.toFixed(3)} before, ` +
      `${end.held.toFixed(3)} after ${end.step} steps (nats/token); the chat now uses the ` +
      "fine-tuned model";
    $("ft-held").dataset.done = "1";
    setState("ready", `Fine-tuned: ${end.step} steps` + (end.kept ? "; kept in this browser"
             : ` (not kept in the cache: ${end.not_kept})`), "ok");
    $("ft-held").dataset.key = end.key || "";
  } catch (error) {
    failed(error);
  }
  await showCache();
}

// --- start ----------------------------------------------------------------------------------
window.chat = {
  get state() { return state; },
  get messages() { return messages.map((m) => ({ ...m })); },
  get losses() { return chart.losses.slice(); },
  get held() { return { ...held }; },
};

async function start() {
  setState("booting", "Starting Python (Pyodide) in a worker…");
  loadUIBundle().then(({ ui }) => chart.init(ui.uPlot), (e) => {
    $("ft-now").textContent = `(no chart: the UI bundle did not load (${e.message}); run serve.py)`;
  });
  $("demo").addEventListener("click", () => {
    const seed = Math.max(0, Math.floor(Number($("demo-seed").value)));
    useModel(`the demo model (seed ${seed})`, () => webgrad.call("chat_demo", [seed]));
  });
  $("files").addEventListener("change", loadFiles);
  $("send").addEventListener("click", send);
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) send();
  });
  $("stop").addEventListener("click", stopChat);
  $("clear").addEventListener("click", clearChat);
  $("ft-train").addEventListener("click", fineTune);
  $("ft-stop").addEventListener("click", () => { stopRequested = true; setState(state, "Stopping after this call…"); });
  try {
    await webgrad.ready;
    await webgrad.run(PY);
  } catch (error) {
    const hint = /jinja2|markupsafe/.test(error.message || "")
      ? " (jinja2 is missing: pip install jinja2 where serve.py runs, and run serve.py again)" : "";
    setState("dead", `Python failed to start: ${error.message}${hint}`, "error");
    return;
  }
  document.body.dataset.ready = "1";
  const seed = Math.max(0, Math.floor(Number($("demo-seed").value)));
  await useModel("the demo model", () => webgrad.call("chat_demo", [seed]));
}

start();
