"""LoRA (webgrad.lora) and Llama training (llama.LlamaModule + lm_loss) against transformers and
PEFT + torch.

The oracle is a tiny transformers model with random weights moved off their defaults, in f32:
the full fine-tune loss and gradients must equal LlamaForCausalLM's; a LoRA run started from the
same base and adapter weights (B set nonzero: PEFT starts it at zero, which would hide B's
maths) must give PEFT + torch.optim.AdamW's losses step for step; the files save_pretrained
writes must load into PeftModel.from_pretrained with equal logits and PEFT's files into
webgrad; a merged base must give the adapter model's logits and merge_and_unload's. GPT-2
(transformers' Conv1D layout: PEFT's fan_in_fan_out) goes through the same code. Frozen
parameters: only the adapters have gradients and optimizer state in the compiled program.
"""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import webgrad as wg  # noqa: E402
from webgrad import lora, ops, optim  # noqa: E402
from webgrad.codegen import matmul_config as mm  # noqa: E402
from webgrad.models import gpt2, llama  # noqa: E402
from backends import WEBGPU  # noqa: E402
from test_gpt2 import hf_model as hf_gpt2  # noqa: E402
from test_llama import hf_model as hf_llama  # noqa: E402  (llama3 rope, every bias)

B, T = 2, 8
INPUTS = {"tokens": ([B, T], "i32"), "targets": ([B, T], "i32")}
TARGETS = ["q_proj", "v_proj", "down_proj"]
BACKENDS = ["reference", "torch"]


GCFG = gpt2.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_ctx=16, vocab_size=50)


def sequences(seed, vocab):
    """[B, T + 1] tokens: webgrad's tokens/targets are its two shifted views."""
    return np.random.default_rng(seed).integers(0, vocab, size=(B, T + 1)).astype(np.int32)


def feed(seq):
    return {"tokens": seq[:, :T], "targets": seq[:, 1:]}


def hf_loss(model, seq):
    """transformers' loss on T + 1 tokens: the mean over the T predicted ones (it shifts)."""
    s = torch.tensor(seq, dtype=torch.long)
    return model(input_ids=s, labels=s).loss


def sd_numpy(model):
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def llama_logits(m, f):
    return llama.head(m, llama.hidden(m, f["tokens"], m.cfg))[0][0]


def gpt2_logits(m, f):
    return gpt2.logits_of(m, gpt2.hidden(m, f["tokens"], m.cfg))


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.fixture(scope="module")
def base():
    hf = hf_llama("llama")
    return hf, llama.LlamaConfig.from_hf(hf.config.to_dict()), sd_numpy(hf)


def random_adapters(lo, seed):
    """Adapter values (webgrad names) with B nonzero."""
    rng = np.random.default_rng(seed)
    c = lo()
    return {n: (rng.standard_normal(s.shape) * 0.1).astype(np.float32) for n, s in c.named_specs()
            if n in lo.adapter_names}


def lora_compiled(lo, sd, backend, *, optimizer=None, adapters=None):
    c = wg.compile_module(lo, llama.lm_loss if "model.norm.weight" in lo.base_names else gpt2.lm_loss,
                          inputs=INPUTS, optimizer=optimizer, backend=backend)
    lo.load_base(c, sd)
    if adapters is not None:
        c.upload_params(adapters, partial=True)
    return c


def steps_equal_peft(c, pm, vocab, seed, n, **adamw):
    """n steps of c and of PEFT model pm under torch's AdamW give the same losses."""
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], **adamw)
    for k in range(n):
        seq = sequences(seed + k, vocab)
        got = c.step(feed(seq))
        opt.zero_grad()
        want = hf_loss(pm, seq)
        want.backward()
        opt.step()
        assert abs(got - want.item()) <= 1e-5 * abs(want.item()), (k, got, want.item())


def peft_from(hf, lo, adapters, **kw):
    """A PEFT model over a copy of hf with webgrad's adapter values."""
    cfg = peft.LoraConfig(r=lo.config.r, lora_alpha=lo.config.lora_alpha, lora_dropout=0.0,
                          target_modules=lo.config.target_modules, **kw)
    pm = peft.get_peft_model(copy.deepcopy(hf), cfg)
    sd = {lo.peft_name(n): torch.tensor(v) for n, v in adapters.items()}
    res = peft.set_peft_model_state_dict(pm, sd)
    assert not res.unexpected_keys
    return pm


# ---------------------------------------------------------------- full fine-tuning

