"""Half precision: the f16 storage type, the precision modes and dynamic loss scaling.

* casts to f16 round as torch's .half() does (nearest even, overflow to inf, subnormals),
  on the reference and torch executors;
* ops refuse f16 operands where they would compute (f16 is storage; the maths is f32);
* precision="f32" (the default) leaves every traced program as it was;
* a small transformer block trained with precision="mixed" on the reference executor tracks
  torch.amp (fp16 autocast, GradScaler) step by step, including a step that overflows and is
  skipped (parameters and Adam state kept, scale halved) and the scale's growth after 2000
  good steps.
The f16 run of every op's oracle record is in tests/test_ops.py (test_oracle_f16).
"""
from __future__ import annotations

import numpy as np
import pytest

import webgrad as wg
from backends import WEBGPU
from webgrad import Module, nn, ops, optim
from webgrad.precision import apply_precision
from webgrad.primitives import ShapeError

torch = pytest.importorskip("torch")

SPECIALS = np.array([0.0, -0.0, 1.0, 1 / 3, 65504.0, 65520.0, 7e4, -1e6, 1e-5, 6e-8, 2e-8,
                     2.0 ** -24, 1.0009765625, 1.00048828125, 1.00146484375, 2049.0, 2051.0],
                    np.float32)


@pytest.mark.parametrize("backend,emulate", [
    ("reference", False), ("torch", False), pytest.param("webgpu", False, marks=WEBGPU.marks),
    pytest.param("webgpu", True, marks=WEBGPU.marks, id="webgpu-f16_emulation")])
def test_cast_rounds_as_torch_half(backend, emulate):
    """f32 -> f16 -> f32 through a compiled program against torch's .half(): ties to even
    (1 + 2^-11), overflow past 65504 + half an ulp to inf, f16 subnormals down to 2^-24,
    and random values across f16's range; on WebGPU with f16 storage and in f32 buffers
    (f16_emulation). The rounding is integer arithmetic in both (elementwise.wg_round_f16):
    f32(f16(x)) came back unrounded on the H200 (NVIDIA's compiler folds it)."""
    from webgrad.codegen import KernelOptions
    rng = np.random.RandomState(6)
    x = np.concatenate([SPECIALS, (rng.randn(4000) * 10.0 ** rng.uniform(-9, 5, 4000))
                        .astype(np.float32), np.nextafter(SPECIALS, np.float32(np.inf))])

    def fwd(m, f):
        return ops.cast(ops.cast(f["x"], "f16"), "f32")

    kw = {"kernel_options": KernelOptions(f16_emulation=True)} if emulate else {}
    prog = wg.compile_forward(Module, fwd, inputs={"x": [len(x)]}, backend=backend, **kw)
    got = np.asarray(prog.run({"x": x}))
    want = torch.from_numpy(x).half().float().numpy()
    np.testing.assert_array_equal(got, want)
    assert np.isinf(got[5]) and got[10] == 0.0 and got[11] == 2.0 ** -24


def test_f16_is_storage_only():
    """Arithmetic on f16 values is refused with the fix; layout ops and matmul take them."""
    def fwd(m, f):
        h = ops.cast(f["x"], "f16")
        return h + h
    with pytest.raises(ShapeError, match=r"f16 is a storage type.*ops.cast\(x, 'f32'\)"):
        wg.compile_forward(Module, fwd, inputs={"x": [2, 2]})

    def mixed(m, f):
        return ops.matmul(ops.cast(f["x"], "f16"), f["x"])
    with pytest.raises(ShapeError, match="two f32 or two f16 operands"):
        wg.compile_forward(Module, mixed, inputs={"x": [2, 2]})

    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    prog = wg.compile_forward(Module, lambda m, f: ops.matmul(
        ops.cast(f["x"], "f16"), ops.transpose(ops.cast(f["x"], "f16"), (1, 0))),
        inputs={"x": [2, 3]})
    xh = torch.from_numpy(x).half().float()
    np.testing.assert_allclose(prog.run({"x": x}), (xh @ xh.T).numpy(), rtol=1e-6)


def _tiny_model_ir(precision):
    def loss_fn(m, f):
        return nn.mse(m(f["x"]), f["y"])
    c = wg.compile_module(lambda: nn.Linear(3, 2), loss_fn, inputs={"x": [4, 3], "y": [4, 2]},
                          precision=precision)
    return c


def test_f32_default_is_unchanged():
    """precision="f32" is the default and the identity: the same IR text as before the
    precision pass existed (no cast node, no loss-scale state), and a bad mode is refused."""
    default, f32 = _tiny_model_ir("f32"), wg.compile_module(
        lambda: nn.Linear(3, 2), lambda m, f: nn.mse(m(f["x"]), f["y"]),
        inputs={"x": [4, 3], "y": [4, 2]})
    assert str(default.ir) == str(f32.ir)
    assert not any(n.op == "cast" for n in default.ir.nodes)
    assert not any(k.startswith("opt/amp") for k in default.ir.state)
    g = default.ir
    assert apply_precision(g, "f32")[0] is g
    with pytest.raises(ValueError, match="precision must be one of 'f32', 'mixed', 'f16'"):
        _tiny_model_ir("bf16")
    with pytest.raises(ValueError, match="optimizer=None, or train with precision='mixed'"):
        _tiny_model_ir("f16")


MIXED_IR = """\
%0: f32[4,3] = param {name='W'}
%1: f32[3] = param {name='b'}
%2: f32[] = state {name='step'}
%3: f32[2,4] = input {name='x'}
%4: f16[2,4] = cast %3 {dtype='f16'}
%5: f16[4,3] = cast %0 {dtype='f16'}
%6: f32[2,3] = matmul %4, %5
%7: f16[2,3] = cast %6 {dtype='f16'}
%8: f32[2,3] = cast %7 {dtype='f32'}
%9: f32[2,3] = add %8, %1
%10: f32[2,3] = relu %9
output output = %10"""


