"""Quantized weights read in registers: the WGSL of `dequantize` (webgrad/quants' words).

`dequantize(words)` is never stored. Every kernel that reads it calls a helper
`dq_<binding>(e) -> f32` that decodes element e (row-major over the logical shape) from the
words buffer, bound as array<u32>:

  * the expression rule below serves elementwise and gather consumers (an embedding decodes
    only the rows it gathers; a slice of the position table only its rows);
  * a matmul whose operand is a strided view of a dequantize (x @ W^T, GPT-2's linear layers
    and tied head) reads that operand through `operand_reader`: the tiled kernel decodes
    each element as it stages the tile in shared memory, the barrier-free kernel as it loads
    its registers (codegen/matmul_tiled.py, matmul_direct.py, matmul_gemv.py). fusion.py and program.GroupCtx treat such a view as
    a stored operand (`quant_base`), so no f32 copy of the weight is planned.

Each helper is its format's WGSL (webgrad/quants/q*.py, the type's one definition) wrapped
in a function; the formulas are GGUF's in f32, where products of an f16 scale and small
integers are exact and a min's subtraction rounds once, as the host's numpy path does, so
the values equal gguf's dequantization (tests/test_gguf_quant.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..quants import FORMATS
from .emit import Emitter, Idx, Storage, rule
from .layout import nonunit_digits


def quant_base(g, n: int, has_storage) -> bool:
    """Is node n a dequantize its consumers read in registers (its words are stored)?"""
    node = g[n]
    return node.op == "dequantize" and not has_storage(n) and has_storage(node.inputs[0])


@dataclass(frozen=True)
class QuantOperand:
    """A matmul operand read through dequantize: the words' storage, the type, the count."""
    words: Storage
    qtype: str
    n: int
    offset: int = 0

    @property
    def group(self) -> int:
        """Values sharing one scale (group_helpers' groups)."""
        return FORMATS[self.qtype].group

    @property
    def block(self) -> int:
        return FORMATS[self.qtype].block

    @property
    def has_min(self) -> bool:
        return FORMATS[self.qtype].has_min

    @property
    def what(self) -> str:
        return f"{self.qtype} blocks of {self.words.what}"


def helper(kernel, words: Storage, qtype: str, n: int) -> str:
    """The name of `fn dq_<binding>(e: u32) -> f32` in `kernel`, reading `words`."""
    b = kernel.binding(words.buffer, "u32", what=f"{qtype} blocks of {words.what}",
                       nbytes=words.nbytes)
    name = f"dq_{b}"
    kernel.helper(name, f"fn {name}(e: u32) -> f32 {{{FORMATS[qtype].wgsl(b, n)}\n}}\n")
    return name


def group_helpers(kernel, st: "QuantOperand") -> tuple[str, str, bool, int]:
    """(scale fn, quant fn, has a min, group size) for a kernel that walks whole groups of
    values sharing a scale: `dqs_<b>(group) -> vec2<f32>` (scale, min) once per group,
    `dqq_<b>(e) -> vec4<f32>` the integers of elements e..e+3 (e a multiple of 4); value =
    scale * q - min. The barrier-free matmul hoists the scale out of its K loop this way
    (codegen/matmul_direct.py, matmul_gemv.py)."""
    fmt = FORMATS[st.qtype]
    b = kernel.binding(st.words.buffer, "u32", what=st.what, nbytes=st.words.nbytes)
    scale, quant = fmt.wgsl_group(b, st.n)
    kernel.helper(f"dqs_{b}", f"fn dqs_{b}(gi: u32) -> vec2<f32> {{{scale}\n}}\n")
    kernel.helper(f"dqq_{b}", f"fn dqq_{b}(e: u32) -> vec4<f32> {{{quant}\n}}\n")
    return f"dqs_{b}", f"dqq_{b}", fmt.has_min, fmt.group


