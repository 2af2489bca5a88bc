"""Training checkpoints: a CompiledModule's parameters, optimizer state and step counter in
one safetensors file (CompiledModule.save / .load are thin wrappers over this module).

The file is an ordinary safetensors file, so the safetensors library and torch read it
(`safetensors.torch.load_file`), and a state dict written there (names = c.param_names,
float tensors of the right shapes) loads here:

    layers.0.W, layers.0.b, ...     the parameters, F32, under their webgrad names
    opt/m.layers.0.W, ...           optimizer state (optimizer=True): the optim.py buffers
    step                            the step counter (optimizer=True), F32 scalar
    __metadata__                    {"format": "pt", "webgrad": "checkpoint", "step": "12",
                                     "seed": "0"}   (step and seed with optimizer=True)

Resuming continues training exactly as if it never stopped: the step counter drives the
learning-rate schedule and the dropout masks, and the optimizer buffers hold the moments,
so `c.load(f)` on a module compiled with the same factory, loss, optimizer and seed (the
seed also keys the dropout masks; the file's metadata records it), then
the same feeds, gives the same losses bit for bit (tests/test_checkpoint.py, per backend).

Loading checks the whole file against the module before writing anything: an unknown or
missing parameter, a wrong shape, a non-float dtype, a NaN/inf value (unless
allow_nonfinite=True; arrays.to_host, the check every path in shares) or a step counter that
is not a whole number >= 0 raises CheckpointError naming the file and the tensor, and the
module keeps its parameters, optimizer state and step.
"""
from __future__ import annotations

from math import prod

from ..arrays import FeedError, HostArray, to_host
from ..optim import STATE_PREFIX
from . import safetensors as st


class CheckpointError(ValueError):
    """A checkpoint that does not fit the module it is loaded into."""


async def to_tensors(c, *, optimizer: bool = True) -> dict[str, HostArray]:
    """name -> HostArray of everything a checkpoint of c holds."""
    out = {n: await c.backend.read(n) for n in c.param_names}
    if optimizer:
        for n in c.state_shapes("save"):
            out[n] = await c.backend.read(n)
    return out


async def save_async(c, dst=None, *, optimizer: bool = True) -> bytes | None:
    """Write c's checkpoint to dst (a path or binary file); with dst=None, return the bytes."""
    tensors = await to_tensors(c, optimizer=optimizer)
    meta = {"format": "pt", "webgrad": "checkpoint"}
    if optimizer:
        meta["step"] = str(int(tensors["step"][0]))
        meta["seed"] = str(c.seed)
    if dst is None:
        return st.dumps(tensors, meta)
    st.save(tensors, dst, meta)
    return None


def _fail(file, msg):
    raise CheckpointError(f"load(): checkpoint {file}: {msg}")


def check_tensors(c, f: dict, file: str, *, optimizer: bool | None,
                  allow_nonfinite: bool = False) -> dict[str, HostArray]:
    """Validate a name -> StoredTensor mapping against c; the HostArrays to write.

    optimizer=None loads the optimizer state and step when the file has them (any opt/ name
    or "step"), True requires them, False ignores them."""
    stored = c.held_params   # quantized: i32 words
    params = {n: shape for n, (shape, _) in stored.items()}
    has_opt = "step" in f or any(k.startswith(STATE_PREFIX) for k in f)
    want_opt = has_opt if optimizer is None else optimizer
    if want_opt and not has_opt:
        _fail(file, "optimizer=True but the file holds no optimizer state or step (it was "
              "saved with optimizer=False, or by another program)")
    expected = dict(params)
    if want_opt:
        expected.update(c.state_shapes("load"))
    ignored = set() if want_opt else {k for k in f if k == "step" or k.startswith(STATE_PREFIX)}
    unknown = sorted(set(f) - set(expected) - ignored)
    if unknown:
        which = [u for u in unknown if u.startswith(STATE_PREFIX)]
        hint = (" (optimizer state of a different optimizer? load with optimizer=False to "
                "take only the parameters)" if which else "")
        _fail(file, f"unknown tensor {', '.join(map(repr, unknown[:8]))}"
              f"{' ...' if len(unknown) > 8 else ''}{hint}; the module's parameters are "
              f"{', '.join(c.param_names)}")
    missing = [n for n in expected if n not in f]
    if missing:
        _fail(file, f"missing {', '.join(map(repr, missing[:8]))}"
              f"{' ...' if len(missing) > 8 else ''}")
    hosts = {}
    for name, shape in expected.items():
        t = f[name]
        if tuple(t.shape) != tuple(shape) and not (prod(t.shape) == 1 and prod(shape) == 1):
            _fail(file, f"tensor {name!r} has shape {list(t.shape)}, the module's is {list(shape)}")
        if name in stored and stored[name][1] == "i32":
            if t.dtype != "I32":
                _fail(file, f"tensor {name!r} has dtype {t.dtype}; the module holds it "
                      "quantized, as I32 words of its blocks (save() writes them)")
        elif t.dtype not in ("F32", "F16", "BF16", "F64"):
            _fail(file, f"tensor {name!r} has dtype {t.dtype}; parameters and optimizer state "
                  "are floats (F32, or F16/BF16/F64 converted)")
        try:   # the one value check of every path in (arrays.to_host): NaN, inf, overflow
            dtype = stored[name][1] if name in stored else "f32"   # quantized: its i32 words
            dtype = "f32" if dtype == "f16" else dtype  # f16 weights travel as f32 values
            h = to_host(t, shape=tuple(t.shape), dtype=dtype, what=f"tensor {name!r}",
                        allow_nonfinite=allow_nonfinite)
        except FeedError as e:
            _fail(file, str(e))
        h.shape = tuple(shape)
        hosts[name] = h
    step = hosts.get("step")
    if step is not None and not (step[0] >= 0 and step[0] == int(step[0])):
        _fail(file, f"tensor 'step' is {step[0]}; the step counter is a whole number >= 0")
    return hosts


async def load_async(c, src, *, optimizer: bool | None = None,
                     allow_nonfinite: bool = False) -> None:
    """Load a checkpoint (path, bytes or binary file) into c: all checks first, then writes."""
    c.check_alive("load")
    f = st.load(src)                    # a broken file raises SafetensorsError, naming it
    hosts = check_tensors(c, f, f.name, optimizer=optimizer, allow_nonfinite=allow_nonfinite)
    await c.write_state_async(hosts, method="load")
