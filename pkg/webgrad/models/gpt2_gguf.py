"""GPT-2 from GGUF files as llama.cpp writes them (architecture gpt2): the config from the
"gpt2." metadata, llama.cpp's tensor names mapped to transformers' GPT2LMHeadModel names
(gpt2.py's parameters), and the weights written into a GPT2. GPT2.from_gguf is built on it;
io/gguf.py only parses the file.

    from webgrad.io import gguf
    from webgrad.models import gpt2_gguf
    f = gguf.load(path)
    cfg, sd = gpt2_gguf.state_dict(f)   # GPT2Config's fields, {transformers name: HostArray}

Layouts: transformers' Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) are
[in, out]; llama.cpp stores them [out, in] (numpy order of the GGUF dims), so they come back
transposed on the host, or held quantized as the file's [out, in] blocks with a transposed
QuantSpec (module.py reads them through ops.dequantize and a swap of axes).
"""
from __future__ import annotations

from ..arrays import HostArray, transpose2d
from ..io.gguf import GGUFError, GGUFFile, GGUFTensor, load

# llama.cpp's gpt2 names -> transformers' GPT2LMHeadModel names (without "transformer.")
_GLOBAL = {"token_embd.weight": "wte.weight", "position_embd.weight": "wpe.weight",
           "output_norm.weight": "ln_f.weight", "output_norm.bias": "ln_f.bias",
           "output.weight": "lm_head.weight"}
