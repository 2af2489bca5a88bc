"""Hugging Face tokenizer.json BPE tokenizers (Llama 2/3, Mistral, Qwen2/3) in pure Python.

    from webgrad.models import llama
    tok = llama.Tokenizer.from_file("tokenizer.json")     # or .from_gguf(path_or_bytes)
    tok = llama.Tokenizer.from_pretrained(folder)         # + tokenizer_config.json
    ids = tok.encode(text, add_special_tokens=True)
    text = tok.decode(ids, skip_special_tokens=False)
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True)

It gives the ids of the `tokenizers` library (Rust) on the same file, stage by stage as
tokenizers runs them:
  1. added tokens ("<|begin_of_text|>", "<|im_start|>", "<s>") are cut out of the text first
     (longest first at each position); those marked `normalized` after normalization;
  2. normalizer (NFC, Prepend "▁", Replace " " -> "▁", Lowercase, ...) on each other segment;
  3. pre-tokenizer: Split by a regex (pretokenize.py runs tokenizers' \\p{L}/\\p{N} patterns
     on Python's re), ByteLevel (GPT-2's bytes_to_unicode), Metaspace;
  4. BPE (merges.Merges: linear in the piece, cached per piece) on bytes (byte-level) or
     characters (SentencePiece style, <0xXX> byte fallback for those outside the vocabulary);
  5. post-processor: TemplateProcessing adds "<s>" / "<|begin_of_text|>" when asked.
decode runs the decoder chain (ByteLevel, or Replace/ByteFallback/Fuse/Strip for Llama 2).
Anything of tokenizer.json this module does not implement raises ValueError naming the file
and the field, rather than tokenizing differently. Known differences: NFC comes from Python's
unicodedata, whose tables (Unicode 14 in Python 3.11) are newer than tokenizers', so combining
marks added since are reordered where tokenizers leaves them (13 adjacent pairs in all of
Unicode); transformers 5 rebuilds Llama 2's pipeline with a Metaspace pre-tokenizer and so
differs from the file (and from webgrad) on segments that start with a space. GGUF files (llama.cpp keeps the vocabulary
in its metadata) are turned into the same tokenizer.json structure (tokenizer_gguf.py).
Consumers: webgrad.models.llama (re-exports Tokenizer), the tests against `tokenizers`.
"""
from __future__ import annotations

import json
import os
import re
import unicodedata

from . import pretokenize
from .bpe import bytes_to_unicode
from .merges import Merges

_BYTE_CHARS = bytes_to_unicode()
_BYTE_OF = {c: b for b, c in _BYTE_CHARS.items()}
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_WS = "".join(sorted(pretokenize.WHITE_SPACE))


def _read_json(src, what: str):
    """A path, bytes, or an already parsed dict -> (dict, name for messages)."""
    if isinstance(src, dict):
        return src, what
    name = what
    if isinstance(src, (bytes, bytearray, memoryview)):
        raw = bytes(src)
    else:
        name = os.fspath(src)
        try:
            with open(name, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise ValueError(f"{name}: cannot read it ({e.strerror})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{name}: not UTF-8 text (byte {e.start}); a tokenizer.json is JSON") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{name}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{name}: a tokenizer.json is a JSON object, this holds a "
                         f"{type(data).__name__}")
    return data, name


class _Fields:
    """Typed access to a tokenizer.json section, with errors that name file and field."""

    def __init__(self, name: str):
        self.name = name

    def fail(self, field: str, msg: str):
        raise ValueError(f"{self.name}: {field}: {msg}")

    def unsupported(self, field: str, value):
        self.fail(field, f"{value!r} is not supported by webgrad's tokenizer")

    def get(self, d, key: str, field: str, kind=None, default=...):
        if not isinstance(d, dict):
            self.fail(field, f"should be an object, got {type(d).__name__}")
        where = f"{field}.{key}" if field else key
        if key not in d or (d[key] is None and default is not ...):
            if default is ...:
                self.fail(where, "missing")
            return default
        v = d[key]
        if kind is not None and not isinstance(v, kind):
            self.fail(where, f"should be {getattr(kind, '__name__', kind)}, got {type(v).__name__}")
        return v


