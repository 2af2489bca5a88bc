// The playground's editor and examples (web/main.mjs is the page): CodeMirror from the UI
// bundle (a plain <textarea> where the bundle did not load), the example files, the person's
// edits kept per example in localStorage (Reset code puts back the original), the line a
// traceback ends in marked, and share links: #example=FILE&z=... (the code deflated, in
// base64url) put into the address bar, read back when a page opens on one.

import { loadUIBundle } from "../losschart.mjs";
import { chart, consoleBox, showBoxes } from "./output.mjs";
import { $, page, setState } from "./page.mjs";

const STORE_PREFIX = "webgrad.playground.code.";  // + example file: the edited text

// --- the editor ------------------------------------------------------------------------------
let editor = null;   // CodeMirror EditorView, or a <textarea> if the bundle failed to load
let errorMark = null;  // {effect, view}: marks the line a traceback ends in (CodeMirror only)
const originals = {};  // example file -> its text as served
let setting = false;   // code.set is writing: not an edit of the person's
export const code = {
  get() { return editor?.state ? editor.state.doc.toString() : editor?.value ?? ""; },
  set(text) {
    setting = true;
    try {
      if (editor?.state) editor.dispatch({ changes: { from: 0, to: editor.state.doc.length, insert: text } });
      else if (editor) editor.value = text;
    } finally {
      setting = false;
    }
    updateReset();
  },
};

// What tracebacks call the code: the example's file while it is unchanged, else "your code".
export function runName() {
  const file = $("examples").value;
  return file && originals[file] === code.get() ? file : "your code";
}