def test_mixed_ir_snapshot():
    """The pass's rounding points, readable: the matmul's operands and result in f16, the
    bias add and relu on f32 values (a change to the pass shows up here as a diff)."""
    f = wg.compile_forward(lambda: nn.Linear(4, 3), lambda m, f: ops.relu(m(f["x"])),
                           inputs={"x": [2, 4]}, precision="mixed")
    assert str(f._prog.graph) == MIXED_IR


# ---------------------------------------------------------------- training against torch.amp

D, T, V = 16, 8, 11


class Block(Module):
    """Embedding, one causal self-attention head, layer norm, a GELU MLP, tied-free head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.ln1 = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.ln2 = nn.LayerNorm(D)
        self.fc = nn.Linear(D, 2 * D)
        self.out = nn.Linear(2 * D, V)

    def __call__(self, tokens):
        x = self.emb(tokens)                                   # [B, T, D]
        qkv = self.qkv(self.ln1(x))
        q, k, v = (ops.slice(qkv, 2, j * D, (j + 1) * D) for j in range(3))
        att = ops.softmax_causal_last(ops.matmul(q, ops.swap_axes(k, -1, -2)) * (D ** -0.5))
        x = x + self.proj(ops.matmul(att, v))
        return self.out(ops.gelu(self.fc(self.ln2(x))))


def _loss(m, f):
    return nn.cross_entropy_last(m(f["tokens"]), f["targets"])


def _torch_block(params):
    """The same block in torch, its parameters copied from webgrad's (nn.Linear W is [in, out])."""
    P = {k: torch.tensor(np.asarray(v), requires_grad=True) for k, v in params.items()}

    def lin(x, name):
        return x @ P[f"{name}.W"] + P[f"{name}.b"]

    def ln(x, name):  # CUDA autocast runs layer_norm in f32; CPU autocast would not: cast here
        return torch.nn.functional.layer_norm(x.float(), (D,), P[f"{name}.weight"],
                                              P[f"{name}.bias"], 1e-5)

    def fwd(tokens):
        x = P["emb.W"][tokens]
        qkv = lin(ln(x, "ln1"), "qkv")
        q, k, v = qkv.split(D, dim=-1)
        s = (q @ k.transpose(-1, -2)).float() * (D ** -0.5)   # softmax in f32, as on CUDA
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        x = x + lin(torch.softmax(s, -1) @ v, "proj")
        h = torch.nn.functional.gelu(lin(ln(x, "ln2"), "fc").float(), approximate="tanh")
        return lin(h, "out").float()
    return P, fwd


@pytest.mark.parametrize("backend", ["reference", WEBGPU])
def test_mixed_training_tracks_torch_amp(backend):
    """12 Adam steps of a transformer block in precision="mixed" on the reference executor
    (and on WebGPU, where each parameter's update behind the skip is one kernel, the
    finiteness check sums several gradients at once: fusion_groups._merge_siblings,
    precision.unscale, and the attention is fused) against torch.autocast("cpu", float16) with torch.amp.GradScaler,
    from the same weights: the same losses (within f16 rounding), the same skipped steps and
    scales, and at step 6 a batch whose embedding overflows f16 (an f16 matmul operand
    becomes inf): both skip it, keep every parameter and Adam moment, and halve the scale."""
    B = 2
    opt = optim.Adam(lr=3e-3)
    c = wg.compile_module(Block, _loss, inputs={"tokens": ([B, T], "i32"), "targets": ([B, T], "i32")},
                          optimizer=opt, precision="mixed", seed=3, backend=backend)
    if backend != "reference":  # its attention fused (KernelOptions.attn_mixed)
        assert any(n.startswith("attn_") for n in c._train.exe.kernel_names)
    P, fwd = _torch_block(c.download_params())
    topt = torch.optim.Adam(P.values(), lr=3e-3)
    scaler = torch.amp.GradScaler("cpu")
    rng = np.random.RandomState(0)
    big = 1e5  # > 65504: the embedding row read by the first matmul is inf in f16
    for step in range(12):
        tokens = rng.randint(0, V, size=(B, T)).astype(np.int32)
        targets = rng.randint(0, V, size=(B, T)).astype(np.int32)
        if step == 6:
            saved = c.download_params()["emb.W"]
            row = np.asarray(saved).copy()
            row[tokens[0, 0]] = big
            c.upload_params({"emb.W": row}, partial=True)
            before = {k: np.asarray(v).copy() for k, v in c.download_params().items()}
            with torch.no_grad():
                P["emb.W"][tokens[0, 0]] = big
            before_adam = {k: v["exp_avg"].clone() for k, v in topt.state.items()}
        loss = c.step({"tokens": tokens, "targets": targets})
        topt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            logits = fwd(torch.from_numpy(tokens).long())
        tl = torch.nn.functional.cross_entropy(logits.reshape(-1, V),
                                               torch.from_numpy(targets).long().reshape(-1))
        scaler.scale(tl).backward()
        scale_before = scaler.get_scale()
        scaler.step(topt)
        scaler.update()
        torch_skipped = scaler.get_scale() < scale_before
        assert loss.skipped == torch_skipped, f"step {step}: skipped {loss.skipped}, torch {torch_skipped}"
        assert loss.scale == scaler.get_scale() == c.loss_scale, step
        if step == 6:
            assert loss.skipped and loss.scale == 32768.0
            after = c.download_params()
            for k in before:
                np.testing.assert_array_equal(np.asarray(after[k]), before[k], err_msg=k)
            assert all(torch.equal(before_adam[k], v["exp_avg"]) for k, v in topt.state.items())
            c.upload_params({"emb.W": saved}, partial=True)  # the model and torch's go on from here
            with torch.no_grad():
                P["emb.W"].copy_(torch.tensor(np.asarray(saved)))
        else:
            assert not loss.skipped, step
            assert float(loss) == pytest.approx(float(tl.detach()), rel=3e-3, abs=3e-3), step
    got = c.download_params()
    for k, v in P.items():
        mine, theirs = np.asarray(got[k]), v.detach().numpy()
        if k == "qkv.b":  # the key bias's true gradient is 0 (softmax ignores q.b_k, the same
            # for a whole row): both gradients are rounding noise, which Adam scales to lr
            mine, theirs = np.delete(mine, np.s_[D:2 * D]), np.delete(theirs, np.s_[D:2 * D])
        np.testing.assert_allclose(mine, theirs, atol=2e-3, rtol=2e-2, err_msg=k)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_skipped_step_with_check_finite_and_a_checkpoint(tmp_path):
    """check_finite=True does not refuse a step that loss scaling skipped (its state is the
    right one: parameters kept, scale halved); a checkpoint keeps the scale across a load."""
    def make():
        return wg.compile_module(lambda: nn.Linear(3, 2), lambda m, f: nn.mse(m(f["x"]), f["y"]),
                                 inputs={"x": [4, 3], "y": [4, 2]}, precision="mixed",
                                 check_finite=True, optimizer=optim.Adam(lr=1e-2))
    c = make()
    x, y = np.ones((4, 3), np.float32) * 0.1, np.zeros((4, 2), np.float32)
    assert not c.step({"x": x, "y": y}).skipped
    before = c.download_params()
    loss = c.step({"x": x * 1e6, "y": y})  # f16 overflow in the first matmul's operand
    assert loss.skipped and loss.scale == 32768.0 and c.last_step_skipped
    for k, v in c.download_params().items():
        np.testing.assert_array_equal(np.asarray(v), np.asarray(before[k]))
    c.save(str(tmp_path / "ck.safetensors"))
    d = make()
    d.load(str(tmp_path / "ck.safetensors"))
    assert d.loss_scale == 32768.0
    assert d.step({"x": x, "y": y}).scale == c.step({"x": x, "y": y}).scale == 32768.0
    d.reset_optimizer_state()  # the scale is optimizer state: back to 2^16
    assert d.loss_scale == 65536.0 and d.step({"x": x, "y": y}).scale == 65536.0


