// The playground's third-party browser code, bundled by serve.py (esbuild, at provision time)
// into web/assets/ui/bundle.mjs: CodeMirror 6 with Python highlighting, and uPlot for charts.
export { EditorView, basicSetup } from "codemirror";
export { keymap, Decoration } from "@codemirror/view";
export { StateEffect, StateField } from "@codemirror/state";
export { python } from "@codemirror/lang-python";
export { default as uPlot } from "uplot";
