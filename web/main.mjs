// webgrad's playground: a Python editor (CodeMirror), Run/Stop, a console, a live loss chart
// (uPlot), the demo's picture, the compiled kernels, and weights download/upload. Python runs
// in the worker that webgrad.mjs starts; the page only draws what the worker reports.
//
// Keys: Ctrl-Enter (Cmd-Enter) or Shift-Enter runs, anywhere on the page and before the
// editor's own bindings; Escape stops a run. The editor's text is kept per example in
// localStorage (Reset code puts back the original); Share puts a link carrying the code
// (deflated, base64url, in the hash: #example=FILE&z=...) into the address bar, and a page
// opened on such a link starts with that code. While a run works the status says what it is
// doing: compiling (kernels generated, pipelines made, from the worker's "compile" events),
// then step N of M with steps/s and an ETA (from the progress events), with the time so far.
//
// For tests and the CPython driver the page exposes `window.webgrad` (webgrad.mjs's API) and
// `window.playground`: {state, code (get/set: a snippet, not kept), load(example file), run(),
// stop(), clearChart(), losses, steps, figures (count drawn), runs (count started)}.
// #status carries data-state: booting, ready, running, stopping, done, stopped, error, dead.

import { startWebgrad } from "./webgrad.mjs";
import { drawFigure } from "./figures.mjs";
import { LossChart, loadUIBundle } from "./losschart.mjs";

const MAX_CONSOLE_LINES = 4000;   // lines kept in the console's DOM (older ones are dropped)
const MAX_CHART_POINTS = 20000;   // loss points kept for the chart (older ones thinned)
const STORE_PREFIX = "webgrad.playground.code.";  // + example file: the edited text
const IDLE = ["ready", "done", "stopped", "error"];
const RUN_TITLE = "Run the code (Ctrl-Enter or Shift-Enter)";

const $ = (id) => document.getElementById(id);
const webgrad = startWebgrad();
window.webgrad = webgrad;

// --- the console: text arrives in chunks; appended once per frame; bounded -------------------
const consoleBox = {
  el: $("console"), queue: [], lines: 0, dropped: 0, scheduled: false,
  add(text, kind = "stdout") {
    if (!text) return;
    this.queue.push([text, kind]);
    if (!this.scheduled) {
      this.scheduled = true;
      requestAnimationFrame(() => this.render());
    }
  },
  render() {
    this.scheduled = false;
    if (!this.queue.length) return;
    const stick = this.el.scrollTop + this.el.clientHeight >= this.el.scrollHeight - 4;
    const fragment = document.createDocumentFragment();
    let span = null;
    for (const [text, kind] of this.queue) {
      if (!span || span.className !== kind) fragment.append(span = Object.assign(
        document.createElement("span"), { className: kind }));
      span.textContent += text;
      this.lines += (text.match(/\n/g) || []).length;
    }
    this.queue = [];
    this.el.append(fragment);
    // Drop whole spans from the front until at most MAX_CONSOLE_LINES lines remain.
    while (this.lines > MAX_CONSOLE_LINES && this.el.firstChild) {
      const first = this.el.firstChild;
      const n = (first.textContent.match(/\n/g) || []).length;
      if (first.classList?.contains("note")) { first.remove(); continue; }
      if (this.lines - n < MAX_CONSOLE_LINES / 2) {  // a huge span: cut its text instead
        const keep = first.textContent.split("\n").slice(-(MAX_CONSOLE_LINES / 2));
        this.dropped += n - keep.length + 1;
        this.lines -= n - keep.length + 1;
        first.textContent = keep.join("\n");
        break;
      }
      first.remove();
      this.lines -= n;
      this.dropped += n;
    }
    if (this.dropped) {
      const note = Object.assign(document.createElement("span"), { className: "note",
        textContent: `… ${this.dropped} earlier lines not shown\n` });
      this.el.prepend(note);
    }
    if (stick) this.el.scrollTop = this.el.scrollHeight;
  },
  clear() { this.el.textContent = ""; this.queue = []; this.lines = 0; this.dropped = 0; },
};

