// TensorFlow.js trains webgrad's two small causal transformers, for bench/transformer_browser.py
// (the models are described in jaxjs_transformer.mjs: "tiny", tests/models.py's Transformer, and
// "adder", examples/transformer_addition.py). Eager, as TF.js runs: tf.variableGrads records
// the forward pass and backpropagates; the update is webgrad's Adam / AdamW formula written in
// tf ops (TF.js has no AdamW, and the adder's learning rate changes every step), with the bias
// corrections of step t computed in JavaScript. TF.js has no attention op and no GELU: both are
// written out (softmax(q k^T / sqrt(Dh) + causal mask) v; GELU's tanh form).
// `tf` is the global the UMD bundles in tfjs_transformer.html define.
import { packageVersion, register, tfjsBackend } from "./common.mjs";

const tf = globalThis.tf;
// ?device=wasm: tfjs-backend-wasm (bench/transformer_browser.py --cpu, WebGPU off)
const DEVICE = new URLSearchParams(location.search).get("device") ?? "webgpu";

function layerNorm(x, w, b) {
  const { mean, variance } = tf.moments(x, -1, true);
  return x.sub(mean).div(variance.add(1e-5).sqrt()).mul(w).add(b);
}

function gelu(x) {  // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
  const inner = x.add(x.mul(x).mul(x).mul(0.044715)).mul(Math.sqrt(2 / Math.PI));
  return x.mul(0.5).mul(tf.tanh(inner).add(1));
}

/** x [..., K] @ W [K, N] as a 2-D product (TF.js's gradient of a rank-3 by rank-2 matMul
 * gives W a batched shape and fails). */
function lin(x, W) {
  const lead = x.shape.slice(0, -1);
  return tf.matMul(x.reshape([-1, x.shape[x.rank - 1]]), W).reshape([...lead, W.shape[1]]);
}

/** [B, T, V] logits for int32 [B, T] tokens. */
function logits(p, idx, m, mask) {
  const { B, T, D, heads, layers } = m;
  const Dh = D / heads;
  const split = (a) => a.reshape([B, T, heads, Dh]).transpose([0, 2, 1, 3]);  // [B, H, T, Dh]
  // the token table through a one-hot product: tf.gather's gradient needs UnsortedSegmentSum,
  // which tfjs-backend-wasm does not have (vocab 12: a small product)
  let x = lin(tf.oneHot(idx, m.vocab).toFloat(), p["tok.W"]).add(p.pos);
  for (let l = 0; l < layers; l++) {
    const q = (name) => p[`blocks.${l}.${name}`];
    const h = layerNorm(x, q("ln1.weight"), q("ln1.bias"));
    let qh, kh, vh;
    if (m.kind === "tiny") {
      qh = lin(h, q("Wq")); kh = lin(h, q("Wk")); vh = lin(h, q("Wv"));
    } else {
      const qkv = lin(h, q("qkv.W")).add(q("qkv.b"));
      [qh, kh, vh] = tf.split(qkv, 3, -1);
    }
    const scores = tf.matMul(split(qh), split(kh), false, true).mul(1 / Math.sqrt(Dh)).add(mask);
    const att = tf.matMul(tf.softmax(scores), split(vh)).transpose([0, 2, 1, 3]).reshape([B, T, D]);
    x = m.kind === "tiny"
      ? x.add(lin(att, q("Wo")))
      : x.add(lin(att, q("proj.W")).add(q("proj.b")));
    const h2 = layerNorm(x, q("ln2.weight"), q("ln2.bias"));
    x = m.kind === "tiny"
      ? x.add(lin(gelu(lin(h2, q("W1")).add(q("b1"))), q("W2")).add(q("b2")))
      : x.add(lin(gelu(lin(h2, q("fc1.W")).add(q("fc1.b"))), q("fc2.W"))
        .add(q("fc2.b")));
  }
  const y = layerNorm(x, p["ln_f.weight"], p["ln_f.bias"]);
  return m.kind === "tiny" ? lin(y, p.head) : lin(y, p["head.W"]).add(p["head.b"]);
}

/** Mean over the answer positions of -log softmax(logits)[target] (nn.cross_entropy_last). */
function lossFn(p, idx, target, m, mask) {
  const [a0, a1] = m.answer;
  const answer = logits(p, idx, m, mask).slice([0, a0, 0], [m.B, a1 - a0, m.vocab]);
  const picked = tf.logSoftmax(answer, -1).mul(tf.oneHot(target, m.vocab)).sum(-1);
  return picked.mean().neg();
}

async function setup(config) {
  const adapter = await tfjsBackend(tf, DEVICE);
  const m = config.model;  // {kind, B, T, D, heads, layers, vocab, answer: [from, to]}
  const { beta1, beta2, eps, weight_decay: wd, decoupled } = config.optimizer;
  const A = m.answer[1] - m.answer[0];
  const p = {}, mo = {}, ve = {};
  for (const [name, values] of Object.entries(config.params)) {
    const shape = config.shapes[name];
    p[name] = tf.variable(tf.tensor(Float32Array.from(values), shape), true, name);
    mo[name] = tf.variable(tf.zeros(shape), false, `${name}/m`);
    ve[name] = tf.variable(tf.zeros(shape), false, `${name}/v`);
  }
  const varList = Object.values(p);
  // 0 where key j <= query i, a large negative number above the diagonal (exp gives 0)
  const mask = tf.tidy(() => tf.sub(1, tf.linalg.bandPart(tf.ones([m.T, m.T]), -1, 0)).mul(-1e9));
  let t = 0;
  return {
    info: { adapter, backend: tf.getBackend() },
    async step(feed) {
      t += 1;
      const lr = config.lrs[t - 1];
      const stepSize = lr / (1 - beta1 ** t), sqrtBc2 = Math.sqrt(1 - beta2 ** t);
      const loss = tf.tidy(() => {
        const idx = tf.tensor2d(feed.idx, [m.B, m.T], "int32");
        const target = tf.tensor2d(feed.target, [m.B, A], "int32");
        const { value, grads } = tf.variableGrads(() => lossFn(p, idx, target, m, mask), varList);
        for (const [name, w] of Object.entries(p)) {
          let g = grads[name], w0 = w;
          const decays = wd > 0 && config.decays[name];
          if (decays && !decoupled) g = g.add(w.mul(wd));         // Adam's L2 form
          if (decays && decoupled) w0 = w.mul(1 - lr * wd);       // AdamW: w (1 - lr wd)
          const m2 = mo[name].mul(beta1).add(g.mul(1 - beta1));
          const v2 = ve[name].mul(beta2).add(g.square().mul(1 - beta2));
          w.assign(w0.sub(m2.mul(stepSize).div(v2.sqrt().div(sqrtBc2).add(eps))));
          mo[name].assign(m2);
          ve[name].assign(v2);
        }
        return value;
      });
      const value = (await loss.data())[0];
      loss.dispose();
      return value;
    },
  };
}

register("TensorFlow.js", await packageVersion("@tensorflow/tfjs"), setup);
