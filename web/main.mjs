// webgrad's playground: a Python editor (CodeMirror), Run/Stop, a console, a live loss chart
// (uPlot), the demo's picture, the compiled kernels, and weights download/upload. Python runs
// in the worker that webgrad.mjs starts; the page only draws what the worker reports. This
// module starts the page and wires its controls; the parts live in playground/:
//   page.mjs     the status line and the state every part reads (setState)
//   output.mjs   the console, the loss chart, the picture, the kernels panel
//   editor.mjs   the editor, the examples and the edits kept of them, share links
//   bridge.mjs   the worker (window.webgrad) and its events turned into the page
//   run.mjs      Run / Stop and their keys, kernel timing, weights, the WebGPU check
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

import { boot, showBoot, webgrad } from "./playground/bridge.mjs";
import { code, loadExample, loadUI, openShared, share } from "./playground/editor.mjs";
import { chart, figure } from "./playground/output.mjs";
import { $, duration, page, setState } from "./playground/page.mjs";
import { checkWebGPU, loadWeights, onKey, run, saveWeights, stop, timeKernels } from "./playground/run.mjs";

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
    setState(page.state, `Cannot load the example: ${e.message}`, "error")));
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
    setState(page.state, `Cannot make a share link: ${e.message}`, "error")));
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
  get state() { return page.state; },
  get code() { return code.get(); },
  set code(text) { code.set(text); },
  load: loadExample, run, stop, clearChart: () => chart.clear(),
  get losses() { return chart.losses.slice(); },
  get steps() { return chart.steps.slice(); },
  get figures() { return figure.drawn; },
  get runs() { return page.runs; },
  started: start(),
};
