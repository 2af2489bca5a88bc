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

`Merges` is the merge loop, shared with webgrad.models.tokenizer (Llama/Qwen's tokenizer.json).
It gives the ids Hugging Face's `tokenizers` gives (lowest rank first, leftmost first among
equal ranks) in O(n log n), not the O(n^2) of rescanning the word after every merge (issue 29:
a 20 KB word without spaces took 5 s): symbols are a linked list over positions, pending merges
wait in one bucket per rank (a heap orders the ranks only), and a bucket's positions run in
order. A long word is first cut where no merge can ever join its neighbours (a "junction" no
merge result contains), and equal chunks are merged once.

Consumers: webgrad.models.gpt2 (re-exports `Tokenizer`), the surprisal page, the tests that
compare every id with transformers' GPT2Tokenizer built from the same encoder.json/vocab.bpe.
"""
from __future__ import annotations

import array
import json
import os
import re
import sys
from heapq import heappop, heappush
from itertools import compress, repeat
from operator import lshift, not_, or_

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


_SHIFT = 32   # a pair of symbol ids as one dict key: left << _SHIFT | right
_LONG = 64    # words at least this many symbols long are cut at junctions first
_BATCH = 4096  # symbols per _merge call when a long word's chunks are merged
_SEP = -2     # between chunks of a batch: an id in no pair
_SMALL = 1 << 15  # ids below this make one-digit junction keys (Merges._junctions_small)
_LOW = (1 << _SHIFT) - 1
_END = -3     # after a word's last symbol in _merge: an id in no pair


class Merges:
    """A BPE merge table over symbol ids and the merge loop (consumers: `Tokenizer` here,
    webgrad.models.tokenizer). `triples` are (left id, right id, merged id) in rank order;
    `junctions` are the (left, right) pairs of *initial* symbols that some merge joins (the
    last symbol of its left part, the first of its right), or None when they are unknown."""

    def __init__(self, triples: list[tuple[int, int, int]], *, junctions=None):
        # a pair listed twice keeps its last rank, as tokenizers' merge map does
        self.info = list(triples)
        self.rank = {a << _SHIFT | b: r for r, (a, b, _) in enumerate(self.info)}
        # (None, x): a symbol that does not exist, so no merge joins there
        self.junctions = (None if junctions is None else frozenset(
            a << _SHIFT | b for a, b in junctions if a is not None and b is not None))
        # the same pairs over small numbers (one-digit ints, quicker to make and hash: a long
        # word's junction test is a pass over all of its pairs): the ids themselves where they
        # fit in 15 bits (`_dense` None), else each junction symbol's rank in `_dense` (0:
        # a symbol in no junction)
        self._dense = self._junctions_small = None
        if self.junctions is not None:
            ends = {k >> _SHIFT for k in self.junctions} | {k & _LOW for k in self.junctions}
            if max(ends, default=0) < _SMALL:
                self._junctions_small = frozenset(
                    (k >> _SHIFT) << 15 | (k & _LOW) for k in self.junctions)
            elif len(ends) < _SMALL:
                self._dense = {e: i + 1 for i, e in enumerate(sorted(ends))}
                self._junctions_small = frozenset(
                    self._dense[k >> _SHIFT] << 15 | self._dense[k & _LOW] for k in self.junctions)

    def apply(self, ids: list[int]) -> list[int]:
        """The ids after every merge (`ids`, the initial symbols, is consumed)."""
        n = len(ids)
        if n < 2:
            return ids
        if n < _LONG or self.junctions is None:
            return self._merge(ids, self._pairs(ids))
        small = ids if self._dense is None else list(map(self._dense.get, ids, repeat(0)))
        if self._junctions_small is not None and (self._dense is not None or max(ids) < _SMALL):
            joined = map(self._junctions_small.__contains__,
                         map(or_, map(lshift, small[:-1], repeat(15)), small[1:]))
        else:
            joined = map(self.junctions.__contains__, self._pairs(ids))
        cuts = list(compress(range(1, n), map(not_, joined)))
        if not cuts:
            return self._merge(ids, self._pairs(ids))
        # Chunks no merge crosses: each distinct one is merged once (when they repeat, as
        # the words of a Llama 2 text do), a few thousand symbols to a _merge call (_SEP
        # between them), so neither the calls' overhead nor one huge call's memory traffic
        # dominates.
        bounds = [0, *cuts, n]
        chunks = [tuple(ids[a:b]) for a, b in zip(bounds, bounds[1:])]
        distinct = dict.fromkeys(chunks)
        if sum(map(len, distinct)) > n // 2:      # few repeats: one call is quicker
            return self._merge(ids, self._pairs(ids))
        done: dict[tuple, list[int]] = {}
        batch, batch_keys = [], []
        for chunk in distinct:
            batch += chunk
            batch.append(_SEP)
            batch_keys.append(chunk)
            if len(batch) >= _BATCH:
                self._merge_batch(batch, batch_keys, done)
                batch, batch_keys = [], []
        if batch:
            self._merge_batch(batch, batch_keys, done)
        out: list[int] = []
        for chunk in chunks:
            out += done[chunk]
        return out

    @staticmethod
    def _pairs(ids: list[int]) -> list[int]:
        """The pairs of neighbours in `ids`, as rank's keys."""
        return list(map(or_, map(lshift, ids[:-1], repeat(_SHIFT)), ids[1:]))

    def _merge_batch(self, batch: list[int], keys: list[tuple], done: dict) -> None:
        merged, start = self._merge(batch, self._pairs(batch)), 0
        for key in keys:
            end = merged.index(_SEP, start)
            done[key] = merged[start:end]
            start = end + 1

    def _merge(self, ids: list[int], keys: list[int]) -> list[int]:
        """`keys`: the pairs of neighbours in `ids`, as rank's keys."""
        n = len(ids)
        # _END after the last symbol (and, as ids[-1], before the first): it is in no pair,
        # so the loop needs no bounds checks
        ids.append(_END)
        nxt, prv = list(range(1, n + 2)), list(range(-1, n))
        get, info = self.rank.get, self.info
        buckets = _Buckets()
        for i, r in enumerate(map(get, keys)):
            if r is not None:
                buckets[r].append(i)
        ranks = buckets.ranks
        while ranks:
            r = heappop(ranks)
            todo = buckets.pop(r)
            todo.sort()
            a, b, new = info[r]
            for x, pos in enumerate(todo):
                j = nxt[pos]
                if ids[pos] != a or ids[j] != b:
                    continue                  # stale: a neighbour merged since this was queued
                ids[pos] = new
                ids[j] = -1
                k = nxt[pos] = nxt[j]
                prv[k] = pos
                lower = False                 # a new pair ranked below r goes first (the heap order)
                r2 = get(new << _SHIFT | ids[k])
                if r2 is not None:
                    buckets[r2].append(pos)
                    lower = r2 < r
                p = prv[pos]
                r2 = get(ids[p] << _SHIFT | new)
                if r2 is not None:
                    buckets[r2].append(p)
                    lower = lower or r2 < r
                if lower and x + 1 < len(todo):
                    buckets[r] = todo[x + 1:]  # no rank-r pair arises while rank r merges
                    heappush(ranks, r)
                    break
        ids.pop()
        return [i for i in ids if i != -1]      # -1: merged into its left neighbour


class _Buckets(dict):
    """rank -> positions waiting to merge; `ranks`, a heap of the ranks present."""

    def __init__(self):
        super().__init__()
        self.ranks: list[int] = []

    def __missing__(self, r: int) -> list[int]:
        heappush(self.ranks, r)
        bucket = self[r] = []
        return bucket


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
        # symbols start as single bytes, so a merge joins a's last byte to b's first
        initial = {c: self._byte_ids[b] for b, c in self.byte_encoder.items()}
        self.merges = Merges(
            [(self._id(a, "merge part"), self._id(b, "merge part"), self._id(a + b, "merge result"))
             for a, b in merges], junctions=[(initial[a[-1]], initial[b[0]]) for a, b in merges])
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
        byte_ids = self._byte_ids
        return self.merges.apply([byte_ids[b] for b in word.encode("utf-8")])

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
