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
import codecs
import json
import os
import re
import sys
from functools import partial
from heapq import heappop, heappush
from itertools import compress, count, repeat
from operator import add, is_, is_not, itemgetter, lshift, or_

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
_SHORT = 64   # words and chunks this short merge on their own (Merges._merge_short)
_END = -3     # after a word's last symbol in _merge: an id in no pair
_COMPACT = 1024  # _merge calls at least this long link their symbols in arrays
# Chunks are strings of one character per symbol id (C-speed slices, keys and joins):
# UTF-32 through array's 4-byte unsigned ints, and U+10FFFF, an id no vocabulary reaches,
# between the chunks of one _merge call and around a word whose windows are read.
_UTF32 = "utf-32-le" if sys.byteorder == "little" else "utf-32-be"
_U32 = next(t for t in "IL" if array.array(t).itemsize == 4)
_SEP = 0x10FFFF
_SEP_CHAR = chr(_SEP)


def _text_of(ids: list[int]) -> str:
    """One character per id (OverflowError or UnicodeDecodeError for an id outside
    0..0x10FFFF)."""
    return array.array(_U32, ids).tobytes().decode(_UTF32, "surrogatepass")


def _ids_of(text: str) -> list[int]:
    return array.array(_U32, text.encode(_UTF32, "surrogatepass")).tolist()