def test_forward_over_a_mixed_module_rounds_as_its_step():
    """CompiledModule.compile_forward takes the module's precision unless told otherwise:
    its output is the step's forward (run()), and precision="f32" gives the f32 value."""
    c = wg.compile_module(_Net, lambda m, f: ops.mean_all(m(f["x"])), inputs={"x": [3, 6]},
                          precision="mixed", optimizer=None)
    x = np.random.RandomState(4).randn(3, 6).astype(np.float32)
    mixed = c.compile_forward(lambda m, f: ops.mean_all(m(f["x"])), inputs={"x": [3, 6]})
    f32 = c.compile_forward(lambda m, f: ops.mean_all(m(f["x"])), inputs={"x": [3, 6]},
                            precision="f32")
    assert float(np.asarray(mixed.run({"x": x}))) == c.run({"x": x})
    assert float(np.asarray(f32.run({"x": x}))) != c.run({"x": x})
    assert not any(n.dtype == "f16" for n in f32._prog.graph.nodes)


def test_mixed_matches_f32_where_f16_is_exact():
    """Operands that f16 holds exactly (multiples of 1/8 below 2^8) give mixed precision's
    matmul the f32 result bit for bit: the accumulation really is f32 (an f16 accumulator
    would round 2049 to 2048)."""
    x = np.full((1, 4099), 1.0, np.float32)  # sum of 4099 ones: exact in f32, 4100 in f16
    w = np.ones((4099, 1), np.float32)
    for precision, want in (("f32", 4099.0), ("mixed", 4100.0)):  # mixed rounds the result
        prog = wg.compile_forward(Module, lambda m, f: ops.matmul(f["x"], f["w"]),
                                  inputs={"x": [1, 4099], "w": [4099, 1]}, precision=precision)
        assert float(np.asarray(prog.run({"x": x, "w": w}))[0, 0]) == want, precision
    prog = wg.compile_forward(Module, lambda m, f: ops.cast(ops.matmul(
        ops.cast(f["x"], "f16"), ops.cast(f["w"], "f16")), "f32"), inputs={"x": [1, 4099], "w": [4099, 1]})
    assert float(np.asarray(prog.run({"x": x, "w": w}))[0, 0]) == 4099.0  # f32 accumulation


def test_loss_scale_grows_after_2000_good_steps():
    """GradScaler doubles the scale on the 2000th good step in a row. The good-step count is
    persistent state (saved by checkpoints): both counters are set to 1997 after a first
    step, and the next four steps' scales are compared with torch.amp.GradScaler's."""
    from webgrad.arrays import HostArray
    from webgrad.blocking import run_blocking
    from webgrad.precision import GOOD_STEPS
    c = wg.compile_module(lambda: nn.Linear(2, 1), lambda m, f: nn.mse(m(f["x"]), f["y"]),
                          inputs={"x": [1, 2], "y": [1, 1]}, optimizer=optim.SGD(lr=0.0),
                          precision="mixed", keep_grads=False)
    assert GOOD_STEPS in c.state_shapes("test")
    w = torch.zeros(1, requires_grad=True)
    scaler = torch.amp.GradScaler("cpu")
    topt = torch.optim.SGD([w], lr=0.0)
    feed = {"x": np.array([[0.01, 0.02]], np.float32), "y": np.array([[0.0]], np.float32)}
    mine, theirs = [], []
    for k in range(5):
        if k == 1:
            run_blocking(c.write_state_async({GOOD_STEPS: HostArray("f32", [1997.0], shape=())},
                                             method="test"))
            scaler._growth_tracker.fill_(1997)
        mine.append(c.step(feed).scale)
        topt.zero_grad()
        scaler.scale((w * 0.5 - 1.0).pow(2).sum()).backward()
        scaler.step(topt)
        scaler.update()
        theirs.append(scaler.get_scale())
    assert mine == theirs == [65536.0, 65536.0, 65536.0, 131072.0, 131072.0]


# ---------------------------------------------------------------- WebGPU adapters

class _Host:
    """A host that names its adapter and features and keeps the plan it is given."""
    limits = None

    def __init__(self, info, features):
        self.info, self.features, self.plan = info, frozenset(features), None

    def load(self, plan):
        self.plan = plan
        raise _Loaded