// --- the loss chart: uPlot if its bundle loaded, fed from progress events -------------------
const chart = new LossChart($("chart"), $("loss-now"), { maxPoints: MAX_CHART_POINTS });

// --- the picture ---------------------------------------------------------------------------
const figure = { pending: null, scheduled: false, drawn: 0 };
function showFigure(fig) {
  figure.pending = fig;
  if (figure.scheduled) return;
  figure.scheduled = true;
  requestAnimationFrame(() => {
    figure.scheduled = false;
    $("figure-box").hidden = false;
    $("figure-title").textContent = drawFigure($("figure"), figure.pending);
    figure.drawn++;
    showBoxes();
  });
}

// The right column shows a box only once it has something in it; before that, one line
// saying what will appear.
function showBoxes() {
  $("right-empty").hidden = !($("loss-box").hidden && $("figure-box").hidden &&
                              $("kernels-panel").hidden);
}

function showChart() {
  if (!$("loss-box").hidden) return;
  $("loss-box").hidden = false;
  chart.resize();
  showBoxes();
}

// --- status and buttons ----------------------------------------------------------------------
let state = "booting";
let hasModel = false;   // a compiled model lives in the worker (Download weights has one)
function setState(next, text, kind = "busy") {
  state = next;
  const status = $("status");
  status.textContent = text;
  status.title = `${text}\n(click to show it whole)`;  // a long message cut by "…" reads here
  status.className = kind;
  status.dataset.state = next;
  const idle = IDLE.includes(next);
  $("run").disabled = !idle;
  $("stop").disabled = next !== "running";
  $("save").disabled = !idle || !hasModel;
  $("save").title = hasModel
    ? "Download the model's weights and optimizer state (safetensors)"
    : "Run an example first: there is no model to download yet";
  $("load").disabled = !idle;
  $("time-kernels").disabled = !idle || !$("kernels").childElementCount;
  $("examples").disabled = !idle && next !== "booting";
}

// --- what a run is doing, for the status line --------------------------------------------------
const progress = { t0: 0, compile: null, step: null, total: null, first: null, shown: 0,
                   timer: null };

function progressText() {
  const p = progress;
  const seconds = (performance.now() - p.t0) / 1000;
  let text;
  if (p.step !== null) {
    const n = p.step + 1;
    text = `Training: step ${n}` + (p.total ? ` of ${p.total}` : "");
    const rate = rateOf(p);
    if (rate) {
      text += ` · ${rate.toPrecision(3)} steps/s`;
      if (p.total && p.total > n) text += ` · ETA ${duration((p.total - n) / rate)}`;
    }
  } else if (p.compile) {
    const { kernels, pipelines } = p.compile;
    text = `Compiling: ${kernels} kernels generated, ${pipelines} of ${kernels} pipelines created`;
  } else if (p.tracing) {
    text = "Tracing your code into the model's program (before its first kernel)…";
  } else {
    text = `Running ${runName()}…`;
  }
  return `${text} · ${duration(seconds)}`;
}

function rateOf(p) {  // steps per second since the first step reported
  if (!p.first || p.step <= p.first.step) return 0;
  const dt = (p.last - p.first.at) / 1000;
  return dt > 0 ? (p.step - p.first.step) / dt : 0;
}

function duration(s) {
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  return m < 60 ? `${m} min ${Math.round(s - 60 * m)} s` : `${Math.floor(m / 60)} h ${m % 60} min`;
}

function showProgress(force = false) {
  if (state !== "running") return;
  const now = performance.now();
  if (!force && now - progress.shown < 100) return;
  progress.shown = now;
  setState("running", progressText());
}

// --- the boot, for the status line: the worker's phase and the time since the page opened ----
const boot = { text: "Starting Python (Pyodide) in a worker…", timer: null };

function showBoot() {
  if (state !== "booting") {
    clearInterval(boot.timer);
    return;
  }
  setState("booting", `${boot.text} · ${duration(performance.now() / 1000)}`);
}

