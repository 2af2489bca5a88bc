// jax-js (npm @jax-js/jax) on its WebGPU device: the whole training step -- forward, loss,
// valueAndGrad and a hand-written Adam (webgrad's / torch's form, bias correction in-graph) --
// is one jit()-compiled function, so jax-js fuses it into as few kernels as it can.
//
// jax-js arrays are reference counted and every function consumes its arguments, so values
// used twice are passed as `x.ref` (see the jax-js README, "Reference counting").
import { defaultDevice, init, jit, nn, numpy as np, tree, valueAndGrad }
  from "./node_modules/@jax-js/jax/dist/index.js";
import { ADAM, LAYERS, packageVersion, register, requireWebGPU } from "./common.mjs";

// ?device=wasm: jax-js's WebAssembly device (bench/mlp_browser.py --cpu, WebGPU off)
const DEVICE = new URLSearchParams(location.search).get("device") ?? "webgpu";

async function setup(config) {
  const adapter = DEVICE === "webgpu" ? await requireWebGPU() : "cpu";
  const devices = await init(DEVICE);
  if (!devices.includes(DEVICE)) throw new Error(`jax-js init: no ${DEVICE} device (${devices})`);
  defaultDevice(DEVICE);
  const B = config.batch, lr = config.lr, { beta1, beta2, eps } = ADAM;

  function lossFn(p, x, y) {
    let h = x;
    LAYERS.forEach(([w, b], i) => {
      h = np.matmul(h, p[w]).add(p[b]);
      if (i < LAYERS.length - 1) h = nn.relu(h);
    });
    const d = h.sub(y);
    return d.ref.mul(d).sum().div(B);  // sum(d * d) / B, as webgrad's loss_fn
  }

  const trainStep = jit((p, m, v, t, x, y) => {
    const [loss, g] = valueAndGrad(lossFn)(tree.ref(p), x, y);
    // bc = 1 - beta^t; p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
    const bc1 = np.exp(t.ref.mul(Math.log(beta1))).mul(-1).add(1);
    const bc2 = np.exp(t.mul(Math.log(beta2))).mul(-1).add(1);
    const stepSize = np.reciprocal(bc1).mul(lr);
    const invSqrtBc2 = np.reciprocal(np.sqrt(bc2));
    const out = { p: {}, m: {}, v: {}, loss };
    for (const name of Object.keys(p)) {
      const gk = g[name];
      const m2 = m[name].mul(beta1).add(gk.ref.mul(1 - beta1));
      const v2 = v[name].mul(beta2).add(gk.ref.mul(gk).mul(1 - beta2));
      const denom = np.sqrt(v2.ref).mul(invSqrtBc2.ref).add(eps);
      out.p[name] = p[name].sub(stepSize.ref.mul(m2.ref).div(denom));
      out.m[name] = m2;
      out.v[name] = v2;
    }
    stepSize.dispose();
    invSqrtBc2.dispose();
    return out;
  });

  const array = (values, shape) => np.array(Float32Array.from(values)).reshape(shape);
  let state = { p: {}, m: {}, v: {} };
  for (const [name, values] of Object.entries(config.params)) {
    state.p[name] = array(values, config.shapes[name]);
    state.m[name] = np.zeros(config.shapes[name]);
    state.v[name] = np.zeros(config.shapes[name]);
  }
  let t = 0;
  return {
    info: { adapter, device: DEVICE, jit: true },
    async step(x, y) {
      t += 1;
      const out = trainStep(state.p, state.m, state.v, np.array(t),
                            np.array(x).reshape([B, 1]), np.array(y).reshape([B, 1]));
      state = { p: out.p, m: out.m, v: out.v };
      return (await out.loss.data())[0];  // data() reads back and releases the loss
    },
  };
}

register("jax-js", await packageVersion("@jax-js/jax"), setup);
