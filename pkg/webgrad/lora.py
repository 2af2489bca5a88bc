"""LoRA: low-rank adapters on a model's linear layers, trained with the base frozen, saved and
loaded in PEFT's format, merged into the base on request.

    from webgrad import lora, optim
    lo = lora.LoRA(lambda: llama.LlamaModule(cfg),
                   lora.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    c = wg.compile_module(lo, llama.lm_loss, inputs=..., optimizer=optim.AdamW(lr=1e-4))
    lo.load_base(c, base_state_dict)          # the pretrained weights, frozen
    c.step(batch); ...
    lo.save_pretrained(c, "adapter/")          # adapter_config.json + adapter_model.safetensors
    lo = lora.LoRA.from_pretrained(factory, "adapter/"); lo.load_adapter(c, "adapter/")
    lo.merged_state_dict(c)                    # W + scale * B @ A, under the model's own names

Why this shape: a LoRA object is an ordinary model factory (compile_module calls it), so
training goes through the ordinary path; the base parameters are declared frozen
(module.py's trainable=False), so the compiled step holds gradients and optimizer state for
the adapters only. A frozen base may be held quantized (QLoRA: LoRA(..., base_quant={name:
"Q8_0" | "Q4_0" | "Q4_K"}) puts a quants.QuantSpec on those ParamSpecs, and load_base takes
their GGUF blocks as bytes); the forward reads them through ops.dequantize as any quantized
weight, so the f32 base is never stored on WebGPU.

A target is a linear-layer Module: a 2-D `weight` and a class attribute `fan_in_fan_out`
(False: torch's nn.Linear, weight [out, in], y = x W^T; True: transformers' Conv1D, weight
[in, out], y = x W; PEFT's flag of that name). The adapter of rank r adds

    y += scale * dropout(x) @ A^T @ B^T       A [r, in], B [out, r]
    scale = lora_alpha / r  (lora_alpha / sqrt(r) with use_rslora)

held as parameters `lora_A.weight` and `lora_B.weight` of the layer (PEFT's names without
its adapter name; A ~ U(+-1/sqrt(in)) as PEFT's kaiming_uniform(a=sqrt(5)), B = 0), and
merging gives W + scale * B A (transposed for fan_in_fan_out). The model's linear function
calls `adapted(p, x, y)` (models/llama.py, models/gpt2.py: the same code for both).

Files: PEFT's names are "base_model.model." + the model's transformers prefix (a Module's
`hf_prefix`, e.g. GPT-2's "transformer.") + the webgrad name. This module knows no model and
imports no backend: it reaches the parameters through the compiled module's API.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field, fields

from . import init, ops
from .arrays import HostArray
from .blocking import run_blocking
from .module import Module

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."
# PEFT adapter_config.json keys that would change the model if not at these values
_UNSUPPORTED = {"use_dora": False, "lora_bias": False, "layers_to_transform": None,
                "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {},
                "modules_to_save": None, "bias": "none"}


@dataclass
class LoraConfig:
    """PEFT's LoraConfig fields (the names adapter_config.json uses). target_modules: a list
    of layer names (a layer matches when its full name is one or ends in "." + one), a
    regular expression matched against whole names, or "all-linear"."""
    target_modules: list | str
    r: int = 8
    lora_alpha: float = 8
    lora_dropout: float = 0.0
    use_rslora: bool = False
    init_lora_weights: bool | str = True   # True: PEFT's default; "gaussian": A ~ N(0, 1/r)
    extra: dict = field(default_factory=dict, repr=False)   # other keys of a loaded file

    def __post_init__(self):
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r <= 0:
            raise ValueError(f"LoraConfig: r (the rank) must be a whole number >= 1, got {self.r!r}")
        a = self.lora_alpha
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not (math.isfinite(a) and a > 0):
            raise ValueError(f"LoraConfig: lora_alpha must be a number > 0 (scale = alpha / r), "
                             f"got {a!r}")
        d = self.lora_dropout
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d < 1:
            raise ValueError(f"LoraConfig: lora_dropout must be a probability in [0, 1), got {d!r}")
        t = self.target_modules
        if isinstance(t, (list, tuple, set)):
            if not t or not all(isinstance(x, str) and x for x in t):
                raise ValueError(f"LoraConfig: target_modules must name layers, e.g. ['q_proj', "
                                 f"'v_proj'], got {t!r}")
            self.target_modules = sorted(t) if isinstance(t, set) else list(t)
        elif not (isinstance(t, str) and t):
            raise ValueError(f"LoraConfig: target_modules must be a list of layer names, a "
                             f"regular expression or 'all-linear', got {t!r}")
        if self.init_lora_weights not in (True, "gaussian"):
            raise ValueError(f"LoraConfig: init_lora_weights must be True (PEFT's default) or "
                             f"'gaussian', got {self.init_lora_weights!r}")

    @property
    def scale(self) -> float:
        return self.lora_alpha / (math.sqrt(self.r) if self.use_rslora else self.r)

    def matches(self, name: str) -> bool:
        """PEFT's rule for whether the layer `name` gets an adapter."""
        t = self.target_modules
        if t == "all-linear":
            return True
        if isinstance(t, str):
            return re.fullmatch(t, name) is not None
        return any(_matches_one(name, k) for k in t)

    @classmethod
    def from_dict(cls, d: dict, where: str = "adapter config") -> "LoraConfig":
        """From PEFT's adapter_config.json; keys that would change the model are refused."""
        if d.get("peft_type", "LORA") != "LORA":
            raise ValueError(f"{where}: peft_type {d.get('peft_type')!r} is not LORA")
        for k, ok in _UNSUPPORTED.items():
            v = d.get(k)
            if (v not in (None, "none") if k == "bias" else bool(v)):   # None, {}, []: unset
                raise ValueError(f"{where}: {k}={d[k]!r} is not supported by webgrad.lora "
                                 f"(only {k}={ok!r}); save the adapter without it")
        if "target_modules" not in d:
            raise ValueError(f"{where}: no target_modules")
        own = {f.name for f in fields(cls)} - {"extra"}
        kw = {k: d[k] for k in own if k in d and d[k] is not None}
        if kw.get("init_lora_weights") is False:   # B drawn at random: the file's values count
            kw["init_lora_weights"] = True
        if isinstance(kw.get("target_modules"), (list, tuple)):
            kw["target_modules"] = sorted(kw["target_modules"])  # PEFT saves a set's order
        return cls(**kw, extra={k: v for k, v in d.items() if k not in own})

    def to_peft_dict(self, *, fan_in_fan_out: bool, base_model_name_or_path=None) -> dict:
        d = {**self.extra, **{k: v for k, v in asdict(self).items() if k != "extra"}}
        d.update(peft_type="LORA", task_type=d.get("task_type") or "CAUSAL_LM", bias="none",
                 fan_in_fan_out=fan_in_fan_out, inference_mode=True, modules_to_save=None,
                 base_model_name_or_path=base_model_name_or_path)
        return d


