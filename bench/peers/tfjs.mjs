// TensorFlow.js on its WebGPU backend (@tensorflow/tfjs-backend-webgpu), eager as TF.js runs:
// optimizer.minimize() records the forward pass on a tape, backpropagates and applies Adam
// (tf.train.adam with webgrad's betas and eps; TF.js's default eps would be 1e-7).
// `tf` is the global the UMD bundles in tfjs.html define.
import { ADAM, LAYERS, packageVersion, register, tfjsBackend } from "./common.mjs";

const tf = globalThis.tf;
// ?device=wasm: tfjs-backend-wasm (bench/mlp_browser.py --cpu, WebGPU off)
const DEVICE = new URLSearchParams(location.search).get("device") ?? "webgpu";

async function setup(config) {
  const adapter = await tfjsBackend(tf, DEVICE);
  const B = config.batch;
  const vars = {};
  for (const [name, values] of Object.entries(config.params))
    vars[name] = tf.variable(tf.tensor(Float32Array.from(values), config.shapes[name]), true, name);
  const optimizer = tf.train.adam(config.lr, ADAM.beta1, ADAM.beta2, ADAM.eps);
  const varList = Object.values(vars);
  return {
    info: { adapter, backend: tf.getBackend() },
    async step(x, y) {
      const xt = tf.tensor2d(x, [B, 1]), yt = tf.tensor2d(y, [B, 1]);
      const loss = optimizer.minimize(() => {
        let h = xt;
        LAYERS.forEach(([w, b], i) => {
          h = tf.add(tf.matMul(h, vars[w]), vars[b]);
          if (i < LAYERS.length - 1) h = tf.relu(h);
        });
        const d = tf.sub(h, yt);
        return tf.div(tf.sum(tf.mul(d, d)), B);  // sum(d * d) / B, as webgrad's loss_fn
      }, true, varList);
      const value = (await loss.data())[0];
      tf.dispose([xt, yt, loss]);
      return value;
    },
  };
}

register("TensorFlow.js", await packageVersion("@tensorflow/tfjs-backend-webgpu"), setup);
