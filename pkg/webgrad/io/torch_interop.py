"""PyTorch interop: a compiled webgrad program as a torch.nn.Module, and torch state dicts back.

`c.to_torch()` (CompiledModule: the loss; CompiledForward: its output) returns a
`GraphModule`: a torch.nn.Module whose parameters are c's, under the same dotted names
(`named_parameters()` / `state_dict()` keys equal `c.param_names`; "layers.0.W" becomes
submodule "layers", submodule "0", parameter "W"), and whose forward evaluates c's traced
forward graph with the torch executor's per-op lowerings (backends/torch_backend.py). Those
are plain differentiable torch ops, so torch autograd, optimizers, DistributedDataParallel,
`.to("cuda")` and torch.save all apply: the route for a run that outgrows one browser tab.

    m = c.to_torch()                          # params copied from c (c is not changed)
    loss = m(x=xb, y=yb)                      # inputs by name, or positionally in the order
                                              # compile_module declared them; static shapes
    loss.backward(); opt.step()               # torch's own training loop
    c.load_state_dict(m.state_dict())         # back into webgrad (strict: names and shapes)
    params = webgrad.from_torch_state_dict(sd)    # name -> HostArray, for upload_params

The graph's persistent state other than parameters (the step counter, which keys dropout
masks, and any state a program reads) is held in non-persistent buffers, so `state_dict()`
is exactly the parameters. In training mode each forward advances the step counter by one,
as a webgrad training step does, so dropout masks change from call to call exactly as they
would in webgrad; in eval mode the counter stays (and forward equals c.run at that step).

Nothing here imports torch until to_torch() is called: `import webgrad` stays torch-free.
"""
from __future__ import annotations

from ..arrays import FeedError, HostArray, to_host


def _strip_prefix(sd: dict) -> dict:
    """DistributedDataParallel's state_dict prefixes every name with "module."."""
    if sd and all(isinstance(k, str) and k.startswith("module.") for k in sd):
        return {k[len("module."):]: v for k, v in sd.items()}
    return dict(sd)


def from_torch_state_dict(state_dict: dict, *, allow_nonfinite: bool = False
                          ) -> dict[str, HostArray]:
    """A torch state dict (tensors on any device, any float dtype, bf16 included; a DDP
    "module." prefix is dropped) -> {name: HostArray f32}, ready for c.upload_params.
    Every value goes through arrays.to_host (dtype, NaN/inf unless allow_nonfinite); values
    without a shape (nested lists, array.array) are passed on as they are: upload_params
    checks them against the parameter's shape."""
    out = {}
    for name, v in _strip_prefix(state_dict).items():
        if not hasattr(v, "shape"):
            out[name] = v
            continue
        out[name] = to_host(v, shape=tuple(v.shape), dtype="f32",
                            what=f"from_torch_state_dict: {name!r}",
                            allow_nonfinite=allow_nonfinite)
    return out


async def load_state_dict_async(c, state_dict: dict, *, strict: bool = True,
                                allow_nonfinite: bool = False) -> None:
    """c.load_state_dict: every name and shape checked before any write (upload_params)."""
    if not isinstance(state_dict, dict):
        raise FeedError(f"load_state_dict(): pass a dict name -> tensor (module.state_dict()), "
                        f"got {type(state_dict).__name__}")
    await c._upload_params(from_torch_state_dict(state_dict, allow_nonfinite=allow_nonfinite),
                           not strict, "load_state_dict", "strict=False", allow_nonfinite)


async def to_torch_async(c, graph, output: str):
    """The GraphModule of `graph` (output `output`) with c's current parameters and state."""
    params = {n: await c.backend.read(n) for n in c.param_names}
    state = {}
    for node in graph.nodes:
        if node.op == "state":
            state[node.attrs["name"]] = await c.backend.read(node.attrs["name"])
    return GraphModule(graph, output, params, state)


def GraphModule(graph, output: str, params: dict, state: dict):
    """Build the module (the class needs torch, so it is made on first use)."""
    return _module_class()(graph, output, params, state)


_CLASS = None


