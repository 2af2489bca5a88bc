"""LlamaConfig: the shape of a Llama-family decoder, read from transformers' config.json.

One config covers the four families whose blocks differ only in switches (models/llama.py
builds all of them from it):

  llama     GQA, rope_theta, rope scaling "llama3" (Llama 3.1/3.2), attention_bias and
            mlp_bias (all four projections / the three MLP ones), tied embeddings optional
  mistral   llama without biases, plus sliding_window (keys older than W positions hidden)
  qwen2     bias on q/k/v (not o), tied embeddings in the small sizes
  qwen3     q/k RMSNorm over each head (before the rotation), attention_bias, head_dim

`LlamaConfig.from_hf(config_dict)` takes config.json as a dict in either transformers'
4.x form (rope_theta and rope_scaling at the top) or 5.x form (rope_parameters). What the
model cannot compute (another model type, activation, rope variant, per-layer sliding
windows, quantized checkpoints) is refused there, naming the field and what is supported,
rather than giving wrong logits later.

n_ctx is webgrad's own field: the KV cache's length and the longest sequence a program
takes (static shapes: every decode step attends over n_ctx rows). It defaults to
min(max_position_embeddings, 2048); pass n_ctx= to from_hf for more.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
ROPE_TYPES = ("default", "llama3")
DEFAULT_N_CTX = 2048
FREQ_FACTORS_KEY = "webgrad_rope_freq_factors"   # config.json: rope_freq_factors (from GGUF)


@dataclass(frozen=True)
class LlamaConfig:
    model_type: str = "llama"
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 32
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None   # {"rope_type": "llama3", "factor", ...} or None
    rope_freq_factors: tuple | None = None   # llama.cpp's rope_freqs: inv_freq[k] / factors[k]
    max_position_embeddings: int = 2048
    n_ctx: int = DEFAULT_N_CTX
    tie_word_embeddings: bool = False
    qkv_bias: bool = False             # bias on q_proj, k_proj, v_proj
    o_bias: bool = False               # bias on o_proj
    mlp_bias: bool = False             # bias on gate_proj, up_proj, down_proj
    qk_norm: bool = False              # Qwen3's q_norm / k_norm over head_dim
    sliding_window: int | None = None  # Mistral: a query sees keys k > q - sliding_window
    bos_token_id: int | None = None
    eos_token_id: int | tuple | None = None   # one id or several (Llama 3 lists two)
    extra: dict = field(default_factory=dict, compare=False, repr=False)   # unused fields, kept for save

    def __post_init__(self):
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"LlamaConfig: model_type {self.model_type!r} is not supported; "
                             f"supported: {', '.join(MODEL_TYPES)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"LlamaConfig: num_attention_heads {self.num_attention_heads} is not a "
                             f"multiple of num_key_value_heads {self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig: head_dim {self.head_dim} must be even (rotary pairs)")
        if not 1 <= self.n_ctx:
            raise ValueError(f"LlamaConfig: n_ctx must be >= 1, got {self.n_ctx}")
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        if self.rope_scaling is not None:
            _check_llama3(self.rope_scaling)
        if self.rope_freq_factors is not None:
            object.__setattr__(self, "rope_freq_factors", tuple(float(f) for f in self.rope_freq_factors))
            if len(self.rope_freq_factors) != self.head_dim // 2:
                raise ValueError(f"LlamaConfig: rope_freq_factors has {len(self.rope_freq_factors)} "
                                 f"entries; head_dim {self.head_dim} needs {self.head_dim // 2}")

    @property
    def eos_ids(self) -> frozenset:
        e = self.eos_token_id
        return frozenset(() if e is None else e if isinstance(e, tuple) else (e,))

    def inv_freq(self) -> list[float]:
        """The rotary inverse frequencies [head_dim / 2], with llama3 scaling applied
        (transformers' _compute_llama3_parameters; computed in double, used in f32), or
        divided by rope_freq_factors (what a GGUF file's rope_freqs tensor gives: llama.cpp's
        converter writes llama3 scaling that way, and linear scaling is one factor for all)."""
        d = self.head_dim
        inv = [1.0 / self.rope_theta ** (2 * k / d) for k in range(d // 2)]
        if self.rope_freq_factors is not None:
            inv = [f / s for f, s in zip(inv, self.rope_freq_factors)]
        r = self.rope_scaling
        if r is None:
            return inv
        factor, lo, hi = r["factor"], r["low_freq_factor"], r["high_freq_factor"]
        old = r["original_max_position_embeddings"]
        lo_wavelen, hi_wavelen = old / lo, old / hi
        out = []
        for f in inv:
            wavelen = 2 * math.pi / f
            if wavelen < hi_wavelen:
                out.append(f)
            elif wavelen > lo_wavelen:
                out.append(f / factor)
            else:
                s = (old / wavelen - lo) / (hi - lo)
                out.append((1 - s) * f / factor + s * f)
        return out

    # ------------------------------------------------------------ transformers' config.json

    @classmethod
    def from_hf(cls, config: dict, *, n_ctx: int | None = None) -> "LlamaConfig":
        """From transformers' config.json (a dict); see the module header for what is refused."""
        c = dict(config)
        mt = c.get("model_type")
        if mt not in MODEL_TYPES:
            raise ValueError(f"LlamaConfig.from_hf: model_type {mt!r} is not supported; "
                             f"supported: {', '.join(MODEL_TYPES)}")
        _refuse(c, "hidden_act", lambda v: v in (None, "silu"), "'silu' (SwiGLU)")
        _refuse(c, "quantization_config", lambda v: not v, "none (f32/f16/bf16 checkpoints)")
        _refuse(c, "pretraining_tp", lambda v: v in (None, 1), "1")
        if mt in ("qwen2", "qwen3"):
            _refuse(c, "use_sliding_window", lambda v: not v, "false")
        layer_types = c.get("layer_types")
        if layer_types and any(t != "full_attention" for t in layer_types):
            raise ValueError("LlamaConfig.from_hf: field 'layer_types' lists "
                             f"{sorted(set(layer_types))}; supported: only 'full_attention'")
        for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                  "intermediate_size"):
            if not isinstance(c.get(k), int):
                raise ValueError(f"LlamaConfig.from_hf: field {k!r} is {c.get(k)!r}; an int is required")
        H = c["num_attention_heads"]
        kv = c.get("num_key_value_heads") or H
        head_dim = c.get("head_dim") or c["hidden_size"] // H
        theta, scaling = _rope(c)
        max_pos = int(c.get("max_position_embeddings") or DEFAULT_N_CTX)
        window = c.get("sliding_window") if mt == "mistral" else None
        bias = bool(c.get("attention_bias", False))
        known = set(cls.__dataclass_fields__) | {"rope_parameters", "hidden_act", "layer_types",
                                                 "use_sliding_window", "attention_bias",
                                                 FREQ_FACTORS_KEY}
        return cls(model_type=mt, vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
                   intermediate_size=c["intermediate_size"], num_hidden_layers=c["num_hidden_layers"],
                   num_attention_heads=H, num_key_value_heads=kv, head_dim=head_dim,
                   rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)), rope_theta=theta,
                   rope_scaling=scaling, rope_freq_factors=c.get(FREQ_FACTORS_KEY),
                   max_position_embeddings=max_pos,
                   n_ctx=int(n_ctx or min(max_pos, DEFAULT_N_CTX)),
                   tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
                   qkv_bias=True if mt == "qwen2" else bias and mt != "mistral",
                   o_bias=bias and mt in ("llama", "qwen3"),
                   mlp_bias=bool(c.get("mlp_bias", False)) and mt == "llama",
                   qk_norm=mt == "qwen3", sliding_window=window,
                   bos_token_id=c.get("bos_token_id"), eos_token_id=c.get("eos_token_id"),
                   extra={k: v for k, v in c.items() if k not in known})

    def to_hf(self) -> dict:
        """config.json for transformers (4.x form: rope_theta and rope_scaling at the top,
        which 5.x reads too)."""
        arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[self.model_type]
        d = {**self.extra, "architectures": [arch], "model_type": self.model_type,
             "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
             "intermediate_size": self.intermediate_size,
             "num_hidden_layers": self.num_hidden_layers,
             "num_attention_heads": self.num_attention_heads,
             "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
             "hidden_act": "silu", "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
             "rope_scaling": self.rope_scaling,
             "max_position_embeddings": self.max_position_embeddings,
             "tie_word_embeddings": self.tie_word_embeddings,
             "bos_token_id": self.bos_token_id,
             "eos_token_id": list(self.eos_token_id) if isinstance(self.eos_token_id, tuple)
             else self.eos_token_id}
        if self.rope_freq_factors is not None:   # read back by from_hf (not by transformers)
            d[FREQ_FACTORS_KEY] = list(self.rope_freq_factors)
        if self.model_type in ("llama", "qwen3"):
            d["attention_bias"] = self.o_bias
        if self.model_type == "llama":
            d["mlp_bias"] = self.mlp_bias
        if self.model_type == "mistral":
            d["sliding_window"] = self.sliding_window
        return d