class Merges:
    """A BPE merge table over symbol ids and the merge loop (consumers: `Tokenizer` here,
    webgrad.models.tokenizer). `triples` are (left id, right id, merged id) in rank order.
    `parts`, the same merges as (left, right) strings, and `symbols`, the id of each
    character's initial symbol, let long words be cut first (below); without them, or when
    a part is not spelled by its characters' symbols (Llama 2's merges of <0xXX> byte
    tokens), each word is merged whole.

    The merge order is tokenizers' (its word.rs: a heap of (rank, position), the lowest
    first): every adjacent pair with a rank waits in the bucket of its rank; the lowest rank
    present comes off a heap of ranks and its bucket runs in position order, each merge
    linking its right symbol out of a doubly linked list (the arrays `nxt`, `prv`) and
    queueing the two pairs it makes with its neighbours. An entry goes stale when a
    neighbour merges first and is skipped when reached (lazy invalidation). A pair made
    while rank r runs ranks higher, or lower when its token is also made by an earlier
    merge ("ab c" after "a bc"): then the lower rank runs first and rank r resumes where it
    stopped (its bucket's iterator is kept, nothing is copied). No rank-r pair arises while
    rank r runs: every token made then contains a + b, longer than either part.
    Cost: n symbols make at most n - 1 first entries and 2 per merge (at most n merges),
    each entry is reached once and each bucket sorted once: O(n log n), the heap holding
    distinct ranks only.

    A long word is first cut where no merge can ever join two neighbours, and each
    distinct chunk is merged once (`_Windows`). Cutting, deduplicating and joining run in C
    on strings of one character per id; the distinct chunks go through one merge call,
    separated by an id in no pair. A word of random letters is then about 600 K chunks of
    mostly two to six symbols, 65-110 K of them distinct (a quarter to a half of the
    symbols); a prose word's chunks repeat with its words."""

    def __init__(self, triples: list[tuple[int, int, int]], *, parts=None, symbols=None):
        # a pair listed twice keeps its last rank, as tokenizers' merge map does
        self.info = list(triples)
        self.rank = {a << _SHIFT | b: r for r, (a, b, _) in enumerate(self.info)}
        # chunks as strings need every id a merge makes to be a character other than _SEP
        chars = all(0 <= new < _SEP for _, _, new in self.info)
        self._none = len(self.info)      # a rank above every merge's: _merge_short's "none"
        self._windows = (_Windows.build(parts, symbols)
                         if chars and parts is not None and symbols is not None else None)

    def apply(self, ids: list[int]) -> list[int]:
        """The ids after every merge (`ids`, the initial symbols, is consumed)."""
        n = len(ids)
        if n <= _SHORT:
            return self._merge_short(ids, [n], self._ranks(ids, self._none))
        if self._windows is None:
            return self._merge(ids)
        try:
            text = _text_of(ids)
        except (OverflowError, UnicodeDecodeError):   # an id that is no character
            return self._merge(ids)
        if _SEP_CHAR in text:
            return self._merge(ids)
        alphabet = _Alphabet.of(ids)
        cuts = self._windows.cuts(text, alphabet)
        if not cuts:
            return self._merge(ids)
        bounds = [0, *cuts, n]
        chunks = [text[a:b] for a, b in zip(bounds, bounds[1:])]
        done = dict.fromkeys(chunks)
        short = [c for c in done if len(c) <= _SHORT]
        long = [c for c in done if len(c) > _SHORT]
        for group, missing in ((short, self._none), (long, None)):
            if group:
                batch = _SEP_CHAR.join(group)
                ids = _ids_of(batch)
                first = self._ranks(ids, missing, batch, alphabet)
                merged = (self._merge_short(ids, list(map(len, group)), first) if missing
                          else self._merge(ids, first))
                done.update(zip(group, _text_of(merged).split(_SEP_CHAR)))
        return _ids_of("".join(map(done.__getitem__, chunks)))

    def _ranks(self, ids: list[int], missing, text: str | None = None,
               alphabet: "_Alphabet | None" = None) -> list:
        """The rank of each pair of neighbours in ids (`missing` where none); from text's
        alphabet, where given, at C speed."""
        get = self.rank.get
        if alphabet is None:
            return list(map(get, map(or_, map(lshift, ids[:-1], repeat(_SHIFT)), ids[1:]),
                            repeat(missing)))
        return alphabet.pairs(text, lambda p: get(ord(p[0]) << _SHIFT | ord(p[1]), missing))

    def _merge_short(self, ids: list[int], lens: list[int], first: list[int]) -> list[int]:
        """Every merge on each chunk of ids (`lens`: their lengths, one _SEP between two),
        a chunk at a time, in tokenizers' order: its lowest-ranked pair (leftmost among
        equals) merges, and the two pairs that makes are looked up. O(L^2) for a chunk of L
        symbols, in C but for one step per merge: quicker than _merge for the few symbols
        of a chunk (at most _SHORT), whose lists stay in cache where _merge reaches its
        entries in rank order. `first`: the ranks of ids' pairs, self._none where none."""
        none, get, info = self._none, self.rank.get, self.info
        out: list[int] = []
        a = 0
        for n in lens:
            b = a + n
            chunk, ranks = ids[a:b], first[a:b - 1]
            a = b + 1
            while ranks:
                r = min(ranks)
                if r == none:
                    break
                i = ranks.index(r)
                new = info[r][2]
                chunk[i] = new
                del chunk[i + 1], ranks[i]
                if i:
                    ranks[i - 1] = get(chunk[i - 1] << _SHIFT | new, none)
                if i < len(ranks):
                    ranks[i] = get(new << _SHIFT | chunk[i + 1], none)
            out += chunk
            out.append(_SEP)
        out.pop()
        return out

    def _merge(self, ids: list[int], first: list | None = None) -> list[int]:
        """Every merge on `ids` (consumed), in tokenizers' order (the class's docstring);
        `first`, when known, the ranks of its pairs of neighbours."""
        n = len(ids)
        if n < 2:
            return ids
        get, info = self.rank.get, self.info
        if first is None:
            first = self._ranks(ids, None)
        # _END after the last symbol (and, as ids[-1], before the first): it is in no pair,
        # so the loop needs no bounds checks. A long word's links are C ints: a fifth
        # quicker there (fewer cache misses than a list of int objects), slower to make
        links = list if n < _COMPACT else partial(array.array, "i")
        ids.append(_END)
        nxt, prv = links(range(1, n + 2)), links(range(-1, n))
        buckets = _Buckets()
        for i in compress(count(), map(is_not, first, repeat(None))):
            buckets[first[i]].append(i)
        ranks = buckets.ranks
        paused: dict[int, object] = {}   # rank -> its bucket's iterator, where it stopped
        while ranks:
            r = heappop(ranks)
            todo, fresh = paused.pop(r, None), buckets.pop(r, None)
            if fresh is not None:
                fresh.sort()
                # both only with a token of an empty string (a + "" == a): merge the orders
                todo = iter(fresh if todo is None else sorted([*todo, *fresh]))
            elif todo is None:
                continue                       # r was queued twice
            a, b, new = info[r]
            left = new << _SHIFT
            for pos in todo:
                j = nxt[pos]
                if ids[pos] != a or ids[j] != b:
                    continue                   # stale: a neighbour merged since this was queued
                ids[pos] = new
                ids[j] = -1                    # merged into its left neighbour
                k = nxt[pos] = nxt[j]
                prv[k] = pos
                p = prv[pos]
                r2 = get(left | ids[k])
                r3 = get(ids[p] << _SHIFT | new)
                if r2 is not None:
                    buckets[r2].append(pos)
                    if r2 < r:                 # a lower rank goes first, then r resumes
                        if r3 is not None:
                            buckets[r3].append(p)
                        paused[r] = todo
                        heappush(ranks, r)
                        break
                if r3 is not None:
                    buckets[r3].append(p)
                    if r3 < r:
                        paused[r] = todo
                        heappush(ranks, r)
                        break
        ids.pop()
        return list(filter((-1).__ne__, ids))


