"""Ready-made models built on webgrad: gpt2 (training, KV-cached decoding, surprisal)."""