class _Loaded(Exception):
    pass


def _mixed_forward(backend):
    return wg.compile_forward(lambda: nn.Linear(4, 3), lambda m, f: m(f["x"]),
                              inputs={"x": [2, 4]}, backend=backend, precision="mixed")


def test_webgpu_needs_shader_f16():
    """An adapter without shader-f16 given a precision="mixed" program: the error names the
    feature, the adapter and the way out, before anything is lowered. With the feature, the
    kernels round to f16 (wg_round_f16; stored temporaries in f16 buffers, `enable f16;`)
    and an f32 program's kernels do not."""
    from webgrad.backends.webgpu import WebGPUBackend
    host = _Host("SwiftShader Device (Subzero)", ["timestamp-query"])
    with pytest.raises(RuntimeError, match=r"SwiftShader Device.*'shader-f16'.*precision='f32'"):
        _mixed_forward(WebGPUBackend(host))
    assert host.plan is None
    host = _Host("llvmpipe (LLVM 15.0.6, 256 bits)", ["shader-f16"])
    with pytest.raises(_Loaded):
        _mixed_forward(WebGPUBackend(host))
    code = "\n".join(p["wgsl"] for p in host.plan["pipelines"])
    assert "wg_round_f16(" in code and "f32(f16(" not in code
    with pytest.raises(_Loaded):
        wg.compile_forward(lambda: nn.Linear(4, 3), lambda m, f: m(f["x"]),
                           inputs={"x": [2, 4]}, backend=WebGPUBackend(host))
    code = "\n".join(p["wgsl"] for p in host.plan["pipelines"])
    assert "f16" not in code
    # the fallback asked for: the same rounding from the bits, no f16 type (SwiftShader)
    from webgrad.codegen import KernelOptions
    host = _Host("SwiftShader Device (Subzero)", [])
    with pytest.raises(_Loaded):
        wg.compile_forward(lambda: nn.Linear(4, 3), lambda m, f: m(f["x"]), inputs={"x": [2, 4]},
                           backend=WebGPUBackend(host), precision="mixed",
                           kernel_options=KernelOptions(f16_emulation=True))
    code = "\n".join(p["wgsl"] for p in host.plan["pipelines"])
    assert "wg_round_f16(" in code and "enable f16" not in code


@pytest.mark.webgpu
def test_mixed_on_native_adapter_matches_reference():
    """precision="mixed" on this machine's native adapter (lavapipe in CI: wgpu-native offers
    shader-f16 there) gives the reference executor's f16-rounded values, not f32's."""
    from backends import webgpu_available
    if not webgpu_available():
        pytest.skip("no native WebGPU adapter")
    x = np.random.RandomState(1).randn(2, 4).astype(np.float32)
    outs = {}
    for be, precision in (("reference", "mixed"), ("webgpu", "mixed"), ("reference", "f32")):
        prog = _mixed_forward(be) if precision == "mixed" else wg.compile_forward(
            lambda: nn.Linear(4, 3), lambda m, f: m(f["x"]), inputs={"x": [2, 4]}, backend=be)
        outs[be, precision] = np.asarray(prog.run({"x": x}))
    np.testing.assert_allclose(outs["webgpu", "mixed"], outs["reference", "mixed"], rtol=0, atol=1e-7)
    assert np.abs(outs["reference", "mixed"] - outs["reference", "f32"]).max() > 1e-5


# ---------------------------------------------------------------- f16 weights

