"""What surrounds a tokenizer.json: tokenizer_config.json (special tokens, chat template),
chat templates rendered as transformers renders them, and GGUF files, whose metadata holds
the vocabulary the way llama.cpp's converter writes it.

  - apply_config: bos/eos/unk/pad tokens, chat_template and add_bos/eos_token from
    tokenizer_config.json (Tokenizer.from_pretrained);
  - render_chat: transformers' apply_chat_template(..., tokenize=False): the same jinja2
    sandbox (trim_blocks, lstrip_blocks, loopcontrols, its tojson, raise_exception,
    strftime_now), with the special tokens as variables. jinja2 is optional: it is imported
    only here, and its absence is a clear ImportError;
  - from_gguf: tokenizer.ggml.* metadata -> the tokenizer.json structure the Tokenizer reads:
    model "gpt2" (byte-level BPE; tokenizer.ggml.pre names the regex: llama-bpe, qwen2,
    gpt-2) or "llama" (SentencePiece BPE with byte fallback; merges from the file, or, when it
    has only scores, rebuilt the way transformers converts a SentencePiece model).
Consumer: webgrad.models.tokenizer.Tokenizer.
"""
from __future__ import annotations

_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                 "mask_token")


def _content(v):
    return v.get("content") if isinstance(v, dict) else v


def apply_config(tok, config: dict, name: str) -> None:
    tok.config = config
    for key in _SPECIAL_KEYS:
        v = _content(config.get(key))
        if v is not None and not isinstance(v, str):
            raise ValueError(f"{name}: {key} should be a string, got {type(v).__name__}")
        setattr(tok, key, v)
    template = config.get("chat_template")
    if isinstance(template, list):          # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise ValueError(f"{name}: chat_template should be a string or a list of "
                         f"{{name, template}}, got {type(template).__name__}")
    tok.chat_template = template
    # add_bos_token only adds what tokenizer.json's post-processor does not already add
    before, after = tok._post
    for flag, token, ids, at_start in (("add_bos_token", tok.bos_token, before, True),
                                       ("add_eos_token", tok.eos_token, after, False)):
        if config.get(flag) and token is not None:
            i = tok._lookup(token, f"{name}: {flag}")
            if i not in ids:
                ids.insert(0, i) if at_start else ids.append(i)


def render_chat(tok, messages, *, add_generation_prompt: bool, chat_template=None, **kwargs) -> str:
    template = chat_template or tok.chat_template
    if template is None:
        raise ValueError(f"Tokenizer.apply_chat_template: {tok.name} has no chat template; "
                         "load with Tokenizer.from_pretrained(folder) (tokenizer_config.json "
                         "holds it) or pass chat_template=")
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ImportError("Tokenizer.apply_chat_template needs jinja2 (pip install jinja2; in "
                          "Pyodide: await micropip.install('jinja2'))") from None
    import json
    from datetime import datetime

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: datetime.now().strftime(fmt))
    specials = {k: getattr(tok, k, None) for k in _SPECIAL_KEYS}
    variables = {**{k: v for k, v in specials.items() if v is not None}, **kwargs}
    return env.from_string(template).render(messages=list(messages), tools=None, documents=None,
                                            add_generation_prompt=add_generation_prompt,
                                            **variables)


# ------------------------------------------------------------------ GGUF

# tokenizer.ggml.pre -> tokenizer.json's pre-tokenizer and normalizer (llama.cpp's names)
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}


def _split(regex):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        _BYTE_LEVEL]}


_PRE = {
    "llama-bpe": (_split(_LLAMA3), None, True), "llama3": (_split(_LLAMA3), None, True),
    "qwen2": (_split(_QWEN2), {"type": "NFC"}, False),
    "gpt-2": ({**_BYTE_LEVEL, "use_regex": True}, None, False),
    "default": ({**_BYTE_LEVEL, "use_regex": True}, None, False),
}
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


