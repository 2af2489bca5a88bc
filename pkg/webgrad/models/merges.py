"""BPE's merge step over symbol ids, in pure Python and in time linear in the word (issue 29).

`Merges(triples, parts=..., symbols=...).apply(ids)` merges a word's initial symbols (bytes
for byte-level BPE, characters for SentencePiece-style BPE) into token ids, in the order of
Hugging Face's `tokenizers` (its word.rs: a heap of (rank, position), the lowest first: the
lowest-ranked adjacent pair merges, the leftmost among equal ranks, until no pair has a
rank). Consumers: webgrad.models.bpe (GPT-2) and webgrad.models.tokenizer (tokenizer.json:
Llama 2/3, Qwen), whose tests compare every id with tokenizers' and transformers'.

Rescanning the word after each merge is O(n^2) (issue 29: a 20 KB word without spaces took
5 s). A word of n symbols instead goes through three steps, each O(n) or O(n log n):
  1. Cut (`_Windows`): a merge (A, B) joins across position i only if A ends at i and B
     starts there, so i is a cut where no merge's edge symbols match the word's around i:
     a table lookup per pair of neighbours, then, where a merge with a longer part could
     match, a set lookup of the three or four symbols around i. No merge ever crosses a
     cut, so the chunks between cuts merge independently.
  2. Deduplicate: equal chunks merge once (dict keys). A 1 MB word of random letters is
     then 450-650 K chunks of mostly two to six symbols, 65-110 K of them distinct; a
     prose word's chunks repeat with its words.
  3. Merge each distinct chunk. One of at most _SHORT (64) symbols, as every short word,
     merges on its own (`_merge_short`): its lowest-ranked pair merges and the two pairs
     that makes are looked up, with min() and index() in C over a list that stays in cache:
     O(L^2) in C but one Python step per merge, so O(n) for a word of such chunks. A longer
     chunk (or an uncut long word) goes through `_merge`, O(L log L): a doubly linked list
     of symbols, a bucket of positions per rank and a heap of the ranks present (below).
Cutting, deduplicating and joining run in C on strings of one character per symbol id
(UTF-32 through `array`), and pairs of neighbours are read 16 bits at a time from the word
spelled in a byte per symbol (`_Alphabet`, a charmap codec). bench/tokenizer_speed.py has
the figures (a 1 MB word in 0.4-0.7 s of CPython on the 2-core VM, random letters or prose).
"""
from __future__ import annotations

import array
import codecs
import sys
from functools import partial
from heapq import heappop, heappush
from itertools import compress, count, repeat
from operator import add, and_, getitem, is_not, itemgetter, lshift, not_, or_

_SHIFT = 32   # a pair of symbol ids as one dict key: left << _SHIFT | right
_SHORT = 64   # words and chunks at most this long merge on their own (Merges._merge_short)
_END = -3     # after a word's last symbol in _merge: an id in no pair
_COMPACT = 1024  # _merge calls at least this long link their symbols in arrays
# Chunks are strings of one character per symbol id: UTF-32 through array's 4-byte unsigned
# ints, and U+10FFFF, an id no vocabulary reaches, between the chunks of one merge call and
# around a word whose windows are read.
_UTF32 = "utf-32-le" if sys.byteorder == "little" else "utf-32-be"
_U32 = next(t for t in "IL" if array.array(t).itemsize == 4)
_SEP = 0x10FFFF
_SEP_CHAR = chr(_SEP)
_LITTLE = sys.byteorder == "little"


def _text_of(ids: list[int]) -> str:
    """One character per id (OverflowError or UnicodeDecodeError for an id outside
    0..0x10FFFF)."""
    return array.array(_U32, ids).tobytes().decode(_UTF32, "surrogatepass")


def _ids_of(text: str) -> list[int]:
    return array.array(_U32, text.encode(_UTF32, "surrogatepass")).tolist()