# ------------------------------------------------------------------ normalizers

def _normalizer(spec, f: _Fields, field: str):
    """tokenizer.json's normalizer as a str -> str function (None: identity)."""
    if spec is None:
        return None
    kind = f.get(spec, "type", field, str)
    if kind == "Sequence":
        steps = [_normalizer(s, f, f"{field}.normalizers[{i}]")
                 for i, s in enumerate(f.get(spec, "normalizers", field, list))]
        steps = [s for s in steps if s is not None]

        def seq(text):
            for s in steps:
                text = s(text)
            return text
        return seq
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        return lambda text: unicodedata.normalize(kind, text)
    if kind == "Lowercase":
        return str.lower
    if kind == "Prepend":
        p = f.get(spec, "prepend", field, str)
        return lambda text: p + text if text else text
    if kind == "Replace":
        pat = f.get(spec, "pattern", field, dict)
        if "String" not in pat:
            f.unsupported(f"{field}.pattern", pat)
        old, new = pat["String"], f.get(spec, "content", field, str)
        return lambda text: text.replace(old, new)
    f.unsupported(f"{field}.type", kind)


# ------------------------------------------------------------------ pre-tokenizers

def _pre_tokenizer(spec, f: _Fields, field: str, steps: list):
    """Appends (kind, ...) steps; returns whether the pieces are spelled as bytes."""
    if spec is None:
        return False
    kind = f.get(spec, "type", field, str)
    if kind == "Sequence":
        byte_level = False
        for i, s in enumerate(f.get(spec, "pretokenizers", field, list)):
            byte_level |= _pre_tokenizer(s, f, f"{field}.pretokenizers[{i}]", steps)
        return byte_level
    if kind == "Split":
        pat = f.get(spec, "pattern", field, dict)
        behavior = f.get(spec, "behavior", field, str)
        if behavior != "Isolated" or f.get(spec, "invert", field, bool, False):
            f.unsupported(f"{field}.behavior", behavior)
        if "Regex" in pat:
            steps.append(("split", pretokenize.translate(pat["Regex"], field=f"{f.name}: {field}")))
        elif "String" in pat and pat["String"].isascii():    # split() sees ASCII as is
            steps.append(("split", re.compile(re.escape(pat["String"]))))
        else:
            f.unsupported(f"{field}.pattern", pat)
        return False
    if kind == "ByteLevel":
        if f.get(spec, "add_prefix_space", field, bool, False):
            steps.append(("prefix_space",))
        if f.get(spec, "use_regex", field, bool, True):
            steps.append(("split", pretokenize.translate(pretokenize.GPT2_PATTERN, field=field)))
        return True
    if kind == "Metaspace":
        rep = f.get(spec, "replacement", field, str)
        scheme = f.get(spec, "prepend_scheme", field, str, "always")
        if scheme not in ("always", "first", "never"):
            f.unsupported(f"{field}.prepend_scheme", scheme)
        steps.append(("metaspace", rep, scheme, f.get(spec, "split", field, bool, True)))
        return False
    if kind == "Digits":
        one = f.get(spec, "individual_digits", field, bool, False)
        # Rust's char::is_numeric: every N* character
        steps.append(("split", pretokenize.translate(r"\p{N}" if one else r"\p{N}+", field=field)))
        return False
    f.unsupported(f"{field}.type", kind)


def _metaspace(piece: str, rep: str, scheme: str, split: bool, first: bool) -> list[str]:
    piece = piece.replace(" ", rep)
    if piece and not piece.startswith(rep) and (scheme == "always" or scheme == "first" and first):
        piece = rep + piece
    if not split:
        return [piece]
    return [p for p in re.split(f"(?={re.escape(rep)})", piece) if p]


# ------------------------------------------------------------------ decoders

