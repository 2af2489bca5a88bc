// The playground's status line and the state every part of the page reads (web/main.mjs is
// the page; the other playground/ modules import this one). `page.state` is one of booting,
// ready, running, stopping, done, stopped, error, dead, and #status carries it as
// data-state; setState also enables the buttons that state allows.

export const $ = (id) => document.getElementById(id);

export const IDLE = ["ready", "done", "stopped", "error"];
export const RUN_TITLE = "Run the code (Ctrl-Enter or Shift-Enter)";

export const page = {
  state: "booting",
  hasModel: false,  // a compiled model lives in the worker (Download weights has one)
  runs: 0,          // runs started (window.playground.runs)
};

export function setState(next, text, kind = "busy") {
  page.state = next;
  const status = $("status");
  status.textContent = text;
  status.title = `${text}\n(click to show it whole)`;  // a long message cut by "…" reads here
  status.className = kind;
  status.dataset.state = next;
  const idle = IDLE.includes(next);
  $("run").disabled = !idle;
  $("stop").disabled = next !== "running";
  $("save").disabled = !idle || !page.hasModel;
  $("save").title = page.hasModel
    ? "Download the model's weights and optimizer state (safetensors)"
    : "Run an example first: there is no model to download yet";
  $("load").disabled = !idle;
  $("time-kernels").disabled = !idle || !$("kernels").childElementCount;
  $("examples").disabled = !idle && next !== "booting";
}

export function duration(s) {
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  return m < 60 ? `${m} min ${Math.round(s - 60 * m)} s` : `${Math.floor(m / 60)} h ${m % 60} min`;
}