class _Windows:
    """Where a word can be cut: the positions no merge can ever join across.

    The first token to span position i of a word is made by a merge (A, B) with A ending
    at i and B starting there, so i is a cut when no merge's edges match the symbols
    around i. `pair`: the two symbols around i -> 0 when a merge joins exactly these two
    (never a cut), 1 when only merges with a longer part end and start with them; a pair
    not in it is a cut. Where it says 1, the three symbols (a part of two symbols, the
    other of one) or four around i must match a merge's: `left2`, `right2`, `both2`
    (`left3`, `right3`: their three-symbol halves, a quicker first test). Strings of one
    character per symbol id, as in Merges.apply; a character with no symbol becomes _SEP,
    which no word holds, so a merge that needs it never matches."""

    @classmethod
    def build(cls, parts, symbols: dict[str, int]) -> "_Windows | None":
        """None where windows cannot be read from the parts' characters."""
        if not all(isinstance(i, int) and 0 <= i < _SEP for i in symbols.values()):
            return None
        lefts, rights = [p[0] for p in parts], [p[1] for p in parts]
        if not (all(lefts) and all(rights)):
            return None                     # an empty part: a token that is no symbol
        pair = list(map(add, map(itemgetter(-1), lefts), map(itemgetter(0), rights)))
        kind = dict.fromkeys(pair, 1)
        whole = list(map(add, lefts, rights))
        kind.update(dict.fromkeys(compress(whole, map((2).__eq__, map(len, whole))), 0))
        left2, right2, both2 = set(), set(), set()
        for a, b in compress(zip(lefts, rights), map(kind.__getitem__, pair)):
            if len(a) > 1 and len(b) > 1:
                both2.add(a[-2:] + b[:2])
            elif len(a) > 1:
                left2.add(a[-2:] + b)
            else:
                right2.add(a + b[:2])
        spell = _Spelling({ord(c): i for c, i in symbols.items()})
        self = cls()
        self.pair = {}
        for k, v in kind.items():            # the smaller kind where two spellings meet
            k = k.translate(spell)
            self.pair[k] = min(v, self.pair.get(k, 1))
        tr = lambda keys: {k for k in (k.translate(spell) for k in keys) if _SEP_CHAR not in k}
        self.left2, self.right2, self.both2 = tr(left2), tr(right2), tr(both2)
        self.left3 = self.left2 | {k[:3] for k in self.both2}
        self.right3 = self.right2 | {k[1:] for k in self.both2}
        return self

    def cuts(self, text: str, alphabet: "_Alphabet | None") -> list[int]:
        """The positions i (1..len - 1) where no merge joins text[:i] to text[i:]."""
        n = len(text)
        kinds = alphabet and alphabet.pairs(text, self._kind)
        kinds = bytes(kinds or map(self.pair.get, map(add, text, text[1:]), repeat(2)))
        cuts = compress(range(1, n), kinds.translate(_IS_CUT))
        weak = compress(range(1, n), kinds.translate(_IS_WEAK))
        # _SEP_CHAR (in no window) pads both ends: t[j] is text[j - 1]
        t = _SEP_CHAR + text + _SEP_CHAR
        left3, right3, left2, right2, both2 = (self.left3, self.right3, self.left2,
                                               self.right2, self.both2)
        more = [i for i in weak
                if t[i - 1:i + 2] not in left3 and t[i:i + 3] not in right3
                or not (t[i - 1:i + 2] in left2 or t[i:i + 3] in right2
                        or t[i - 1:i + 3] in both2)]
        return sorted([*cuts, *more])      # two sorted runs: a linear merge

    def _kind(self, pair: str) -> int:
        return self.pair.get(pair, 2)