def _decoder(spec, f: _Fields, field: str):
    """tokenizer.json's decoder as a list[str] -> list[str] function (tokenizers' decode_chain)."""
    if spec is None:
        return lambda tokens: [" ".join(tokens)]
    kind = f.get(spec, "type", field, str)
    if kind == "Sequence":
        steps = [_decoder(s, f, f"{field}.decoders[{i}]")
                 for i, s in enumerate(f.get(spec, "decoders", field, list))]

        def seq(tokens):
            for s in steps:
                tokens = s(tokens)
            return tokens
        return seq
    if kind == "ByteLevel":
        def byte_level(tokens):
            out = bytearray()
            for t in tokens:
                try:
                    out += bytes(_BYTE_OF[c] for c in t)
                except KeyError:                        # not byte-spelled: its own UTF-8
                    out += t.encode("utf-8", "surrogatepass")
            return [out.decode("utf-8", "replace")]
        return byte_level
    if kind == "Replace":
        pat = f.get(spec, "pattern", field, dict)
        if "String" not in pat:
            f.unsupported(f"{field}.pattern", pat)
        old, new = pat["String"], f.get(spec, "content", field, str)
        return lambda tokens: [t.replace(old, new) for t in tokens]
    if kind == "ByteFallback":
        return _byte_fallback
    if kind == "Fuse":
        return lambda tokens: ["".join(tokens)]
    if kind == "Strip":
        c = f.get(spec, "content", field, str)
        start, stop = f.get(spec, "start", field, int), f.get(spec, "stop", field, int)

        def strip(tokens):
            out = []
            for t in tokens:
                a = 0
                while a < min(start, len(t)) and t[a] == c:
                    a += 1
                b = len(t)
                while len(t) - b < stop and b > a and t[b - 1] == c:
                    b -= 1
                out.append(t[a:b])
            return out
        return strip
    if kind == "Metaspace":
        rep = f.get(spec, "replacement", field, str)
        scheme = f.get(spec, "prepend_scheme", field, str, "always")

        def metaspace(tokens):
            out = []
            for i, t in enumerate(tokens):
                t = t.replace(rep, " ")
                if i == 0 and scheme != "never" and t.startswith(" "):
                    t = t[1:]
                out.append(t)
            return out
        return metaspace
    f.unsupported(f"{field}.type", kind)


def _byte_fallback(tokens: list[str]) -> list[str]:
    """Runs of <0xXX> tokens become their UTF-8 text; a run that is not valid UTF-8 becomes
    one U+FFFD per byte token (tokenizers' ByteFallback)."""
    out, run = [], []

    def flush():
        if run:
            try:
                out.append(bytes(run).decode("utf-8"))
            except UnicodeDecodeError:
                out.extend("\ufffd" * len(run))
            run.clear()
    for t in tokens:
        m = _BYTE_TOKEN.fullmatch(t) if len(t) == 6 else None
        if m:
            run.append(int(m.group(1), 16))
        else:
            flush()
            out.append(t)
    flush()
    return out


# ------------------------------------------------------------------ the tokenizer

