// Draws the figures that training code sends with webgrad.playground.report(figure=...) on a
// 2D canvas: "lines" (curves, optional scatter), "heatmaps" (e.g. attention maps), "matrix"
// (a confusion matrix with counts), "text" (e.g. sampled text). The data layout is documented
// in pkg/webgrad/playground.py; anything else is drawn as a note saying what it was.

const COLORS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#57606a"];
const FONT = "12px system-ui, sans-serif";

function range(values) {
  let lo = Infinity, hi = -Infinity;
  for (const v of values) if (Number.isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  if (!(hi > lo)) { lo -= 1; hi += 1; }
  return [lo, hi];
}

function drawLines(ctx, w, h, fig) {
  const pad = { l: 40, r: 10, t: 10, b: 24 };
  const ys = fig.series.flatMap((s) => s.y).concat(fig.scatter ? fig.scatter.y : []);
  const [x0, x1] = range(fig.x);
  const [y0, y1] = range(ys);
  const X = (v) => pad.l + (v - x0) / (x1 - x0) * (w - pad.l - pad.r);
  const Y = (v) => h - pad.b - (v - y0) / (y1 - y0) * (h - pad.t - pad.b);
  ctx.strokeStyle = "#d0d7de"; ctx.lineWidth = 1;
  ctx.strokeRect(pad.l, pad.t, w - pad.l - pad.r, h - pad.t - pad.b);
  ctx.fillStyle = "#57606a"; ctx.font = FONT;
  ctx.fillText(y1.toPrecision(3), 2, pad.t + 10); ctx.fillText(y0.toPrecision(3), 2, h - pad.b);
  ctx.fillText(x0.toPrecision(3), pad.l, h - 6); ctx.fillText(x1.toPrecision(3), w - pad.r - 40, h - 6);
  const legend = [];
  if (fig.scatter) {
    ctx.fillStyle = "#8c959f";
    fig.scatter.x.forEach((x, i) => {
      ctx.beginPath(); ctx.arc(X(x), Y(fig.scatter.y[i]), 2.5, 0, 2 * Math.PI); ctx.fill();
    });
    legend.push([fig.scatter.name || "data", "#8c959f"]);
  }
  fig.series.forEach((s, k) => {
    const color = COLORS[k % COLORS.length];
    ctx.strokeStyle = ctx.fillStyle = color; ctx.lineWidth = 2;
    if (s.points) {
      s.y.forEach((y, i) => { ctx.beginPath(); ctx.arc(X(fig.x[i]), Y(y), 2.5, 0, 7); ctx.fill(); });
    } else {
      ctx.beginPath();
      s.y.forEach((y, i) => (i ? ctx.lineTo : ctx.moveTo).call(ctx, X(fig.x[i]), Y(y)));
      ctx.stroke();
    }
    legend.push([s.name, color]);
  });
  legend.forEach(([name, color], i) => {
    ctx.fillStyle = color; ctx.fillRect(pad.l + 8, pad.t + 8 + 16 * i, 10, 10);
    ctx.fillStyle = "#1f2328"; ctx.fillText(name, pad.l + 22, pad.t + 17 + 16 * i);
  });
}

function heat(v, lo, hi) {  // white -> blue
  const t = hi > lo ? Math.min(1, Math.max(0, (v - lo) / (hi - lo))) : 0;
  return `rgb(${Math.round(255 - 246 * t)},${Math.round(255 - 150 * t)},${Math.round(255 - 37 * t)})`;
}

function drawGrid(ctx, x, y, size, rows, { labels = null, counts = false } = {}) {
  const n = rows.length, m = rows[0]?.length || 0;
  const cell = size / Math.max(n, m);
  const [lo, hi] = range(rows.flat());
  rows.forEach((row, i) => row.forEach((v, j) => {
    ctx.fillStyle = heat(v, Math.min(lo, 0), hi);
    ctx.fillRect(x + j * cell, y + i * cell, Math.ceil(cell), Math.ceil(cell));
    if (counts && cell >= 16) {
      ctx.fillStyle = (v - lo) / (hi - lo || 1) > 0.55 ? "#fff" : "#1f2328";
      ctx.fillText(String(Math.round(v)), x + j * cell + 3, y + i * cell + cell / 2 + 4);
    }
  }));
  ctx.strokeStyle = "#d0d7de"; ctx.strokeRect(x, y, cell * m, cell * n);
  if (labels) {
    ctx.fillStyle = "#57606a";
    labels.forEach((label, i) => {
      text(ctx, label, x - 14, y + i * cell + cell / 2 + 4);
      text(ctx, label, x + i * cell + cell / 2 - 3, y - 4);
    });
  }
}

// Every label drawn through text() is noted on the canvas (canvas.textBoxes: {text, x, y, w,
// h} in canvas pixels), so that a test can check that no two labels overlap.
function text(ctx, s, x, y) {
  ctx.fillText(s, x, y);
  const m = ctx.measureText(s);
  const box = { text: s, x, y: y - m.actualBoundingBoxAscent, w: m.width,
                h: m.actualBoundingBoxAscent + m.actualBoundingBoxDescent };
  const t = ctx.getTransform();
  if (t.b || t.c) {  // rotated a quarter turn (the matrix's "true" label): its box turns too
    const [x0, y0] = [t.a * box.x + t.c * box.y + t.e, t.b * box.x + t.d * box.y + t.f];
    const [x1, y1] = [t.a * (box.x + box.w) + t.c * (box.y + box.h) + t.e,
                      t.b * (box.x + box.w) + t.d * (box.y + box.h) + t.f];
    Object.assign(box, { x: Math.min(x0, x1), y: Math.min(y0, y1), w: Math.abs(x1 - x0),
                         h: Math.abs(y1 - y0) });
  } else Object.assign(box, { x: box.x + t.e, y: box.y + t.f });
  ctx.canvas.textBoxes?.push(box);
}

function drawHeatmaps(ctx, w, h, fig) {
  const k = fig.maps.length;
  const cols = Math.ceil(Math.sqrt(k * w / h));
  const rowsN = Math.ceil(k / cols);
  const size = Math.min((w - 10) / cols - 10, (h - 10) / rowsN - 22);
  ctx.font = FONT;
  fig.maps.forEach((map, i) => {
    const x = 10 + (i % cols) * (size + 10), y = 18 + Math.floor(i / cols) * (size + 22);
    ctx.fillStyle = "#1f2328"; ctx.fillText(map.caption, x, y - 4);
    drawGrid(ctx, x, y, size, map.rows);
  });
}

function drawMatrix(ctx, w, h, fig) {
  ctx.font = FONT;
  // "predicted →" on a line of its own above the column labels, "true →" left of the rows'
  const top = 36, left = 34;
  const size = Math.min(w - left, h - top) - 6;
  drawGrid(ctx, left, top, size, fig.rows, { labels: fig.labels, counts: true });
  ctx.fillStyle = "#57606a";
  const label = "predicted →";
  text(ctx, label, left + size - ctx.measureText(label).width, 14);
  ctx.save(); ctx.translate(12, top + size); ctx.rotate(-Math.PI / 2);
  text(ctx, "true →", 0, 0); ctx.restore();
}

function drawText(ctx, w, h, fig) {
  ctx.font = "13px ui-monospace, monospace"; ctx.fillStyle = "#1f2328";
  const lines = [];
  for (const para of String(fig.text).split("\n")) {
    let line = "";
    for (const ch of para) {
      if (ctx.measureText(line + ch).width > w - 20) { lines.push(line); line = ""; }
      line += ch;
    }
    lines.push(line);
  }
  lines.slice(0, Math.floor((h - 10) / 17)).forEach((line, i) => ctx.fillText(line, 10, 20 + 17 * i));
}

const DRAW = { lines: drawLines, heatmaps: drawHeatmaps, matrix: drawMatrix, text: drawText };

/** Draw `fig` on `canvas` (cleared first); returns its title. */
export function drawFigure(canvas, fig) {
  const ctx = canvas.getContext("2d");
  const { width: w, height: h } = canvas;
  ctx.clearRect(0, 0, w, h);
  canvas.textBoxes = [];
  ctx.font = FONT;
  const draw = DRAW[fig?.kind];
  if (!draw) {
    ctx.fillStyle = "#b42318";
    ctx.fillText(`cannot draw a figure of kind ${JSON.stringify(fig?.kind)}`, 10, 20);
    return "Picture";
  }
  draw(ctx, w, h, fig);
  return fig.title || "Picture";
}
