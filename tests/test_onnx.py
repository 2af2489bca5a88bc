"""ONNX export and the `wasm` backend, against onnx's checker and the reference executor.

* every record of the op oracle (tests/oracle.py) runs on backend="wasm" (its graph exported
  by webgrad/onnx and run by onnxruntime, PyPI's CPU build) and must equal the reference
  executor's outputs and gradients within the record's tolerances; the random records give
  the same bits. Each record's training graph also passes `onnx.checker` (full check, with
  shape inference);
* the exported training step of the MLP, run by onnxruntime directly (no webgrad in the
  loop: the test feeds parameters and state and feeds the `<name>:new` outputs back), trains
  as the reference executor does over several steps; the tiny transformer and a dropout
  model train equally on backend="wasm";
* a forward program's export (parameters embedded), GPT-2 tiny's logits and cached decode
  (backend="wasm", and its exported file in onnxruntime), the Llama demo model's cached decode
  and greedy generation, and a Q8_0 weight (decoded by the runtime, and at export) equal the
  reference; the Llama decode step's export makes each layer's q/k/v and gate/up products one
  MatMul and its RMS norms onnxruntime's SimplifiedLayerNormalization;
* parameters a program only reads are resident in its session (external initializers): an
  upload or a training step is seen by the next run, a parameter written twice after the
  session was made is fed from then on; GPT-2 tiny's decode step holds every weight so and
  feeds and writes back its KV cache, equal to the reference before and after new weights.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

import models
import oracle
import webgrad as wg
from webgrad import Module, nn, ops, optim
from webgrad.onnx import export_graph

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def check_model(model: bytes) -> None:
    onnx.checker.check_model(onnx.load_from_string(model), full_check=True)


def _close(got, want, rtol, atol, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


def _size(record) -> int:
    return sum(int(np.prod(a.shape)) for a in record.args)


# the records of large arguments exist for WGSL's tilings (the same ONNX operators run them):
# slow cases here, where generating their inputs in pure Python costs most of their time
RECORDS = [pytest.param(r, marks=pytest.mark.slow) if _size(r) > 9000 else r for r in oracle.RECORDS]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.name)
def test_oracle_records_equal_the_reference(record):
    c, _ = oracle.compile_record(record, "reference")
    try:
        check_model(export_graph(c.ir).model)
    finally:
        c.destroy()
    want = oracle.run_webgrad(record, "reference")
    got = oracle.run_webgrad(record, "wasm")
    tol = dict(rtol=max(record.rtol, 1e-5), atol=max(record.atol, 1e-6))
    for key in ("out", "out_run"):
        if got["out_dtype"] == "i32":
            assert got[key] == want[key], f"{record.name}: {key}"
        else:
            _close(got[key], want[key], what=f"{record.name}: {key}", **tol)
    _close([got["loss"], got["loss_run"]], [want["loss"], want["loss_run"]],
           what=f"{record.name}: loss", rtol=tol["rtol"], atol=tol["atol"] * 100)
    for name, g in want["grads"].items():
        _close(got["grads"][name], g, what=f"{record.name}: gradient of {name}", **tol)


def _ort_session(model: bytes):
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def test_exported_training_step_trains_in_onnxruntime(tmp_path):
    ref = models.compile_mlp("reference", seed=0)
    path = tmp_path / "mlp_step.onnx"
    ex = ref.export_onnx(str(path))
    check_model(path.read_bytes())
    assert {"loss", *(f"{n}:new" for n in ref.param_names)} <= {o.name for o in onnx.load(str(path)).graph.output}
    sess = _ort_session(path.read_bytes())
    # the state the reference holds before its first step: parameters, Adam's moments, step
    state = {n: np.asarray(v, np.float32) for n, v in ref.download_params().items()}
    for name in ex.persistent:
        if name not in state:
            state[name] = np.asarray(run_read(ref, name), np.float32)
    rng = random.Random(1)
    for _ in range(4):
        batch = models.sin_batch(rng)
        want = ref.step(batch)
        feeds = {k: np.asarray(batch[k], np.float32) for k in ex.feeds}
        names = ["loss", *ex.writebacks]
        outs = dict(zip(names, sess.run(names, {**feeds, **{k: state[k] for k in ex.persistent}})))
        np.testing.assert_allclose(outs["loss"], want, rtol=1e-5)
        for o, buf in ex.writebacks.items():
            state[buf] = outs[o]
    for name, v in ref.download_params().items():
        np.testing.assert_allclose(state[name], v, rtol=1e-5, atol=1e-6, err_msg=name)
    assert float(state["step"]) == 4.0


def run_read(c, name):
    from webgrad.blocking import run_blocking
    from webgrad.arrays import to_user
    return to_user(run_blocking(c.backend.read(name)))


class DropoutMLP(Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(3, 16)
        self.fc2 = nn.Linear(16, 1)


def dropout_loss(m, inp):
    h = ops.dropout(ops.gelu(m.fc1(inp["x"])), 0.3)
    d = m.fc2(h) - inp["y"]
    return ops.sum_all(d * d)


def test_training_on_wasm_equals_the_reference():
    # the tiny transformer (cross entropy, attention, Adam) and a dropout model (the in-graph
    # random numbers, keyed by the step counter): every loss and the final parameters
    batch = models.reversal_batch(0)
    runs = {}
    for be in ("reference", "wasm"):
        c = models.compile_transformer(be, seed=0)
        runs[be] = ([c.step(batch) for _ in range(3)], c.download_params())
    (lw, pw), (lr, pr) = runs["wasm"], runs["reference"]
    np.testing.assert_allclose(lw, lr, rtol=1e-5)
    for n in pr:
        np.testing.assert_allclose(pw[n], pr[n], rtol=1e-4, atol=1e-5, err_msg=n)
    rng = np.random.default_rng(0)
    feed = {"x": rng.standard_normal((8, 3)).astype(np.float32),
            "y": rng.standard_normal((8, 1)).astype(np.float32)}
    losses = {}
    for be in ("reference", "wasm"):
        c = wg.compile_module(DropoutMLP, dropout_loss, inputs={"x": ([8, 3], "f32"), "y": ([8, 1], "f32")},
                              optimizer=optim.SGD(lr=0.01), backend=be, seed=5)
        losses[be] = [c.step(feed) for _ in range(4)]
    np.testing.assert_allclose(losses["wasm"], losses["reference"], rtol=1e-5)
    assert len(set(losses["wasm"])) == 4  # the masks (and so the losses) change every step


def test_forward_program_export_embeds_the_parameters(tmp_path):
    c = models.compile_mlp("reference", seed=3)
    fwd = c.compile_forward(lambda m, f: models.mlp_forward(m, f["x"]), inputs={"x": ([5, 1], "f32")})
    x = np.linspace(-3, 3, 5, dtype=np.float32).reshape(5, 1)
    path = tmp_path / "mlp.onnx"
    ex = fwd.export_onnx(str(path))
    check_model(path.read_bytes())
    assert list(ex.feeds) == ["x"] and not ex.persistent  # weights inside the file
    got = _ort_session(path.read_bytes()).run(["output"], {"x": x})[0]
    np.testing.assert_allclose(got, fwd.run({"x": x}), rtol=1e-5, atol=1e-6)


def test_gpt2_tiny_logits_and_cached_decode(tmp_path):
    from webgrad.models import gpt2
    cfg = gpt2.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_ctx=32, vocab_size=11,
                          layer_norm_epsilon=1e-5)
    ids = [1, 5, 2, 7, 3, 3, 9, 0]
    ref, w = (gpt2.GPT2.init_random(cfg, seed=3, backend=b) for b in ("reference", "wasm"))
    want = np.asarray(ref.forward(ids))
    np.testing.assert_allclose(w.forward(ids), want, rtol=1e-4, atol=1e-5)
    cache = w.new_cache()
    rows = [w.logits_all_step(ids[:3], cache)] + [w.logits_step([t], cache)[None] for t in ids[3:]]
    np.testing.assert_allclose(np.concatenate(rows), want, rtol=1e-4, atol=1e-5)
    # the exported file alone: feed the ids, read the logits
    path = tmp_path / "gpt2_tiny.onnx"
    ref.export_onnx(str(path), n_tokens=len(ids))
    check_model(path.read_bytes())
    got = _ort_session(path.read_bytes()).run(["logits.0"], {"ids": np.asarray(ids, np.int32)})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _resident(fwd) -> tuple[set, set]:
    """(resident, fed) persistent buffers of a wasm program's current export."""
    ex = fwd._prog.exe.ex
    return {v[1] for v in ex.resident.values()}, set(ex.persistent)


