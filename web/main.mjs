// webgrad's playground: a Python editor (CodeMirror), Run/Stop, a console, a live loss chart
// (uPlot), the demo's picture, the compiled kernels, and weights download/upload. Python runs
// in the worker that webgrad.mjs starts; the page only draws what the worker reports.
//
// For tests and the CPython driver the page exposes `window.webgrad` (webgrad.mjs's API) and
// `window.playground`: {state, code (get/set), load(example file), run(), stop(), clearChart(), losses,
// steps, figures (count drawn)}. #status carries data-state: booting, ready, running,
// stopping, done, stopped, error, dead.

import { startWebgrad } from "./webgrad.mjs";
import { drawFigure } from "./figures.mjs";
import { LossChart, loadUIBundle } from "./losschart.mjs";

const MAX_CONSOLE_LINES = 4000;   // lines kept in the console's DOM (older ones are dropped)
const MAX_CHART_POINTS = 20000;   // loss points kept for the chart (older ones thinned)

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
    $("figure-title").textContent = drawFigure($("figure"), figure.pending);
    figure.drawn++;
  });
}

// --- status and buttons ----------------------------------------------------------------------
let state = "booting";
function setState(next, text, kind = "busy") {
  state = next;
  const status = $("status");
  status.textContent = text;
  status.className = kind;
  status.dataset.state = next;
  const idle = ["ready", "done", "stopped", "error"].includes(next);
  $("run").disabled = !idle;
  $("stop").disabled = next !== "running";
  $("save").disabled = $("load").disabled = !idle;
  $("time-kernels").disabled = !idle || !$("kernels").childElementCount;
  $("examples").disabled = !idle && next !== "booting";
}

webgrad.onEvent((message) => {
  if (message.type === "stdout" || message.type === "stderr") {
    consoleBox.add(message.text, message.type);
  } else if (message.type === "progress") {
    if (typeof message.loss === "number") chart.add(message.step, message.loss);
    if (message.figure) showFigure(message.figure);
  }
});

// --- the editor ------------------------------------------------------------------------------
let editor = null;   // CodeMirror EditorView, or a <textarea> if the bundle failed to load
let currentFile = "snippet.py";
const code = {
  get() { return editor?.state ? editor.state.doc.toString() : editor?.value ?? ""; },
  set(text) {
    if (editor?.state) editor.dispatch({ changes: { from: 0, to: editor.state.doc.length, insert: text } });
    else if (editor) editor.value = text;
  },
};

async function loadUI() {
  try {
    const { manifest, ui } = await loadUIBundle();
    const { EditorView, basicSetup, keymap, python, uPlot } = ui;
    editor = new EditorView({
      parent: $("editor"),
      extensions: [basicSetup, python(),
                   keymap.of([{ key: "Mod-Enter", run: () => { run(); return true; } }])],
    });
    chart.init(uPlot);
    return manifest;
  } catch (e) {
    // Without the bundle the page still works: a plain text area, no chart.
    editor = Object.assign(document.createElement("textarea"),
      { rows: 24, spellcheck: false, style: "width:100%;height:100%" });
    $("editor").append(editor);
    consoleBox.add(`the editor/chart bundle did not load (${e.message}); run serve.py to ` +
                   "provision it\n", "stderr");
    return (await fetch("assets/manifest.json").then((r) => r.json()).catch(() => ({})));
  }
}

async function loadExample(file) {
  const response = await fetch(`examples/${file}`);
  if (!response.ok) throw new Error(`examples/${file}: HTTP ${response.status}`);
  code.set(await response.text());
  currentFile = file;
  $("examples").value = file;
}

// --- run / stop ------------------------------------------------------------------------------
function show(value) {
  if (typeof value === "string") return value;
  return JSON.stringify(value, (key, v) => ArrayBuffer.isView(v)
    ? `<${v.constructor.name}(${v.length})>` : typeof v === "bigint" ? v.toString() : v, 2);
}

