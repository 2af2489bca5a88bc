"""GPT-2's byte-level BPE tokenizer in pure Python (it runs in Pyodide: no `regex`, no numpy).

Text becomes token ids in three steps, each the one OpenAI's encoder and Hugging Face's
GPT2Tokenizer take:
  1. special tokens (`<|endoftext|>`) are cut out and map straight to their ids;
  2. the rest is pre-split by GPT-2's pattern
         's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
     into words, each word's UTF-8 bytes are spelled as printable characters (bytes_to_unicode)
     and merged pair by pair, lowest merge rank first, into vocabulary entries (`Merges`);
  3. decode joins the entries, maps the characters back to bytes and decodes UTF-8, replacing
     invalid sequences with U+FFFD (what transformers does with errors="replace").

Python's `re` has no \\p{L}/\\p{N}, so step 2 rebuilds them from classes `re` does have, with
the code points where they disagree computed from `unicodedata` at first use:
  - re's \\w (str patterns) is: letters (str.isalpha, exactly categories L*) + numeric chars
    (str.isnumeric: every N* char, plus some CJK ideographs that are letters anyway) + "_";
  - re's \\d is exactly category Nd (Unicode keeps Numeric_Type=Decimal equal to gc=Nd);
  - so with X = the N* chars that are not Nd (categories Nl and No, about 1100 code points),
        \\p{L} = [^\\W\\d_X]     \\p{N} = [\\dX]     [^\\s\\p{L}\\p{N}] = [^\\w<WS>] or "_";
  - \\s is Unicode's White_Space property (25 code points, stable since Unicode 6.3), spelled
    out because re's \\s also takes U+001C..U+001F, which the GPT-2 pattern does not split on.
ASCII text (the common case) skips the table and uses a pattern with ASCII classes.

The merges themselves are webgrad.models.merges (shared with webgrad.models.tokenizer, Llama
and Qwen's tokenizer.json): the ids Hugging Face's `tokenizers` gives, in time linear in the
word (issue 29: a 20 KB word without spaces took 5 s with the merge loop that rescanned it).

Consumers: webgrad.models.gpt2 (re-exports `Tokenizer`), the surprisal page, the tests that
compare every id with transformers' GPT2Tokenizer built from the same encoder.json/vocab.bpe.
"""
from __future__ import annotations

import array
import json
import os
import re
import sys

from .merges import Merges

# Unicode's White_Space property: what \s means in the GPT-2 pattern (Oniguruma, `regex`).
_WS = ("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000")
_CONTRACTIONS = r"'(?:s|t|re|ve|m|ll|d)"   # 's|'t|'re|'ve|'m|'ll|'d, factored


def _pattern(letter: str, number: str, other: str, ws: str) -> re.Pattern:
    # (?![^ws]) is \s's complement looked ahead: it also holds at the end of the text,
    # as (?!\S) does, so a trailing whitespace run stays one word.
    return re.compile(f"{_CONTRACTIONS}| ?{letter}+| ?{number}+| ?{other}+|[{ws}]+(?![^{ws}])|[{ws}]+")


_ASCII_WS = "\t\n\x0b\x0c\r "
_ASCII_PATTERN = _pattern("[A-Za-z]", "[0-9]", f"[^A-Za-z0-9{_ASCII_WS}]", _ASCII_WS)
_unicode_pattern: re.Pattern | None = None


def _class_escape(codepoints: list[int]) -> str:
    """A character-class body for these code points, as ranges (\\U escapes, no metachars)."""
    out, i = [], 0
    while i < len(codepoints):
        j = i
        while j + 1 < len(codepoints) and codepoints[j + 1] == codepoints[j] + 1:
            j += 1
        lo, hi = codepoints[i], codepoints[j]
        out.append(f"\\U{lo:08x}" if lo == hi else f"\\U{lo:08x}-\\U{hi:08x}")
        i = j + 1
    return "".join(out)


def _numbers_not_decimal() -> list[int]:
    """Code points of categories Nl and No: \\w chars that are neither letters nor \\d.

    One pass of re over every code point finds the runs of [^\\W\\d_] (letters plus these);
    str.isalpha (C speed) clears whole runs at once and bisection finds the few others.
    """
    cps = array.array("I", range(0xD800))
    cps.extend(range(0xE000, 0x110000))          # surrogates are Cs: none of L, N, White_Space
    every = cps.tobytes().decode("utf-32-le" if sys.byteorder == "little" else "utf-32-be")
    found: list[int] = []

    def split(run: str) -> None:
        if run.isalpha():
            return
        if len(run) == 1:
            found.append(ord(run))
            return
        half = len(run) // 2
        split(run[:half])
        split(run[half:])

    for run in re.findall(r"[^\W\d_]+", every):
        split(run)
    return found


def _get_unicode_pattern() -> re.Pattern:
    global _unicode_pattern
    if _unicode_pattern is None:
        x = _class_escape(_numbers_not_decimal())
        _unicode_pattern = _pattern(f"[^\\W\\d_{x}]", f"[\\d{x}]", f"(?:[^\\w{_WS}]|_)", _WS)
    return _unicode_pattern