def test_resident_parameters_follow_every_write():
    # a forward program holds the parameters it only reads in its session (external
    # initializers, not feeds); every upload is seen by the next run, and a parameter written
    # twice after the session was made is fed from then on, with the same results
    rng = np.random.default_rng(0)
    x = rng.standard_normal((models.MLP_B, 1)).astype(np.float32)
    fwds = {}
    for be in ("reference", "wasm"):
        c = models.compile_mlp(be, seed=3)
        fwds[be] = c.compile_forward(lambda m, f: models.mlp_forward(m, f["x"]),
                                     inputs={"x": ([models.MLP_B, 1], "f32")})
    names = fwds["reference"].param_names
    resident, fed = _resident(fwds["wasm"])
    assert resident == set(names) and not fed & set(names)
    np.testing.assert_allclose(fwds["wasm"].run({"x": x}), fwds["reference"].run({"x": x}),
                               rtol=1e-5, atol=1e-6)
    for k in range(3):
        new = {n: rng.standard_normal(v.shape).astype(np.float32)
               for n, v in fwds["reference"].download_params().items() if n.startswith("l2")}
        for f in fwds.values():
            f.upload_params(new, partial=True)
        np.testing.assert_allclose(fwds["wasm"].run({"x": x}), fwds["reference"].run({"x": x}),
                                   rtol=1e-5, atol=1e-6, err_msg=f"after upload {k}")
    resident, fed = _resident(fwds["wasm"])
    assert set(new) <= fed and not set(new) & resident   # written twice: fed now
    assert resident == set(names) - set(new)