def from_gguf(cls, src):
    from ..io import gguf
    f = src if isinstance(src, gguf.GGUFFile) else gguf.load(src)
    md, name = f.metadata, f"GGUF file {f.name}"     # as gguf.py's own errors name it

    def need(key, kind):
        v = md.get(key)
        if not isinstance(v, kind):
            raise ValueError(f"{name}: metadata {key} is "
                             f"{'missing' if v is None else type(v).__name__}; a tokenizer "
                             "needs it (was the file written without its vocabulary?)")
        return v
    model = need("tokenizer.ggml.model", str)
    tokens = need("tokenizer.ggml.tokens", list)
    types = md.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
    added = [{"id": i, "content": t, "special": ty != _USER_DEFINED, "normalized": False,
              "lstrip": False, "rstrip": False, "single_word": False}
             for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (_UNKNOWN, _CONTROL, _USER_DEFINED)]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = md.get("tokenizer.ggml.merges")
    spec = {"added_tokens": added,
            "model": {"type": "BPE", "vocab": vocab, "merges": merges or []}}
    if model == "gpt2":
        pre = md.get("tokenizer.ggml.pre", "default")
        if pre not in _PRE:
            raise ValueError(f"{name}: metadata tokenizer.ggml.pre = {pre!r} is not one webgrad "
                             f"knows ({', '.join(sorted(_PRE))})")
        spec["pre_tokenizer"], spec["normalizer"], spec["model"]["ignore_merges"] = _PRE[pre]
        spec["decoder"] = _BYTE_LEVEL
    elif model == "llama":
        prefix = md.get("tokenizer.ggml.add_space_prefix", True)
        spec["normalizer"] = {"type": "Sequence", "normalizers": (
            [{"type": "Prepend", "prepend": "▁"}] if prefix else []) + [
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
        unk = next((tokens[i] for i, ty in enumerate(types) if ty == _UNKNOWN), None)
        spec["model"].update(byte_fallback=True, fuse_unk=True, unk_token=unk)
        if not merges:
            spec["model"]["merges"] = _merges_from_scores(
                tokens, md.get("tokenizer.ggml.scores"), types, name)
        spec["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}] + (
            [{"type": "Strip", "content": " ", "start": 1, "stop": 0}] if prefix else [])}
    else:
        raise ValueError(f"{name}: metadata tokenizer.ggml.model = {model!r}: webgrad reads "
                         "'gpt2' (byte-level BPE) and 'llama' (SentencePiece BPE)")
    before, after = [], []
    bos, eos = md.get("tokenizer.ggml.bos_token_id"), md.get("tokenizer.ggml.eos_token_id")
    if md.get("tokenizer.ggml.add_bos_token", model == "llama") and bos is not None:
        before.append(bos)
    if md.get("tokenizer.ggml.add_eos_token", False) and eos is not None:
        after.append(eos)
    tok = cls(spec, name=name)
    tok._post = (before, after)
    tok.bos_token = tokens[bos] if bos is not None else None
    tok.eos_token = tokens[eos] if eos is not None else None
    tok.chat_template = md.get("tokenizer.chat_template")
    return tok


def _merges_from_scores(tokens, scores, types, name):
    """A SentencePiece BPE vocabulary's merges, as transformers' SentencePieceExtractor makes
    them: every split of a piece into two pieces, ordered by the piece's score (highest
    first), within a piece by the ids of its parts."""
    if not isinstance(scores, list) or len(scores) != len(tokens):
        raise ValueError(f"{name}: metadata tokenizer.ggml.merges is absent, so "
                         "tokenizer.ggml.scores (one per token) is needed, and it is "
                         f"{'missing' if scores is None else 'of another length'}")
    vocab = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (_NORMAL, _BYTE)}
    merges = []
    for piece, i in vocab.items():
        local = [(vocab[piece[:k]], vocab[piece[k:]], piece[:k], piece[k:])
                 for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        local.sort()
        merges.extend((scores[i], a, b) for _, _, a, b in local)
    merges.sort(key=lambda m: -m[0])           # stable: ties keep the vocabulary's order
    return [[a, b] for _, a, b in merges]