def _module_class():
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    import torch
    from ..backends.torch_backend import torch_dtype, torch_impls

    reserved = set(dir(torch.nn.Module()))

    class WebgradGraphModule(torch.nn.Module):
        """A webgrad forward graph as a torch Module; see webgrad/io/torch_interop.py."""

        def __init__(self, graph, output, params, state):
            super().__init__()
            self._graph, self._output = graph, output
            self._input_specs = {name: (tuple(graph[i].shape), graph[i].dtype)
                                 for name, i in graph.inputs.items()}
            self._param_names = list(params)
            for name, h in params.items():
                owner, leaf = self._owner_of(name)
                owner.register_parameter(leaf, torch.nn.Parameter(_tensor(h)))
            # state (the step counter, ...) under buffer-safe names, outside state_dict
            self._state_keys = {}
            for i, (name, h) in enumerate(state.items()):
                key = "step" if name == "step" else f"_state{i}"
                self._state_keys[name] = key
                self.register_buffer(key, _tensor(h), persistent=False)
            self._impls_by_device = {}

        def _owner_of(self, name: str):
            parts = name.split(".")
            for p in parts:
                if not p or p in reserved:
                    raise ValueError(f"to_torch: parameter name {name!r} has the part {p!r}, "
                                     "which a torch.nn.Module cannot hold; rename it")
            owner = self
            for p in parts[:-1]:
                sub = owner._modules.get(p)
                if sub is None:
                    sub = torch.nn.Module()
                    owner.add_module(p, sub)
                owner = sub
            return owner, parts[-1]

        def _feeds(self, args, kwargs):
            names = list(self._input_specs)
            if len(args) > len(names):
                raise FeedError(f"forward(): {len(args)} positional inputs, the program takes "
                                f"{len(names)} ({', '.join(names)})")
            feed = dict(zip(names, args))
            for k, v in kwargs.items():
                if k in feed:
                    raise FeedError(f"forward(): input {k!r} given twice")
                feed[k] = v
            if feed.keys() != self._input_specs.keys():
                raise FeedError(f"forward(): got inputs {sorted(feed)}, the program takes "
                                f"{', '.join(f'{k!r} {d}{list(s)}' for k, (s, d) in self._input_specs.items())}")
            device = self._device()
            out = {}
            for k, (shape, dtype) in self._input_specs.items():
                v = feed[k]
                if not isinstance(v, torch.Tensor):
                    v = _tensor(to_host(v, shape=shape, dtype=dtype, what=f"forward(): input {k!r}"))
                if tuple(v.shape) != shape:
                    raise FeedError(f"forward(): input {k!r} expects shape {list(shape)} "
                                    f"({dtype}), got {list(v.shape)}")
                if dtype == "i32" and v.dtype.is_floating_point:
                    raise FeedError(f"forward(): input {k!r} expects integer indices ({dtype}), "
                                    f"got {v.dtype}")
                out[k] = v.to(device=device, dtype=torch_dtype(dtype))
            return out

        def _device(self):
            for p in self.parameters():
                return p.device
            for b in self.buffers():
                return b.device
            return torch.device("cpu")

        def forward(self, *args, **kwargs):
            feeds = self._feeds(args, kwargs)
            device = self._device()
            impls = self._impls_by_device.get(device)
            if impls is None:
                impls = self._impls_by_device[device] = torch_impls(device)
            params = dict(self.named_parameters())
            g = self._graph
            vals = [None] * len(g.nodes)
            for n in g.nodes:
                if n.op == "input":
                    vals[n.id] = feeds[n.attrs["name"]]
                elif n.op == "param":
                    vals[n.id] = params[n.attrs["name"]]
                elif n.op == "state":
                    vals[n.id] = getattr(self, self._state_keys[n.attrs["name"]])
                else:
                    vals[n.id] = impls[n.op](n.attrs, *[vals[i] for i in n.inputs])
            out = vals[g.outputs[self._output]]
            if self.training and "step" in self._state_keys:
                with torch.no_grad():
                    self.step += 1.0
            return out

        def extra_repr(self) -> str:
            ins = ", ".join(f"{k}: {d}{list(s)}" for k, (s, d) in self._input_specs.items())
            return f"webgrad graph of {len(self._graph.nodes)} nodes; inputs {ins}"

    _CLASS = WebgradGraphModule
    return _CLASS


def _tensor(h: HostArray):
    import torch
    from ..backends.torch_backend import torch_dtype
    t = torch.zeros(h.shape, dtype=torch_dtype(h.dtype))
    if len(h):
        t.copy_(torch.frombuffer(bytearray(h), dtype=torch_dtype(h.dtype)).reshape(h.shape))
    return t