def test_resident_parameters_see_training_steps():
    # a training step writes the parameters that a forward program of the same store holds
    # resident: every evaluation between steps sees the step before it, as on the reference
    rng = random.Random(2)
    batches = [models.sin_batch(rng) for _ in range(4)]
    x = np.linspace(-3, 3, models.MLP_B, dtype=np.float32).reshape(-1, 1)
    outs = {}
    for be in ("reference", "wasm"):
        c = models.compile_mlp(be, seed=1)
        fwd = c.compile_forward(lambda m, f: models.mlp_forward(m, f["x"]),
                                inputs={"x": ([models.MLP_B, 1], "f32")})
        outs[be] = [np.asarray(fwd.run({"x": x}))]
        for b in batches:
            c.step(b)
            outs[be].append(np.asarray(fwd.run({"x": x})))
    for k, (got, want) in enumerate(zip(outs["wasm"], outs["reference"])):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"after step {k}")
    assert len({o.tobytes() for o in outs["wasm"]}) == len(outs["wasm"])  # each step moved them


def test_decode_step_holds_its_weights_resident():
    # GPT-2 tiny's cached step: the weights are the session's, the KV cache is fed and
    # written back; the greedy tokens equal the reference's, before and after new weights
    from webgrad.models import gpt2
    cfg = gpt2.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_ctx=32, vocab_size=11,
                          layer_norm_epsilon=1e-5)
    ids = [1, 5, 2, 7]
    ref, w = (gpt2.GPT2.init_random(cfg, seed=3, backend=b) for b in ("reference", "wasm"))
    assert w.generate(ids, max_new_tokens=8, temperature=0) == ref.generate(ids, max_new_tokens=8, temperature=0)
    ex = w._programs[("step", 1)]._prog.exe.ex
    written = set(ex.writebacks.values())
    assert written and written <= set(ex.persistent)       # the cache: fed, written back
    assert {v[1] for v in ex.resident.values()} == set(w.shapes)   # every weight resident
    other = gpt2.GPT2.init_random(cfg, seed=4, backend="reference")
    for n in w.shapes:
        h = run_blocking_read(other.backend, n)
        w.backend.write(n, h)
        ref.backend.write(n, h)
    cache_w, cache_r = w.new_cache(), ref.new_cache()
    np.testing.assert_allclose(w.logits_step(ids, cache_w), ref.logits_step(ids, cache_r),
                               rtol=1e-4, atol=1e-5)


def run_blocking_read(backend, name):
    from webgrad.blocking import run_blocking
    return run_blocking(backend.read(name))


