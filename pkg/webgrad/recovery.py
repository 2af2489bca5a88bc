"""Keeping the last good training state: the finite check and device-loss recovery.

A compiled module's state is its persistent store: parameters, optimizer moments, kept
gradients and the step counter. `Guard` copies that store to the host after every completed
step (in memory, or into a checkpoint file), which buys two guarantees:

  check_finite  a step whose loss, kept gradients or updated state holds NaN/inf is refused:
                the previous copy is written back (parameters, optimizer state and step counter
                as they were before the call) and NonFiniteError names what went bad and where.
  recovery      after a lost GPU device (DeviceLostError), `CompiledModule.recover()` rebuilds
                the programs on a new device and writes the last copy back, so training goes
                on from the last completed step with the same losses as if nothing happened.

Cost, and why it is opt-in: one read-back of the whole store per step (the model's size in
bytes, plus its optimizer state), and for a checkpoint file one write of it. Without the
guard a step reads back the loss alone.

The checkpoint is a safetensors file (8-byte little-endian header length, a JSON header of
dtype/shape/offsets, the raw little-endian data), written by hand here so that the package
keeps no dependency; it is replaced atomically (written aside, then renamed), so a crash
while saving leaves the previous checkpoint intact. The step counter is stored as the
tensor "step". Consumed by compiled.py.
"""
from __future__ import annotations

import json
import os

from .arrays import HostArray, first_nan

_ST_DTYPES = {"f32": "F32", "i32": "I32"}


class NonFiniteError(FloatingPointError):
    """A training step produced NaN or inf; it was refused and the state left as before."""


def save_state(path: str, state: dict[str, HostArray]) -> None:
    """Write `state` (name -> HostArray) as a safetensors file, atomically."""
    header, offset = {}, 0
    for name, h in state.items():
        n = 4 * len(h)
        header[name] = {"dtype": _ST_DTYPES[h.dtype], "shape": list(h.shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the format pads the header to 8 bytes with spaces
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        for h in state.values():
            f.write(_little_endian(h))
    os.replace(tmp, path)


def load_state(path: str) -> dict[str, HostArray]:
    """Read a file written by save_state (any safetensors file of F32/I32 tensors)."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    body = memoryview(raw)[8 + n:]
    out = {}
    inverse = {v: k for k, v in _ST_DTYPES.items()}
    for name, meta in header.items():
        if meta["dtype"] not in inverse:
            raise ValueError(f"{path}: tensor {name!r} has dtype {meta['dtype']}; a webgrad "
                             "checkpoint holds F32 and I32 tensors only")
        a, b = meta["data_offsets"]
        h = HostArray(inverse[meta["dtype"]], shape=meta["shape"])
        h.frombytes(body[a:b])
        if _BIG_ENDIAN:
            h.byteswap()
        out[name] = h
    return out


_BIG_ENDIAN = HostArray("i32", [1]).tobytes()[0] == 0


def _little_endian(h: HostArray) -> bytes:
    if not _BIG_ENDIAN:
        return h.tobytes()
    c = HostArray(h.dtype, h, shape=h.shape)
    c.byteswap()
    return c.tobytes()


class Guard:
    """The host copy of one module's store (see the module docstring)."""

    def __init__(self, module, *, check_finite: bool, recovery):
        if recovery not in (None, "memory") and not isinstance(recovery, (str, os.PathLike)):
            raise ValueError(f"recovery must be None, 'memory' or a checkpoint file path, got "
                             f"{recovery!r}")
        self.module, self.check_finite = module, check_finite
        self.path = None if recovery in (None, "memory") else os.fspath(recovery)
        self.recovery = recovery is not None
        self.state: dict[str, HostArray] | None = None  # the last good copy

    def names(self) -> list[str]:
        m = self.module
        return list(m._specs) + sorted(m._state_names())

    async def read(self) -> dict[str, HostArray]:
        be = self.module.backend
        return {n: await be.read(n) for n in self.names()}

    async def ensure_copy(self) -> None:
        """Before the first step: copy the starting state (init, or what was uploaded)."""
        if self.state is None:
            self.commit(await self.read())

    def commit(self, state: dict[str, HostArray]) -> None:
        self.state = state
        if self.path is not None:
            save_state(self.path, state)

    def update(self, values: dict[str, HostArray]) -> None:
        """Values written from the host (upload_params): the copy follows without a read."""
        if self.state is not None:
            self.commit({**self.state, **values})

    def restore(self, state: dict[str, HostArray]) -> None:
        for name, h in state.items():
            if name in self.module.backend.store:
                self.module.backend.write(name, h)

    def last(self) -> dict[str, HostArray]:
        if self.state is not None:
            return self.state
        if self.path is not None and os.path.exists(self.path):
            return load_state(self.path)
        raise RuntimeError("recover(): there is no copy of the state yet (no step completed)")

    async def after_step(self, loss: float) -> None:
        """Copy the new state; with check_finite, refuse it (restoring the last copy) when the
        loss, a kept gradient or any updated value is not finite."""
        state = await self.read()
        if self.check_finite:
            bad = _first_nonfinite(loss, state)
            if bad is not None:
                self.restore(self.state)
                raise NonFiniteError(f"step(): {bad}; the step was refused: parameters, optimizer "
                                     "state and the step counter are as before this call. Lower "
                                     "the learning rate, clip gradients (clip_norm=) or check the "
                                     "inputs")
        self.commit(state)


def _first_nonfinite(loss: float, state: dict[str, HostArray]) -> str | None:
    if loss != loss or loss in (float("inf"), float("-inf")):
        return f"the loss is {loss}"
    # gradients first: they are the cause, the updated parameters the consequence
    order = sorted(state, key=lambda n: (not n.startswith("grad/"), n))
    for name in order:
        h = state[name]
        if h.dtype != "f32":
            continue
        at = first_nan(h)
        if at is None:
            at = _first_inf(h)
        if at is not None:
            what = (f"the gradient of '{name[5:]}'" if name.startswith("grad/")
                    else f"'{name}' after the update")
            return f"{what} holds {h[at]} at flat position {at} (shape {list(h.shape)})"
    return None


def _first_inf(h: HostArray) -> int | None:
    from .arrays import numpy_or_none
    np = numpy_or_none()
    if np is not None:
        hits = np.flatnonzero(np.isinf(np.frombuffer(h, dtype=np.float32)))
        return int(hits[0]) if hits.size else None
    if max(h, default=0.0) != float("inf") and min(h, default=0.0) != float("-inf"):
        return None
    return next(i for i, v in enumerate(h) if v in (float("inf"), float("-inf")))