class _Net(Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(6, 5), nn.Linear(5, 4)

    def __call__(self, x):
        return self.l2(ops.gelu(self.l1(x)))


@pytest.mark.parametrize("backend", ["reference", "torch", WEBGPU])
def test_half_weights_are_held_rounded(backend):
    """Module.half() holds the weights in f16: initialised and uploaded values are rounded
    (as torch's .half()), read back as f32, frozen; the forward equals torch's with f16
    weights and f32 maths, and with precision="f16" torch's all-f16 module."""
    x = np.random.RandomState(2).randn(3, 6).astype(np.float32)
    prog = wg.compile_forward(lambda: _Net().half(), lambda m, f: m(f["x"]),
                              inputs={"x": [3, 6]}, backend=backend)
    w = prog.download_params()
    for k, v in w.items():  # the initial values are already f16 values
        assert np.array_equal(np.asarray(v), np.asarray(v).astype(np.float16).astype(np.float32)), k
    rng = np.random.RandomState(3)
    new = {k: (rng.randn(*np.shape(v)) * 3).astype(np.float32) for k, v in w.items()}
    new["l1.b"][0] = 1e5  # past f16's range: inf, as .half() gives
    prog.upload_params(new)
    got = {k: np.asarray(v) for k, v in prog.download_params().items()}
    for k, v in new.items():
        np.testing.assert_array_equal(got[k], torch.from_numpy(v).half().float().numpy(), err_msg=k)
    new["l1.b"][0] = 0.5
    prog.upload_params(new)
    T = {k: torch.from_numpy(v).half() for k, v in new.items()}

    def torch_fwd(x, dt):
        h = torch.nn.functional.gelu(x @ T["l1.W"].to(dt) + T["l1.b"].to(dt), approximate="tanh")
        return h @ T["l2.W"].to(dt) + T["l2.b"].to(dt)
    xt = torch.from_numpy(x)
    np.testing.assert_allclose(np.asarray(prog.run({"x": x})), torch_fwd(xt, torch.float32).numpy(),
                               rtol=1e-5, atol=1e-6)
    p16 = wg.compile_forward(lambda: _Net().half(), lambda m, f: m(f["x"]), inputs={"x": [3, 6]},
                             backend=backend, precision="f16")
    p16.upload_params(new)
    np.testing.assert_allclose(np.asarray(p16.run({"x": x})),
                               torch_fwd(xt.half(), torch.float16).float().numpy(), rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match="held in f16 and trainable"):
        def unfrozen():
            m = _Net().half()
            m.l1.W.trainable = True
            return m
        wg.compile_module(unfrozen, lambda m, f: ops.sum_all(m(f["x"])), inputs={"x": [3, 6]})


class _Quantized(Module):
    def __init__(self):
        super().__init__()
        from webgrad.quants import QuantSpec
        self.W = self.param([64, 32], trainable=False)
        self.W.quant = QuantSpec("Q8_0", (64, 32))

    def __call__(self, x):
        return ops.matmul(x, self.W)


@pytest.mark.parametrize("backend", ["reference", WEBGPU])
def test_mixed_keeps_quantized_weights_decoded_in_the_matmul(backend):
    """A quantized weight's matmul under precision="mixed" rounds only the activation: the
    decoded weight keeps its exact value (Q8_0's d * q is not an f16 value in general), and
    on WebGPU it is still decoded in the matmul's registers, never stored as f32. Checked
    against gguf's own dequantize."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.RandomState(5)
    w = rng.randn(64, 32).astype(np.float32)
    prog = wg.compile_forward(_Quantized, lambda m, f: m(f["x"]), inputs={"x": [2, 64]},
                              backend=backend, precision="mixed")
    g = prog._prog.graph
    mm = next(n for n in g.nodes if n.op == "matmul")
    assert [g[i].dtype for i in mm.inputs] == ["f32", "f32"]
    assert any(g[i].op in ("dequantize", "transpose", "reshape") for i in mm.inputs)
    blocks = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    from webgrad.quants.words import transcode
    prog.upload_params({"W": np.frombuffer(transcode("Q8_0", blocks.tobytes()), np.int32)})
    dec = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0).reshape(64, 32)
    x = rng.randn(2, 64).astype(np.float32)
    want = (x.astype(np.float16).astype(np.float32) @ dec).astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(np.asarray(prog.run({"x": x})), want, rtol=2e-3, atol=1e-3)
    if backend != "reference":
        assert prog._prog.exe.memory_report()["pool_bytes"] < 64 * 32 * 4


class _OddMLP(Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(64, 66), nn.Linear(66, 19)

    def __call__(self, x):
        return self.l2(ops.gelu(self.l1(x)))


def _odd_loss(m, f):
    return ops.mean_all((m(f["x"]) - f["y"]) ** 2)


@pytest.mark.webgpu
@pytest.mark.parametrize("kernel", ["tiled", "tiled_vec4", "direct"])
def test_f16_storage_on_native_adapter(kernel):
    """With shader-f16 (lavapipe through wgpu-native), a precision="mixed" training step keeps
    its f16 values in array<f16> buffers (odd element counts: 5 x 19 = 95 halves, padded),
    each matmul (tiled, tiled with vec4<f16> loads, direct) reading its operands as f16 and
    storing its rounded result in f16: the losses and parameters of three Adam
    steps equal those of the same program with its f16 values in f32 buffers (the fallback,
    f16_emulation) bit for bit and are the reference executor's (which rounds at the same
    points in numpy), and the plan holds fewer bytes than the fallback's."""
    from backends import webgpu_available
    from webgrad.codegen import KernelOptions
    if not webgpu_available():
        pytest.skip("no native WebGPU adapter")
    be = wg.backends.get_backend("webgpu")
    if "shader-f16" not in (getattr(be.host, "features", None) or ()):
        pytest.skip("this adapter has no shader-f16 (test_webgpu_needs_shader_f16 checks the error)")
    rng = np.random.RandomState(7)
    feed = {"x": rng.randn(5, 64).astype(np.float32), "y": rng.randn(5, 19).astype(np.float32)}
    from webgrad.codegen.matmul_config import Config
    vec4 = Config(4, 4, 16, vload=True) if kernel == "tiled_vec4" else None  # 64 x 64 tiles
    opts = KernelOptions(force_direct=kernel == "direct", force_config=vec4)
    runs, reports = {}, {}
    for name, backend, kw in (("ref", "reference", {}), ("gpu", "webgpu", {"kernel_options": opts}),
                              ("emulated", "webgpu", {"kernel_options": KernelOptions(
                                  force_direct=kernel == "direct", force_config=vec4,
                                  f16_emulation=True)})):
        m = wg.compile_module(_OddMLP, _odd_loss, inputs={"x": [5, 64], "y": [5, 19]},
                              optimizer=optim.Adam(lr=0.01), backend=backend, precision="mixed",
                              **kw)
        runs[name] = [float(m.step(feed)) for _ in range(3)], {
            k: np.asarray(v) for k, v in m.download_params().items()}
        if backend != "reference":
            exe = m._train.exe
            reports[name] = exe.memory_report()
            code = "\n".join(p["wgsl"] for p in exe.plan["pipelines"])
            if name == "gpu":
                assert "array<f16>" in code and "enable f16;" in code
                if kernel != "direct":
                    assert " tile " in " ".join(exe.kernel_names)
                assert ("array<vec4<f16>>" in code) == (kernel == "tiled_vec4")
            else:
                assert "f16" not in code.replace("wg_round_f16", "")
    # the same kernels' sums rounded at the same points: f16 storage changes no value
    assert runs["gpu"][0] == runs["emulated"][0]
    for k, v in runs["emulated"][1].items():
        np.testing.assert_array_equal(runs["gpu"][1][k], v, err_msg=k)
    # numpy sums in another order: an f16 rounding may flip by an ulp, and Adam amplifies it
    np.testing.assert_allclose(runs["gpu"][0][0], runs["ref"][0][0], rtol=1e-6)
    np.testing.assert_allclose(runs["gpu"][0], runs["ref"][0], rtol=1e-4)
    for k, v in runs["ref"][1].items():
        np.testing.assert_allclose(runs["gpu"][1][k], v, rtol=1e-3, atol=1e-4, err_msg=k)
    assert reports["gpu"]["pool_bytes"] < reports["emulated"]["pool_bytes"]


