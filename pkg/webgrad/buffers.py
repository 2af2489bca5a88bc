"""Buffer planning by liveness, with pooled reuse.

A WebGPU program's temporaries (kernel outputs nothing persistent holds) are known in
advance, with the step at which each is written and the last step that reads it. They
share a pool of buffers, each buffer holding tensors whose [first, last] steps do not
overlap; its size is its largest tensor's. Two packings are computed and the one with
fewer bytes in all is kept: walking the schedule, a tensor takes the smallest free buffer
that fits (growing the largest free one if none fits, else a new one) and gives it back
after its last reader; or largest tensor first, each into the smallest buffer free over
its whole lifetime, else a new one (the greedy-by-size packing of shared objects, which
grows no buffer: the GPT bench's pool at 2 x 256 from 187 to 163 MiB, the most ever
live, bench/memory_plan.py).
A buffer is handed to a tensor written by the kernel that reads the buffer's previous
tensor only when the planner says that is safe (`Live.donor`: that kernel reads the donor
only at the index it writes, in the same thread, before writing: an elementwise update in
place); otherwise outputs are placed before the kernel's inputs are freed. A kernel binds
a shared buffer once, read_write (codegen/wgsl.py). Persistent buffers (params, optimizer
state, kept gradients) and feeds are not pooled: they live for the program's lifetime.
"""
from __future__ import annotations

from dataclasses import dataclass

from .arrays import ALIGN, align  # noqa: F401  (the planner's sizes; re-exported)

END = 1 << 60  # "read at the end of the step" (outputs, end-of-step copies)


@dataclass
class Live:
    key: object
    nbytes: int
    first: int  # the step that writes it
    last: int   # the last step that reads it (END: read back / copied after the step)
    donor: object = None  # key of a tensor whose last reader (step `first`) writes this
                          # one at the same indices: this may take over its buffer


def plan_pool(tensors: list[Live]) -> tuple[list[int], dict]:
    """Assign every tensor a pool slot; returns (slot sizes in bytes, key -> slot): the
    smaller in total of the two packings (module docstring)."""
    a = _plan_in_order(tensors)
    b = _plan_by_size(tensors)
    return b if sum(b[0]) < sum(a[0]) else a


def _plan_by_size(tensors: list[Live]) -> tuple[list[int], dict]:
    """Largest first, each into the smallest slot free over its lifetime. A tensor and the
    donor whose buffer it takes over (the donor's last reader writes it) are one object
    over both lifetimes."""
    by_key = {t.key: t for t in tensors}
    head: dict = {}  # key -> the first tensor of its donor chain
    taken = set()
    for t in sorted(tensors, key=lambda t: t.first):
        d = t.donor
        if d is not None and d in by_key and d not in taken and by_key[d].last == t.first \
                and by_key[d].first < t.first and align(by_key[d].nbytes) >= align(t.nbytes):
            taken.add(d)
            head[t.key] = head.get(d, d)
    objects: dict = {}  # head key -> [first, last, bytes, keys]
    for t in tensors:
        h = head.get(t.key, t.key)
        o = objects.setdefault(h, [t.first, t.last, 0, []])
        o[0], o[1] = min(o[0], t.first), max(o[1], t.last)
        o[2] = max(o[2], align(t.nbytes))
        o[3].append(t.key)
    slots: list[int] = []
    spans: list[list[tuple[int, int]]] = []
    assign: dict = {}
    for first, last, need, keys in sorted(objects.values(), key=lambda o: (-o[2], o[0])):
        free = [s for s in range(len(slots))
                if all(l < first or last < f for f, l in spans[s])]
        if free:  # every slot is at least `need` (largest first): the smallest one
            s = min(free, key=lambda s: slots[s])
        else:
            s = len(slots)
            slots.append(need)
            spans.append([])
        spans[s].append((first, last))
        for k in keys:
            assign[k] = s
    return slots, assign


def _plan_in_order(tensors: list[Live]) -> tuple[list[int], dict]:
    slots: list[int] = []
    free: set[int] = set()
    assign: dict = {}
    busy: list[tuple[int, int]] = []  # (last, slot)
    last_of = {t.key: t.last for t in tensors}
    for t in sorted(tensors, key=lambda t: (t.first, -t.nbytes)):
        # release what died before this step (a tensor read at step s is busy during s)
        for last, slot in list(busy):
            if last < t.first:
                busy.remove((last, slot))
                free.add(slot)
        need = align(t.nbytes)
        d = assign.get(t.donor) if t.donor is not None else None
        if d is not None and last_of[t.donor] == t.first and (t.first, d) in busy \
                and slots[d] >= need:
            busy.remove((t.first, d))  # in place: the donor dies in the kernel writing t
            s = d
        elif (fits := [s for s in free if slots[s] >= need]):
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
