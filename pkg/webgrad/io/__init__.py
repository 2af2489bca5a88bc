"""Weights in and out, in pure Python: `safetensors` (read and write), training checkpoints
(`checkpoint`, built on it) and GGUF (`gguf`, read and dequantize). See each module's header."""