def test_bad_export_arguments_are_refused():
    c = models.compile_mlp("reference", seed=0)
    with pytest.raises(ValueError, match="'step' or 'run'"):
        c.export_onnx(program="train")

    class Clash(Module):  # a parameter named as a feed: one ONNX input name for both
        def __init__(self):
            super().__init__()
            self.x = self.param([2])

    clash = wg.compile_forward(Clash, lambda m, f: m.x * f["x"], inputs={"x": [2]})
    with pytest.raises(ValueError, match="both a feed and a persistent buffer.*rename the feed"):
        clash.export_onnx(embed_params=False)


def test_device_info_names_the_engine():
    info = wg.device_info("wasm")
    assert info == {"backend": "wasm", "engine": f"onnxruntime {ort.__version__} (CPU)",
                    "reason": "asked for"}
    assert wg.device_info("reference")["engine"] == "numpy"


def test_quantized_weights_decoded_by_the_runtime_and_at_export(tmp_path):
    gguf = pytest.importorskip("gguf")
    from webgrad import quants
    from webgrad.compile import compile_forward

    class M(Module):
        def __init__(self):
            super().__init__()
            self.w = self.param([32, 4])
            self.w.quant = quants.QuantSpec("Q8_0", (4, 32), transposed=True)
            self.b = self.param([4])

    W = (0.1 * np.random.default_rng(0).standard_normal((4, 32))).astype(np.float32)
    raw = gguf.quants.quantize(W, gguf.GGMLQuantizationType.Q8_0)
    words = np.frombuffer(quants.transcode("Q8_0", raw.tobytes()), dtype="<i4")
    x = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
    want = x.astype(np.float64) @ gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0).T + 0.5
    for be in ("wasm", "reference"):
        f = compile_forward(M, lambda m, fd: fd["x"] @ m.w + m.b, inputs={"x": [2, 32]}, backend=be)
        f.upload_params({"w": words, "b": np.full(4, 0.5, np.float32)})
        np.testing.assert_allclose(f.run({"x": x}), want, rtol=1e-5, atol=1e-6, err_msg=be)
    path = tmp_path / "q8.onnx"
    ex = f.export_onnx(str(path))
    check_model(path.read_bytes())
    assert not ex.dequantized and list(ex.feeds) == ["x"]  # decoded into an initializer
    got = _ort_session(path.read_bytes()).run(["output"], {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_llama_cached_decode_and_greedy_generate(tmp_path):
    from webgrad.models import llama_demo
    ref, w = (llama_demo.model(seed=0, backend=b) for b in ("reference", "wasm"))
    ids = [1, 5, 9, 3, 7]
    want = np.asarray(ref.forward(ids))
    np.testing.assert_allclose(w.forward(ids), want, rtol=1e-4, atol=1e-5)
    cache = w.new_cache()
    w.logits_step(ids[:3], cache)
    np.testing.assert_allclose(w.logits_step(ids[3:], cache), want[-1], rtol=1e-4, atol=1e-5)
    assert w.generate(ids, max_new_tokens=6, temperature=0) == ref.generate(ids, max_new_tokens=6, temperature=0)
    # the decode step's file: the KV cache in and out
    path = tmp_path / "llama_step.onnx"
    ex = ref.export_onnx(str(path), n_tokens=1, program="step")
    check_model(path.read_bytes())
    assert ex.writebacks and all(o.endswith(":new") for o in ex.writebacks)


def test_llama_step_export_fuses_shared_products_and_rms_norms(tmp_path):
    """The decode step's export: each layer's q/k/v and gate/up products are one MatMul on
    the weights concatenated (folded by onnxruntime into one initializer) and a Split, and
    each RMS norm is in the form onnxruntime makes one SimplifiedLayerNormalization: fewer
    nodes a step than one per primitive, each a fixed cost in onnxruntime-web. The values
    equal the reference's: test_llama_cached_decode_and_greedy_generate (backend="wasm")."""
    from webgrad.models import llama_demo
    ref = llama_demo.model(seed=0, backend="reference")
    layers = llama_demo.CONFIG.num_hidden_layers
    path = tmp_path / "llama_step.onnx"
    ref.export_onnx(str(path), n_tokens=1, program="step")
    check_model(path.read_bytes())
    nodes = onnx.load(str(path)).graph.node
    made = {o: n.op_type for n in nodes for o in n.output}
    splits = [n for n in nodes if n.op_type == "Split" and made[n.input[0]] == "MatMul"]
    assert sorted(len(n.output) for n in splits) == [2] * layers + [3] * layers
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx")).graph.node
    ops = [n.op_type for n in optimized]
    assert ops.count("SimplifiedLayerNormalization") == 2 * layers + 1  # and the final norm
    assert "Reciprocal" not in ops  # rsqrt's lowering: no norm left unfused
    made = {o: n.op_type for n in optimized for o in n.output}
    assert not [n for n in optimized if n.op_type == "MatMul" and made.get(n.input[1]) == "Concat"]


@pytest.mark.parametrize("change, gqa, rotary", [
    ({}, True, True),                                   # the demo model: head_dim 16
    ({"head_dim": 8}, True, False),                     # the CPU kernel's rotary needs 16k
    ({"sliding_window": 4, "model_type": "mistral"}, False, False),   # a window: unfused
])
def test_llama_decode_step_attention_is_group_query_attention(change, gqa, rotary):
    """The decode step's attention on the KV cache: one com.microsoft GroupQueryAttention a
    layer (with its rotary embedding where head_dim allows), else the standard form. Its
    logits and the whole cache after the step equal the reference executor's, from a cache
    of random rows (the rows past the position, which the node's present K/V zero, keep
    their values, as write_rows keeps them)."""
    import dataclasses
    from webgrad.models import llama, llama_demo
    from webgrad.models.decoding import step_kind
    cfg = dataclasses.replace(llama_demo.CONFIG, n_ctx=32, **change)
    ref, w = (llama.Llama.init_random(cfg, seed=3, backend=b) for b in ("reference", "wasm"))
    rng = np.random.default_rng(0)
    caches = [m.new_cache() for m in (ref, w)]
    for m, c in zip((ref, w), caches):
        m.logits_step([1, 5, 9], c)   # compiles the programs and makes the cache state
    states = {k: rng.standard_normal(np.shape(v)).astype(np.float32)
              for k, v in ref.backend.store.items() if k.startswith("kv.")}
    assert len(states) == 2 * cfg.num_hidden_layers
    for pos in (11, 0, cfg.n_ctx - 1):   # the first and the last row too
        for m, c in zip((ref, w), caches):
            m.backend.store.update({k: v.copy() for k, v in states.items()})
            c.pos = pos
        got, want = w.logits_step([7], caches[1]), ref.logits_step([7], caches[0])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        for k in states:
            a, b = np.asarray(w.backend.store[k]), np.asarray(ref.backend.store[k])
            np.testing.assert_array_equal(np.delete(a, pos, axis=0), np.delete(states[k], pos, axis=0))
            np.testing.assert_allclose(a[pos], b[pos], rtol=1e-5, atol=1e-6, err_msg=k)
            assert not np.allclose(b[pos], states[k][pos])   # the row was written
    ex = w._program(step_kind(1, ["logits.0"]), 1)._prog.exe.ex
    model = onnx.load_from_string(ex.model)
    nodes = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(nodes) == (cfg.num_hidden_layers if gqa else 0)
    assert ("Softmax" in ex.ops) != gqa
    assert all({a.name: a.i for a in n.attribute}.get("do_rotary", 0) == rotary for n in nodes)
    assert ("Sin" in ex.ops) != rotary   # the rotary tables are the node's: none computed
    # under the node, each cache is exchanged by rows: fed its rows below pos (a symbolic
    # length), its new row returned and written in place (no "<buffer>:new" of the cache)
    kv = {k for k in states}
    assert set(b for b, _ in ex.row_reads.values()) == (kv if gqa else set())
    assert set(b for b, _ in ex.row_writes.values()) == (kv if gqa else set())
    assert not kv & set(ex.writebacks.values()) if gqa else kv <= set(ex.writebacks.values())
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in model.graph.input}
    assert all(dims[k] == ["pos", dims[k][1]] for k in ex.row_reads)
    before = {k: np.asarray(w.backend.store[k]).copy() for k in states}
    if gqa:   # the program itself fed a position past the cache (the Cache refuses it first)
        with pytest.raises(ValueError, match="rows 0 to 31"):
            w._program(step_kind(1, ["logits.0"]), 1).run({"ids": [7], "pos": [cfg.n_ctx + 1]},
                                                          ["logits.0"])
    assert all(np.array_equal(np.asarray(w.backend.store[k]), before[k]) for k in states)