def _matches_one(name: str, key: str) -> bool:
    return name == key or name.endswith("." + key)


class _Matrix(Module):
    def __init__(self, shape, init_w):
        super().__init__()
        # torch's AdamW decays every parameter it is given: both adapters, B included
        self.weight = self.param(shape, init=init_w, decay=True)


def linear_layers(module: Module) -> dict[str, Module]:
    """{name: layer} of the Modules LoRA can target (a 2-D weight and fan_in_fan_out)."""
    out = {}

    def walk(obj, prefix):
        if isinstance(obj, Module):
            if hasattr(type(obj), "fan_in_fan_out") and len(getattr(obj.weight, "shape", ())) == 2:
                out[prefix.rstrip(".")] = obj
            items = [(k, v) for k, v in vars(obj).items() if not k.startswith("lora_")]
        elif isinstance(obj, (list, tuple)):
            items = list(enumerate(obj))
        elif isinstance(obj, dict):
            items = list(obj.items())
        else:
            return
        for k, v in items:
            walk(v, f"{prefix}{k}.")
    walk(module, "")
    return out


def apply(module: Module, config: LoraConfig) -> dict[str, Module]:
    """Add adapters to the layers config.target_modules names and freeze everything else.
    Returns {layer name: layer}. Refuses (changing nothing) names that match no layer."""
    layers = linear_layers(module)
    chosen = {n: p for n, p in layers.items() if config.matches(n)}
    t = config.target_modules
    unmatched = ([k for k in t if not any(_matches_one(n, k) for n in layers)]
                 if isinstance(t, list) else ([] if chosen else [t]))
    if unmatched or not chosen:
        leaves = sorted({n.rsplit(".", 1)[-1] for n in layers})
        raise ValueError(f"LoraConfig: target_modules {unmatched or t!r} match no linear layer "
                         f"of {type(module).__name__}; its linear layers are "
                         f"{', '.join(leaves) or 'none'} (full names such as "
                         f"{next(iter(layers), '-')!r})")
    for name, spec in module.named_specs():
        spec.trainable = False
    for k, (name, p) in enumerate(chosen.items()):
        d0, d1 = p.weight.shape
        d_in, d_out = (d0, d1) if p.fan_in_fan_out else (d1, d0)
        a_init = (init.randn(1.0 / config.r) if config.init_lora_weights == "gaussian"
                  else init.uniform(1.0 / math.sqrt(d_in)))
        p.lora_A = _Matrix([config.r, d_in], a_init)
        p.lora_B = _Matrix([d_out, config.r], "zeros")
        p.lora_scale, p.lora_dropout, p.lora_seed = config.scale, float(config.lora_dropout), 7919 + k
    return chosen


