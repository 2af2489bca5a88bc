"""A LoRA fine-tune of a Llama-family model on one text: the chat page's "Fine-tune" section
(web/chat.mjs calls it in the worker) and its test, which runs the same steps in CPython.

    ft = finetune.FineTune(model, tok, text, backend="webgpu")   # base weights frozen
    await ft.held_loss_async()                 # mean loss on the held-out tenth of the text
    await ft.steps_async(5)                    # losses of 5 AdamW steps on the adapters
    tuned = await ft.merged_async()            # a Llama with W + scale * B A, for chatting

The text is tokenized once (without special tokens), its last tenth held out; training
batches are windows drawn by random.Random(seed), the held-out batches are fixed, so the same
model, text and seed give the same losses on every backend. Dropout is 0 for that reason.
"""
from __future__ import annotations

import random

from .. import lora, optim
from .llama import Llama, LlamaModule, lm_loss

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def pydoc_text(n_chars: int = 40_000) -> str:
    """The start of Python's pydoc topics (pydoc_data.topics ships with CPython)."""
    import pydoc_data.topics as t
    return "".join(t.topics[k] for k in sorted(t.topics))[:n_chars]


class FineTune:
    def __init__(self, model: Llama, tok, text: str, *, backend="auto", batch: int = 8,
                 seq: int = 64, r: int = 8, lora_alpha: int = 16, lr: float = 1e-2,
                 seed: int = 0, held_batches: int = 2):
        ids = tok.encode(text, add_special_tokens=False)
        cut = int(len(ids) * 0.9)
        self.train_ids, held = ids[:cut], ids[cut:]
        if min(len(self.train_ids), len(held)) < seq + 2:
            raise ValueError(f"FineTune: the text has {len(ids)} tokens; with seq={seq} it needs "
                             f"at least {10 * (seq + 2)} (paste a longer text, or lower seq)")
        self.cfg, self.B, self.T = model.cfg, batch, seq
        self.rng = random.Random(seed)
        self.held = [self._batch(held, random.Random(seed + 1 + i)) for i in range(held_batches)]
        cfg = self.cfg
        self.lora = lora.LoRA(lambda: LlamaModule(cfg), lora.LoraConfig(
            r=r, lora_alpha=lora_alpha, lora_dropout=0.0, target_modules=TARGETS))
        self.c = lora_compile(self.lora, batch, seq, lr=lr, backend=backend, seed=seed)
        self.base = model
        self.step = 0

    def _batch(self, ids, rng):
        xs, ys = [], []
        for _ in range(self.B):
            i = rng.randrange(len(ids) - self.T - 1)
            xs.append(ids[i:i + self.T])
            ys.append(ids[i + 1:i + self.T + 1])
        return {"tokens": xs, "targets": ys}

    async def load_base_async(self) -> None:
        sd = await self.base.state_dict_async()
        self.lora.load_base(self.c, sd)

    async def steps_async(self, k: int) -> list[float]:
        out = []
        for _ in range(k):
            out.append(float(await self.c.step_async(self._batch(self.train_ids, self.rng))))
            self.step += 1
        return out

    async def held_loss_async(self) -> float:
        return sum([float(await self.c.run_async(b)) for b in self.held]) / len(self.held)

    async def merged_async(self, backend=None) -> Llama:
        """The base with the adapters merged in, as a Llama on `backend` (default the base's)."""
        sd = self.lora.merged_state_dict(self.c)
        return Llama.from_hf_state_dict(self.cfg, sd, backend=backend or self.base.backend)

    def destroy(self) -> None:
        self.c.destroy()


def lora_compile(lo, batch: int, seq: int, *, lr: float, backend, seed: int):
    import webgrad as wg
    return wg.compile_module(lo, lm_loss, inputs={"tokens": ([batch, seq], "i32"),
                                                  "targets": ([batch, seq], "i32")},
                             optimizer=optim.AdamW(lr=lr), backend=backend, seed=seed)
