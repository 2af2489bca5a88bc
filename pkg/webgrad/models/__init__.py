"""Models built on webgrad: GPT-2 (`gpt2`) and its byte-level BPE tokenizer (`bpe`)."""