webgrad.onEvent((message) => {
  if (message.type === "boot") {
    boot.text = message.text;
    showBoot();
  } else if (message.type === "tracing") {
    progress.tracing = true;
    if (progress.compile === null) showProgress(true);
  } else if (message.type === "stdout" || message.type === "stderr") {
    consoleBox.add(message.text, message.type);
  } else if (message.type === "progress") {
    if (typeof message.loss === "number") {
      showChart();
      chart.add(message.step, message.loss);
    }
    if (message.figure) showFigure(message.figure);
    if (typeof message.step === "number") {
      const now = performance.now();
      const first = progress.step === null;
      progress.step = message.step;
      progress.last = now;
      if (typeof message.total === "number") progress.total = message.total;
      if (first) progress.first = { step: message.step, at: now };
      if (first && progress.compile) {  // compiled: the panel lists them when the run ends
        $("kernel-count").textContent = `(${progress.compile.kernels} kernels compiled)`;
      }
      showProgress(first);
    }
  } else if (message.type === "compile") {
    if (state !== "running") return;  // another caller's request (webgrad.run), not a Run
    const first = progress.compile === null;
    progress.compile = { kernels: message.kernels, pipelines: message.pipelines };
    $("kernels-panel").hidden = false;
    showBoxes();
    $("kernel-count").textContent = `(compiling: ${message.kernels} kernels, ` +
      `${message.pipelines} pipelines made)`;
    if (progress.step === null) showProgress(first);
  } else if (message.type === "weights") {
    pendingWeights = null;
    $("run").title = RUN_TITLE;
    progress.weights = message.used;
  }
});

// --- the editor ------------------------------------------------------------------------------
let editor = null;   // CodeMirror EditorView, or a <textarea> if the bundle failed to load
let errorMark = null;  // {effect, view}: marks the line a traceback ends in (CodeMirror only)
const originals = {};  // example file -> its text as served
let setting = false;   // code.set is writing: not an edit of the person's
const code = {
  get() { return editor?.state ? editor.state.doc.toString() : editor?.value ?? ""; },
  set(text) {
    setting = true;
    try {
      if (editor?.state) editor.dispatch({ changes: { from: 0, to: editor.state.doc.length, insert: text } });
      else if (editor) editor.value = text;
    } finally {
      setting = false;
    }
    updateReset();
  },
};

// What tracebacks call the code: the example's file while it is unchanged, else "your code".
function runName() {
  const file = $("examples").value;
  return file && originals[file] === code.get() ? file : "your code";
}