def operand_reader(kernel, st):
    """at -> WGSL of a matmul operand's element at address `at`: a load of f32 storage, or a
    decode of a quantized operand's blocks (the address is then the logical flat index)."""
    if isinstance(st, QuantOperand):
        fn = helper(kernel, st.words, st.qtype, st.n)
        return lambda at: f"{fn}({at})"
    name = kernel.binding(st.buffer, st.dtype, what=st.what, nbytes=st.nbytes)
    if st.dtype == "f16":  # f16 storage, widened as it is read (f32 math)
        return lambda at: f"f32({name}[{at}])"
    return lambda at: f"{name}[{at}]"


def vec4_reader(kernel, st):
    """at -> WGSL of the four f32 values at address `at` (a multiple of 4) of plain storage:
    one vec4 load, of f32 or of f16 widened as it is read."""
    kind = "vec4_f16" if st.dtype == "f16" else "vec4_f32"
    name = kernel.binding(st.buffer, kind, what=st.what, nbytes=st.nbytes)
    if st.dtype == "f16":
        return lambda at: f"vec4<f32>({name}[({at}) >> 2u])"
    return lambda at: f"{name}[({at}) >> 2u]"


@rule("dequantize")
def _dequantize_rule(em: Emitter, node, idx: Idx) -> str:
    st = em.storage(node.inputs[0])
    if st is None:
        raise AssertionError(f"dequantize %{node.id}: its words are not stored")
    return f"{helper(em.k, st, node.attrs['qtype'], node.size)}({idx.flat(em)})"


def grouped_quant(sb, offb, dimb, bsh, K) -> bool:
    """Is a matmul's B (storage sb, offset offb, digits dimb, shape bsh) a quantized W^T
    whose K runs along W's rows (stride 1) from group starts? Then the matmul kernels read
    it a group of G values (one scale) at a time (group_helpers)."""
    return isinstance(sb, QuantOperand) and _rows_from(sb.group, offb, dimb, bsh, K)


def chunked_quant(sb, offb, dimb, bsh, K) -> bool:
    """Is B such a W^T whose rows start at block starts (and its words at their buffer's
    start)? Then the matrix-vector kernel reads it in its formats' chunks (chunk_reader)."""
    return (isinstance(sb, QuantOperand) and sb.words.offset == 0
            and _rows_from(FORMATS[sb.qtype].block, offb, dimb, bsh, K))


def _rows_from(G, offb, dimb, bsh, K) -> bool:
    return (len(bsh) == 2 and K % G == 0 and offb % G == 0
            and nonunit_digits(dimb[-2]) == [(K, 1)]
            and all(st % G == 0 for c, st in dimb[-1] if c > 1))


def chunk_reader(kernel, st: "QuantOperand"):
    """(format's Chunk, word, vec) for a kernel reading `st` in chunks: the words bound in
    the chunk's load unit (vec4<u32>, vec2<u32> or u32), word(at) / vec(at) the WGSL of word
    `at` / of words at..at+3 (at a multiple of the unit), as Chunk.load takes them."""
    ch = FORMATS[st.qtype].wgsl_chunk(st.n)
    kind = {4: "vec4_u32", 2: "vec2_u32", 1: "u32"}[ch.unit]
    b = kernel.binding(st.words.buffer, kind, what=st.what, nbytes=st.words.nbytes)
    if ch.unit == 1:
        words = lambda at: ", ".join(f"{b}[({at}) + {t}u]" for t in range(4))
        return ch, (lambda at: f"{b}[{at}]"), (lambda at: f"vec4<u32>({words(at)})")
    sh = ch.unit.bit_length() - 1
    if ch.unit == 2:
        vec = lambda at: f"vec4<u32>({b}[({at}) >> 1u], {b}[(({at}) >> 1u) + 1u])"
    else:
        vec = lambda at: f"{b}[({at}) >> 2u]"
    return ch, (lambda at: f"{b}[({at}) >> {sh}u][({at}) & {ch.unit - 1}u]"), vec


__all__ = ["QuantOperand", "chunk_reader", "chunked_quant", "grouped_quant", "quant_base", "operand_reader", "vec4_reader", "helper", "group_helpers"]
