// webgrad's playground page (placeholder UI, replaced below).
import { startWebgrad } from "./webgrad.mjs";
function show(value) {
  if (typeof value === "string") return value;
  return JSON.stringify(value, (key, v) => ArrayBuffer.isView(v)
    ? `<${v.constructor.name}(${v.length}) ${Array.from(v.slice(0, 16)).join(" ")}${v.length > 16 ? " …" : ""}>`
    : typeof v === "bigint" ? v.toString() : v, 2);
}

function setUpPage(webgrad) {
  const $ = (id) => document.getElementById(id);
  const [status, code, button, output, result] =
    ["status", "code", "run", "output", "result"].map($);
  code.value = "print(1)";
  const setStatus = (text, kind) => { status.textContent = text; status.className = kind; };
  setStatus("Starting Python (Pyodide) in a worker…", "busy");
  webgrad.onEvent((message) => {
    if (message.type === "stdout" || message.type === "stderr") {
      output.textContent += message.text;
    } else if (message.type === "progress") {
      setStatus(`progress: ${JSON.stringify({ ...message, type: undefined })}`, "busy");
    }
  });
  webgrad.ready.then(
    (info) => {
      setStatus(`Ready: Python ${info.python_version}, webgrad ${info.webgrad_version}` +
                (info.jspi ? "" : " (no JSPI: WebGPU calls cannot block)"), "ok");
      button.disabled = false;
    },
    (error) => setStatus(`Python failed to start: ${error.message}`, "error"));
  button.addEventListener("click", async () => {
    button.disabled = true;
    output.textContent = "";
    result.textContent = "";
    result.className = "";
    setStatus("Running…", "busy");
    try {
      result.textContent = show(await webgrad.run(code.value));
      setStatus("Done", "ok");
    } catch (error) {
      result.textContent = error.traceback || error.message;
      result.className = "error";
      setStatus(`${error.type}: ${error.message}`, "error");
    } finally {
      button.disabled = !!webgrad.dead;
    }
  });
}

window.webgrad = startWebgrad();
setUpPage(window.webgrad);
