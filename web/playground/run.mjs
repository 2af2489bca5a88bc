// The playground's run control (web/main.mjs is the page): Run and Stop (and their keys),
// the kernels panel's refresh after a run and its GPU timing, the model's weights downloaded
// and loaded back, and the check that says plainly when WebGPU is missing.

import { progress, rateOf, showProgress, webgrad } from "./bridge.mjs";
import { clearErrorLine, code, markErrorLine, runName } from "./editor.mjs";
import { chart, consoleBox, showBoxes, showKernels } from "./output.mjs";
import { $, IDLE, RUN_TITLE, duration, page, setState } from "./page.mjs";

// --- run / stop ------------------------------------------------------------------------------
async function refreshKernels() {
  let models = [];
  try {
    models = await webgrad.call("webgrad_worker.describe_compiled");
  } catch (e) {
    return;
  }
  page.hasModel = models.length > 0;
  setState(page.state, $("status").textContent, $("status").className);  // Download weights
  showKernels(models);
}

export async function run() {
  if ($("run").disabled) return;
  page.runs++;
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
    if (error.type === "KeyboardInterrupt" && page.state === "stopping" && !webgrad.dead) {
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

export function stop() {
  if (page.state !== "running") return;
  setState("stopping", "Stopping at the end of the current step…");
  webgrad.interrupt();
}

// Ctrl-Enter / Cmd-Enter / Shift-Enter run and Escape stops, wherever the focus is: listened
// for on the document in the capture phase, before the editor's own keymap (its Mod-Enter
// inserts a blank line). Escape goes on to the editor when nothing runs (it closes panels).
export function onKey(event) {
  if (event.key === "Enter" && !event.altKey && (event.ctrlKey || event.metaKey || event.shiftKey)) {
    event.preventDefault();
    event.stopPropagation();
    run();
  } else if (event.key === "Escape" && page.state === "running") {
    event.preventDefault();
    event.stopPropagation();
    stop();
  }
}

// GPU time of every kernel: the worker profiles one step of the newest model on its last batch
// and puts the weights back (webgrad_worker.time_kernels); each summary line gets its time.
export async function timeKernels() {
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
    button.disabled = !IDLE.includes(page.state);
  }
}

// --- weights ---------------------------------------------------------------------------------
export async function saveWeights() {
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
    setState(page.state, `Downloaded the weights of ${name} (${data.length} bytes)`, "ok");
  } catch (error) {
    setState(page.state, `Cannot download weights: ${error.message}`, "error");
  }
}

// The worker keeps the file for the next Run's model (webgrad_worker.weights_load) and loads
// it into the current model if it fits.
export async function loadWeights(file) {
  try {
    const bytes = new Uint8Array(await file.arrayBuffer());
    const { name, params, misfit } = await webgrad.call("webgrad_worker.weights_load",
                                                        [bytes, file.name]);
    $("run").title = `${RUN_TITLE}; its model starts from ${file.name}`;
    const now = name ? ` into ${name} (${params} parameters)` : "";
    const other = misfit ? ` (it does not fit the current model: ${misfit})` : "";
    setState(page.state, `Loaded ${file.name}${now}: the next Run starts its model from these ` +
             `weights and optimizer state${other}`, "ok");
  } catch (error) {
    setState(page.state, `Cannot load ${file.name}: ${error.message}`, "error");
  }
}

// --- WebGPU check: say plainly what is missing instead of failing later ---------------------
export async function checkWebGPU() {
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
