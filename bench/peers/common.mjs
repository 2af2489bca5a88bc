// The harness every peer page shares (bench/mlp_browser.py drives it through Playwright).
//
// A peer module calls `register(name, version, setup)`; the page then exposes
//
//   window.peerBench.run(config) -> Promise<result>
//
// where config = {steps, warmup, batch, lr, params: {"l1.W": [...], ...}, xs: [...], ys: [...]}
// carries webgrad's initial parameters and the very batches webgrad trains on (steps * batch
// values each), so that every library starts from the same point and sees the same data.
// `setup(config)` builds the library's model and returns `step(x, y) -> Promise<number>`: one
// Adam step on a batch given as two Float32Arrays, resolving to the loss as a JS number.
//
// Models with other inputs (the transformers of bench/transformer_browser.py) send
// config.feeds = {name: {dtype: "i32" | "f32", data: [...]}} instead of xs / ys, each data
// holding `steps` equal slices; their step gets one argument, {name: TypedArray slice}.
//
// Timing is the same for every library (and for webgrad's loop in the worker): the wall time of
// one step() call, from host batch to loss read back, median over the steps after `warmup`.
// Kernel dispatches are counted on one warm-up step by wrapping the WebGPU compute pass's
// dispatch methods, which sees every library's kernels alike; the wrapper is removed before
// the timed steps.

/** Median of a list of numbers. */
export function median(values) {
  const s = [...values].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
}

/** The q-quantile (0..1) by nearest rank, for the spread of step times. */
function quantile(values, q) {
  const s = [...values].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.round(q * (s.length - 1))))];
}

/** Run `fn` while counting compute dispatches; returns [fn's result, count]. */
async function countDispatches(fn) {
  const proto = globalThis.GPUComputePassEncoder?.prototype;
  if (!proto) return [await fn(), null];
  const saved = { direct: proto.dispatchWorkgroups, indirect: proto.dispatchWorkgroupsIndirect };
  let count = 0;
  proto.dispatchWorkgroups = function (...args) { count++; return saved.direct.apply(this, args); };
  proto.dispatchWorkgroupsIndirect = function (...args) {
    count++; return saved.indirect.apply(this, args);
  };
  try {
    return [await fn(), count];
  } finally {
    proto.dispatchWorkgroups = saved.direct;
    proto.dispatchWorkgroupsIndirect = saved.indirect;
  }
}

/** MLP configs: step i's arguments are [x, y], two Float32Array slices of `batch` values. */
function xySlicer(config) {
  const { steps, batch } = config;
  const xs = Float32Array.from(config.xs), ys = Float32Array.from(config.ys);
  if (xs.length !== steps * batch || ys.length !== steps * batch)
    throw new Error(`config has ${xs.length} x / ${ys.length} y values; steps * batch is ` +
                    `${steps * batch}`);
  return (i) => [xs.subarray(i * batch, (i + 1) * batch), ys.subarray(i * batch, (i + 1) * batch)];
}

/** config.feeds: step i's argument is [{name: its i-th slice}], typed by each feed's dtype. */
function feedSlicer(feeds, steps) {
  const arrays = {};
  for (const [name, { dtype, data }] of Object.entries(feeds)) {
    if (dtype !== "i32" && dtype !== "f32") throw new Error(`feed ${name}: dtype ${dtype}`);
    if (data.length % steps) throw new Error(`feed ${name}: ${data.length} values do not ` +
                                             `split into ${steps} steps`);
    arrays[name] = dtype === "i32" ? Int32Array.from(data) : Float32Array.from(data);
  }
  return (i) => [Object.fromEntries(Object.entries(arrays).map(([name, a]) => {
    const n = a.length / steps;
    return [name, a.subarray(i * n, (i + 1) * n)];
  }))];
}

async function run(name, version, setup, config) {
  const { steps, warmup } = config;
  if (!(warmup < steps)) throw new Error(`warmup (${warmup}) must be below steps (${steps})`);
  const batchOf = config.feeds ? feedSlicer(config.feeds, steps) : xySlicer(config);
  const t0 = performance.now();
  const model = await setup(config);
  const setupMs = performance.now() - t0;
  const times = [], losses = [];
  let dispatches = null;
  for (let i = 0; i < steps; i++) {
    const args = batchOf(i);  // sliced before the clock starts, as webgrad's batches are made
    if (i === warmup - 1) {  // the last warm-up step: compiled by now, not timed
      const [loss, count] = await countDispatches(() => model.step(...args));
      losses.push(loss); times.push(NaN); dispatches = count;
      continue;
    }
    const start = performance.now();
    const loss = await model.step(...args);
    times.push(performance.now() - start);
    losses.push(loss);
  }
  const timed = times.slice(warmup);
  return {
    library: name, version, steps, warmup, setup_ms: setupMs,
    ms_per_step: median(timed), ms_p10: quantile(timed, 0.1), ms_p90: quantile(timed, 0.9),
    first_step_ms: times[0], dispatches, loss: losses[losses.length - 1], first_loss: losses[0],
    losses: losses.filter((_, i) => i % 10 === 0), first_losses: losses.slice(0, 20),
    ...(model.info ?? {}),
  };
}

/** Expose window.peerBench for the driver; errors come back as {error} rather than throws. */
export function register(name, version, setup) {
  window.peerBench = {
    name, version,
    async run(config) {
      try {
        return await run(name, version, setup, config);
      } catch (e) {
        return { library: name, version, error: `${e?.name ?? "Error"}: ${e?.message ?? e}`,
                 stack: String(e?.stack ?? "") };
      }
    },
  };
}

/** Reject when WebGPU is missing, naming what the page saw (so a failing peer says why). */
export async function requireWebGPU() {
  if (!navigator.gpu) throw new Error("navigator.gpu is missing: Chromium needs "
                                      + "--enable-unsafe-webgpu (webgrad.browser.CHROMIUM_FLAGS)");
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) throw new Error("navigator.gpu.requestAdapter() returned null");
  const info = adapter.info ?? {};
  return [info.vendor, info.architecture, info.device, info.description].filter(Boolean).join(" ");
}

/** Start TensorFlow.js (the global `tf` of the UMD bundles) on "webgpu" or "wasm"; resolves
 * to the adapter's description ("cpu" for wasm). */
export async function tfjsBackend(tf, device) {
  if (!tf) throw new Error("the TensorFlow.js bundles did not load (global tf is missing)");
  let adapter = "cpu";
  if (device === "wasm") {
    tf.wasm.setWasmPaths("./node_modules/@tensorflow/tfjs-backend-wasm/dist/");
  } else {
    adapter = await requireWebGPU();
  }
  if (!(await tf.setBackend(device))) throw new Error(`tf.setBackend('${device}') failed`);
  await tf.ready();
  return adapter;
}

/** The installed version of an npm package (from node_modules/NAME/package.json). */
export async function packageVersion(name) {
  try {
    const response = await fetch(`./node_modules/${name}/package.json`);
    return (await response.json()).version;
  } catch {
    return "?";
  }
}

/** The MLP's layers in order, as the [W, b] parameter names webgrad gives them. */
export const LAYERS = [["l1.W", "l1.b"], ["l2.W", "l2.b"], ["l3.W", "l3.b"]];
export const ADAM = { beta1: 0.9, beta2: 0.999, eps: 1e-8 };  // webgrad's optim.Adam defaults