class Tokenizer:
    """A tokenizer.json BPE tokenizer: encode(text) -> ids, decode(ids) -> text."""

    def __init__(self, spec: dict, *, name: str = "tokenizer.json"):
        f = self._fields = _Fields(name)
        self.name = name
        model = f.get(spec, "model", "", dict)
        if f.get(model, "type", "model", str, "BPE") != "BPE":
            f.unsupported("model.type", model["type"])
        for key in ("continuing_subword_prefix", "end_of_word_suffix"):
            if f.get(model, key, "model", str, ""):
                f.unsupported(f"model.{key}", model[key])
        if f.get(model, "dropout", "model", (int, float), 0):
            f.unsupported("model.dropout", model["dropout"])
        vocab = f.get(model, "vocab", "model", dict)
        self.vocab: dict[str, int] = dict(vocab)
        added = f.get(spec, "added_tokens", "", list, [])
        self.added: dict[str, dict] = {}
        for i, a in enumerate(added):
            content = f.get(a, "content", f"added_tokens[{i}]", str)
            self.added[content] = a
            self.vocab[content] = f.get(a, "id", f"added_tokens[{i}]", int)
        self.id_to_token = {i: s for s, i in self.vocab.items()}
        self.special_ids = {a["id"] for a in added if a.get("special")}
        self.byte_fallback = f.get(model, "byte_fallback", "model", bool, False)
        self.ignore_merges = f.get(model, "ignore_merges", "model", bool, False)
        self.fuse_unk = f.get(model, "fuse_unk", "model", bool, False)
        unk = f.get(model, "unk_token", "model", str, None)
        self.unk_id = None if unk is None else self._lookup(unk, "model.unk_token")

        self.normalize = _normalizer(spec.get("normalizer"), f, "normalizer")
        self._steps: list = []
        self.byte_level = _pre_tokenizer(spec.get("pre_tokenizer"), f, "pre_tokenizer", self._steps)
        self.decoder = _decoder(spec.get("decoder"), f, "decoder")
        self._post = self._post_processor(spec.get("post_processor"), "post_processor")
        self._added_splitters()
        self._build_merges(f.get(model, "merges", "model", list, []))
        self._cache: dict[str, list[int]] = {}
        # filled by from_pretrained / from_gguf: tokenizer_config.json's view
        self.bos_token = self.eos_token = None
        self.chat_template: str | None = None
        self.config: dict = {}

    # ---------------------------------------------------------------- loading

    @classmethod
    def from_file(cls, src) -> "Tokenizer":
        """A tokenizer.json: a path, its bytes, or the parsed dict."""
        spec, name = _read_json(src, "tokenizer.json")
        return cls(spec, name=name)

    @classmethod
    def from_pretrained(cls, folder) -> "Tokenizer":
        """A folder with tokenizer.json and (optional) tokenizer_config.json."""
        from .tokenizer_extras import apply_config
        folder = os.fspath(folder)
        tok = cls.from_file(os.path.join(folder, "tokenizer.json"))
        path = os.path.join(folder, "tokenizer_config.json")
        if os.path.exists(path):
            config, name = _read_json(path, "tokenizer_config.json")
            apply_config(tok, config, name)
        return tok

    @classmethod
    def from_gguf(cls, src) -> "Tokenizer":
        """The tokenizer in a GGUF file's metadata (a path, bytes, or a loaded GGUFFile)."""
        from .tokenizer_extras import from_gguf
        return from_gguf(cls, src)

    def apply_chat_template(self, messages, *, add_generation_prompt: bool = False,
                            chat_template: str | None = None, **kwargs) -> str:
        """The prompt text transformers' apply_chat_template(..., tokenize=False) renders."""
        from .tokenizer_extras import render_chat
        return render_chat(self, messages, add_generation_prompt=add_generation_prompt,
                           chat_template=chat_template, **kwargs)

    def _lookup(self, token: str, field: str) -> int:
        i = self.vocab.get(token)
        if i is None:
            self._fields.fail(field, f"{token!r} is not in the vocabulary")
        return i

    def _post_processor(self, spec, field):
        """The ids added around a sequence by add_special_tokens: (before, after)."""
        f = self._fields
        if spec is None:
            return [], []
        kind = f.get(spec, "type", field, str)
        if kind == "ByteLevel":
            return [], []
        if kind == "Sequence":
            before, after = [], []
            for i, s in enumerate(f.get(spec, "processors", field, list)):
                b, a = self._post_processor(s, f"{field}.processors[{i}]")
                before, after = before + b, after + a
            return before, after
        if kind == "TemplateProcessing":
            specials = f.get(spec, "special_tokens", field, dict)
            before, after, seen = [], [], False
            for i, item in enumerate(f.get(spec, "single", field, list)):
                if "Sequence" in item:
                    seen = True
                elif "SpecialToken" in item:
                    key = item["SpecialToken"].get("id")
                    ids = f.get(f.get(specials, key, f"{field}.special_tokens", dict), "ids",
                                f"{field}.special_tokens.{key}", list)
                    (after if seen else before).extend(ids)
                else:
                    f.unsupported(f"{field}.single[{i}]", item)
            return before, after
        f.unsupported(f"{field}.type", kind)

    def _added_splitters(self):
        """Two regexes over the added tokens: those matched in the raw text, and those
        (normalized=true) matched in the normalized text. Longest first at each position,
        as tokenizers' leftmost-longest matcher; lstrip/rstrip also take the whitespace."""
        def alternation(contents):
            alts = []
            for content in sorted(contents, key=len, reverse=True):
                a = self.added.get(contents[content], {})
                alt = re.escape(content)
                if a.get("lstrip"):
                    alt = f"[{re.escape(_WS)}]*" + alt
                if a.get("rstrip"):
                    alt = alt + f"[{re.escape(_WS)}]*"
                if a.get("single_word"):
                    alt = rf"(?<!\w){alt}(?!\w)"
                alts.append(alt)
            return re.compile("|".join(alts)) if alts else None
        norm = {c: a.get("normalized", not a.get("special")) for c, a in self.added.items() if c}
        self._raw_added = {c: c for c, n in norm.items() if not n}
        self._norm_added = {(self.normalize(c) if self.normalize else c): c
                            for c, n in norm.items() if n}
        self._raw_re = alternation(self._raw_added)
        self._norm_re = alternation(self._norm_added)

    def _build_merges(self, merges: list):
        vocab = self.vocab
        try:                                   # the fast path; errors are found below
            pairs = [m.split(" ") if m.__class__ is str else m for m in merges]
            if set(map(len, pairs)) - {2}:
                raise ValueError
            triples = [(vocab[a], vocab[b], vocab[a + b]) for a, b in pairs]
        except (ValueError, KeyError, TypeError, AttributeError):
            self._merge_error(merges)
        if self.byte_level:
            self._byte_ids = [vocab.get(_BYTE_CHARS[b]) for b in range(256)]
            self._byte_table = (bytes(self._byte_ids) if all(
                i is not None and 0 <= i < 256 for i in self._byte_ids) else None)
            self._spell_table = {b: ord(c) for b, c in _BYTE_CHARS.items()}
            symbol = {c: self._byte_ids[b] for b, c in _BYTE_CHARS.items()}
        else:
            self._byte_ids = [vocab.get(f"<0x{b:02X}>") for b in range(256)]
            symbol = {s: i for s, i in vocab.items() if len(s) == 1}
        # A long piece is cut where no merge's parts, spelled by their characters' symbols,
        # match its symbols (merges.Merges); merges of byte-fallback tokens (spelled "<0x..>",
        # not as their characters) leave the spellings unknown.
        if not self.byte_level and any(_BYTE_TOKEN.fullmatch(a) or _BYTE_TOKEN.fullmatch(b)
                                       for a, b in pairs if a[:1] == "<" or b[:1] == "<"):
            pairs = None
        self.merges = Merges(triples, parts=pairs,
                             symbols={c: i for c, i in symbol.items() if i is not None})

    def _merge_error(self, merges: list):
        """Raises for the first entry of model.merges that is not two symbols of the vocabulary."""
        f, vocab = self._fields, self.vocab
        for r, m in enumerate(merges):
            p = m.split(" ") if isinstance(m, str) else m
            if not (isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) and x for x in p)):
                f.fail(f"model.merges[{r}]", f"should be two symbols, got {m!r}")
            missing = [s for s in (p[0], p[1], p[0] + p[1]) if s not in vocab]
            if missing:
                f.fail(f"model.merges[{r}]", f"{p[0]!r} + {p[1]!r}: {missing[0]!r} is not in "
                                             "model.vocab")
        f.fail("model.merges", "should be a list of two-symbol merges")

    # ---------------------------------------------------------------- encode

    @property
    def vocab_size(self) -> int:
        return max(self.id_to_token) + 1

    @property
    def bos_token_id(self) -> int | None:
        return None if self.bos_token is None else self.vocab.get(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return None if self.eos_token is None else self.vocab.get(self.eos_token)

    def token_to_id(self, token: str) -> int | None:
        return self.vocab.get(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`, as tokenizers' Tokenizer.encode(text).ids."""
        if not isinstance(text, str):
            raise TypeError(f"Tokenizer.encode: text must be str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"Tokenizer.encode: text[{e.start}] is a lone surrogate "
                             f"({text[e.start]!r}), which has no UTF-8 bytes; tokenizers "
                             "refuses it too. Repair the text, e.g. "
                             "s.encode('utf-8', 'replace').decode()") from None
        out: list[int] = []
        first = True
        for seg, is_added in self._segments(text):
            if is_added:
                out.append(self.vocab[seg])
            else:
                self._encode_segment(seg, out, first)
            first = False
        if add_special_tokens:
            before, after = self._post
            out = before + out + after
        return out

    def _segments(self, text: str):
        """(text, is an added token) in order: added tokens cut from the raw text, the rest
        normalized, then normalized added tokens cut from that."""
        for seg, added in _cut(self._raw_re, text, self._raw_added):
            if added:
                yield seg, True
                continue
            if self.normalize is not None:
                seg = self.normalize(seg)
            if self._norm_re is None:
                yield seg, False
            else:
                for s, a in _cut(self._norm_re, seg, self._norm_added):
                    yield (self._norm_added[s], True) if a else (s, False)

    def _encode_segment(self, seg: str, out: list[int], first: bool):
        pieces = [seg]
        for step in self._steps:
            kind = step[0]
            if kind == "split":
                pieces = [p for piece in pieces for p in pretokenize.split(step[1], piece)]
            elif kind == "prefix_space":
                pieces = [p if p.startswith(" ") else " " + p for p in pieces]
            else:
                pieces = [p for i, piece in enumerate(pieces)
                          for p in _metaspace(piece, *step[1:], first and i == 0)]
        cache = self._cache
        for piece in pieces:
            ids = cache.get(piece)
            if ids is None:
                ids = self._bpe(piece)
                if len(cache) < 100_000 and len(piece) < 256:
                    cache[piece] = ids
            out += ids

    def _bpe(self, piece: str) -> list[int]:
        if self.byte_level:
            raw = piece.encode("utf-8")
            if self.ignore_merges:
                whole = self.vocab.get(raw.decode("latin-1").translate(self._spell_table))
                if whole is not None:
                    return [whole]
            if self._byte_table is not None:        # every byte an id below 256: in C
                return self.merges.apply(list(raw.translate(self._byte_table)))
            byte_ids = self._byte_ids
            ids = [byte_ids[b] for b in raw]
            if None in ids:
                ids = self._unknown(ids)
            return self.merges.apply(ids)
        if self.ignore_merges and piece in self.vocab:
            return [self.vocab[piece]]
        ids = list(map(self.vocab.get, piece))
        if None in ids:                        # characters outside the vocabulary
            ids = self._unknown(self._fallback(piece))
        return self.merges.apply(ids)

    def _fallback(self, piece: str) -> list:
        """piece's symbols; a character outside the vocabulary as its bytes' <0xXX> or None."""
        vocab, ids = self.vocab, []
        for ch in piece:
            i = vocab.get(ch)
            if i is not None:
                ids.append(i)
                continue
            fallback = [self._byte_ids[b] for b in ch.encode("utf-8")] if self.byte_fallback else [None]
            ids.extend(fallback if None not in fallback else [None])
        return ids

    def _unknown(self, ids: list) -> list[int]:
        """Symbols outside the vocabulary become unk_token (runs fused when fuse_unk)."""
        if self.unk_id is None:
            return [i for i in ids if i is not None]       # tokenizers drops them too
        out = []
        for i in ids:
            if i is None:
                if self.fuse_unk and out and out[-1] == self.unk_id:
                    continue
                i = self.unk_id
            out.append(i)
        return out

    # ---------------------------------------------------------------- decode

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Text of these ids, as tokenizers' Tokenizer.decode(ids, skip_special_tokens)."""
        tokens = []
        for i in ids:
            i = int(i)
            t = self.id_to_token.get(i)
            if t is None:
                raise ValueError(f"Tokenizer.decode: id {i} is not in the vocabulary of "
                                 f"{self.name} (size {self.vocab_size})")
            if skip_special_tokens and i in self.special_ids:
                continue
            tokens.append(t)
        return "".join(self.decoder(tokens))


def _cut(regex, text: str, added: dict):
    """(piece, is added token) for the matches of `regex` in text and the text between."""
    if regex is None or not text:
        if text:
            yield text, False
        return
    pos = 0
    for m in regex.finditer(text):
        a, b = m.span()
        token = m.group()
        if token not in added:                 # lstrip/rstrip: the whitespace is eaten
            token = token.strip(_WS)
        if a > pos:
            yield text[pos:a], False
        yield token, True
        pos = b
    if pos < len(text):
        yield text[pos:], False