async function refreshKernels() {
  let models = [];
  try {
    models = await webgrad.call("webgrad_worker.describe_compiled");
  } catch (e) {
    return;
  }
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
  $("time-kernels").disabled = !total || !["ready", "done", "stopped", "error"].includes(state);
  $("ir").textContent = models.map((m) => `# ${m.name}\n${m.ir}`).join("\n\n");
}

async function run() {
  if ($("run").disabled) return;
  consoleBox.clear();
  chart.clear();
  setState("running", `Running ${currentFile}…`);
  const t0 = performance.now();
  try {
    const value = await webgrad.run(code.get());
    if (value !== null && value !== undefined) consoleBox.add(`=> ${show(value)}\n`, "result");
    setState("done", `Done in ${((performance.now() - t0) / 1000).toFixed(1)} s`, "ok");
  } catch (error) {
    const traceback = (error.traceback || `${error.type}: ${error.message}\n`)
      .replaceAll(/File "<run-\d+>"/g, `File "${currentFile}"`);
    consoleBox.add(traceback.endsWith("\n") ? traceback : traceback + "\n", "error");
    if (webgrad.dead) setState("dead", `${error.type}: ${error.message}`, "error");
    else if (error.type === "KeyboardInterrupt" && state === "stopping") {
      setState("stopped", "Stopped: the model keeps the weights of its last completed step", "ok");
    } else setState("error", `${error.type}: ${error.message}`, "error");
  }
  await refreshKernels();
}

function stop() {
  if (state !== "running") return;
  setState("stopping", "Stopping at the end of the current step…");
  webgrad.interrupt();
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
    button.disabled = !["ready", "done", "stopped", "error"].includes(state);
  }
}

// --- weights ---------------------------------------------------------------------------------
async function saveWeights() {
  try {
    const { name, data } = await webgrad.call("webgrad_worker.weights_save");
    const blob = new Blob([data], { type: "application/octet-stream" });
    const a = Object.assign(document.createElement("a"), {
      href: URL.createObjectURL(blob),
      download: `${currentFile.replace(/\.py$/, "")}-${name}.safetensors` });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
    setState(state, `Downloaded the weights of ${name} (${data.length} bytes)`, "ok");
  } catch (error) {
    setState(state, `Cannot download weights: ${error.message}`, "error");
  }
}

async function loadWeights(file) {
  try {
    const bytes = new Uint8Array(await file.arrayBuffer());
    const { name, params } = await webgrad.call("webgrad_worker.weights_load", [bytes]);
    setState(state, `Loaded ${file.name} into ${name} (${params} parameters)`, "ok");
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
  setState("booting", "Starting Python (Pyodide) in a worker…");
  const [manifest] = await Promise.all([loadUI(), checkWebGPU()]);
  const select = $("examples");
  for (const ex of manifest.examples || []) {
    select.append(Object.assign(document.createElement("option"),
      { value: ex.file, textContent: `${ex.file} — ${ex.title}` }));
  }
  select.addEventListener("change", () => loadExample(select.value).catch((e) =>
    setState(state, `Cannot load the example: ${e.message}`, "error")));
  if (manifest.examples?.length) await loadExample(manifest.examples[0].file);
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
    setState("ready", `Ready: Python ${info.python_version}, webgrad ${info.webgrad_version}` +
      (info.jspi ? "" : " (no JSPI: WebGPU calls cannot block)"), "ok");
  } catch (error) {
    setState("dead", `Python failed to start: ${error.message}`, "error");
  }
}

window.playground = {
  get state() { return state; },
  get code() { return code.get(); },
  set code(text) { code.set(text); currentFile = "snippet.py"; },
  load: loadExample, run, stop, clearChart: () => chart.clear(),
  get losses() { return chart.losses.slice(); },
  get steps() { return chart.steps.slice(); },
  get figures() { return figure.drawn; },
  started: start(),
};
