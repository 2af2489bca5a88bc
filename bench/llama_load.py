"""Loading Llama models at the size people use, natively (wgpu-py: lavapipe here, Dawn/Vulkan
on a GPU machine): host time from a file on disk to a model whose weights are on the GPU.

    python3 bench/llama_load.py gguf    # SmolLM2-360M's shape, Q4_K_M as llama-quantize lays
                                        # it out (about 270 MB, random blocks)
    python3 bench/llama_load.py bf16    # Llama-3.2-1B's shape, a bf16 safetensors folder
    python3 bench/llama_load.py bf16 --layers 4 --profile 25

The files are written once into .cache/bench/ (random weights of the real shapes; the GGUF
as llama.cpp writes SmolLM2-360M at Q4_K_M: its 960-wide matrices are not whole 256-value
blocks, so they are Q5_0, ffn_down is Q6_K, the tied token table Q8_0). Each run prints the
time of the file's parse alone, then of the whole load (parse + conversion + upload, up to
the GPU having done the work: one weight is read back), wall clock and CPU time of all the
process's threads (lavapipe's included; on a loaded machine wall clock is mostly waiting for
a core), --runs times, and with --profile N the N functions of most own time in a profiled load.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "pkg"))

import numpy as np  # noqa: E402

from webgrad.blocking import run_blocking  # noqa: E402

CACHE = ROOT / ".cache" / "bench"
SMOL360 = dict(hidden_size=960, num_hidden_layers=32, num_attention_heads=15,
               num_key_value_heads=5, intermediate_size=2560, vocab_size=49152,
               rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=2048,
               tie_word_embeddings=True)
LLAMA1B = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=8192, vocab_size=128256,
               rope_theta=500000.0, rms_norm_eps=1e-5, max_position_embeddings=2048,
               tie_word_embeddings=True, head_dim=64, model_type="llama",
               architectures=["LlamaForCausalLM"], torch_dtype="bfloat16",
               rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})


def _blocks(rng, qt, rows, cols):
    """Random blocks of qtype qt for a [rows, cols] matrix, with finite f16 scales of about
    the magnitude a quantizer writes."""
    import gguf
    block, size = gguf.GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    f16 = {gguf.GGMLQuantizationType.Q8_0: (0,), gguf.GGMLQuantizationType.Q5_0: (0,),
           gguf.GGMLQuantizationType.Q6_K: (208,)}[qt]
    for at in f16:
        raw[:, at:at + 2] = np.full((raw.shape[0], 1), 1e-3, np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def gguf_file(layers: int) -> Path:
    import gguf
    QT = gguf.GGMLQuantizationType
    c = SMOL360
    path = CACHE / f"smollm2-360m-shape-q4_k_m-{layers}l.gguf"
    if path.exists():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    H, Hkv, D, F, V = (c["num_attention_heads"], c["num_key_value_heads"], c["hidden_size"],
                       c["intermediate_size"], c["vocab_size"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(D)
    w.add_feed_forward_length(F)
    w.add_block_count(layers)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_freq_base(c["rope_theta"])
    w.add_rope_dimension_count(D // H)
    w.add_vocab_size(V)
    w.add_token_list([f"<t{i}>" for i in range(V)])
    w.add_eos_token_id(2)
    hd = D // H
    w.add_tensor("token_embd.weight", (b := _blocks(rng, QT.Q8_0, V, D)), raw_shape=b.shape,
                 raw_dtype=QT.Q8_0)
    w.add_tensor("output_norm.weight", np.ones(D, np.float32))
    for i in range(layers):
        for name, rows, cols, qt in (("attn_q", H * hd, D, QT.Q5_0), ("attn_k", Hkv * hd, D, QT.Q5_0),
                                     ("attn_v", Hkv * hd, D, QT.Q5_0), ("attn_output", D, H * hd, QT.Q5_0),
                                     ("ffn_gate", F, D, QT.Q5_0), ("ffn_up", F, D, QT.Q5_0),
                                     ("ffn_down", D, F, QT.Q6_K)):
            b = _blocks(rng, qt, rows, cols)
            w.add_tensor(f"blk.{i}.{name}.weight", b, raw_shape=b.shape, raw_dtype=qt)
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(D, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(D, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def bf16_folder(layers: int) -> Path:
    import torch
    from safetensors.torch import save_file
    c = dict(LLAMA1B, num_hidden_layers=layers)
    folder = CACHE / f"llama-3.2-1b-shape-bf16-{layers}l"
    if (folder / "model.safetensors").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    D, F, V, hd = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["head_dim"]
    H, Hkv = c["num_attention_heads"], c["num_key_value_heads"]
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    sd = {"model.embed_tokens.weight": rnd(V, D), "model.norm.weight": torch.ones(D, dtype=torch.bfloat16)}
    for i in range(layers):
        p = f"model.layers.{i}."
        sd.update({p + "self_attn.q_proj.weight": rnd(H * hd, D), p + "self_attn.k_proj.weight": rnd(Hkv * hd, D),
                   p + "self_attn.v_proj.weight": rnd(Hkv * hd, D), p + "self_attn.o_proj.weight": rnd(D, H * hd),
                   p + "mlp.gate_proj.weight": rnd(F, D), p + "mlp.up_proj.weight": rnd(F, D),
                   p + "mlp.down_proj.weight": rnd(D, F),
                   p + "input_layernorm.weight": torch.ones(D, dtype=torch.bfloat16),
                   p + "post_attention_layernorm.weight": torch.ones(D, dtype=torch.bfloat16)})
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(c))
    return folder


def _wait(m) -> None:
    """Until the GPU has done the load's work (a read of one weight waits for the queue)."""
    run_blocking(m.backend.read(next(iter(m.shapes))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["gguf", "bf16"])
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the real shape")
    ap.add_argument("--profile", type=int, default=0, metavar="N")
    ap.add_argument("--runs", type=int, default=1, help="timed loads, one after another")
    a = ap.parse_args()
    from webgrad.io import gguf as wgg
    from webgrad.io import safetensors as wst
    from webgrad.models import llama
    if a.what == "gguf":
        path = gguf_file(a.layers or SMOL360["num_hidden_layers"])
        size = path.stat().st_size

        def parse():
            return wgg.load(str(path))

        def load():
            return llama.Llama.from_gguf(str(path), backend="webgpu")
    else:
        path = bf16_folder(a.layers or LLAMA1B["num_hidden_layers"])
        size = sum(f.stat().st_size for f in path.iterdir())

        def parse():
            return wst.load(str(path / "model.safetensors"))

        def load():
            return llama.Llama.from_pretrained(str(path), backend="webgpu")
    print(f"{path.name}: {size / 1e6:.0f} MB")
    t = time.perf_counter()
    parse()
    print(f"parse alone: {time.perf_counter() - t:.2f} s")
    llama.Llama.from_hf_state_dict  # noqa: B018 (imports done before timing)
    for run in range(a.runs):
        t, cpu = time.perf_counter(), time.process_time()
        m = load()
        _wait(m)
        print(f"load (parse + convert + upload), run {run + 1}: {time.perf_counter() - t:.2f} s "
              f"(CPU {time.process_time() - cpu:.2f} s, all threads), {m.weight_bytes / 1e6:.0f} MB "
              f"of weights on the GPU, {len(m.quant)} held quantized, "
              f"{len(m.backend.programs)} upload programs")
        m.backend.destroy()
        del m
    m = load()
    m.backend.destroy()
    del m
    if a.profile:
        prof = cProfile.Profile()
        prof.enable()
        m = load()
        prof.disable()
        m.backend.destroy()
        pstats.Stats(prof).sort_stats("tottime").print_stats(a.profile)


if __name__ == "__main__":
    os.environ.setdefault("WGPU_BACKEND_TYPE", "Vulkan")
    main()