@pytest.mark.parametrize("backend", BACKENDS)
def test_llama_module_loss_and_gradients_equal_transformers(base, backend):
    hf, cfg, sd = base
    c = wg.compile_module(lambda: llama.LlamaModule(cfg), llama.lm_loss, inputs=INPUTS,
                          optimizer=None, backend=backend)
    assert set(c.param_names) == set(sd)          # transformers' names
    c.load_state_dict(sd)
    seq = sequences(1, cfg.vocab_size)
    loss = c.step(feed(seq))
    model = copy.deepcopy(hf).train()
    want = hf_loss(model, seq)
    want.backward()
    assert abs(loss - want.item()) <= 1e-5 * abs(want.item())
    grads = c.download_param_grads()
    for n, p in model.named_parameters():
        assert rel(grads[n], p.grad.numpy()) <= 1e-4, n


# ---------------------------------------------------------------- LoRA against PEFT

@pytest.mark.parametrize("backend", BACKENDS + [WEBGPU])
def test_lora_adamw_steps_equal_peft(base, backend):
    hf, cfg, sd = base
    lo = lora.LoRA(lambda: llama.LlamaModule(cfg), r=4, lora_alpha=8, target_modules=TARGETS)
    ad = random_adapters(lo, 2)
    c = lora_compiled(lo, sd, backend, adapters=ad,
                      optimizer=optim.AdamW(lr=1e-2, weight_decay=0.05))
    pm = peft_from(hf, lo, ad).train()
    assert sum(p.requires_grad for p in pm.parameters()) == len(lo.adapter_names) == 12
    steps_equal_peft(c, pm, cfg.vocab_size, 10, 4, lr=1e-2, weight_decay=0.05)
    trained = lo.adapter_state_dict(c)
    peft_sd = peft.get_peft_model_state_dict(pm)
    for n, v in trained.items():
        assert rel(v, peft_sd[n].detach().numpy()) <= 1e-4, n
    # the base did not move
    after = c.download_params()
    assert all(np.array_equal(after[n], sd[n]) for n in lo.base_names)


# the tiled product kernel for every product of the forced-epilogue tests: lavapipe's own
# barrier-free kernel with the rank-r sum in its epilogue (inlined for each of its 64
# outputs a thread) takes LLVM about a minute to compile on an empty shader cache
TILED = mm.Config(4, 4, 8, wx=4, wy=4)


