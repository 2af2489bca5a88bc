// The playground's bridge to the worker (web/main.mjs is the page): starts webgrad's worker
// (webgrad.mjs; `window.webgrad` for tests and the CPython driver) and turns its events into
// the page: console text, loss points and pictures (playground/output.mjs), and the status
// line while a run works: compiling (kernels generated, pipelines made, from the "compile"
// events), then step N of M with steps/s and an ETA (from the "progress" events), with the
// time so far; while Python boots, the worker's phase and the time since the page opened.

import { startWebgrad } from "../webgrad.mjs";
import { runName } from "./editor.mjs";
import { chart, consoleBox, showBoxes, showChart, showFigure } from "./output.mjs";
import { $, RUN_TITLE, duration, page, setState } from "./page.mjs";

export const webgrad = startWebgrad();
window.webgrad = webgrad;

// --- what a run is doing, for the status line --------------------------------------------------
export const progress = { t0: 0, compile: null, step: null, total: null, first: null, shown: 0,
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

export function rateOf(p) {  // steps per second since the first step reported
  if (!p.first || p.step <= p.first.step) return 0;
  const dt = (p.last - p.first.at) / 1000;
  return dt > 0 ? (p.step - p.first.step) / dt : 0;
}

export function showProgress(force = false) {
  if (page.state !== "running") return;
  const now = performance.now();
  if (!force && now - progress.shown < 100) return;
  progress.shown = now;
  setState("running", progressText());
}

// --- the boot, for the status line: the worker's phase and the time since the page opened ----
export const boot = { text: "Starting Python (Pyodide) in a worker…", timer: null };

export function showBoot() {
  if (page.state !== "booting") {
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
    if (page.state !== "running") return;  // another caller's request (webgrad.run), not a Run
    const first = progress.compile === null;
    progress.compile = { kernels: message.kernels, pipelines: message.pipelines };
    $("kernels-panel").hidden = false;
    showBoxes();
    $("kernel-count").textContent = `(compiling: ${message.kernels} kernels, ` +
      `${message.pipelines} pipelines made)`;
    if (progress.step === null) showProgress(first);
  } else if (message.type === "weights") {  // a run's model started from loaded weights
    $("run").title = RUN_TITLE;
    progress.weights = message.used;
  }
});