def split_words(text: str) -> list[str]:
    """GPT-2's pre-tokenizer: the words (strings) BPE then works on, one by one."""
    return (_ASCII_PATTERN if text.isascii() else _get_unicode_pattern()).findall(text)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table: the 188 printable Latin-1 bytes stand for
    themselves; the other 68 (controls, space, 0x7F-0xA0, 0xAD) take chr(256), chr(257), ...
    in byte order, so vocabulary entries never hold whitespace or control characters."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _read_text(src, what: str) -> str:
    """encoder.json / vocab.bpe given as a path, bytes, or their text."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src).decode("utf-8")
    if isinstance(src, os.PathLike):
        src = os.fspath(src)
    if not isinstance(src, str):
        raise TypeError(f"Tokenizer.from_files: {what} must be a path, bytes or str, "
                        f"got {type(src).__name__}")
    if "\n" in src or src.lstrip().startswith("{"):
        return src                                   # the contents themselves
    with open(src, encoding="utf-8") as f:
        return f.read()


class Tokenizer:
    """GPT-2 byte-level BPE: `encode(text) -> list[int]`, `decode(ids) -> str`."""

    def __init__(self, encoder: dict[str, int], merges: list[tuple[str, str]]):
        self.encoder = dict(encoder)
        self.decoder = {i: s for s, i in self.encoder.items()}
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        self._byte_ids = [self._id(self.byte_encoder[b], "byte") for b in range(256)]
        self._byte_table = (bytes(self._byte_ids) if all(0 <= i < 256 for i in self._byte_ids)
                            else None)
        # symbols start as single bytes, spelled by bytes_to_unicode (so are the merges' parts)
        initial = {c: self._byte_ids[b] for b, c in self.byte_encoder.items()}
        self.merges = Merges(
            [(self._id(a, "merge part"), self._id(b, "merge part"), self._id(a + b, "merge result"))
             for a, b in merges], parts=merges, symbols=initial)
        # <|...|> entries (GPT-2 has one, <|endoftext|>) are special: matched in the text as a
        # whole, never produced by BPE -- the added-token behaviour of transformers.
        self.special = {s: i for s, i in self.encoder.items()
                        if s.startswith("<|") and s.endswith("|>") and len(s) > 4}
        self._special_re = (re.compile("|".join(re.escape(s) for s in
                                                 sorted(self.special, key=len, reverse=True)))
                            if self.special else None)
        # a word -> its ids; words repeat, so most lookups end here
        self._cache: dict[str, list[int]] = {}
        self.eot = self.special.get("<|endoftext|>")

    @classmethod
    def from_files(cls, encoder_json, vocab_bpe) -> "Tokenizer":
        """encoder.json and vocab.bpe (as OpenAI ships them), each a path, bytes or str text."""
        encoder = json.loads(_read_text(encoder_json, "encoder_json"))
        merges = []
        for n, line in enumerate(_read_text(vocab_bpe, "vocab_bpe").split("\n")):
            if not line or line.startswith("#version"):
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ValueError(f"Tokenizer.from_files: vocab_bpe line {n + 1} should be two "
                                 f"symbols separated by a space, got {line!r}")
            merges.append((parts[0], parts[1]))
        return cls(encoder, merges)

    @property
    def vocab_size(self) -> int:
        return len(self.encoder)

    def _id(self, entry: str, what: str) -> int:
        i = self.encoder.get(entry)
        if i is None:
            raise ValueError(f"Tokenizer: the {what} {entry!r} is not in encoder.json "
                             "(encoder.json and vocab.bpe do not belong together)")
        return i

    def _bpe(self, word: str) -> list[int]:
        """Ids of one word: its bytes, spelled by bytes_to_unicode, merged the lowest-ranked
        adjacent pair first (leftmost first among equals) until no pair has a rank."""
        raw = word.encode("utf-8")
        if self._byte_table is not None:             # every byte an id below 256: in C
            return self.merges.apply(list(raw.translate(self._byte_table)))
        byte_ids = self._byte_ids
        return self.merges.apply([byte_ids[b] for b in raw])

    def _encode_ordinary(self, text: str, out: list[int]) -> None:
        cache = self._cache
        for word in split_words(text):
            ids = cache.get(word)
            if ids is None:
                ids = self._bpe(word)
                if len(cache) < 100_000:          # bounded: a long stream of unique words
                    cache[word] = ids
            out.extend(ids)

    def encode(self, text: str, *, special: bool = True) -> list[int]:
        """Token ids of `text`. With special=False, "<|endoftext|>" is plain text."""
        if not isinstance(text, str):
            raise TypeError(f"Tokenizer.encode: text must be str, got {type(text).__name__}")
        out: list[int] = []
        if not special or self._special_re is None:
            self._encode_ordinary(text, out)
            return out
        pos = 0
        for m in self._special_re.finditer(text):
            self._encode_ordinary(text[pos:m.start()], out)
            out.append(self.special[m.group()])
            pos = m.end()
        self._encode_ordinary(text[pos:], out)
        return out

    def decode_bytes(self, ids) -> bytes:
        """The raw bytes of these ids (a token may end inside a UTF-8 character)."""
        bd, dec = self.byte_decoder, self.decoder
        out = bytearray()
        for i in ids:
            s = dec.get(int(i))
            if s is None:
                raise ValueError(f"Tokenizer.decode: id {int(i)} is outside the vocabulary "
                                 f"(0..{len(self.encoder) - 1})")
            if s in self.special:
                out += s.encode("utf-8")
            else:
                out += bytes(bd[c] for c in s)
        return bytes(out)

    def decode(self, ids) -> str:
        """Text of these ids; invalid UTF-8 (a character cut between tokens) becomes U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")