@pytest.mark.webgpu
def test_lora_with_the_rank_products_in_the_base_products_epilogues_equals_peft(base):
    """KernelOptions.lowrank_epilogue forced on this adapter (off by default: options.py;
    the rank-r products are then kernels of their own): (x A^T) B^T and (dY B) A are summed
    by the base products' epilogues (codegen/lowrank.py), so no K = r product is a kernel;
    the forward logits and the AdamW steps' losses still equal PEFT's."""
    from test_llama import _forced_backend
    hf, cfg, sd = base
    lo = lora.LoRA(lambda: llama.LlamaModule(cfg), r=4, lora_alpha=8, target_modules=TARGETS)
    ad = random_adapters(lo, 7)
    c = lora_compiled(lo, sd, _forced_backend(lowrank_epilogue=True, force_config=TILED),
                      adapters=ad, optimizer=optim.AdamW(lr=1e-2, weight_decay=0.05))
    ids = sequences(8, cfg.vocab_size)[:, :T]
    fwd = c.compile_forward(llama_logits, inputs={"tokens": ([B, T], "i32")})
    for names in (c._train.exe.kernel_names, fwd._prog.exe.kernel_names):
        mm = [n for n in names if n.startswith("matmul ")]
        assert mm and not any(" K=4 " in n for n in mm), mm
    pm = peft_from(hf, lo, ad).eval()
    with torch.no_grad():
        theirs = pm(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    assert rel(np.asarray(fwd.run({"tokens": ids})), theirs) <= 1e-5
    steps_equal_peft(c, pm.train(), cfg.vocab_size, 30, 3, lr=1e-2, weight_decay=0.05)



@pytest.mark.webgpu
def test_lora_with_the_sibling_factor_products_merged_equals_peft(base):
    """KernelOptions.thin_siblings forced on this adapter (on GPUs only by default): q's and
    v's x A^T, which read the same normalized x, are one [T, 2r] product against both A's
    (codegen/thin_siblings.py), read in slices; the AdamW steps' losses and the trained
    adapters still equal PEFT's."""
    from test_llama import _forced_backend
    hf, cfg, sd = base
    lo = lora.LoRA(lambda: llama.LlamaModule(cfg), r=4, lora_alpha=8, target_modules=TARGETS)
    ad = random_adapters(lo, 5)
    c = lora_compiled(lo, sd, _forced_backend(thin_siblings=True), adapters=ad,
                      optimizer=optim.AdamW(lr=1e-2, weight_decay=0.05))
    merged = f"matmul {B}x{T}x8 K={cfg.hidden_size} "
    assert [n for n in c._train.exe.kernel_names if n.startswith(merged)], c._train.exe.kernel_names
    pm = peft_from(hf, lo, ad).train()
    steps_equal_peft(c, pm, cfg.vocab_size, 40, 3, lr=1e-2, weight_decay=0.05)
    peft_sd = peft.get_peft_model_state_dict(pm)
    for n, v in lo.adapter_state_dict(c).items():
        assert rel(v, peft_sd[n].detach().numpy()) <= 1e-4, n


@pytest.mark.webgpu
def test_lora_on_the_rank_products_tiles_equals_peft(base):
    """The tiled kernel forced onto this adapter with the H200's row and the rank-r
    products' rules at thresholds this small model reaches (r 8, thin_split 64, thin_chunk
    8; matmul_config.expand_config, thin_config): the K = r products ((x A^T) B^T, (dY B)
    A) and those over the 16 tokens (dA, dB) on tiles whose threads' columns are 32 apart,
    the thin ones (x A^T, dY B, and the base's [16, d] products) split over K with their
    chunk sums; the AdamW steps' losses and the trained adapters equal PEFT's."""
    from test_llama import _forced_backend
    hf, cfg, sd = base
    lo = lora.LoRA(lambda: llama.LlamaModule(cfg), r=8, lora_alpha=16, target_modules=TARGETS)
    ad = random_adapters(lo, 9)
    c = lora_compiled(lo, sd, _forced_backend(force_direct=False, force_gemv=False,
                                              tiling_row=mm.ADAPTER_TILINGS[0][1],
                                              thin_split=64, thin_chunk=8),
                      adapters=ad, optimizer=optim.AdamW(lr=1e-2, weight_decay=0.05))
    names = [n for n in c._train.exe.kernel_names if n.startswith("matmul ")]
    expand = [n for n in names if " K=8 " in n]
    assert expand and all(n.split(" tile ")[1].split("x")[1] in ("32", "64", "128")
                          for n in expand), expand   # wx 32 threads along N
    assert [n for n in names if "x8 K=" in n and " split " in n], names   # x A^T, dY B
    pm = peft_from(hf, lo, ad).train()
    steps_equal_peft(c, pm, cfg.vocab_size, 50, 3, lr=1e-2, weight_decay=0.05)
    peft_sd = peft.get_peft_model_state_dict(pm)
    for n, v in lo.adapter_state_dict(c).items():
        assert rel(v, peft_sd[n].detach().numpy()) <= 1e-4, n


@pytest.mark.webgpu
def test_gpt2_lora_with_the_rank_products_in_the_base_products_epilogues_equals_peft():
    """The same for GPT-2's Conv1D layers (x W + b, PEFT's fan_in_fan_out): a bias between
    the product and the adapter's sum, B read through the other layout."""
    from test_llama import _forced_backend
    hf = hf_gpt2(GCFG, 0)
    sd = {k.removeprefix("transformer."): v for k, v in sd_numpy(hf).items()
          if k != "lm_head.weight" and not k.endswith(".attn.bias")}
    lo = lora.LoRA(lambda: gpt2.GPT2Module(GCFG), r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"])
    ad = random_adapters(lo, 9)
    c = lora_compiled(lo, sd, _forced_backend(lowrank_epilogue=True, force_config=TILED),
                      adapters=ad, optimizer=optim.AdamW(lr=1e-2))
    mm = [n for n in c._train.exe.kernel_names if n.startswith("matmul ")]
    assert mm and not any(" K=4 " in n for n in mm), mm
    pm = peft_from(hf, lo, ad, fan_in_fan_out=True).train()
    steps_equal_peft(c, pm, GCFG.vocab_size, 20, 3, lr=1e-2)


def test_only_the_adapters_have_gradients_and_optimizer_state(base):
    _, cfg, sd = base
    lo = lora.LoRA(lambda: llama.LlamaModule(cfg), r=2, lora_alpha=4, target_modules=["q_proj"])
    c = wg.compile_module(lo, llama.lm_loss, inputs=INPUTS, optimizer=optim.AdamW(lr=1e-3))
    assert sorted(c.trainable_names) == sorted(lo.adapter_names)
    assert lo.adapter_names == [f"model.layers.{i}.self_attn.q_proj.lora_{x}.weight"
                                for i in range(cfg.num_hidden_layers) for x in "AB"]
    assert set(c.param_shapes) == set(lo.base_names) | set(lo.adapter_names)   # all held
    state = set(c.ir.state) | set(c.ir.writebacks)
    grads = {n for n in state if n.startswith("grad/")}
    moments = {n for n in state if n.startswith("opt/")}
    assert grads == {f"grad/{n}" for n in lo.adapter_names}
    assert moments == {f"opt/adam.{m}.{n}" for n in lo.adapter_names for m in "mv"}
    assert not set(c.ir.writebacks) & set(lo.base_names)   # the base is never written
    held = {n for n in c.backend.store if n.startswith(("grad/", "opt/"))}   # buffers allocated
    assert held == grads | moments
    assert set(c.download_param_grads()) == set(lo.adapter_names)


def test_dropout_applies_in_training_and_not_at_eval(base):
    hf, cfg, sd = base
    lo0 = lora.LoRA(lambda: llama.LlamaModule(cfg), r=4, lora_alpha=8, target_modules=TARGETS)
    lo5 = lora.LoRA(lambda: llama.LlamaModule(cfg), r=4, lora_alpha=8, target_modules=TARGETS,
                    lora_dropout=0.5)
    ad = random_adapters(lo0, 3)
    f = feed(sequences(4, cfg.vocab_size))
    c0 = lora_compiled(lo0, sd, "reference", adapters=ad)
    c5 = lora_compiled(lo5, sd, "reference", adapters=ad)
    plain = c0.run(f)
    assert abs(c5.run(f) - plain) > 1e-4            # training graph: dropout on x's LoRA path
    ev = c5.compile_forward(llama.lm_loss, inputs=INPUTS)   # inference: dropout is identity
    assert float(np.asarray(ev.run(f))) == pytest.approx(plain, rel=1e-6)


# ---------------------------------------------------------------- files and merging

def test_saved_adapter_loads_into_peft_and_peft_saved_loads_back(base, tmp_path):
    hf, cfg, sd = base
    factory = lambda: llama.LlamaModule(cfg)    # noqa: E731
    lo = lora.LoRA(factory, r=4, lora_alpha=16, target_modules=TARGETS, use_rslora=True)
    ad = random_adapters(lo, 5)
    c = lora_compiled(lo, sd, "reference", adapters=ad)
    lo.save_pretrained(c, tmp_path / "wg")
    from safetensors.numpy import load_file
    names = set(load_file(str(tmp_path / "wg" / lora.ADAPTER_WEIGHTS)))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in names
    assert names == {lo.peft_name(n) for n in lo.adapter_names}
    ids = sequences(6, cfg.vocab_size)[:, :T]
    fwd = c.compile_forward(llama_logits, inputs={"tokens": ([B, T], "i32")})
    mine = np.asarray(fwd.run({"tokens": ids}))
    pm = peft.PeftModel.from_pretrained(copy.deepcopy(hf), str(tmp_path / "wg")).eval()
    with torch.no_grad():
        theirs = pm(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    assert rel(mine, theirs) <= 1e-5

    # PEFT's own file back into webgrad: change its adapters, save, load
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.add_(torch.randn_like(p) * 0.05)
        theirs = pm(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    pm.save_pretrained(str(tmp_path / "peft"))
    lo2 = lora.LoRA.from_pretrained(factory, tmp_path / "peft")
    assert lo2.config.use_rslora and lo2.config.lora_alpha == 16
    c2 = lora_compiled(lo2, sd, "reference")
    lo2.load_adapter(c2, tmp_path / "peft")
    got = np.asarray(c2.compile_forward(llama_logits, inputs={"tokens": ([B, T], "i32")}).run({"tokens": ids}))
    assert rel(got, theirs) <= 1e-5


def test_merged_base_equals_the_adapter_model_and_merge_and_unload(base):
    hf, cfg, sd = base
    lo = lora.LoRA(lambda: llama.LlamaModule(cfg), r=4, lora_alpha=8, target_modules="all-linear")
    ad = random_adapters(lo, 7)
    c = lora_compiled(lo, sd, "reference", adapters=ad)
    ids = sequences(8, cfg.vocab_size)[0, :T]
    unmerged = np.asarray(c.compile_forward(llama_logits, inputs={"tokens": ([T], "i32")}).run({"tokens": ids}))
    merged = lo.merged_state_dict(c)
    assert set(merged) == set(sd)
    mine = llama.Llama.from_hf_state_dict(cfg, merged, backend="reference").forward(list(ids))
    assert rel(mine, unmerged) <= 1e-5
    pm = peft_from(hf, lo, ad).merge_and_unload().eval()
    with torch.no_grad():
        theirs = pm(torch.tensor([ids], dtype=torch.long)).logits[0].numpy()
    assert rel(mine, theirs) <= 1e-5
    for n, v in pm.state_dict().items():
        assert rel(merged[n], v.numpy()) <= 1e-6, n


def _lora_1b_step(layers: int):
    """bench/lora_step.py's step (r = 16, alpha 32, q, k, v, o, gate, up, down; AdamW) at
    the Llama-3.2-1B shape, 4 x 512, with `layers` layers: the graph only, no weights."""
    from webgrad.compile import build_train_graph, parse_inputs
    cfg = llama.LlamaConfig.from_hf(dict(
        model_type="llama", hidden_size=2048, num_hidden_layers=layers, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, intermediate_size=8192, vocab_size=128256,
        max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=True), n_ctx=512)
    lo = lora.LoRA(lambda: llama.LlamaModule(cfg), r=16, lora_alpha=32, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    ins = parse_inputs({"tokens": ([4, 512], "i32"), "targets": ([4, 512], "i32")})
    return build_train_graph(lo, llama.lm_loss, ins, optim.AdamW(lr=1e-4, weight_decay=0.01))[1]


def test_h200_lora_step_runs_the_rank_16_products_unsplit_and_the_updates_in_them():
    """The 1B-shaped LoRA step (2 layers) lowered for an H200 without a device. Its 14
    adapters' rank-16 products were 129 kernels of 236 (bench/README.md's profile counted
    1053 of 1850 at 16 layers): the thin products ([T, 16] = x A^T, dY B; the [16, in] and
    [out, 16] gradients) split over K in 4 or 16 chunks, each with a second kernel adding
    the chunks, and AdamW's update of each factor an elementwise kernel of its own (it read
    the gradient through a transpose). Thin products over K = 2048 now run unsplit on
    smaller tiles at a longer K step (as many workgroups and K steps as the chunks:
    KernelOptions.split_thin) and the gradients are computed in the factors' layout, so
    that the updates join their kernels (thin_grads): 87 of 166. Left split: dY B of gate
    and up (K = 8192, 16 chunks: 256 workgroups against 64 unsplit). The K = 16 products,
    (x A^T) B^T and (dY B) A, are summed by the base products' epilogues
    (KernelOptions.lowrank_epilogue, codegen/lowrank.py): 62 of 141, no K = 16 kernel.
    The sibling products (q's, k's and v's x A^T, of the same normalized x; gate's and up's)
    are one product each (KernelOptions.thin_siblings, codegen/thin_siblings.py), 48 and 32
    wide: no longer thin, they split over K in 4 chunks, each with its chunk sum, and their
    concatenated A's are an elementwise kernel: 3 kernels for q, k, v's 3 and for gate and
    up's 2 (+2 in all: 168, 77 of them rank-16). On the H200 (2026-12-04, 16 layers: 1306
    kernels against 1290) the step took 269.3-269.4 ms against 270.0-270.2 without: the
    products that read x took 4.65 ms against 5.83, the copies 0.2 ms; the merged products
    kept unsplit on 32 x 32 tiles (one kernel fewer a layer) took 0.3 ms more. All of that
    on the table's tiles (expand_k=0, thin_split=0); with the rank-r products' rules (the
    defaults, test_h200_lora_step_takes_the_rank_products_tiles) the thin products split
    again, into grids of 1024 workgroups."""
    from dataclasses import replace
    from webgrad.codegen import KernelOptions, Limits, lower
    g = _lora_1b_step(2)
    TABLE = KernelOptions(expand_k=0, thin_split=0)   # the table's tiles: the rules below off
    h200 = Limits(adapter="NVIDIA H200 (DiscreteGPU)", max_storage_buffer_binding_size=(1 << 32) - 4,
                  max_buffer_size=1 << 40, max_compute_workgroup_storage_size=49152, subgroups=True,
                  max_storage_buffers_per_shader_stage=16,   # Dawn's, as measured
                  options=TABLE)

    def rank16(names):
        return [n for n in names if n.startswith("matmul ")
                and ("16" in n.split(" ")[1].split("x") or " K=16 " in n)]
    alone = replace(TABLE, thin_siblings=False)
    fused = lower(g, replace(h200, options=replace(alone, lowrank_epilogue=True)))[1]
    assert len(fused) == 141 and len(rank16(fused)) == 62, fused
    assert not [n for n in fused if " K=16 " in n]
    # without the low-rank epilogues (the default: slower on the H200, options.py):
    # (x A^T) B^T and (dY B) A kernels of their own, 25
    names = lower(g, replace(h200, options=alone))[1]
    assert len(names) == 166 and len(rank16(names)) == 87, names
    # the sibling products merged (the default on GPUs)
    merged = lower(g, h200)[1]
    assert len(merged) == 168 and len(rank16(merged)) == 77, merged
    assert sorted(set(merged) - set(names)) == [
        "matmul 4x512x32 K=2048 tile 128x32x8 split 4", "matmul 4x512x32 sum of 4 K chunks",
        "matmul 4x512x48 K=2048 tile 128x32x8 split 4", "matmul 4x512x48 sum of 4 K chunks"]
    assert merged.count("elementwise") == names.count("elementwise") + 2 * 2
    assert names.count("matmul 4x512x16 K=2048 tile 32x16x64") - 5 * 2 == merged.count(
        "matmul 4x512x16 K=2048 tile 32x16x64")
    fused_merged = lower(g, replace(h200, options=replace(TABLE, lowrank_epilogue=True)))[1]
    assert len(fused_merged) == 143 and len(rank16(fused_merged)) == 52, fused_merged
    assert sorted(set(names) - set(fused)) == [
        "matmul 4x512x2048 K=16 tile 128x128x8", "matmul 4x512x512 K=16 tile 64x64x16",
        "matmul 4x512x8192 K=16 tile 128x128x8"]
    assert [n for n in rank16(names) if "split" in n or "sum of" in n] == [
        "matmul 4x512x16 K=8192 tile 128x16x16 split 16", "matmul 4x512x16 sum of 16 K chunks"] * 6
    off = replace(TABLE, lowrank_epilogue=False, thin_grads=False, thin_siblings=False)
    unsplit = lower(g, replace(h200, options=off))[1]
    assert len(unsplit) == 166 + 2 * 14 and len(rank16(unsplit)) == 87
    before = lower(g, replace(h200, options=replace(off, split_thin=0)))[1]
    assert len(before) == 236 and len(rank16(before)) == 129
    # a CPU adapter (no split-K rows: the products were never split) keeps the updates
    # in the products too
    cpu = Limits(adapter="llvmpipe (LLVM 15.0.6, 256 bits) (CPU)", cpu=True,
                 max_storage_buffer_binding_size=1 << 31, max_buffer_size=1 << 40)
    assert (len(lower(g, replace(cpu, options=KernelOptions(thin_grads=False)))[1])
            - len(lower(g, cpu)[1])) == 2 * 14


def test_h200_lora_step_takes_the_rank_products_tiles():
    """The same step under the defaults: every K = 16 product ((x A^T) B^T, (dY B) A) on
    expand_config's tiles (a thread's columns 32 apart, 1024 or more workgroups), every
    thin product over K >= 256 (x A^T, dY B, the factor gradients, the merged siblings') on
    thin_config's tiles split over K into grids of 1024 workgroups, each split with its
    chunk sum (the gradients' AdamW updates in those): 40 kernels more than on the table's
    tiles at 2 layers (test_h200_lora_step_runs_the_rank_16_products_unsplit_...)."""
    from dataclasses import replace
    from math import prod
    from webgrad.codegen import KernelOptions, Limits, lower
    g = _lora_1b_step(2)
    h200 = Limits(adapter="NVIDIA H200 (DiscreteGPU)", max_storage_buffer_binding_size=(1 << 32) - 4,
                  max_buffer_size=1 << 40, max_compute_workgroup_storage_size=49152, subgroups=True,
                  max_storage_buffers_per_shader_stage=16)
    low, names = lower(g, h200)
    table = lower(g, replace(h200, options=KernelOptions(expand_k=0, thin_split=0)))[1]
    assert len(names) == len(table) + 40
    expand = [k for k in low.kernels if " K=16 " in k["name"]]
    # (k's and v's 512 columns keep the table's 64 x 64 tile: expand_min_n)
    assert len(expand) == 25 and all(
        (k["name"].split(" tile ")[1] == "32x128x16" and k["workgroups"] >= 1024)
        or (k["name"].split(" tile ")[1] == "64x64x16" and k["name"].startswith("matmul 4x512x512 "))
        for k in expand), expand
    thin = [k for k in low.kernels if k["name"].startswith("matmul ") and " K=16 " not in k["name"]
            and min(prod(map(int, k["name"].split(" ")[1].split("x")[:-1])),
                    int(k["name"].split(" ")[1].split("x")[-1])) <= 48]
    products = [k for k in thin if " K=" in k["name"]]
    assert len(products) == 50 and all(" split " in k["name"] for k in products), products

    def thin_rule(name):   # thin_config's: K up to THIN_MAX_K, a side of at most thin_side
        dims = [int(d) for d in name.split(" ")[1].split("x")]
        return int(name.split(" K=")[1].split(" ")[0]) <= mm.THIN_MAX_K and \
            min(prod(dims[:-1]), dims[-1]) <= KernelOptions().thin_side
    assert {k["workgroups"] for k in products if thin_rule(k["name"])} == \
        {mm.THIN_TILES // 2, mm.THIN_TILES}
    sums = [k for k in thin if " sum of " in k["name"]]
    assert len(sums) == len(products)
    # the factor gradients' AdamW updates run in the chunk sums (sqrt: AdamW's denominator)
    assert sum("sqrt" in k["ops"] for k in sums) == 14 * 2


# ---------------------------------------------------------------- GPT-2: the same code

def test_gpt2_lora_equals_peft_with_fan_in_fan_out(tmp_path):
    gcfg = GCFG
    hf = hf_gpt2(gcfg, 0)
    sd = {k.removeprefix("transformer."): v for k, v in sd_numpy(hf).items()
          if k != "lm_head.weight" and not k.endswith(".attn.bias")}
    lo = lora.LoRA(lambda: gpt2.GPT2Module(gcfg), r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"])
    assert len(lo.layers) == 3 * gcfg.n_layer            # c_attn, attn.c_proj, mlp.c_proj
    assert all(f for f, _ in lo.layers.values())         # Conv1D's layout
    ad = random_adapters(lo, 9)
    c = lora_compiled(lo, sd, "reference", adapters=ad, optimizer=optim.AdamW(lr=1e-2))
    pm = peft_from(hf, lo, ad, fan_in_fan_out=True).train()
    steps_equal_peft(c, pm, gcfg.vocab_size, 20, 3, lr=1e-2)
    lo.save_pretrained(c, tmp_path)
    assert json.loads((tmp_path / lora.ADAPTER_CONFIG).read_text())["fan_in_fan_out"] is True
    reloaded = peft.PeftModel.from_pretrained(copy.deepcopy(hf), str(tmp_path)).eval()
    merged = lo.merged_state_dict(c)
    ids = sequences(30, gcfg.vocab_size)[0, :T]
    mine = gpt2.GPT2.from_hf_state_dict(gcfg, merged, backend="reference").forward(list(ids))
    with torch.no_grad():
        theirs = reloaded(torch.tensor([ids], dtype=torch.long)).logits[0].numpy()
    assert rel(mine, theirs) <= 1e-5


# ---------------------------------------------------------------- QLoRA: a quantized base

@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_qlora_steps_on_a_quantized_base_equal_peft_on_its_dequantized_weights(base, qtype):
    gguf = pytest.importorskip("gguf")
    hf, cfg, sd = base
    qt = getattr(gguf.GGMLQuantizationType, qtype)
    # every linear layer's matrix (rows of 64 and 96: whole blocks of 32), tables stay f32
    held = [n for n, v in sd.items() if v.ndim == 2 and "embed" not in n and "lm_head" not in n]
    blocks = {n: gguf.quants.quantize(sd[n], qt) for n in held}
    lo = lora.LoRA(lambda: llama.LlamaModule(cfg), r=4, lora_alpha=8, target_modules=TARGETS,
                   base_quant={n: qtype for n in held})
    ad = random_adapters(lo, 13)
    c = lora_compiled(lo, {**sd, **blocks}, "reference", adapters=ad,
                      optimizer=optim.AdamW(lr=1e-2))
    assert all(c.backend.store[n].dtype == np.int32 for n in held)   # held as words
    dq = copy.deepcopy(hf)                        # the oracle: the decoded weights, in f32
    with torch.no_grad():
        for n, p in dq.named_parameters():
            if n in blocks:
                p.copy_(torch.tensor(gguf.quants.dequantize(blocks[n], qt)))
    pm = peft_from(dq, lo, ad).train()
    steps_equal_peft(c, pm, cfg.vocab_size, 40, 3, lr=1e-2)
    merged = lo.merged_state_dict(c)              # f32: decoded base + adapters
    theirs = pm.merge_and_unload().state_dict()
    assert all(rel(merged[n], theirs[n].numpy()) <= 1e-5 for n in sd)
    with pytest.raises(ValueError, match="pass its GGUF blocks"):
        lo.load_base(c, sd)                       # f32 values for a quantized weight
    c2 = wg.compile_module(lo, llama.lm_loss, inputs=INPUTS, optimizer=optim.AdamW(lr=1e-2))
    c2.load(c.save())                             # a checkpoint holds the blocks as words
    f = feed(sequences(50, cfg.vocab_size))
    assert c2.step(f) == c.step(f)


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("kw,match", [
    (dict(target_modules=["q_proj", "qproj"]), r"\['qproj'\] match no linear layer.*down_proj, "
                                               r"gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"),
    (dict(target_modules=["lm_head"]), "match no linear layer"),
    (dict(target_modules=[]), "target_modules must name layers"),
    (dict(target_modules=["q_proj"], r=0), r"r \(the rank\) must be a whole number >= 1"),
    (dict(target_modules=["q_proj"], r=2.5), "r .* whole number"),
    (dict(target_modules=["q_proj"], lora_alpha=0), "lora_alpha must be a number > 0"),
    (dict(target_modules=["q_proj"], lora_dropout=1.0), r"lora_dropout must be a probability in \[0, 1\)"),
    (dict(target_modules=["q_proj"], init_lora_weights="pissa"), "init_lora_weights"),
])
def test_bad_configs_are_refused(base, kw, match):
    _, cfg, _ = base
    with pytest.raises(ValueError, match=match):
        lora.LoRA(lambda: llama.LlamaModule(cfg), **kw)


def test_refused_loads_change_nothing_and_unsupported_files_are_named(base, tmp_path):
    _, cfg, sd = base
    lo = lora.LoRA(lambda: llama.LlamaModule(cfg), r=2, lora_alpha=4, target_modules=["q_proj"])
    ad = random_adapters(lo, 11)
    c = lora_compiled(lo, sd, "reference", adapters=ad)
    before = c.download_params()
    other = lora.LoRA(lambda: llama.LlamaModule(cfg), r=2, lora_alpha=4, target_modules=["v_proj"])
    bad = {other.peft_name(n): v for n, v in random_adapters(other, 12).items()}
    with pytest.raises(ValueError, match="does not fit this model's target_modules"):
        lo.load_adapter(c, bad)
    with pytest.raises(ValueError, match="missing .*model.norm.weight"):
        lo.load_base(c, {k: v for k, v in sd.items() if k != "model.norm.weight"})
    after = c.download_params()
    assert all(np.array_equal(before[n], after[n]) for n in before)
    d = lora.LoraConfig(r=2, target_modules=["q_proj"]).to_peft_dict(fan_in_fan_out=False)
    (tmp_path / lora.ADAPTER_CONFIG).write_text(json.dumps({**d, "use_dora": True}))
    with pytest.raises(ValueError, match="use_dora=True is not supported"):
        lora.LoRA.from_pretrained(lambda: llama.LlamaModule(cfg), tmp_path)


# ---------------------------------------------------------------- frozen parameters

class _Two(wg.Module):
    def __init__(self, frozen=True):
        super().__init__()
        self.a = self.param([3], init=wg.init.literal([1.0, 2.0, 3.0]), trainable=not frozen)
        self.b = self.param([3], init=wg.init.literal([0.5, -1.0, 2.0]))


def _two_loss(m, f):
    return ops.sum_all(m.a * m.b * f["x"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_frozen_parameters_get_no_gradient_state_or_update(backend):
    c = wg.compile_module(_Two, _two_loss, inputs={"x": [3]}, optimizer=optim.Adam(lr=0.1),
                          backend=backend)
    c.step({"x": [1.0, 1.0, 1.0]})
    p = c.download_params()
    assert list(np.asarray(p["a"])) == [1.0, 2.0, 3.0]          # frozen: unchanged
    assert not np.allclose(np.asarray(p["b"]), [0.5, -1.0, 2.0])  # trained
    assert c.trainable_names == ["b"]
    assert set(c.download_param_grads()) == {"b"}
    np.testing.assert_allclose(c.download_param_grads()["b"], [1.0, 2.0, 3.0])
    assert not any("a" == n.split(".")[-1] or n == "grad/a" for n in c.ir.writebacks)
    # Module.freeze: the same, from outside the class
    c2 = wg.compile_module(lambda: _Two(frozen=False).freeze(keep=lambda n: n == "b"), _two_loss,
                           inputs={"x": [3]}, backend=backend)
    assert c2.trainable_names == ["b"]
