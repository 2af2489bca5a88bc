"""Models built on webgrad: GPT-2 (`gpt2`: training, KV-cached decoding on the device,
sampling, surprisal) and its byte-level BPE tokenizer (`bpe`)."""
