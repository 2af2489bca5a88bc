// A live loss chart (uPlot from the UI bundle that serve.py builds, web/ui.src.mjs): points
// arrive one by one, the plot is redrawn at most once per frame, old points are thinned past
// maxPoints. Used by the playground (playground/output.mjs) and the chat page's fine-tune (chat.mjs).
//
//   const chart = new LossChart(el, nowEl);   chart.init(uPlot);   // without init: no plot
//   chart.add(step, loss); chart.clear(); chart.resize(); chart.steps, chart.losses
// Hovering the plot shows the step and loss under the cursor (a .chart-tip inside it).
//   loadUIBundle() -> the bundle's exports ({uPlot, EditorView, ...}) and the manifest

export async function loadUIBundle() {
  const manifest = await (await fetch("assets/manifest.json")).json();
  return { manifest, ui: await import(`./assets/${manifest.ui_bundle}`) };
}

export class LossChart {
  constructor(el, nowEl, { maxPoints = 20000, label = "loss", height = 220 } = {}) {
    Object.assign(this, { el, nowEl, maxPoints, label, height });
    this.steps = []; this.losses = []; this.plot = null; this.scheduled = false;
  }

  init(uPlot) {
    // the axes' text in the page's own colour (style.css: light or dark theme); faint grey
    // grid lines, which read on either background
    const text = getComputedStyle(this.el).color, faint = "rgba(128, 128, 128, 0.2)";
    const axis = (label) => ({ label, stroke: text, grid: { stroke: faint, width: 1 },
                               ticks: { stroke: faint, width: 1 } });
    this.plot = new uPlot({
      width: Math.max(200, this.el.clientWidth || 500), height: this.height,
      scales: { x: { time: false }, y: { distr: 3 } },   // log-scale loss
      axes: [axis("step"), axis(this.label)],
      series: [{ label: "step" }, { label: this.label, stroke: "#0969da", width: 1.5 }],
      legend: { show: false },
      hooks: { setCursor: [(u) => this.hover(u)] },
    }, [[], []], this.el);
    this.tip = Object.assign(document.createElement("div"), { className: "chart-tip", hidden: true });
    this.plot.over.append(this.tip);
    // follow the column's width (a phone turned, the window resized, columns stacked)
    new ResizeObserver(() => this.resize()).observe(this.el);
  }

  /** The point under the cursor, as text beside it (uPlot's setCursor hook). */
  hover(u) {
    const i = u.cursor.idx;
    const [steps, losses] = u.data;
    if (i == null || u.cursor.left < 0 || losses[i] == null) { this.tip.hidden = true; return; }
    this.tip.textContent = `step ${steps[i]}  ${this.label} ${losses[i].toPrecision(4)}`;
    this.tip.hidden = false;
    const left = Math.min(u.cursor.left + 10, u.over.clientWidth - this.tip.offsetWidth);
    Object.assign(this.tip.style, { left: `${Math.max(0, left)}px`,
                                    top: `${Math.max(0, u.cursor.top - 24)}px` });
  }

  /** Fit the plot to its element's width again (after it was hidden, or the window resized). */
  resize() {
    const width = Math.max(200, this.el.clientWidth || 500);
    if (this.plot && width !== this.plot.width) this.plot.setSize({ width, height: this.height });
  }

  add(step, loss) {
    if (!Number.isFinite(loss) || loss <= 0) return;
    this.steps.push(step ?? this.steps.length);
    this.losses.push(loss);
    if (this.losses.length > this.maxPoints) {  // keep every other old point
      const half = this.maxPoints / 2;
      const thin = (a) => a.slice(0, half).filter((_, i) => i % 2 === 0).concat(a.slice(half));
      this.steps = thin(this.steps); this.losses = thin(this.losses);
    }
    if (this.nowEl) this.nowEl.textContent = `${loss.toPrecision(4)} at step ${step}`;
    if (!this.scheduled) {
      this.scheduled = true;
      requestAnimationFrame(() => {
        this.scheduled = false;
        this.plot?.setData([this.steps, this.losses]);
      });
    }
  }

  clear() {
    this.steps = []; this.losses = [];
    if (this.nowEl) this.nowEl.textContent = "";
    this.plot?.setData([[], []]);
  }
}
