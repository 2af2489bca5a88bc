// jax-js (npm @jax-js/jax) trains webgrad's two small causal transformers on WebGPU, for
// bench/transformer_browser.py:
//
//   "tiny"   tests/models.py's Transformer: vocab 12, T 8, d 32, 2 layers of 2 heads, separate
//            Wq/Wk/Wv/Wo without bias, GELU MLP 4d, untied head; loss = cross entropy on the
//            last 4 positions (the reversed digits); Adam lr 0.01.
//   "adder"  examples/transformer_addition.py (tensorgrad's 2-digit addition sample): vocab 12,
//            T 8, d 64, 3 layers of 4 heads, fused QKV Linear, proj / fc1 / fc2 / head Linears
//            with bias; loss = cross entropy on positions 5..7; AdamW (weight decay 0.01 on
//            the matrices and embeddings, as webgrad's init rule says) with webgrad's warm-up
//            + cosine schedule, whose value for each step the driver sends in config.lrs.
//
// Both are pre-LN (eps 1e-5), GELU in its tanh form, softmax attention with a causal mask,
// written as jax-js users would: nn.dotProductAttention on [B, T, H, Dh], nn.standardize,
// nn.logSoftmax and a one-hot pick. The whole training step -- forward, valueAndGrad and the
// optimizer in webgrad's form (bias corrections in-graph from the step count) -- is one jit()
// function. Parameters (webgrad's initial values, by webgrad's names), batches and the
// learning rates all come from the driver, so the losses can be compared with webgrad's.
//
// jax-js arrays are reference counted and every function consumes its arguments: a value used
// twice is passed as `x.ref` once (see the jax-js README, "Reference counting").
import { defaultDevice, init, jit, nn, numpy as np, tree, valueAndGrad }
  from "./node_modules/@jax-js/jax/dist/index.js";
import { packageVersion, register, requireWebGPU } from "./common.mjs";

/** Layer norm over the last axis with an affine weight and bias (webgrad's nn.LayerNorm). */
function layerNorm(x, w, b) {
  return nn.standardize(x, -1, { epsilon: 1e-5 }).mul(w).add(b);
}

/** [B, T, V] logits for i32 [B, T] tokens; consumes each parameter once. */
function logits(p, idx, m) {
  const { B, T, D, heads, layers } = m;
  const split = (a) => a.reshape([B, T, heads, D / heads]);  // [B, T, H, Dh]
  let x = np.take(p["tok.W"], idx, 0).add(p.pos);
  for (let l = 0; l < layers; l++) {
    const q = (name) => p[`blocks.${l}.${name}`];
    const h = layerNorm(x.ref, q("ln1.weight"), q("ln1.bias"));
    let qh, kh, vh;
    if (m.kind === "tiny") {
      qh = np.matmul(h.ref, q("Wq")); kh = np.matmul(h.ref, q("Wk")); vh = np.matmul(h, q("Wv"));
    } else {
      const qkv = np.matmul(h, q("qkv.W")).add(q("qkv.b"));
      qh = qkv.ref.slice([], [], [0, D]);
      kh = qkv.ref.slice([], [], [D, 2 * D]);
      vh = qkv.slice([], [], [2 * D, 3 * D]);
    }
    const att = nn.dotProductAttention(split(qh), split(kh), split(vh), { isCausal: true })
      .reshape([B, T, D]);
    x = m.kind === "tiny"
      ? x.add(np.matmul(att, q("Wo")))
      : x.add(np.matmul(att, q("proj.W")).add(q("proj.b")));
    const h2 = layerNorm(x.ref, q("ln2.weight"), q("ln2.bias"));
    x = m.kind === "tiny"
      ? x.add(np.matmul(nn.gelu(np.matmul(h2, q("W1")).add(q("b1"))), q("W2")).add(q("b2")))
      : x.add(np.matmul(nn.gelu(np.matmul(h2, q("fc1.W")).add(q("fc1.b"))), q("fc2.W"))
        .add(q("fc2.b")));
  }
  const y = layerNorm(x, p["ln_f.weight"], p["ln_f.bias"]);
  return m.kind === "tiny" ? np.matmul(y, p.head) : np.matmul(y, p["head.W"]).add(p["head.b"]);
}

