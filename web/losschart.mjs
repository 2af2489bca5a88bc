// A live loss chart (uPlot from the UI bundle that serve.py builds, web/ui.src.mjs): points
// arrive one by one, the plot is redrawn at most once per frame, old points are thinned past
// maxPoints. Used by the playground (main.mjs) and the chat page's fine-tune (chat.mjs).
//
//   const chart = new LossChart(el, nowEl);   chart.init(uPlot);   // without init: no plot
//   chart.add(step, loss); chart.clear(); chart.steps, chart.losses
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
    }, [[], []], this.el);
    // follow the column's width (a phone turned, the window resized, columns stacked)
    new ResizeObserver(() => {
      const width = Math.max(200, this.el.clientWidth);
      if (this.plot && width !== this.plot.width) this.plot.setSize({ width, height: this.height });
    }).observe(this.el);
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
