"""Weights in and out, in pure Python: `safetensors` (read and write), training checkpoints
(`checkpoint`, built on it), GGUF (`gguf`, read; its blocks decoded by webgrad.quants;
`gpu_dequant`, the same on a WebGPU device) and PyTorch interop (`torch_interop`: to_torch,
state dicts). See each module's header."""