class _Alphabet:
    """The few distinct symbols of a long word, for C-speed work on its pairs of neighbours:
    a byte per symbol (a charmap codec), so that each pair is a 16-bit number read from a
    memoryview (the even pairs from the bytes, the odd ones from them shifted by one) and
    looked up in a table of the alphabet's pairs. _SEP_CHAR is in every alphabet (it
    separates chunks)."""

    @classmethod
    def of(cls, ids: list[int]) -> "_Alphabet | None":
        """None where the symbols are too many for a byte each, or for a table that
        costs less than the word (or beyond U+FFFF, where the codec's table does not go)."""
        distinct = set(ids)
        if len(distinct) > 254 or len(distinct) ** 2 > len(ids) or max(distinct) > 0xFFFF:
            return None
        self = cls()
        # The codec's quick table wants 256 characters up to U+FFFF, U+0000 first: a spare
        # character stands for _SEP_CHAR.
        distinct.discard(0)
        spare = [c for c in map(chr, range(1, 512)) if ord(c) not in distinct]
        self.sep = spare.pop()
        self.chars = ["\0", _SEP_CHAR, *map(chr, distinct)]
        self.codec = codecs.charmap_build("".join(["\0", self.sep, *self.chars[2:],
                                                   *spare[:256 - len(self.chars)]]))
        return self

    def pairs(self, text: str, value) -> list:
        """[value(text[i] + text[i + 1]) for i in range(len(text) - 1)], text's characters
        all in the alphabet."""
        n = len(text)
        codes = codecs.charmap_encode(text.replace(_SEP_CHAR, self.sep), "strict", self.codec)[0]
        table = [None] * 65536
        for x, cx in enumerate(self.chars):
            for y, cy in enumerate(self.chars):
                table[x | y << 8 if _LITTLE else x << 8 | y] = value(cx + cy)
        out = [None] * (n - 1)
        out[0::2] = map(table.__getitem__, memoryview(codes[:n - n % 2]).cast("H"))
        out[1::2] = map(table.__getitem__, memoryview(codes[1:n - (n - 1) % 2]).cast("H"))
        return out


_IS_CUT = bytes.maketrans(b"\0\1\2", b"\0\0\1")
_IS_WEAK = bytes.maketrans(b"\0\1\2", b"\0\1\0")
_LITTLE = sys.byteorder == "little"


class _Spelling(dict):
    """str.translate's table from characters to their symbols' ids; _SEP for the others."""

    def __missing__(self, key: int) -> int:
        return _SEP


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
        self._byte_table = (bytes(self._byte_ids) if all(0 <= i < 256 for i in self._byte_ids)
                            else None)
        # symbols start as single bytes: a merge's edges are its parts' end bytes
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
