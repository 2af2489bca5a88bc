// The playground's output (web/main.mjs is the page): the console, the live loss chart, the
// demo's picture, the kernels panel, and the right column's boxes, each shown only once it
// has something in it. What a run prints and reports arrives through playground/bridge.mjs.

import { drawFigure } from "../figures.mjs";
import { LossChart } from "../losschart.mjs";
import { $, IDLE, page } from "./page.mjs";

const MAX_CONSOLE_LINES = 4000;   // lines kept in the console's DOM (older ones are dropped)
const MAX_CHART_POINTS = 20000;   // loss points kept for the chart (older ones thinned)

// --- the console: text arrives in chunks; appended once per frame; bounded -------------------
export const consoleBox = {
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
export const chart = new LossChart($("chart"), $("loss-now"), { maxPoints: MAX_CHART_POINTS });

// --- the picture ---------------------------------------------------------------------------
export const figure = { pending: null, scheduled: false, drawn: 0 };
export function showFigure(fig) {
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
export function showBoxes() {
  $("right-empty").hidden = !($("loss-box").hidden && $("figure-box").hidden &&
                              $("kernels-panel").hidden);
}

export function showChart() {
  if (!$("loss-box").hidden) return;
  $("loss-box").hidden = false;
  chart.resize();
  showBoxes();
}

// --- the kernels panel: every compiled model's kernels (WGSL, workgroups) and its IR --------
// models: webgrad_worker.describe_compiled's list; timeKernels (playground/run.mjs) fills
// each summary line's .gpu-time
export function showKernels(models) {
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
  $("time-kernels").disabled = !total || !IDLE.includes(page.state);
  $("ir").textContent = models.map((m) => `# ${m.name}\n${m.ir}`).join("\n\n");
}
