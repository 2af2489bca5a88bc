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

The checkpoint is a safetensors file (io/safetensors.py: pure Python, so it works in the
browser too) of every store buffer under its store name ("W", "opt/m.W", "grad/W", "step");
it is replaced atomically (written aside, then renamed), so a crash while saving leaves the
previous checkpoint intact. Consumed by compiled.py.
"""
from __future__ import annotations

import os

from .arrays import HostArray, first_nonfinite


class NonFiniteError(FloatingPointError):
    """A training step produced NaN or inf; it was refused and the state left as before."""


def save_state(path: str, state: dict[str, HostArray]) -> None:
    """Write `state` (name -> HostArray) as a safetensors file, atomically: written aside,
    then renamed over the old one, so a crash mid-write keeps the previous checkpoint."""
    from .io import safetensors as st
    tmp = f"{path}.tmp"
    st.save(state, tmp, {"webgrad": "recovery", "step": str(int(state["step"][0]))})
    os.replace(tmp, path)


def load_state(path: str) -> dict[str, HostArray]:
    from .io import safetensors as st
    return {name: t.to_host() for name, t in st.load(path).items()}


class Guard:
    """The host copy of one module's store (see the module docstring)."""

    def __init__(self, module, *, check_finite: bool, recovery):
        if recovery not in (None, "memory") and not isinstance(recovery, (str, os.PathLike)):
            raise ValueError(f"recovery must be None, 'memory' or a checkpoint file path, got "
                             f"{recovery!r}")
        self.module, self.check_finite = module, check_finite
        self.path = None if recovery in (None, "memory") else os.fspath(recovery)
        self.recovery = recovery is not None
        # the last good copy: in memory, or only in the file (a checkpoint keeps host memory
        # free of a second copy of the model; the finite check then reads it back on refusal)
        self.state: dict[str, HostArray] | None = None
        self.has_copy = False

    def names(self) -> list[str]:
        m = self.module
        return list(m._specs) + sorted(m._state_names())

    async def read(self) -> dict[str, HostArray]:
        be = self.module.backend
        return {n: await be.read(n) for n in self.names()}

    async def ensure_copy(self) -> None:
        """Before the first step: copy the starting state (init, or what was uploaded)."""
        if not self.has_copy:
            self.commit(await self.read())

    def commit(self, state: dict[str, HostArray]) -> None:
        if self.path is not None:
            save_state(self.path, state)
        self.state = state if self.path is None else None
        self.has_copy = True

    def update(self, values: dict[str, HostArray]) -> None:
        """Values written from the host (upload_params): the copy follows without a read."""
        if self.has_copy:
            self.commit({**self.last(), **values})

    def restore(self, state: dict[str, HostArray]) -> None:
        for name, h in state.items():
            if name in self.module.backend.store:
                self.module.backend.write(name, h)

    def last(self) -> dict[str, HostArray]:
        if self.state is not None:
            return self.state
        if self.has_copy:
            return load_state(self.path)
        raise RuntimeError("recover(): there is no copy of the state yet (no step ran)")

    async def after_step(self, loss: float, skipped: bool = False) -> None:
        """Copy the new state; with check_finite, refuse it (restoring the last copy) when the
        loss, a kept gradient or any updated value is not finite. skipped: loss scaling
        (precision="mixed") already skipped the step for a non-finite gradient, keeping the
        parameters and halving the scale: that state is kept, not refused."""
        state = await self.read()
        if self.check_finite and not skipped:
            bad = _first_nonfinite(loss, state)
            if bad is not None:
                self.restore(self.last())
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
        at = first_nonfinite(h)
        if at is not None:
            what = (f"the gradient of '{name[5:]}'" if name.startswith("grad/")
                    else f"'{name}' after the update")
            return f"{what} holds {h[at]} at flat position {at} (shape {list(h.shape)})"
    return None
