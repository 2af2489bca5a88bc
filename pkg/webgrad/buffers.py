"""Buffer planning by liveness, with pooled reuse.

A WebGPU program's temporaries (kernel outputs nothing persistent holds) are known in
advance, with the step at which each is written and the last step that reads it. They
share a pool of buffers: walking the schedule, a tensor takes the smallest free buffer
that fits (growing the largest free one if none fits, else a new one) and gives it back
after its last reader. A buffer is never handed to a tensor written by the kernel that
reads the buffer's previous tensor (outputs are placed before that kernel's inputs are
freed), so no dispatch binds one buffer twice. Persistent buffers (params, optimizer
state, kept gradients) and feeds are not pooled: they live for the program's lifetime.
"""
from __future__ import annotations

from dataclasses import dataclass

ALIGN = 16  # bytes: buffer sizes are multiples of this (vec4 views stay possible)
END = 1 << 60  # "read at the end of the step" (outputs, end-of-step copies)


def align(nbytes: int) -> int:
    return max(ALIGN, -(-int(nbytes) // ALIGN) * ALIGN)


@dataclass
class Live:
    key: object
    nbytes: int
    first: int  # the step that writes it
    last: int   # the last step that reads it (END: read back / copied after the step)


def plan_pool(tensors: list[Live]) -> tuple[list[int], dict]:
    """Assign every tensor a pool slot; returns (slot sizes in bytes, key -> slot)."""
    slots: list[int] = []
    free: set[int] = set()
    assign: dict = {}
    busy: list[tuple[int, int]] = []  # (last, slot)
    for t in sorted(tensors, key=lambda t: (t.first, -t.nbytes)):
        # release what died before this step (a tensor read at step s is busy during s)
        for last, slot in list(busy):
            if last < t.first:
                busy.remove((last, slot))
                free.add(slot)
        need = align(t.nbytes)
        fits = [s for s in free if slots[s] >= need]
        if fits:
            s = min(fits, key=lambda s: slots[s])
        elif free:
            s = max(free, key=lambda s: slots[s])
            slots[s] = need
        else:
            s = len(slots)
            slots.append(need)
        free.discard(s)
        busy.append((t.last, s))
        assign[t.key] = s
    return slots, assign
