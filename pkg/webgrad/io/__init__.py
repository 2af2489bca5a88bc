"""Weights in and out, in pure Python: `safetensors` (read and write), training checkpoints
(`checkpoint`, built on it), GGUF (`gguf`, read; its blocks decoded by webgrad.quants;
`gpu_dequant`, the same on a WebGPU device), the browser's cache of model images
(`modelcache`) and PyTorch interop (`torch_interop`: to_torch, state dicts). See each
module's header. The file formats know no model and no runtime object; `checkpoint` and
`torch_interop`, which take a CompiledModule, belong to the runtime API's layer
(docs/architecture.md)."""