_BLOCK = {"attn_norm": "ln_1", "attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj",
          "ffn_norm": "ln_2", "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}
_CONV1D = {"attn_qkv", "attn_output", "ffn_up", "ffn_down"}


def tensors(f: GGUFFile) -> dict[str, tuple[GGUFTensor, bool]]:
    """transformers name -> (GGUF tensor, whether it is stored transposed), validated: every
    name in llama.cpp's gpt2 layout, token and position tables present."""
    out = {}
    for name, t in f.tensors.items():
        parts = name.split(".")
        if name in _GLOBAL:
            out[_GLOBAL[name]] = (t, False)
        elif (len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit()
              and parts[2] in _BLOCK and parts[3] in ("weight", "bias")):
            out[f"h.{int(parts[1])}.{_BLOCK[parts[2]]}.{parts[3]}"] = (
                t, parts[2] in _CONV1D and parts[3] == "weight")
        else:
            raise GGUFError(f"GGUF file {f.name}: tensor {name!r} is not part of llama.cpp's gpt2 "
                            "layout")
    for need in ("wte.weight", "wpe.weight"):
        if need not in out:
            raise GGUFError(f"GGUF file {f.name}: tensor "
                            f"{[k for k, v in _GLOBAL.items() if v == need][0]!r} is missing")
    wte = out["wte.weight"][0]
    if len(wte.shape) != 2:
        raise GGUFError(f"GGUF file {f.name}: tensor 'token_embd.weight' has shape "
                        f"{list(wte.shape)}; it should be [vocab, n_embd]")
    head = out.get("lm_head.weight")
    if head is not None and head[0].shape != wte.shape:
        raise GGUFError(f"GGUF file {f.name}: tensor 'output.weight' has shape "
                        f"{list(head[0].shape)}, token_embd.weight {list(wte.shape)}")
    return out


def config(f: GGUFFile) -> dict:
    """GPT2Config's fields from the gpt2.* metadata (vocab_size from the token table), each
    checked (type, range) and checked against the tensors in the file before anything is
    built from it: a header cannot ask for more layers, positions or columns than the file
    holds."""
    md = f.metadata
    arch = md.get("general.architecture")
    if arch != "gpt2":
        raise GGUFError(f"GGUF file {f.name}: metadata 'general.architecture': expected 'gpt2', "
                        f"got {arch!r}" + (" (Llama-family files: webgrad.models.llama.Llama."
                                           "from_gguf)" if arch in ("llama", "qwen2", "qwen3") else ""))

    def fail(k, msg):
        raise GGUFError(f"GGUF file {f.name}: metadata {k!r} {msg}")

    def key(k):
        k = f"gpt2.{k}"
        if k not in md:
            fail(k, "is missing")
        v = md[k]
        if type(v) is not int or v < 1:
            fail(k, f"must be a whole number >= 1 (a GGUF integer type), got {v!r}")
        return v

    cfg = {"n_layer": key("block_count"), "n_head": key("attention.head_count"),
           "n_embd": key("embedding_length"), "n_ctx": key("context_length")}
    tensors_ = tensors(f)
    vocab, n_embd = tensors_["wte.weight"][0].shape
    if cfg["n_embd"] != n_embd:
        fail("gpt2.embedding_length", f"is {cfg['n_embd']} but token_embd.weight has {n_embd} "
             "columns")
    if n_embd % cfg["n_head"]:
        fail("gpt2.attention.head_count", f"is {cfg['n_head']}, which does not divide embedding_length "
             f"{n_embd}")
    wpe = tensors_["wpe.weight"][0].shape
    if tuple(wpe) != (cfg["n_ctx"], n_embd):
        fail("gpt2.context_length", f"is {cfg['n_ctx']} but position_embd.weight has shape "
             f"{list(wpe)}; they must agree ([context_length, embedding_length])")
    blocks = {int(n.split(".")[1]) for n in tensors_ if n.startswith("h.")}
    # the count first: set(range(2**63)) would be the very allocation this check prevents
    if len(blocks) != cfg["n_layer"] or blocks != set(range(cfg["n_layer"])):
        fail("gpt2.block_count", f"is {cfg['n_layer']} but the file holds blocks "
             f"{_ranges(sorted(blocks))}; they must be blk.0 .. blk.{cfg['n_layer'] - 1}")
    eps = md.get("gpt2.attention.layer_norm_epsilon", 1e-5)
    if type(eps) not in (int, float) or not 0 < eps < 1:
        fail("gpt2.attention.layer_norm_epsilon", f"must be a number in (0, 1), got {eps!r}")
    eos = md.get("tokenizer.ggml.eos_token_id")
    if eos is not None and (type(eos) is not int or not 0 <= eos < vocab):
        fail("tokenizer.ggml.eos_token_id", f"must be a token id in [0, {vocab}), got {eos!r}")
    cfg.update(vocab_size=vocab, layer_norm_epsilon=float(eps), eos_token_id=eos)
    return cfg


def _ranges(ids: list[int]) -> str:
    if not ids:
        return "none"
    return f"{ids[0]}..{ids[-1]} ({len(ids)} of them)" if len(ids) > 3 else str(ids)


def state_dict(f: GGUFFile | object) -> tuple[dict, dict[str, HostArray]]:
    """(hyper-parameters, state dict) of a llama.cpp gpt2 GGUF (a GGUFFile, or what
    io.gguf.load reads), in transformers' GPT-2 names and layouts, dequantized to f32 on the
    host. Hyper-parameters: GPT2Config's fields (config). A missing output.weight means the
    head is tied to token_embd.weight (GPT-2's own tying); a present one comes back as
    "lm_head.weight", as in transformers' state dict (llama.cpp's converter writes the tied
    table twice, and llama-quantize may then give the two copies different types)."""
    if not isinstance(f, GGUFFile):
        f = load(f)
    cfg = config(f)
    sd = {}
    for hf, (t, transposed) in tensors(f).items():
        h = t.dequantize()
        sd[hf] = transpose2d(h) if transposed else h
    return cfg, sd


async def write_async(model, f: GGUFFile, *, progress=None) -> None:
    """Write a gpt2 GGUF's weights into a webgrad.models.gpt2.GPT2 built from config(f):
    weights the model holds quantized (GPT2.quant_full) get their blocks (write_blocks);
    others on WebGPU are uploaded as they are and dequantized by a kernel
    (io/gpu_dequant.py); a token table the device splits into chunks, and other backends,
    take the host path. The tied head (output.weight) is not a GPT2 parameter.
    progress(done, total), if given, hears the tensor bytes written so far."""
    from ..io import gpu_dequant
    found = tensors(f)
    missing = sorted(set(model.shapes) - set(found) - {n for n in model.shapes if n.startswith("wte.")})
    if missing:
        raise GGUFError(f"GGUF file {f.name}: missing {', '.join(missing[:5])} for {model.cfg}")
    done, total = 0, sum(t.data.nbytes for hf, (t, _) in found.items() if hf != "lm_head.weight")
    for hf, (t, transposed) in found.items():
        if hf == "lm_head.weight":
            continue
        if hf in model.quant_full:                # kept quantized: the blocks themselves
            model.write_blocks(hf, t.data)
        elif hf == "wte.weight" and "wte.weight" not in model.shapes:     # split table
            model.write_weights({hf: t.dequantize()})
        else:
            await gpu_dequant.write_async(model.backend, hf, t, transpose=transposed)
        done += t.data.nbytes
        if progress is not None:
            progress(done, total)


__all__ = ["tensors", "config", "state_dict", "write_async"]