def _quant_specs(module: Module, base_quant: dict) -> dict:
    """{name: quants.QuantSpec} of base weights to hold quantized (QLoRA), checked here."""
    from .quants import QuantSpec
    specs = dict(module.named_specs())
    out = {}
    for n, q in base_quant.items():
        s = specs.get(n)
        if s is None or s.trainable:
            raise ValueError(f"LoRA: base_quant names {n!r}, which is not a frozen base "
                             f"parameter; e.g. {next(iter(specs))!r}")
        if isinstance(q, str):
            q = QuantSpec(q, s.shape)   # raises when the rows are not whole blocks
        if q.declared_shape != s.shape:
            raise ValueError(f"LoRA: base_quant {n!r}: {q.qtype}{list(q.shape)} does not give "
                             f"its shape {list(s.shape)}")
        out[n] = q
    return out


def adapted(p, x, y):
    """y plus the LoRA path of layer p when it holds adapters (else y unchanged):
    y + scale * dropout(x) @ A^T @ B^T (dropout only in training graphs)."""
    a = getattr(p, "lora_A", None)
    if a is None:
        return y
    h = ops.dropout(x, p.lora_dropout, seed=p.lora_seed) if p.lora_dropout else x
    h = ops.matmul(ops.matmul(h, ops.swap_axes(a.weight, 0, 1)), ops.swap_axes(p.lora_B.weight, 0, 1))
    return y + h * p.lora_scale


def delta(p):
    """scale * B A in the layout of p.weight (transposed for fan_in_fan_out)."""
    d = ops.matmul(p.lora_B.weight, p.lora_A.weight) * p.lora_scale    # [out, in]
    return ops.swap_axes(d, 0, 1) if p.fan_in_fan_out else d


