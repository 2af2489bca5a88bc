"""A tiny Llama with SmolLM2's shape and chat format, built from a seed: the chat page's demo
model (web/chat.mjs) and its tests' reference (tests/browser/test_chat_page.py), so both build
it from this one definition.

    from webgrad.models import llama_demo
    tok = llama_demo.tokenizer()                 # byte-level BPE + ChatML's special tokens
    m = llama_demo.model(seed=0, backend="webgpu")
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "hi"}],
                                             add_generation_prompt=True))

SmolLM2 (HuggingFaceTB/SmolLM2-*-Instruct): LlamaForCausalLM with GQA, rope_theta 100000 and
the ChatML template below; SmolLM2 ties its head to the token table, this one does not (a tied
random model's greedy reply only repeats its last input token). Here hidden 64, 2 layers and a vocabulary of
the 256 bytes plus the three special tokens, so it trains and decodes in seconds on a CPU
rasterizer. The weights are init.py's values for `seed` (Llama.init_random's), made on the host
in pure Python (no numpy in the browser), then written to the requested backend: the same seed
gives the same weights on every backend. Rendering the template needs jinja2 (serve.py ships it to the browser worker).
"""
from __future__ import annotations

from ..arrays import HostArray
from .bpe import bytes_to_unicode
from .llama_config import LlamaConfig
from .tokenizer import Tokenizer

HEAD_SCALE = 10.0
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SYSTEM = "You are a tiny demo model."
# SmolLM2-Instruct's template, with a shorter default system prompt
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + SYSTEM + "<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

CONFIG = LlamaConfig(
    model_type="llama", vocab_size=256 + len(SPECIAL), hidden_size=64, intermediate_size=160,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=256, n_ctx=256,
    tie_word_embeddings=False, bos_token_id=256 + SPECIAL.index("<|im_start|>"),
    eos_token_id=256 + SPECIAL.index("<|im_end|>"))


def tokenizer_spec() -> dict:
    """The tokenizer.json: GPT-2's byte-level alphabet, no merges, ChatML's special tokens."""
    chars = bytes_to_unicode()
    vocab = {chars[b]: b for b in range(256)}
    added = [{"id": 256 + i, "content": s, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True} for i, s in enumerate(SPECIAL)]
    return {"version": "1.0", "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                              "use_regex": True},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
                      "byte_fallback": False, "vocab": vocab, "merges": []}}


def tokenizer_config() -> dict:
    """The tokenizer_config.json: special tokens and the chat template."""
    return {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
            "unk_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE}


def tokenizer() -> Tokenizer:
    from .tokenizer_extras import apply_config
    tok = Tokenizer(tokenizer_spec(), name="demo tokenizer.json")
    apply_config(tok, tokenizer_config(), "demo tokenizer_config.json")
    return tok


def model(seed: int = 0, backend="auto"):
    """The demo Llama with weights from `seed` (N(0, 0.02), unit norms), on `backend`."""
    from ..init import generate
    from .llama import Llama, LlamaModule
    sd = {}
    for name, spec in LlamaModule(CONFIG).named_specs():   # init.py's bits, made on the host
        sd[name] = HostArray("f32", generate(spec.init, spec.shape, seed=seed, name=name),
                             shape=spec.shape)
    # a head of std 0.02 reaches logits of about +-1 from a unit-RMS hidden state: LoRA on the
    # blocks could not move the loss far from uniform. HEAD_SCALE lets a fine-tune show.
    head = sd["lm_head.weight"]
    sd["lm_head.weight"] = HostArray("f32", [v * HEAD_SCALE for v in head], shape=head.shape)
    return Llama.from_hf_state_dict(CONFIG, sd, backend=backend)
