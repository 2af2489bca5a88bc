"""tokenizer.json's regular expressions (the Split pre-tokenizer of Llama 3, Qwen2/3, GPT-2's
ByteLevel pattern) run on Python's `re`, which lacks \\p{L}, \\p{N} and Oniguruma's \\s.

Hugging Face's `tokenizers` runs these patterns on Oniguruma. `re` has no Unicode property
classes, and the `regex` module is not in Pyodide, so the pattern is translated over a small
alphabet: every non-ASCII character of the text is replaced (str.translate, one C call) by the
representative of its class -- its Unicode general category, and whether it is White_Space --
and the pattern's classes name ASCII characters plus those representatives. The match lengths
on the translated text then cut the real text. ASCII text needs no translation.

This also keeps `(?i:'s)` from matching "'ſ" (re folds U+017F to "s"; Oniguruma does not), and
gives \\s Unicode's White_Space (re's \\s also takes U+001C..U+001F).
Supported: \\p{X}/\\P{X} for a category or a major class (L, N, Lu, Nd, ...), \\s \\S \\d \\D,
ASCII literals and escapes; anything else raises ValueError naming the field.
Consumer: webgrad.models.tokenizer.
"""
from __future__ import annotations

import re
import unicodedata

# Unicode's White_Space property: what \s means in Oniguruma
WHITE_SPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"
                        + "".join(map(chr, range(0x2000, 0x200B))))
_CATEGORIES = ("Lu Ll Lt Lm Lo Mn Mc Me Nd Nl No Pc Pd Ps Pe Pi Pf Po Sm Sc Sk So "
               "Zs Zl Zp Cc Cf Cs Co Cn").split()


# every category has non-ASCII members; Cc both with White_Space (U+0085) and without
_N_CLASSES = len(_CATEGORIES) + 1


def _class_of(c: str) -> tuple[str, bool]:
    return unicodedata.category(c), c in WHITE_SPACE


def _find_representatives() -> dict[tuple[str, bool], str]:
    """One non-ASCII character per (category, White_Space) class, none of them case-related
    to an ASCII letter (so a (?i) literal never matches one)."""
    reps: dict[tuple[str, bool], str] = {}
    for cp in range(0x80, 0x110000):
        c = chr(cp)
        key = _class_of(c)
        if key not in reps and not re.fullmatch("(?i)[a-z]", c):
            reps[key] = c
            if len(reps) == _N_CLASSES:
                break
    return reps


class _Table(dict):
    """str.translate's table: ASCII to itself, anything else to its class representative."""

    def __init__(self, reps):
        super().__init__((i, i) for i in range(128))
        self.reps = reps

    def __missing__(self, cp: int) -> int:
        rep = self[cp] = ord(self.reps[_class_of(chr(cp))])
        return rep


_state: dict = {}


def _tables() -> tuple[dict, _Table]:
    if not _state:                        # once per process, a scan up to U+E000 (Co, the last to appear)
        reps = _find_representatives()
        _state["reps"], _state["table"] = reps, _Table(reps)
    return _state["reps"], _state["table"]


def _members(cats: set[str], ws: bool | None) -> str:
    """A class body: the ASCII characters and representatives in these categories
    (ws=True: White_Space only; ws=None: regardless of White_Space)."""
    reps, _ = _tables()
    chars = [chr(i) for i in range(128) if unicodedata.category(chr(i)) in cats
             and (ws is None or (chr(i) in WHITE_SPACE) == ws)]
    chars += [c for (cat, w), c in reps.items() if cat in cats and (ws is None or w == ws)]
    return "".join("\\" + c if c in "\\]^-[" else c for c in chars)


def _ws_members() -> str:
    reps, _ = _tables()
    return re.escape("".join(sorted(c for c in WHITE_SPACE if c.isascii()))) + "".join(
        c for (_, w), c in reps.items() if w)


def translate(pattern: str, *, field: str) -> re.Pattern:
    """tokenizer.json's (Oniguruma) pattern as a compiled `re` over the translated alphabet."""
    out, i, in_class = [], 0, False
    n = len(pattern)

    def bad(what):
        raise ValueError(f"{field}: {what} in the pattern {pattern!r} is not supported by "
                         "webgrad's tokenizer (only \\p{..}, \\s, \\d and ASCII)")

    while i < n:
        c = pattern[i]
        if not c.isascii():
            bad(f"the non-ASCII character {c!r}")
        if c == "\\" and i + 1 < n:
            e = pattern[i + 1]
            if e in "pP":
                m = re.match(r"\{\^?([A-Za-z]+)\}", pattern[i + 2:])
                if not m:
                    bad(f"\\{e} without {{name}}")
                name = m.group(1)
                cats = {k for k in _CATEGORIES if k == name or (len(name) == 1 and k[0] == name)}
                if not cats:
                    bad(f"the class \\{e}{{{name}}}")
                body, negate = _members(cats, None), e == "P"
                i += 2 + m.end()
            elif e in "sSdD":
                body = _ws_members() if e in "sS" else _members({"Nd"}, None)
                negate = e in "SD"
                i += 2
            elif e.isalnum() and e not in "rntfv":
                bad(f"the escape \\{e}")
            else:
                out.append(pattern[i:i + 2])
                i += 2
                continue
            if in_class:
                if negate:
                    bad(f"a negated class inside [...]")
                out.append(body)
            else:
                out.append(f"[{'^' if negate else ''}{body}]")
            continue
        if in_class:
            in_class = c != "]" or out[-1] in ("[", "[^")
        elif c == "[":
            in_class = True
            if pattern.startswith("[^", i):
                out.append("[^")
                i += 2
                continue
        elif c == "(" and not pattern.startswith("(?", i):
            out.append("(?:")             # no capture groups: findall returns whole matches
            i += 1
            continue
        out.append(c)
        i += 1
    try:
        return re.compile("".join(out))
    except re.error as e:
        raise ValueError(f"{field}: the pattern {pattern!r} does not compile ({e})") from None


def split(regex: re.Pattern, text: str) -> list[str]:
    """tokenizers' Split with behavior "Isolated": the matches and the gaps between them."""
    if text.isascii():
        mapped = text
    else:
        mapped = text.translate(_tables()[1])
    parts = regex.findall(mapped)
    if sum(map(len, parts)) != len(text):            # gaps: cut at every match and between
        parts, pos = [], 0
        for m in regex.finditer(mapped):
            a, b = m.span()
            if a > pos:
                parts.append(mapped[pos:a])
            if b > a:
                parts.append(mapped[a:b])
            pos = b
        if pos < len(text):
            parts.append(mapped[pos:])
    if mapped is text:
        return parts
    out, pos = [], 0
    for p in parts:
        end = pos + len(p)
        out.append(text[pos:end])
        pos = end
    return out


# GPT-2's pattern, which tokenizers' ByteLevel pre-tokenizer applies when use_regex is true
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