@pytest.mark.webgpu
def test_padded_operand_of_an_f16_cast_is_stored_in_f16():
    """The alignment pass (align_match, forced here: 16 columns) pads l2's 19-column product
    to 32: under precision="mixed" its padded operand is a zero padding of an f16 value, and
    on an adapter with shader-f16 it is stored as f16, so the product's kernel reads two f16
    operands (as the subgroup-matrix kernel needs). Its values are the f16 values padded
    with exact zeros: three Adam steps track the reference executor's."""
    import re
    from backends import webgpu_available
    from webgrad.codegen import KernelOptions
    if not webgpu_available():
        pytest.skip("no native WebGPU adapter")
    be = wg.backends.get_backend("webgpu")
    if "shader-f16" not in (getattr(be.host, "features", None) or ()):
        pytest.skip("this adapter has no shader-f16 (test_webgpu_needs_shader_f16 checks the error)")
    rng = np.random.RandomState(8)
    feed = {"x": rng.randn(5, 64).astype(np.float32), "y": rng.randn(5, 19).astype(np.float32)}
    runs = {}
    for backend in ("reference", "webgpu"):
        kw = {"kernel_options": KernelOptions(force_align=(16, 16, 1))} if backend == "webgpu" else {}
        m = wg.compile_module(_OddMLP, _odd_loss, inputs={"x": [5, 64], "y": [5, 19]},
                              optimizer=optim.Adam(lr=0.01), backend=backend, precision="mixed", **kw)
        runs[backend] = [float(m.step(feed)) for _ in range(3)], {
            k: np.asarray(v) for k, v in m.download_params().items()}
        if backend == "webgpu":
            exe = m._train.exe
            dispatches = [c for c in exe.plan["commands"] if c["op"] == "dispatch"]
            padded = [exe.plan["pipelines"][c["pipeline"]]["wgsl"] for c, n in
                      zip(dispatches, exe.kernel_names) if n.startswith("matmul 5x32 ")]
            assert padded, exe.kernel_names   # the forward product over the padded columns
            for w in padded:
                halves = re.findall(r"var<storage, read> b\d+: array<(?:vec4<f16>|f16)>", w)
                assert len(halves) == 2, w
            # the padded product's f16 rounding is stored as f16 (slice(f16(x @ pad(W))))
            forward = [w for w, n in zip(padded, [n for n in exe.kernel_names
                                                   if n.startswith("matmul 5x32 ")]) if "K=66" in n]
            assert forward and re.search(r"var<storage, read_write> b\d+: array<(?:vec4<f16>|f16)>",
                                         forward[0]), exe.kernel_names
    np.testing.assert_allclose(runs["webgpu"][0][0], runs["reference"][0][0], rtol=1e-6)
    np.testing.assert_allclose(runs["webgpu"][0], runs["reference"][0], rtol=1e-4)
    for k, v in runs["reference"][1].items():
        np.testing.assert_allclose(runs["webgpu"][1][k], v, rtol=1e-3, atol=1e-4, err_msg=k)


def test_mixed_weight_gradient_over_a_batch_rounds_once():
    """sum_b x_b^T g_b is one f16 product over all B x T rows (precision._batch_sums), rounded
    once, as torch.amp's. Each row's scaled gradient is 16; batch 0's sum alone, 16 + 2^-6 +
    2^-7, is a tie that rounds up to 16 + 2^-5 (then + 2^-7 for batch 1), the whole sum is
    16 + 2^-5. Against torch.autocast("cpu", float16) with a GradScaler."""
    x = np.zeros((2, 2048, 1), np.float32)
    x[0, 0, 0], x[0, 1, 0], x[1, 0, 0] = 1 + 2.0 ** -10, 2.0 ** -11, 2.0 ** -11
    c = wg.compile_module(lambda: nn.Linear(1, 1, bias=False), lambda m, f: ops.mean_all(m(f["x"])),
                          inputs={"x": [2, 2048, 1]}, optimizer=optim.SGD(lr=0.0), precision="mixed")
    c.step({"x": x})
    W = torch.ones(1, 1, requires_grad=True)
    scaler, topt = torch.amp.GradScaler("cpu"), torch.optim.SGD([W], lr=0.0)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = torch.matmul(torch.from_numpy(x), W).float().mean()
    scaler.scale(loss).backward()
    scaler.unscale_(topt)
    assert W.grad.item() * 65536 == 16 + 2.0 ** -5
    np.testing.assert_array_equal(np.asarray(c.download_param_grads()["W"]), W.grad.numpy())


# ---------------------------------------------------------------- fused attention, mixed

ATT = (2, 2, 12, 16)  # [B, heads, T, head dim]