/** Mean over the answer positions of -log softmax(logits)[target] (nn.cross_entropy_last). */
function lossFn(p, idx, target, m) {
  const answer = logits(p, idx, m).slice([], [m.answer[0], m.answer[1]], []);
  const picked = nn.logSoftmax(answer, -1).mul(nn.oneHot(target, m.vocab)).sum(-1);
  return picked.mean().neg();
}

// ?device=wasm: jax-js's WebAssembly device (bench/transformer_browser.py --cpu, WebGPU off)
const DEVICE = new URLSearchParams(location.search).get("device") ?? "webgpu";

async function setup(config) {
  const adapter = DEVICE === "webgpu" ? await requireWebGPU() : "cpu";
  const devices = await init(DEVICE);
  if (!devices.includes(DEVICE)) throw new Error(`jax-js init: no ${DEVICE} device (${devices})`);
  defaultDevice(DEVICE);
  const m = config.model;  // {kind, B, T, D, heads, layers, vocab, answer: [from, to]}
  const { beta1, beta2, eps, weight_decay: wd, decoupled } = config.optimizer;
  const A = m.answer[1] - m.answer[0];

  const trainStep = jit((p, mo, ve, hyper, idx, target) => {
    const [loss, g] = valueAndGrad((pp, i, tg) => lossFn(pp, i, tg, m))(tree.ref(p), idx, target);
    const t = hyper.ref.slice(0), lr = hyper.slice(1);
    // bc = 1 - beta^t; p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps), as webgrad's Adam
    const bc1 = np.exp(t.ref.mul(Math.log(beta1))).mul(-1).add(1);
    const bc2 = np.exp(t.mul(Math.log(beta2))).mul(-1).add(1);
    const stepSize = np.reciprocal(bc1).mul(lr.ref);
    const invSqrtBc2 = np.reciprocal(np.sqrt(bc2));
    const out = { p: {}, m: {}, v: {}, loss };
    for (const name of Object.keys(p)) {
      let gk = g[name], w = p[name];
      const decays = wd > 0 && config.decays[name];
      if (decays && !decoupled) gk = gk.add(w.ref.mul(wd));             // Adam's L2 form
      if (decays && decoupled) w = w.mul(lr.ref.mul(-wd).add(1));      // AdamW: w (1 - lr wd)
      const m2 = mo[name].mul(beta1).add(gk.ref.mul(1 - beta1));
      const v2 = ve[name].mul(beta2).add(gk.ref.mul(gk).mul(1 - beta2));
      const denom = np.sqrt(v2.ref).mul(invSqrtBc2.ref).add(eps);
      out.p[name] = w.sub(stepSize.ref.mul(m2.ref).div(denom));
      out.m[name] = m2;
      out.v[name] = v2;
    }
    lr.dispose();
    stepSize.dispose();
    invSqrtBc2.dispose();
    return out;
  });

  let state = { p: {}, m: {}, v: {} };
  for (const [name, values] of Object.entries(config.params)) {
    state.p[name] = np.array(Float32Array.from(values)).reshape(config.shapes[name]);
    state.m[name] = np.zeros(config.shapes[name]);
    state.v[name] = np.zeros(config.shapes[name]);
  }
  let t = 0;
  const int = (a, shape) => np.array(a, { dtype: np.int32 }).reshape(shape);
  return {
    info: { adapter, device: DEVICE, jit: true },
    async step(feed) {
      t += 1;
      const hyper = np.array(Float32Array.of(t, config.lrs[t - 1]));
      const out = trainStep(state.p, state.m, state.v, hyper,
                            int(feed.idx, [m.B, m.T]), int(feed.target, [m.B, A]));
      state = { p: out.p, m: out.m, v: out.v };
      return (await out.loss.data())[0];  // data() reads back and releases the loss
    },
  };
}

register("jax-js", await packageVersion("@jax-js/jax"), setup);
