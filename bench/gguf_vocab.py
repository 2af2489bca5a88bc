"""A made-up vocabulary for the GGUF files the benchmarks write, so that llama.cpp (wllama,
llama-bench) loads them: it refuses a file without tokenizer.ggml.model."""
from __future__ import annotations

# Token i (from 3 on) is the one character chr(PIECE_BASE + i) (private-use code points), so
# that a text of those characters is exactly those ids for llama.cpp's tokenizer: wllama's
# completion takes text only, webgrad's generate takes ids.
PIECE_BASE = 0xF0000


def spm_vocab(w, vocab_size: int) -> None:
    """A SentencePiece vocabulary that llama.cpp loads (<unk>, <s>, </s>, then one made-up
    character per id, no byte pieces), with no space prefix and no BOS added, so that
    wllama_decode.prompt_text(ids) tokenizes to ids and every generated piece reads back as
    its id."""
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [chr(PIECE_BASE + i) for i in range(3, vocab_size)])
    w.add_token_scores([0.0] * 3 + [-float(i) for i in range(3, vocab_size)])
    w.add_token_types([2, 3, 3] + [1] * (vocab_size - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_add_space_prefix(False)