class Merges:
    """A BPE merge table over symbol ids. `triples` are (left id, right id, merged id) in
    rank order (a pair listed twice keeps its last rank, as tokenizers' merge map does).
    `parts`, the same merges as (left, right) strings, and `symbols` (character -> the id
    of its initial symbol) let long words be cut (the module's docstring); without them,
    or when the parts are not spelled by their characters' symbols (Llama 2's merges of
    <0xXX> byte tokens), a long word is merged whole by `_merge`."""

    def __init__(self, triples: list[tuple[int, int, int]], *, parts=None, symbols=None):
        self.info = list(triples)
        self.rank = {a << _SHIFT | b: r for r, (a, b, _) in enumerate(self.info)}
        self._none = len(self.info)      # a rank above every merge's: _merge_short's "none"
        self._cutter = (None if parts is None or symbols is None
                        else _Windows.build(self.info, parts, symbols))

    def apply(self, ids: list[int]) -> list[int]:
        """The ids after every merge (`ids`, the initial symbols, is consumed)."""
        n = len(ids)
        if n <= _SHORT:
            return self._merge_short(ids, [n], self._ranks(ids, self._none))
        if self._cutter is None:
            return self._merge(ids)
        try:
            text = _text_of(ids)
        except (OverflowError, UnicodeDecodeError):   # an id that is no character
            return self._merge(ids)
        if _SEP_CHAR in text:
            return self._merge(ids)
        alphabet = _Alphabet.of(ids)
        cuts = self._cutter.cuts(text, alphabet)
        if not cuts:
            return self._merge(ids)
        bounds = [0, *cuts, n]
        chunks = [text[a:b] for a, b in zip(bounds, bounds[1:])]
        done = dict.fromkeys(chunks)
        for short in (True, False):
            group = [c for c in done if (len(c) <= _SHORT) == short]
            if group:
                done.update(zip(group, self._merge_chunks(group, alphabet, short)))
        return _ids_of("".join(map(done.__getitem__, chunks)))

    def _merge_chunks(self, chunks: list[str], alphabet: _Alphabet | None,
                      short: bool) -> list[str]:
        """Chunks (strings of one character per id) merged, all in one call: by
        _merge_short (each at most _SHORT symbols) or by _merge."""
        batch = _SEP_CHAR.join(chunks)
        ids = _ids_of(batch)
        if short:
            first = self._ranks(ids, self._none, batch, alphabet)
            merged = self._merge_short(ids, list(map(len, chunks)), first)
        else:
            merged = self._merge(ids, self._ranks(ids, None, batch, alphabet))
        return _text_of(merged).split(_SEP_CHAR)

    def _ranks(self, ids: list[int], missing, text: str | None = None,
               alphabet: _Alphabet | None = None) -> list:
        """The rank of each pair of neighbours in ids (`missing` where none); from text's
        alphabet, where given, at C speed."""
        get = self.rank.get
        if alphabet is None:
            return list(map(get, map(or_, map(lshift, ids[:-1], repeat(_SHIFT)), ids[1:]),
                            repeat(missing)))
        return alphabet.pairs(text, lambda p: get(ord(p[0]) << _SHIFT | ord(p[1]), missing))

    def _merge_short(self, ids: list[int], lens: list[int], first: list[int]) -> list[int]:
        """Every merge on each chunk of ids (`lens`: their lengths, one _SEP between two),
        a chunk at a time: its lowest-ranked pair (leftmost among equals) merges and the
        two pairs that makes are looked up. O(L^2) for a chunk of L symbols, in C but for
        one step per merge: quicker than _merge for the few symbols of a chunk, whose lists
        stay in cache where _merge reaches its entries in rank order. `first`: the ranks of
        ids' pairs, self._none where none."""
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
        """Every merge on `ids` (consumed), for a long chunk or word; `first`, when known,
        the ranks of its pairs of neighbours (None where none).

        Every adjacent pair with a rank waits in the bucket of its rank; the lowest rank
        present comes off a heap of ranks and its bucket runs in position order, each merge
        linking its right symbol out of a doubly linked list (`nxt`, `prv`) and queueing
        the two pairs it makes with its neighbours. An entry goes stale when a neighbour
        merges first and is skipped when reached. A pair made while rank r runs ranks
        higher, or lower when its token is also made by an earlier merge ("ab c" after
        "a bc"): then the lower rank runs first and rank r resumes where it stopped (its
        bucket's iterator is kept). No rank-r pair arises while rank r runs: every token
        made then contains a + b, longer than either part. n symbols make at most n - 1
        first entries and 2 per merge (at most n merges), each entry is reached once and
        each bucket sorted once: O(n log n)."""
        n = len(ids)
        if n < 2:
            return ids
        get, info = self.rank.get, self.info
        if first is None:
            first = self._ranks(ids, None)
        # _END after the last symbol (and, as ids[-1], before the first): it is in no pair,
        # so the loop needs no bounds checks. A long word's links are C ints: a fifth
        # quicker there (fewer cache misses than a list of int objects), slower to make.
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
    character per symbol id, as in Merges.apply; a merge that needs a character with no
    symbol never matches."""

    @classmethod
    def build(cls, info: list, parts, symbols: dict[str, int]) -> _Windows | None:
        """None where the strings of one character per id cannot be made."""
        made = list(map(itemgetter(2), info))
        # chunks as strings need every id a merge makes, and every symbol, to be a
        # character other than _SEP
        if made and not (0 <= min(made) and max(made) < _SEP) or not all(
                isinstance(i, int) and 0 <= i < _SEP for i in symbols.values()):
            return None
        lefts, rights = list(map(itemgetter(0), parts)), list(map(itemgetter(1), parts))
        la, lb = list(map(len, lefts)), list(map(len, rights))
        if not (all(la) and all(lb)):
            return None                     # an empty part: a token that is no symbol
        pair = list(map(add, map(itemgetter(-1), lefts), map(itemgetter(0), rights)))
        kind = dict.fromkeys(pair, 1)
        kind.update(dict.fromkeys(compress(pair, map((2).__eq__, map(add, la, lb))), 0))
        # the merges of a longer part whose pair of symbols no two-symbol merge joins:
        # their last two and first two symbols (three or four), by the parts' lengths
        weak = list(map(kind.__getitem__, pair))
        tails = map(getitem, compress(lefts, weak), repeat(slice(-2, None)))
        heads = map(getitem, compress(rights, weak), repeat(slice(2)))
        keys = list(map(add, tails, heads))
        size = list(map(len, keys))
        left_two = list(map((1).__lt__, compress(la, weak)))
        spelling = _Spelling({ord(c): i for c, i in symbols.items()})
        self = cls()
        self.pair = {}
        for k, v in kind.items():            # the smaller kind where two spellings meet
            k = k.translate(spelling)
            self.pair[k] = min(v, self.pair.get(k, 1))

        def spelled(chosen) -> set[str]:
            return {k for k in map(str.translate, compress(keys, chosen), repeat(spelling))
                    if _SEP_CHAR not in k}
        self.both2 = spelled(map((4).__eq__, size))
        self.left2 = spelled(map(and_, map((3).__eq__, size), left_two))
        self.right2 = spelled(map(and_, map((3).__eq__, size), map(not_, left_two)))
        self.left3 = self.left2 | {k[:3] for k in self.both2}
        self.right3 = self.right2 | {k[1:] for k in self.both2}
        return self

    def cuts(self, text: str, alphabet: _Alphabet | None) -> list[int]:
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


_IS_CUT = bytes.maketrans(b"\0\1\2", b"\0\0\1")    # kind 2 -> 1, else 0
_IS_WEAK = bytes.maketrans(b"\0\1\2", b"\0\1\0")   # kind 1 -> 1, else 0


class _Alphabet:
    """The few distinct symbols of a long word, for C-speed work on its pairs of neighbours:
    a byte per symbol (a charmap codec), so that each pair is a 16-bit number read from a
    memoryview (the even pairs from the bytes, the odd ones from them shifted by one) and
    looked up in a table of the alphabet's pairs. _SEP_CHAR is in every alphabet (it
    separates chunks)."""

    @classmethod
    def of(cls, ids: list[int]) -> _Alphabet | None:
        """None where the symbols are too many for a byte each or for a table that costs
        less than the word, or beyond U+FFFF (where the codec's quick table does not go)."""
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