class _Attention(Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (self.param(list(ATT), init=wg.init.randn(1.0)) for _ in range(3))


def _attention_loss(m, f):
    s = ops.matmul(m.q, ops.swap_axes(m.k, -1, -2)) * (ATT[-1] ** -0.5)
    return ops.sum_all((ops.softmax_causal_last(s) @ m.v) * f["w"])


def _attention_step(backend, precision, opts=None):
    """(loss, gradients, initial parameters, attention kernels) of one SGD step (lr 1: the
    gradient is the parameters' change) of causal attention alone."""
    kw = {} if opts is None else {"kernel_options": opts}
    c = wg.compile_module(_Attention, _attention_loss, inputs={"w": list(ATT)},
                          optimizer=optim.SGD(lr=1.0), precision=precision, seed=5,
                          backend=backend, **kw)
    p0 = {k: np.asarray(v).copy() for k, v in c.download_params().items()}
    w = (np.random.RandomState(1).randn(*ATT) * 1e-2).astype(np.float32)  # x 2^16: no overflow
    loss = float(c.step({"w": w}))
    p1 = c.download_params()
    names = c._train.exe.kernel_names if backend != "reference" else []
    return loss, {k: p0[k] - np.asarray(p1[k]) for k in p0}, p0, w, \
        [n.split(" ")[0] for n in names if n.startswith("attn_")], \
        [n for n in names if n.startswith("attn_")]


# the fused forms: attention.py's row kernels, the tiled ones, and the subgroup-matrix ones
# (attention_mma.py) in plain WGSL (KernelOptions.mma_emulate: lavapipe has no subgroup
# matrices; the H200's run of the same kernels is in bench/README.md)
FUSED_FORMS = {"rows": dict(attn_mixed=True), "tiled": dict(attn_mixed=True, attn_tiled=True),
               "mma": dict(attn_mixed=True, attn_tiled=True, mma_emulate=True)}


@pytest.mark.webgpu
@pytest.mark.parametrize("form", sorted(FUSED_FORMS))
def test_mixed_fused_attention_rounds_as_the_program(form):
    """precision="mixed" attention on the native adapter, fused (KernelOptions.attn_mixed:
    attention.py's row kernels, or the tiled ones forced, or those on subgroup matrices,
    emulated) against the same program unfused
    (attn_mixed=False) and torch.autocast(fp16). Tolerances: the loss (the forward) within
    1e-6 relative and dV within 1e-6 of its largest value (both were equal bit for bit on
    lavapipe, 2026-12-03); dQ and dK within 2e-3 of their largest value (8.5e-4 measured:
    Drow is FA-2's rowsum(G * O), not the program's sum_j p_ij f16(dP_ij),
    attention_match.py). That the kernels round where the program does: the loss and dV are
    at least 10x closer to the unfused mixed program's than the f32 program's are."""
    from backends import webgpu_available
    from webgrad.codegen import KernelOptions
    if not webgpu_available():
        pytest.skip("no native WebGPU adapter")
    fused = _attention_step("webgpu", "mixed", KernelOptions(**FUSED_FORMS[form]))
    plain = _attention_step("webgpu", "mixed", KernelOptions(attn_mixed=False))
    f32 = _attention_step("reference", "f32")
    want = ["attn_lse", "attn_out"] + (["attn_dv", "attn_dq", "attn_dk"] if form == "rows"
                                       else ["attn_dkv", "attn_dq"])
    assert fused[4] == want and plain[4] == []
    assert all((" mma " in n) == (form == "mma") for n in fused[5]), fused[5]
    assert fused[0] == pytest.approx(plain[0], rel=1e-6)
    assert abs(fused[0] - plain[0]) <= 0.1 * abs(f32[0] - plain[0])

    def err(a, b, k):
        return float(np.abs(a[1][k] - b[1][k]).max() / np.abs(b[1][k]).max())
    assert err(fused, plain, "v") <= min(1e-6, 0.1 * err(f32, plain, "v"))
    # torch.amp from the same weights: f16 matmuls, softmax in f32, the loss scaled by 2^16
    P = {k: torch.tensor(v, requires_grad=True) for k, v in fused[2].items()}
    with torch.autocast("cpu", dtype=torch.float16):
        s = (P["q"] @ P["k"].transpose(-1, -2)).float() * (ATT[-1] ** -0.5)
        s = s.masked_fill(torch.triu(torch.ones(ATT[2], ATT[2], dtype=torch.bool), 1), -torch.inf)
        tl = ((torch.softmax(s, -1) @ P["v"]).float() * torch.from_numpy(fused[3])).sum()
    (tl * 65536.0).backward()
    amp = (float(tl.detach()), {k: v.grad.numpy() / 65536.0 for k, v in P.items()})
    assert fused[0] == pytest.approx(amp[0], rel=1e-6)
    for k in "qkv":
        assert err(plain, amp, k) <= 1e-4, k  # the unfused program is torch.amp's
        assert err(fused, plain, k) <= 2e-3 and err(fused, amp, k) <= 2e-3, k


@pytest.mark.webgpu
def test_mixed_block_trains_with_fused_attention():
    """Six Adam steps of the transformer block in precision="mixed" on the native adapter with
    fused attention (its row kernels; and the tiled ones) track the unfused program and the
    reference executor: losses within 1e-3 relative (2e-4 measured), the first step's within
    1e-5 (the forward rounds where the program does), the parameters within 2e-2 relative."""
    from backends import webgpu_available
    from webgrad.codegen import KernelOptions
    if not webgpu_available():
        pytest.skip("no native WebGPU adapter")
    from webgpu_helpers import mixed_runs
    runs = mixed_runs(Block, _loss, (
        ("ref", "reference", None), ("unfused", "webgpu", KernelOptions(attn_mixed=False)),
        *((name, "webgpu", KernelOptions(**kw)) for name, kw in FUSED_FORMS.items())),
        B=2, T=T, vocab=V, steps=6, seed=3)
    for name in ("unfused", *FUSED_FORMS):
        assert bool(runs[name][2]) == (name != "unfused"), name
    assert all(" mma " in n for n in runs["mma"][2]), runs["mma"][2]
    for name in FUSED_FORMS:
        for other in ("unfused", "ref"):
            np.testing.assert_allclose(runs[name][0][0], runs[other][0][0], rtol=1e-5)
            np.testing.assert_allclose(runs[name][0], runs[other][0], rtol=1e-3)
            for k, v in runs[other][1].items():
                mine = runs[name][1][k]
                if k == "qkv.b":  # the key bias: rounding noise (test_mixed_training_tracks_torch_amp)
                    mine, v = np.delete(mine, np.s_[D:2 * D]), np.delete(v, np.s_[D:2 * D])
                np.testing.assert_allclose(mine, v, rtol=2e-2, atol=2e-3, err_msg=k)


@pytest.mark.webgpu
@pytest.mark.parametrize("precision", ["mixed", "f16"])
def test_inference_attention_fused_in_half_precision(precision):
    """A forward-only attention (T 40) under precision="mixed" / "f16" on the native adapter is
    fused into attn_lse and attn_out (the probabilities rounded normalized; "f16" also rounds
    the scaled scores: attrs round_x), row and tiled kernels, and gives the unfused
    program's output within one f16 ulp of its largest value (1.2e-4 measured at 0.25 of
    it), 50x closer than the f32 program's."""
    from backends import webgpu_available
    from webgrad.codegen import KernelOptions
    if not webgpu_available():
        pytest.skip("no native WebGPU adapter")
    shape = (2, 2, 40, 16)
    rng = np.random.RandomState(0)
    feed = {k: (rng.randn(*shape) * 2).astype(np.float32) for k in "qkv"}

    def fn(m, f):
        return ops.softmax_causal_last(f["q"] @ ops.swap_axes(f["k"], -1, -2) * 0.3) @ f["v"]

    def run(backend, precision, opts=None):
        kw = {} if opts is None else {"kernel_options": opts}
        f = wg.compile_forward(Module, fn, inputs={k: list(shape) for k in "qkv"},
                               backend=backend, precision=precision, **kw)
        names = f._prog.exe.kernel_names if backend != "reference" else []
        return np.asarray(f.run(feed)), [n for n in names if n.startswith("attn_")]
    plain, none = run("webgpu", precision, KernelOptions(attn_mixed=False))
    f32 = run("reference", "f32")[0]
    assert none == []
    top = np.abs(plain).max()
    for form in (KernelOptions(), KernelOptions(attn_tiled=True),
                 KernelOptions(attn_tiled=True, mma_emulate=True)):
        out, names = run("webgpu", precision, form)
        assert [n.split(" ")[0] for n in names] == ["attn_lse", "attn_out"]
        assert all((" mma " in n) == form.mma_emulate for n in names), names
        gap = np.abs(out - plain).max()
        assert gap <= 2.0 ** -10 * top and gap <= 0.02 * np.abs(f32 - plain).max(), gap


def test_f16_values_are_not_rounded_again():
    """precision="f16" rounds no value that is f16 already (docs/precision.md): a layout op
    of rounded values is not cast, and a KV cache's write_rows of rounded rows is not (the
    cache a state, unrounded as read, was rounded whole after each write: that rounding is
    given up, since the decode programs write only rounded rows into it); its f16 form is
    a cast marked exact, which f16_in_f32 turns into a view (no kernel copies the cache)."""
    from webgrad.models import gpt2
    from webgrad.precision import f16_in_f32
    m = gpt2.GPT2(gpt2.GPT2Config(2, 2, 64, 32, 11, 1e-5), backend="reference", dtype="f16")
    m.precision = "f16"
    g = m._program("step", 1).ir

    def rounded(i):  # an f16 value held as f32: a widened cast, through layout ops
        while g[i].op in ("reshape", "transpose", "slice", "broadcast_to"):
            i = g[i].inputs[0]
        return g[i].op == "cast" and g[i].attrs["dtype"] == "f32" and g[g[i].inputs[0]].dtype == "f16"
    writes = [n for n in g.nodes if n.op == "write_rows"]
    assert len(writes) == 2 * 2 and all(rounded(n.inputs[1]) for n in writes)
    casts = [n for n in g.nodes if n.op == "cast" and n.attrs["dtype"] == "f16"]
    again = [n for n in casts if not n.attrs.get("exact") and (
        g[n.inputs[0]].op == "write_rows" or (g[n.inputs[0]].op in ("reshape", "transpose", "slice")
                                              and rounded(n.inputs[0])))]
    assert not again, again
    exact = [n for n in casts if n.attrs.get("exact")]
    assert {g[n.inputs[0]].op for n in exact} == {"write_rows"} and len(exact) == len(writes)
    held = f16_in_f32(g)
    assert all(held[n.id].op == "reshape" and held[n.id].shape == n.shape for n in exact)


def test_transposed_views_follow_what_the_backward_keeps():
    """apply_precision's transposed_views (KernelOptions.mma_transposed), on a step whose
    backward transposes an input (x^T of dW1, held for the step anyway), a softmax's
    probabilities (P^T of dW2; softmax's own backward keeps them in f32), a product's
    output that nothing else in the backward reads (z^T of dW3) and two weights (W2^T,
    W3^T; persistent): True views only z^T, where the forward's f16 copy replaces what the
    copy would have kept; "all" every one, "weights" the weights'; the mixed graph then
    has no rounded copy of a viewed transpose, and a mode it does not know is refused."""
    from webgrad.compile import build_train_graph, parse_inputs
    from webgrad.precision import _viewed_transposes

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.W1 = self.param([16, 32])
            self.W2 = self.param([32, 24])
            self.W3 = self.param([24, 16])

    def loss(m, f):
        z = ops.matmul(ops.softmax_last(ops.matmul(f["x"], m.W1)), m.W2)
        return ops.mean_all((ops.matmul(z, m.W3) - f["y"]) ** 2.0)

    ins = parse_inputs({"x": [32, 16], "y": [32, 16]})
    g = build_train_graph(Net, loss, ins, optim.SGD(lr=0.1))[1]
    kinds = {m: sorted(g[g[i].inputs[0]].op for i in _viewed_transposes(g, m))
             for m in (True, "all", "weights", False)}
    assert kinds == {True: ["matmul"], "all": ["input", "matmul", "param", "param", "softmax_last"],
                     "weights": ["param", "param"], False: []}, kinds
    for mode, views in ((True, 1), ("all", 5), ("weights", 2), (False, 0)):
        mixed = build_train_graph(Net, loss, ins, optim.SGD(lr=0.1), precision="mixed",
                                  transposed_views=mode)[1]
        # a viewed transpose is an f16 transpose of an f16 value; the others a rounded copy
        half_t = [n for n in mixed.nodes if n.op == "transpose" and n.dtype == "f16"]
        assert len(half_t) == views, (mode, [str(n) for n in half_t])
    # r = a * a: its backward keeps a, so r^T's copy recomputes r from a (no view), where a
    # product's output nothing else keeps (z above) is viewed
    def squares(m, f):
        a = ops.matmul(f["x"], m.W1)
        return ops.mean_all(ops.matmul(ops.matmul(a * a, m.W2), m.W3) ** 2.0)
    g2 = build_train_graph(Net, squares, ins, optim.SGD(lr=0.1))[1]
    assert sorted(g2[g2[i].inputs[0]].op for i in _viewed_transposes(g2, True)) == ["matmul"]
    assert sorted(g2[g2[i].inputs[0]].op for i in _viewed_transposes(g2, "all")) == \
        ["input", "matmul", "mul", "param", "param"]
    with pytest.raises(ValueError, match="transposed_views must be False, True, 'all' or 'weights'"):
        _viewed_transposes(g, "some")