// The person's edits of an example are kept in localStorage (a moment after the last key).
let storeTimer = null;
function edited() {
  if (setting) return;
  clearErrorLine();
  if (/[#&]z=|[#&]code=/.test(location.hash)) {  // the shared link no longer says what is here
    history.replaceState(null, "", location.pathname + location.search);
  }
  clearTimeout(storeTimer);
  storeTimer = setTimeout(storeEdit, 300);
  updateReset();
}

function storeEdit() {
  const file = $("examples").value;
  if (!(file in originals)) return;
  try {
    const text = code.get();
    if (text === originals[file]) localStorage.removeItem(STORE_PREFIX + file);
    else localStorage.setItem(STORE_PREFIX + file, text);
  } catch (e) {  // storage full or disabled: the edit lives on in the editor only
    console.warn("playground: the edit was not stored", e);
  }
}

function updateReset() {
  const file = $("examples").value;
  $("reset").disabled = !(file in originals) || code.get() === originals[file];
}

function errorLineExtension(ui) {
  const { StateEffect, StateField, Decoration, EditorView } = ui;
  const effect = StateEffect.define();
  const line = Decoration.line({ class: "cm-error-line" });
  const field = StateField.define({
    create: () => Decoration.none,
    update(marks, tr) {
      marks = marks.map(tr.changes);
      for (const e of tr.effects) {
        if (e.is(effect)) marks = e.value === null ? Decoration.none
          : Decoration.set([line.range(tr.state.doc.line(e.value).from)]);
      }
      return marks;
    },
    provide: (f) => EditorView.decorations.from(f),
  });
  errorMark = { effect, scroll: EditorView.scrollIntoView };
  return field;
}

export function markErrorLine(n) {
  if (!n || !editor) return;
  if (editor.state && errorMark) {
    const doc = editor.state.doc;
    const line = doc.line(Math.min(Math.max(1, n), doc.lines));
    editor.dispatch({ effects: [errorMark.effect.of(line.number),
                                errorMark.scroll(line.from, { y: "center" })] });
  } else if (!editor.state) {  // the plain text area: select the line
    const lines = editor.value.split("\n");
    const from = lines.slice(0, n - 1).join("\n").length + (n > 1 ? 1 : 0);
    editor.setSelectionRange(from, from + (lines[n - 1] ?? "").length);
  }
}

export function clearErrorLine() {
  if (editor?.state && errorMark) editor.dispatch({ effects: errorMark.effect.of(null) });
}

export async function loadUI() {
  try {
    const { manifest, ui } = await loadUIBundle();
    const { EditorView, basicSetup, python, uPlot } = ui;
    editor = new EditorView({
      parent: $("editor"),
      extensions: [basicSetup, python(), errorLineExtension(ui),
                   EditorView.updateListener.of((u) => { if (u.docChanged) edited(); })],
    });
    chart.init(uPlot);
    return manifest;
  } catch (e) {
    // Without the bundle the page still works: a plain text area, no chart.
    editor = Object.assign(document.createElement("textarea"),
      { rows: 24, spellcheck: false, style: "width:100%;height:100%" });
    $("editor").append(editor);
    editor.addEventListener("input", edited);
    consoleBox.add(`the editor/chart bundle did not load (${e.message}); run serve.py to ` +
                   "provision it\n", "stderr");
    return (await fetch("assets/manifest.json").then((r) => r.json()).catch(() => ({})));
  }
}

// Shows an example: the person's edited text if one is kept, else the file as served
// (`original`: always the file).
export async function loadExample(file, { original = false } = {}) {
  if (!(file in originals)) {
    const response = await fetch(`examples/${file}`);
    if (!response.ok) throw new Error(`examples/${file}: HTTP ${response.status}`);
    originals[file] = await response.text();
  }
  let kept = null;
  try {
    if (original) localStorage.removeItem(STORE_PREFIX + file);
    else kept = localStorage.getItem(STORE_PREFIX + file);
  } catch { /* no storage: the original */ }
  if (file !== $("examples").value && $("figure-box")) $("figure-box").hidden = true;
  $("examples").value = file;
  code.set(kept ?? originals[file]);
  clearErrorLine();
  showBoxes();
}

// --- share links: #example=FILE&z=<deflate-raw, base64url> (or code=<UTF-8, base64url>
// where the browser has no CompressionStream) -----------------------------------------------
const base64url = (bytes) => {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
};
const unbase64url = (text) => Uint8Array.from(
  atob(text.replaceAll("-", "+").replaceAll("_", "/")), (c) => c.charCodeAt(0));

async function shareURL(text) {
  const params = new URLSearchParams();
  if ($("examples").value) params.set("example", $("examples").value);
  const bytes = new TextEncoder().encode(text);
  if (globalThis.CompressionStream) {
    const packed = new Blob([bytes]).stream().pipeThrough(new CompressionStream("deflate-raw"));
    params.set("z", base64url(new Uint8Array(await new Response(packed).arrayBuffer())));
  } else {
    params.set("code", base64url(bytes));
  }
  return `${location.origin}${location.pathname}${location.search}#${params}`;
}

async function sharedCode(hash) {
  const params = new URLSearchParams(hash.replace(/^#/, ""));
  let bytes;
  if (params.has("z")) {
    const stream = new Blob([unbase64url(params.get("z"))]).stream()
      .pipeThrough(new DecompressionStream("deflate-raw"));
    bytes = new Uint8Array(await new Response(stream).arrayBuffer());
  } else if (params.has("code")) {
    bytes = unbase64url(params.get("code"));
  } else {
    return null;
  }
  return { example: params.get("example"), text: new TextDecoder().decode(bytes) };
}

export async function share() {
  const url = await shareURL(code.get());
  history.replaceState(null, "", url);
  let copied = false;
  try {  // the clipboard may be refused (no permission, page not focused): the address bar has it
    await Promise.race([navigator.clipboard.writeText(url),
                        new Promise((_, reject) => setTimeout(reject, 1000))]);
    copied = true;
  } catch { /* the address bar has it */ }
  setState(page.state, `Share link ${copied ? "copied to the clipboard and " : ""}put in the ` +
           `address bar (${url.length} characters): opening it shows this code`, "ok");
}

export async function openShared(hash) {
  let shared;
  try {
    shared = await sharedCode(hash);
  } catch (e) {
    consoleBox.add(`this page's link carries code that does not decode (${e.message}); ` +
                   "showing the example instead\n", "stderr");
    return false;
  }
  if (!shared) return false;
  if (shared.example && [...$("examples").options].some((o) => o.value === shared.example)) {
    await loadExample(shared.example);
  }
  code.set(shared.text);
  return true;
}