// The person's edits of an example are kept in localStorage (a moment after the last key).
let storeTimer = null;
function edited() {
  if (setting) return;
  clearErrorLine();
  if (/[#&]z=|[#&]code=/.test(location.hash)) {  // the shared link no longer says what is here
    history.replaceState(null, "", location.pathname + location.search);
  }
  clearTimeout(storeTimer);
  storeTimer = setTimeout(storeEdit, 300);
  updateReset();
}

function storeEdit() {
  const file = $("examples").value;
  if (!(file in originals)) return;
  try {
    const text = code.get();
    if (text === originals[file]) localStorage.removeItem(STORE_PREFIX + file);
    else localStorage.setItem(STORE_PREFIX + file, text);
  } catch (e) {  // storage full or disabled: the edit lives on in the editor only
    console.warn("playground: the edit was not stored", e);
  }
}

function updateReset() {
  const file = $("examples").value;
  $("reset").disabled = !(file in originals) || code.get() === originals[file];
}

function errorLineExtension(ui) {
  const { StateEffect, StateField, Decoration, EditorView } = ui;
  const effect = StateEffect.define();
  const line = Decoration.line({ class: "cm-error-line" });
  const field = StateField.define({
    create: () => Decoration.none,
    update(marks, tr) {
      marks = marks.map(tr.changes);
      for (const e of tr.effects) {
        if (e.is(effect)) marks = e.value === null ? Decoration.none
          : Decoration.set([line.range(tr.state.doc.line(e.value).from)]);
      }
      return marks;
    },
    provide: (f) => EditorView.decorations.from(f),
  });
  errorMark = { effect, scroll: EditorView.scrollIntoView };
  return field;
}

function markErrorLine(n) {
  if (!n || !editor) return;
  if (editor.state && errorMark) {
    const doc = editor.state.doc;
    const line = doc.line(Math.min(Math.max(1, n), doc.lines));
    editor.dispatch({ effects: [errorMark.effect.of(line.number),
                                errorMark.scroll(line.from, { y: "center" })] });
  } else if (!editor.state) {  // the plain text area: select the line
    const lines = editor.value.split("\n");
    const from = lines.slice(0, n - 1).join("\n").length + (n > 1 ? 1 : 0);
    editor.setSelectionRange(from, from + (lines[n - 1] ?? "").length);
  }
}

function clearErrorLine() {
  if (editor?.state && errorMark) editor.dispatch({ effects: errorMark.effect.of(null) });
}

async function loadUI() {
  try {
    const { manifest, ui } = await loadUIBundle();
    const { EditorView, basicSetup, python, uPlot } = ui;
    editor = new EditorView({
      parent: $("editor"),
      extensions: [basicSetup, python(), errorLineExtension(ui),
                   EditorView.updateListener.of((u) => { if (u.docChanged) edited(); })],
    });
    chart.init(uPlot);
    return manifest;
  } catch (e) {
    // Without the bundle the page still works: a plain text area, no chart.
    editor = Object.assign(document.createElement("textarea"),
      { rows: 24, spellcheck: false, style: "width:100%;height:100%" });
    $("editor").append(editor);
    editor.addEventListener("input", edited);
    consoleBox.add(`the editor/chart bundle did not load (${e.message}); run serve.py to ` +
                   "provision it\n", "stderr");
    return (await fetch("assets/manifest.json").then((r) => r.json()).catch(() => ({})));
  }
}

// Shows an example: the person's edited text if one is kept, else the file as served
// (`original`: always the file).
async function loadExample(file, { original = false } = {}) {
  if (!(file in originals)) {
    const response = await fetch(`examples/${file}`);
    if (!response.ok) throw new Error(`examples/${file}: HTTP ${response.status}`);
    originals[file] = await response.text();
  }
  let kept = null;
  try {
    if (original) localStorage.removeItem(STORE_PREFIX + file);
    else kept = localStorage.getItem(STORE_PREFIX + file);
  } catch { /* no storage: the original */ }
  if (file !== $("examples").value && $("figure-box")) $("figure-box").hidden = true;
  $("examples").value = file;
  code.set(kept ?? originals[file]);
  clearErrorLine();
  showBoxes();
}

// --- share links: #example=FILE&z=<deflate-raw, base64url> (or code=<UTF-8, base64url>
// where the browser has no CompressionStream) -----------------------------------------------
const base64url = (bytes) => {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
};
const unbase64url = (text) => Uint8Array.from(
  atob(text.replaceAll("-", "+").replaceAll("_", "/")), (c) => c.charCodeAt(0));

async function shareURL(text) {
  const params = new URLSearchParams();
  if ($("examples").value) params.set("example", $("examples").value);
  const bytes = new TextEncoder().encode(text);
  if (globalThis.CompressionStream) {
    const packed = new Blob([bytes]).stream().pipeThrough(new CompressionStream("deflate-raw"));
    params.set("z", base64url(new Uint8Array(await new Response(packed).arrayBuffer())));
  } else {
    params.set("code", base64url(bytes));
  }
  return `${location.origin}${location.pathname}${location.search}#${params}`;
}

async function sharedCode(hash) {
  const params = new URLSearchParams(hash.replace(/^#/, ""));
  let bytes;
  if (params.has("z")) {
    const stream = new Blob([unbase64url(params.get("z"))]).stream()
      .pipeThrough(new DecompressionStream("deflate-raw"));
    bytes = new Uint8Array(await new Response(stream).arrayBuffer());
  } else if (params.has("code")) {
    bytes = unbase64url(params.get("code"));
  } else {
    return null;
  }
  return { example: params.get("example"), text: new TextDecoder().decode(bytes) };
}

async function share() {
  const url = await shareURL(code.get());
  history.replaceState(null, "", url);
  let copied = false;
  try {  // the clipboard may be refused (no permission, page not focused): the address bar has it
    await Promise.race([navigator.clipboard.writeText(url),
                        new Promise((_, reject) => setTimeout(reject, 1000))]);
    copied = true;
  } catch { /* the address bar has it */ }
  setState(state, `Share link ${copied ? "copied to the clipboard and " : ""}put in the ` +
           `address bar (${url.length} characters): opening it shows this code`, "ok");
}

async function openShared(hash) {
  let shared;
  try {
    shared = await sharedCode(hash);
  } catch (e) {
    consoleBox.add(`this page's link carries code that does not decode (${e.message}); ` +
                   "showing the example instead\n", "stderr");
    return false;
  }
  if (!shared) return false;
  if (shared.example && [...$("examples").options].some((o) => o.value === shared.example)) {
    await loadExample(shared.example);
  }
  code.set(shared.text);
  return true;
}

// --- run / stop ------------------------------------------------------------------------------
async function refreshKernels() {
  let models = [];
  try {
    models = await webgrad.call("webgrad_worker.describe_compiled");
  } catch (e) {
    return;
  }
  hasModel = models.length > 0;
  setState(state, $("status").textContent, $("status").className);  // Download weights
  $("kernels-panel").hidden = !models.length;
  showBoxes();
  const box = $("kernels");
  box.textContent = "";
  let total = 0;
  for (const m of models) {
    const head = document.createElement("p");
    head.textContent = `${m.name}: backend ${m.backend}, ${m.kernel_count} kernels per step, ` +
      `params ${Object.entries(m.params).map(([k, s]) => `${k}[${s}]`).join(" ")}`;
    box.append(head);
    for (const k of m.kernels) {
      const d = document.createElement("details");
      d.className = "kernel";
      const s = document.createElement("summary");
      s.textContent = `${total + 1}. ${k.label}  [${k.workgroups.join("×")} workgroups]`;
      const time = Object.assign(document.createElement("span"), { className: "gpu-time" });
      s.append(time);  // filled by timeKernels()
      const pre = document.createElement("pre");
      pre.textContent = k.wgsl;
      d.append(s, pre);
      box.append(d);
      total++;
    }
  }
  $("kernel-count").textContent = models.length ? `(${total} dispatches per step)` : "";
  $("kernel-timing").textContent = "";
  $("time-kernels").disabled = !total || !IDLE.includes(state);
  $("ir").textContent = models.map((m) => `# ${m.name}\n${m.ir}`).join("\n\n");
}

let runs = 0;  // runs started (window.playground.runs)
async function run() {
  if ($("run").disabled) return;
  runs++;
  consoleBox.clear();
  chart.clear();
  clearErrorLine();
  // what the previous run showed is not this run's: its boxes go until this one fills them
  $("loss-box").hidden = $("figure-box").hidden = true;
  showBoxes();
  $("kernel-count").textContent = "";
  $("kernels").textContent = "";
  $("ir").textContent = "";
  $("kernel-timing").textContent = "";
  Object.assign(progress, { t0: performance.now(), compile: null, tracing: false, step: null,
                            total: null, first: null, shown: 0, weights: null });
  const name = runName();
  setState("running", `Running ${name}…`);
  progress.timer = setInterval(() => showProgress(true), 500);  // the time so far
  try {
    const value = await webgrad.run(code.get(), { name, show: true });
    if (value !== null && value !== undefined) consoleBox.add(`${value}\n`, "result");
    const steps = progress.step === null ? "" : `: ${progress.step + 1} steps` +
      (rateOf(progress) ? `, ${rateOf(progress).toPrecision(3)} steps/s` : "");
    const from = progress.weights ? ` (started from the loaded ${progress.weights})` : "";
    setState("done", `Done in ${duration((performance.now() - progress.t0) / 1000)}${steps}${from}`,
             "ok");
  } catch (error) {
    if (error.type === "KeyboardInterrupt" && state === "stopping" && !webgrad.dead) {
      // Stop is a normal end: no traceback, the log stays, the status says where it stopped
      const n = progress.step === null ? 0 : progress.step + 1;
      const where = n ? `Stopped at step ${n}` + (progress.total ? ` of ${progress.total}` : "")
        : progress.compile ? "Stopped while compiling, before the first step"
        : "Stopped before any training step";
      consoleBox.add(`[${where.toLowerCase()}]\n`, "info");
      setState("stopped", n ? `${where}: the model keeps the weights of that step` : where, "ok");
    } else {
      const traceback = error.traceback || `${error.type}: ${error.message}\n`;
      consoleBox.add(traceback.endsWith("\n") ? traceback : traceback + "\n", "error");
      markErrorLine(error.line);
      if (webgrad.dead) setState("dead", `${error.type}: ${error.message}`, "error");
      else setState("error", `${error.type}: ${error.message}`, "error");
    }
  } finally {
    clearInterval(progress.timer);
  }
  await refreshKernels();
}

function stop() {
  if (state !== "running") return;
  setState("stopping", "Stopping at the end of the current step…");
  webgrad.interrupt();
}

// Ctrl-Enter / Cmd-Enter / Shift-Enter run and Escape stops, wherever the focus is: listened
// for on the document in the capture phase, before the editor's own keymap (its Mod-Enter
// inserts a blank line). Escape goes on to the editor when nothing runs (it closes panels).
function onKey(event) {
  if (event.key === "Enter" && !event.altKey && (event.ctrlKey || event.metaKey || event.shiftKey)) {
    event.preventDefault();
    event.stopPropagation();
    run();
  } else if (event.key === "Escape" && state === "running") {
    event.preventDefault();
    event.stopPropagation();
    stop();
  }
}

// GPU time of every kernel: the worker profiles one step of the newest model on its last batch
// and puts the weights back (webgrad_worker.time_kernels); each summary line gets its time.
async function timeKernels() {
  const button = $("time-kernels");
  button.disabled = true;
  $("kernel-timing").textContent = "timing…";
  try {
    const { name, timing, total_ms: total, kernels } =
      await webgrad.call("webgrad_worker.time_kernels");
    const spans = [...document.querySelectorAll("#kernels .gpu-time")];
    spans.forEach((span, i) => {
      const ms = kernels[i];
      span.textContent = ms === null || ms === undefined ? "" : `  ${ms.toFixed(3)} ms`;
    });
    const how = timing === "timestamp" ? "GPU timestamps" : "each kernel submitted alone";
    $("kernel-timing").textContent = `${name}: ${total === null ? "-" : total.toFixed(2)} ms ` +
      `of kernels per step (${how})`;
  } catch (error) {
    $("kernel-timing").textContent = `cannot time the kernels: ${error.message}`;
  } finally {
    button.disabled = !IDLE.includes(state);
  }
}

// --- weights ---------------------------------------------------------------------------------
async function saveWeights() {
  try {
    const { name, data } = await webgrad.call("webgrad_worker.weights_save");
    const blob = new Blob([data], { type: "application/octet-stream" });
    const a = Object.assign(document.createElement("a"), {
      href: URL.createObjectURL(blob),
      download: `${($("examples").value || "snippet").replace(/\.py$/, "")}-${name}.safetensors` });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
    setState(state, `Downloaded the weights of ${name} (${data.length} bytes)`, "ok");
  } catch (error) {
    setState(state, `Cannot download weights: ${error.message}`, "error");
  }
}

// The worker keeps the file for the next Run's model (webgrad_worker.weights_load) and loads
// it into the current model if it fits.
let pendingWeights = null;  // the file name, until a run's model started from it (Run's tooltip)
async function loadWeights(file) {
  try {
    const bytes = new Uint8Array(await file.arrayBuffer());
    const { name, params, misfit } = await webgrad.call("webgrad_worker.weights_load",
                                                        [bytes, file.name]);
    pendingWeights = file.name;
    $("run").title = `${RUN_TITLE}; its model starts from ${file.name}`;
    const now = name ? ` into ${name} (${params} parameters)` : "";
    const other = misfit ? ` (it does not fit the current model: ${misfit})` : "";
    setState(state, `Loaded ${file.name}${now}: the next Run starts its model from these ` +
             `weights and optimizer state${other}`, "ok");
  } catch (error) {
    setState(state, `Cannot load ${file.name}: ${error.message}`, "error");
  }
}

// --- WebGPU check: say plainly what is missing instead of failing later ---------------------
async function checkWebGPU() {
  let problem = null;
  if (!globalThis.isSecureContext) {
    problem = "this page is not a secure context (WebGPU needs https or http://localhost; " +
      "open it through localhost, e.g. with an SSH tunnel)";
  } else if (!navigator.gpu) {
    problem = "this browser has no WebGPU (navigator.gpu is missing)";
  } else {
    try {
      if (!(await navigator.gpu.requestAdapter())) problem = "WebGPU found no GPU adapter";
    } catch (e) {
      problem = `WebGPU failed: ${e.message}`;
    }
  }
  if (!problem) return true;
  const banner = $("nogpu");
  banner.textContent = `WebGPU is unavailable: ${problem}. Programs on backend="auto" run on ` +
    "the CPU instead (backend=\"wasm\": ONNX Runtime's WebAssembly, slower); backend=\"webgpu\" " +
    "cannot run. For the GPU use Chrome or Edge 113+, Firefox 141+ or Safari 26+; " +
    "in Chromium on Linux enable chrome://flags/#enable-unsafe-webgpu (or start it with " +
    "--enable-unsafe-webgpu --enable-features=Vulkan), and check chrome://gpu for a blocklisted GPU.";
  banner.hidden = false;
  return false;
}

// --- start -----------------------------------------------------------------------------------
async function start() {
  showBoot();
  boot.timer = setInterval(showBoot, 500);  // the time so far
  const [manifest] = await Promise.all([loadUI(), checkWebGPU()]);
  const select = $("examples");
  for (const ex of manifest.examples || []) {
    select.append(Object.assign(document.createElement("option"),
      { value: ex.file, textContent: `${ex.file} — ${ex.title}` }));
  }
  select.addEventListener("change", () => loadExample(select.value).catch((e) =>
    setState(state, `Cannot load the example: ${e.message}`, "error")));
  if (manifest.examples?.length) await loadExample(manifest.examples[0].file);
  const fromLink = await openShared(location.hash);
  window.addEventListener("hashchange", () => openShared(location.hash));
  document.addEventListener("keydown", onKey, { capture: true });
  $("status").addEventListener("click", () => $("status").classList.toggle("expanded"));
  $("status").addEventListener("keydown", (e) => {
    const plain = !e.ctrlKey && !e.shiftKey && !e.metaKey;  // (those run the code)
    if (e.key === "Enter" && plain) $("status").classList.toggle("expanded");
  });
  $("reset").addEventListener("click", () => {
    history.replaceState(null, "", location.pathname + location.search);  // no shared code
    loadExample(select.value, { original: true });
  });
  $("share").addEventListener("click", () => share().catch((e) =>
    setState(state, `Cannot make a share link: ${e.message}`, "error")));
  $("run").addEventListener("click", run);
  $("stop").addEventListener("click", stop);
  $("save").addEventListener("click", saveWeights);
  $("time-kernels").addEventListener("click", timeKernels);
  $("load").addEventListener("click", () => $("load-file").click());
  $("load-file").addEventListener("change", (e) => {
    if (e.target.files[0]) loadWeights(e.target.files[0]);
    e.target.value = "";
  });
  try {
    const info = await webgrad.ready;
    clearInterval(boot.timer);
    setState("ready", `Ready in ${duration(performance.now() / 1000)}: Python ${info.python_version}, webgrad ${info.webgrad_version}` +
      (info.jspi ? "" : " (no JSPI: WebGPU calls cannot block)") +
      (fromLink ? "; the code is the shared link's (Reset code puts back the example)" : ""), "ok");
  } catch (error) {
    setState("dead", `Python failed to start: ${error.message}`, "error");
  }
}

window.playground = {
  get state() { return state; },
  get code() { return code.get(); },
  set code(text) { code.set(text); },
  load: loadExample, run, stop, clearChart: () => chart.clear(),
  get losses() { return chart.losses.slice(); },
  get steps() { return chart.steps.slice(); },
  get figures() { return figure.drawn; },
  get runs() { return runs; },
  started: start(),
};
