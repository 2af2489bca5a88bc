"""Models built on webgrad: GPT-2 (`gpt2`: training, KV-cached decoding on the device,
sampling, surprisal), its image for the browser's model cache (`gpt2_cache`) and its
byte-level BPE tokenizer (`bpe`); the Llama family (`llama`: Llama 2/3, Mistral, Qwen2, Qwen3
from transformers' configs and checkpoints: training with LlamaModule + lm_loss, LoRA through
webgrad.lora, inference) and their tokenizer.json / GGUF tokenizers (`tokenizer`, re-exported
as llama.Tokenizer). Both decode through `decoding` (programs, KV cache, generate, surprisal)
and `sampling`."""