def _refuse(c: dict, key: str, ok, supported: str) -> None:
    if key in c and not ok(c[key]):
        raise ValueError(f"LlamaConfig.from_hf: field {key!r} = {c[key]!r} is not supported; "
                         f"supported: {supported}")


def _rope(c: dict) -> tuple[float, dict | None]:
    """(rope_theta, llama3 scaling or None) from 5.x rope_parameters or 4.x rope_theta /
    rope_scaling."""
    params = c.get("rope_parameters")
    if isinstance(params, dict) and ("rope_type" in params or "rope_theta" in params):
        where, r = "rope_parameters", dict(params)
    else:
        where, r = "rope_scaling", dict(c.get("rope_scaling") or {})
    theta = float(r.pop("rope_theta", None) or c.get("rope_theta") or 10000.0)
    kind = r.get("rope_type", r.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(f"LlamaConfig.from_hf: field {where!r} has rope_type {kind!r}; "
                         f"supported: {', '.join(ROPE_TYPES)}")
    prf = r.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0))
    if prf not in (None, 1, 1.0):
        raise ValueError(f"LlamaConfig.from_hf: field 'partial_rotary_factor' = {prf!r} is not "
                         "supported; supported: 1.0 (rotate the whole head)")
    if kind == "default":
        return theta, None
    scaling = {"rope_type": "llama3"}
    for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        if k not in r:
            raise ValueError(f"LlamaConfig.from_hf: field {where!r} (rope_type 'llama3') lacks {k!r}")
        scaling[k] = r[k]
    _check_llama3(scaling)
    return theta, scaling


def _check_llama3(r: dict) -> None:
    if r.get("rope_type") != "llama3":
        raise ValueError(f"LlamaConfig: rope_scaling {r!r} is not supported; supported: None or "
                         "{'rope_type': 'llama3', 'factor', 'low_freq_factor', 'high_freq_factor', "
                         "'original_max_position_embeddings'}")
    if not r["high_freq_factor"] > r["low_freq_factor"]:
        raise ValueError("LlamaConfig: rope_scaling needs high_freq_factor > low_freq_factor, got "
                         f"{r['high_freq_factor']} and {r['low_freq_factor']}")