class LoRA:
    """A model factory with adapters: call it (compile_module does) for a fresh Module whose
    chosen layers hold adapters and whose other parameters are frozen. The factory is built
    once here, so a bad config is refused at this line."""

    def __init__(self, factory, config: LoraConfig | None = None, *, base_quant: dict | None = None,
                 **kw):
        if isinstance(factory, Module):
            raise TypeError(f"LoRA: pass the model's factory (lambda: {type(factory).__name__}"
                            "(...)), not a Module instance")
        if config is None:
            config = LoraConfig(**kw)
        elif kw:
            raise TypeError("LoRA: pass a LoraConfig or its fields as keywords, not both")
        self.factory, self.config = factory, config
        self.base_quant = dict(base_quant or {})
        m = factory()
        layers = apply(m, config)
        self.quant = _quant_specs(m, self.base_quant)
        self.prefix = getattr(m, "hf_prefix", "")
        self.layers = {n: (p.fan_in_fan_out, tuple(p.weight.shape)) for n, p in layers.items()}
        self.adapter_names = [n for n, _ in m.named_specs() if ".lora_" in n]
        self.base_names = [n for n, _ in m.named_specs() if ".lora_" not in n]

    def __call__(self) -> Module:
        m = self.factory()
        apply(m, self.config)
        specs = dict(m.named_specs())
        for n, q in self.quant.items():
            specs[n].quant = q
        return m

    @classmethod
    def from_pretrained(cls, factory, folder) -> "LoRA":
        """The adapters PEFT's save_pretrained (or save_pretrained here) wrote in `folder`."""
        path = os.path.join(os.fspath(folder), ADAPTER_CONFIG)
        with open(path) as f:
            return cls(factory, LoraConfig.from_dict(json.load(f), where=path))

    # -- names
    def peft_name(self, name: str) -> str:
        return _PEFT_PREFIX + self.prefix + name

    def _own_name(self, peft_name: str) -> str:
        n = peft_name.removeprefix(_PEFT_PREFIX).removeprefix(self.prefix)
        return n.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")

    # -- weights in and out
    def load_base(self, c, state_dict: dict) -> None:
        """Write the frozen base weights (the model's or transformers' names: the Module's
        hf_prefix is removed). Every base parameter must be given; nothing else. A weight
        held quantized (base_quant) is given as its GGUF blocks (bytes, or a uint8 array as
        gguf.quants.quantize returns) of the weight in its declared layout (rows = blocks)."""
        from .quants import transcode
        sd = {k.removeprefix(self.prefix): v for k, v in state_dict.items()}
        missing = [n for n in self.base_names if n not in sd]
        unknown = sorted(set(sd) - set(self.base_names))
        if missing or unknown:
            raise ValueError(f"LoRA.load_base: missing {missing[:5]} / unknown {unknown[:5]}; "
                             f"pass the base model's state dict (drop tied or buffer entries)")
        for n, q in self.quant.items():
            try:
                if str(getattr(sd[n], "dtype", "uint8")) not in ("uint8", "torch.uint8"):
                    raise TypeError(f"dtype {sd[n].dtype}")
                raw = sd[n] if isinstance(sd[n], bytes) else memoryview(sd[n]).cast("B")
                words = transcode(q.qtype, raw)
            except (ValueError, TypeError) as e:
                raise ValueError(f"LoRA.load_base: {n!r} is held {q.qtype}; pass its GGUF blocks "
                                 f"(bytes), not {type(sd[n]).__name__} ({e})") from None
            if len(words) != 4 * q.words:
                raise ValueError(f"LoRA.load_base: {n!r}: {len(raw)} bytes are not {q.qtype}"
                                 f"{list(q.shape)}")
            sd[n] = HostArray("i32", shape=(q.words,))
            sd[n].frombytes(words)
        c.upload_params(sd, partial=True)

    async def adapter_state_dict_async(self, c) -> dict:
        """{PEFT name: array} of the adapters (what adapter_model.safetensors holds)."""
        from .arrays import to_user
        return {self.peft_name(n): to_user(await c.backend.read(n)) for n in self.adapter_names}

    def adapter_state_dict(self, c) -> dict:
        return run_blocking(self.adapter_state_dict_async(c))

    def save_pretrained(self, c, folder, *, base_model_name_or_path: str | None = None) -> None:
        """adapter_config.json and adapter_model.safetensors in `folder`, as PEFT writes them
        (PeftModel.from_pretrained reads them)."""
        from .io import safetensors as st
        folder = os.fspath(folder)
        os.makedirs(folder, exist_ok=True)
        fifo = {f for f, _ in self.layers.values()}
        cfg = self.config.to_peft_dict(fan_in_fan_out=fifo == {True},
                                       base_model_name_or_path=base_model_name_or_path)
        sd = run_blocking(self._host_adapters(c))
        st.save(sd, os.path.join(folder, ADAPTER_WEIGHTS), metadata={"format": "pt"})
        with open(os.path.join(folder, ADAPTER_CONFIG), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)

    async def _host_adapters(self, c):
        return {self.peft_name(n): await c.backend.read(n) for n in self.adapter_names}

    def load_adapter(self, c, folder_or_state_dict) -> None:
        """Write adapters saved by PEFT (a folder, or its state dict of PEFT names) into c.
        Names and shapes are checked before anything is written."""
        sd = folder_or_state_dict
        where = "LoRA.load_adapter"
        if not isinstance(sd, dict):
            from .io import safetensors as st
            where = os.path.join(os.fspath(sd), ADAPTER_WEIGHTS)
            sd = {k: t.to_host() for k, t in st.load(where).items()}
        own = {self._own_name(k): v for k, v in sd.items()}
        missing = [self.peft_name(n) for n in self.adapter_names if n not in own]
        unknown = sorted(k for k, n in zip(sd, own) if n not in self.adapter_names)
        if missing or unknown:
            raise ValueError(f"{where}: missing {missing[:3]} / unknown {unknown[:3]}: the "
                             f"adapter does not fit this model's target_modules "
                             f"{self.config.target_modules!r} (rank {self.config.r})")
        c.upload_params(own, partial=True)

    def merged_state_dict(self, c) -> dict:
        """The base weights with every adapter merged in (W + scale * B A), under the model's
        own parameter names and without adapters: what PEFT's merge_and_unload gives, for the
        plain model (e.g. Llama.from_hf_state_dict). Computed by a program on c's backend."""
        targets = list(self.layers)
        quantized = [n for n in self.quant if n.removesuffix(".weight") not in self.layers]

        def merged(m, _):
            by_name = linear_layers(m)
            for n in targets:
                p = by_name[n]
                ops.capture(f"{n}.weight", p.weight + delta(p))
            for n in quantized:      # other weights held quantized: their f32 values
                layer = by_name.get(n.removesuffix(".weight"))
                if layer is None:
                    raise ValueError(f"merged_state_dict: {n!r} is held quantized but is not "
                                     "a linear layer's weight; merge on an f32 base")
                ops.capture(n, layer.weight)
            return ops.constant(0.0)

        fwd = c.compile_forward(merged, inputs={})
        try:
            _, caps = fwd.run({}, with_captures=True)
        finally:
            fwd.destroy()
        out = run_blocking(self._host_base(c))
        out.update(caps)
        return out

    async def _host_base(self, c):
        from .arrays import to_user
        return {n: to_user(await c.backend.read(n)) for n in self.base_names}


__all__ = ["LoraConfig", "LoRA", "apply", "adapted", "delta", "linear_layers",
           "ADAPTER_CONFIG", "ADAPTER_WEIGHTS"]
