// wllama's side of bench/wllama_decode.py: greedy decoding of a GGUF file on llama.cpp's CPU
// backend compiled to WebAssembly (n_gpu_layers 0: no WebGPU), timed as webgrad's worker times
// its own generate().
//
//   window.peerBench.run({url, prompt, prompt_ids, new, reps, warmup, threads, n_ctx}) -> Promise<result>
//
// The model is fetched from `url` and loaded from a Blob. Each run is one createCompletion
// call on the text `prompt`: wllama takes text only, so bench/wllama_decode.py writes files
// whose vocabulary makes that text exactly the `prompt_ids` token ids it feeds webgrad
// (checked here against llama.cpp's prompt token count). Greedy (temperature 0, top_k 1),
// exactly `new` tokens (ignore_eos), no prompt cache reuse between runs (cache_prompt false),
// so every run does the same work as webgrad's generate(prompt, new, temperature=0): one
// prefill of the prompt and `new` - 1 single-token steps. `warmup` warm-up runs (1 if not given), then `reps` timed
// runs; the wall time of each call (performance.now() around it) and llama.cpp's own
// prompt/decode timings are returned.
//
// Threads: wllama runs llama.cpp's threads as Web Workers over a shared memory, which needs
// SharedArrayBuffer, i.e. a cross-origin isolated page (COOP + COEP headers). `threads` asks
// for that many; the result says how many wllama used (isMultithread / getNumThreads).
import { Wllama } from "./node_modules/@wllama/wllama/esm/index.js";

const ROOT = new URL("./node_modules/@wllama/wllama/", import.meta.url);

async function version() {
  const r = await fetch(new URL("package.json", ROOT));
  return (await r.json()).version;
}

async function run(config) {
  const log = [];
  const keep = (...a) => log.push(a.map(String).join(" "));
  const wllama = new Wllama({ default: new URL("esm/wasm/wllama.wasm", ROOT).href }, {
    suppressNativeLog: !config.verbose,
    logger: config.verbose ? console : { debug() {}, log: keep, warn: keep, error: keep },
  });
  const blob = await (await fetch(config.url)).blob();
  const t0 = performance.now();
  try {
    await wllama.loadModel([blob], {
      n_ctx: config.n_ctx, n_batch: Math.max(config.prompt_ids, 32), n_threads: config.threads,
      n_gpu_layers: 0, seed: 0,
    });
  } catch (e) {
    throw new Error(`wllama could not load ${config.url}: ${e && e.message || e}\n` +
                    log.slice(-8).join("\n"));
  }
  const loadMs = performance.now() - t0;
  const once = async () => {
    const start = performance.now();
    const r = await wllama.createCompletion({
      prompt: config.prompt, max_tokens: config.new, n_predict: config.new,
      temperature: 0, top_k: 1, ignore_eos: true, cache_prompt: false,
    });
    return { ms: performance.now() - start, r };
  };
  for (let i = 0; i < (config.warmup ?? 1); i++) await once();   // warm-up
  const times = [], timings = [];
  let text = null, usage = null;
  for (let i = 0; i < config.reps; i++) {
    const { ms, r } = await once();
    if (r.usage && r.usage.prompt_tokens !== config.prompt_ids)
      throw new Error(`llama.cpp read the prompt as ${r.usage.prompt_tokens} tokens, ` +
                      `not ${config.prompt_ids}: the file's vocabulary is not what the bench wrote`);
    if (r.usage && r.usage.completion_tokens !== config.new)
      throw new Error(`wllama generated ${r.usage.completion_tokens} tokens, not ${config.new}`);
    times.push(ms);
    timings.push(r.timings || null);
    text = r.choices?.[0]?.text ?? null;
    usage = r.usage ?? null;
  }
  const out = {
    library: "wllama", version: await version(), load_ms: loadMs, times_ms: times, timings,
    text, usage,
    multithread: wllama.isMultithread(), threads: wllama.getNumThreads(),
    isolated: self.crossOriginIsolated,
  };
  await wllama.exit();
  return out;
}

window.peerBench = {
  run: (config) => run(config).catch((e) => ({ error: String(e && e.message || e),
                                               stack: e && e.stack || "" })),
};
