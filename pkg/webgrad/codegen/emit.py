"""Expression emission: the value of any fusable node at an index, as WGSL text.

A kernel never loops over "ops": it asks `Emitter.value(node, idx)` for the value of a node
at an index and gets back a WGSL name. A node with storage outside the kernel is a load; any
other node is computed from its inputs by its family's *expression rule* (EXPR_RULES, filled
by elementwise.py, layout.py, index.py, random.py and conv.py), recursively. This is what
fuses: a chain of elementwise ops, broadcasts, transposes, slices, one_hot, gathers and
random numbers becomes one expression, and a reduction or matmul reads its inputs through
the same call (prologue) and hands its result to the same machinery (epilogue).

Indices are `Idx`: per-dimension u32 expressions and/or the flat row-major index, each
derived from the other on demand (so an elementwise chain over same-shaped tensors never
divides: it indexes storage with the flat thread index). A flat index made by `ravel` is
remembered with its dims, so that unraveling it again (a view reached through reshapes:
pad, slice, merge_heads, a row kernel's [row, j]) regroups those dims instead of dividing
(`_regroup`). Every `let` is deduplicated by its
text within the enclosing blocks, which is common-subexpression elimination for free: the
Adam update's three outputs share one computation of m' and v'. A value that is already a
name or a literal gets no `let`; the emitter knows which those are from data, never by
reading the text: the names it made or was told of (`Emitter.names`: fresh names, the
entry point's builtins, and what builders `declare`: their own lets, loop variables,
function parameters) and the literals, which wgsl.py's f32_lit / u32_lit / zero mark
(`wgsl.Literal`).

Besides its lines, an Emitter keeps its statements as data (`Stmt`: what kind, the name
defined, the names it was built from, a load's element type and index), so that a kernel
can regroup a body it emitted (the tiled matmul's epilogue loads, matmul_epilogue.py; the
elementwise kernel's stores) without reading the WGSL text back.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from math import prod
from typing import NamedTuple

from .wgsl import ENTRY_NAMES, Kernel, Literal, u32_lit, wgsl_type

_ZERO = u32_lit(0)  # the index of a size-1 axis

EXPR_RULES: dict = {}  # op -> rule(em, node, idx) -> WGSL expression text


def rule(*ops):
    def deco(fn):
        for op in ops:
            EXPR_RULES[op] = fn
        return fn
    return deco


class Stmt(NamedTuple):
    """One emitted statement as data. kind: "let" (an immutable name), "load" (a let whose
    value is a storage read), "store" (Emitter.store) or "other" (anything else: a var,
    a block's braces, a line a builder wrote). deps: the names its value is built from; for
    a let an expression rule made, every name the emitter handed out to the rule while it
    ran (a superset: enough to know what it may depend on, through those names' own deps).
    A load also has `elem` (the element type of the array it reads; "f16" is read widened
    to f32) and `at` (the flat index, before the storage's offset)."""
    text: str
    kind: str = "other"
    name: str | None = None
    deps: frozenset = frozenset()
    elem: str | None = None
    at: str | None = None


@dataclass(frozen=True)
class Epilogue:
    """An epilogue function as data (program.GroupCtx.epilogue): `fn name(params, v: dtype)`
    with the statements of its body, `flat` the name of its flat-index parameter (None:
    it takes a grid index) and `slot` its place in its kernel's functions, where a builder
    may put other functions in its stead (the tiled matmul's prefetching form)."""
    name: str
    params: str
    dtype: str
    stmts: tuple
    flat: str | None
    slot: int

    def function(self, lines=None, extra: str = "") -> str:
        """Its WGSL text: the body's lines (or `lines`), `extra` after the parameters."""
        body = [s.text for s in self.stmts] if lines is None else lines
        return (f"fn {self.name}({self.params}, v: {self.dtype}{extra}) {{\n"
                + "\n".join(body) + "\n}\n")

    @property
    def line_count(self) -> int:
        """Lines of the function: the header, the body and the closing brace."""
        return len(self.stmts) + 2


@dataclass(frozen=True)
class Storage:
    """Where a tensor lives: a plan buffer, an element offset, its dtype: the element type of
    the buffer, "f16" for an f16 value stored in half the bytes (program.py's half_storage),
    whose loads widen to f32 and whose stores round (the value computed is f32 text)."""
    buffer: int
    offset: int
    dtype: str
    nbytes: int
    what: str  # for error messages: "param 'l1.W'", "%12 matmul at model.py:7"


class Idx:
    """An index into a tensor of `shape`: per-dim u32 expressions and/or the flat index."""
    __slots__ = ("shape", "_dims", "_flat")

    def __init__(self, shape, dims=None, flat=None):
        self.shape = tuple(shape)
        self._dims = list(dims) if dims is not None else None
        self._flat = flat
        if dims is None and flat is None:
            raise ValueError("Idx needs dims or flat")

    # Derived forms are not cached on the Idx: an Idx may be used in several blocks (a loop
    # body, then after it), and the emitter's CSE already reuses a name where it is in scope.
    def dims(self, em: "Emitter") -> list[str]:
        return self._dims if self._dims is not None else em.unravel(self._flat, self.shape)

    def flat(self, em: "Emitter") -> str:
        return self._flat if self._flat is not None else em.ravel(self._dims, self.shape)

    @property
    def known_flat(self):
        return self._flat


class Emitter:
    """Writes the statements of one WGSL function body.

    storage(n) -> Storage | None  where node n lives (None: compute it here)
    compute:   nodes computed in this kernel even though they have storage (the kernel's
               own fused outputs: read at the same index they are computed, never loaded)
    bound:     {node: (flat index text, WGSL name)}: a kernel's main result, valid at
               exactly that index (the epilogue)
    given:     {node: WGSL name}: a value the builder computed itself, read wherever the
               node is read (the row sum of the matrix-vector kernel's A, gemv_prologue.py,
               which sets it to the row's sum before it reads that row)
    """

    def __init__(self, kernel: Kernel, graph, storage, compute=(), bound=None, indent=1):
        self.k, self.g, self.storage = kernel, graph, storage
        self.compute = set(compute)
        self.bound = dict(bound or {})
        self.given: dict[int, str] = {}
        self.lines: list[str] = []
        self.stmts: list[Stmt] = []  # the statements of `lines`, as emitted (see Stmt)
        self._frames: list[set[str]] = []  # names handed out to each value() now running
        self._ind = indent
        self._scopes: list[dict[str, str]] = [{}]
        self._counter = [0]
        # the names of this body that let() hands back as they are (no `let` of a bare
        # name): those fresh() made and those declared (entry-point builtins, a builder's)
        self.names: set[str] = set(ENTRY_NAMES)

    def fork(self, indent=1) -> "Emitter":
        """A fresh body (another function) over the same kernel and tensors."""
        em = Emitter(self.k, self.g, self.storage, self.compute, self.bound, indent)
        em._counter = self._counter  # names stay unique across the module
        em.names = self.names
        return em

    # -- statements
    def emit(self, line: str, **stmt) -> None:
        """Append a line (at the current indent); `stmt`: its Stmt fields (kind, name, ...)."""
        text = "  " * self._ind + line
        self.lines.append(text)
        self.stmts.append(Stmt(text, **stmt) if stmt else Stmt(text))

    def take_stores(self, at: int) -> list[str]:
        """Remove the stores emitted since statement `at` (len(stmts) then) and return their
        lines, so that a caller can place them later (after every value is computed)."""
        assert len(self.stmts) == len(self.lines), "lines edited outside the emitter"
        mine = [s.text for s in self.stmts[at:] if s.kind == "store"]
        self.stmts[at:] = [s for s in self.stmts[at:] if s.kind != "store"]
        self.lines[at:] = [s.text for s in self.stmts[at:]]
        return mine

    def _hand(self, name: str) -> str:
        """A name given to a caller: a dependency of the value() (or load()) now running.
        Only of the innermost one: what that value is built from is a dependency of its
        own name, which the value() around it gets."""
        if self._frames:
            self._frames[-1].add(name)
        return name

    def _deps(self, deps) -> frozenset:
        if deps is not None:
            return frozenset(deps)
        return frozenset(self._frames[-1]) if self._frames else frozenset()

    def fresh(self, prefix="v") -> str:
        self._counter[0] += 1
        name = f"{prefix}{self._counter[0]}"
        self.names.add(name)
        return name

    def declare(self, *names: str) -> None:
        """Names a builder wrote itself (its own `let`s, loop variables, function parameters)
        that may come back to let() or be returned by a rule: let() then hands them back as
        they are. A name not declared is still correct WGSL, only one `let` longer."""
        self.names.update(names)

    def let(self, expr: str, deps=None, kind: str = "let", **stmt) -> str:
        """A name for `expr` (deps: the names it is built from; None: those handed out
        while the value() now running computed it). A name of this module (fresh or
        declared) or a literal (wgsl.Literal) is its own name."""
        if isinstance(expr, Literal) or expr in self.names:
            return self._hand(expr)
        for scope in reversed(self._scopes):
            if expr in scope:
                return self._hand(scope[expr])
        name = self.fresh()
        self.emit(f"let {name} = {expr};", kind=kind, name=name, deps=self._deps(deps), **stmt)
        self._scopes[-1][expr] = name
        return self._hand(name)

    def snapshot(self, expr: str) -> str:
        """A `let` that is never shared: for reads of memory that changes (shared arrays)."""
        name = self.fresh()
        self.emit(f"let {name} = {expr};", kind="let", name=name, deps=self._deps(None))
        return self._hand(name)

    def var(self, ty: str, init: str, prefix="a") -> str:
        name = self.fresh(prefix)
        self.emit(f"var {name}: {ty} = {init};")
        return self._hand(name)

    @contextmanager
    def block(self, header: str):
        """`header {` ... `}` with its own CSE scope (names made inside stay inside)."""
        self.emit(header + " {")
        self._ind += 1
        self._scopes.append({})
        try:
            yield
        finally:
            self._scopes.pop()
            self._ind -= 1
            self.emit("}")

    # -- indices
    def ravel(self, dims, shape) -> str:
        terms = []
        for k, d in enumerate(shape):
            if d == 1:
                continue
            stride = prod(shape[k + 1:])
            d = dims[k]
            if stride != 1 and (" + " in d or " - " in d):  # a sum (a row kernel's `c * 4u + 1u`)
                d = f"({d})"
            terms.append(d if stride == 1 else f"{d} * {stride}u")
        if not terms:
            return _ZERO
        flat = self.let(" + ".join(terms), deps=[dims[k] for k, d in enumerate(shape) if d != 1])
        if len(terms) > 1:
            # remembered in this scope (where every name in dims is visible): an unravel
            # of this index regroups dims instead of dividing it again
            self._scopes[-1][("ravel", flat)] = (list(dims), tuple(shape))
        return flat

    def _raveled(self, flat):
        for scope in reversed(self._scopes):
            got = scope.get(("ravel", flat))
            if got is not None:
                return got
        return None

    def unravel(self, flat, shape) -> list[str]:
        known = self._raveled(flat)
        if known is not None and prod(known[1]) == prod(shape):
            return self._regroup(*known, tuple(shape))
        return self._unravel(flat, shape)

    def _regroup(self, dims, src, dst) -> list[str]:
        """dims of `src` (a reshape's input) as dims of `dst`: runs of axes with equal
        products map onto each other, each run raveled and/or unraveled on its own (an
        index made by ravel([b, t, j], [8, 512, 50257]) read as [8, 512, 50257] is [b, t,
        j] again, no division; as [4096, 50257] it is [b * 512 + t, j])."""
        A = [(d, n) for d, n in zip(dims, src) if n != 1]
        B = [n for n in dst if n != 1]
        out: list[str] = []
        i = j = 0
        while i < len(A):
            ga, gb = [A[i]], [B[j]]
            pa, pb = A[i][1], B[j]
            i, j = i + 1, j + 1
            while pa != pb:
                if pa < pb:
                    ga.append(A[i])
                    pa *= A[i][1]
                    i += 1
                else:
                    gb.append(B[j])
                    pb *= B[j]
                    j += 1
            if len(ga) == 1 and len(gb) == 1:
                out.append(self._hand(ga[0][0]))
                continue
            f = ga[0][0] if len(ga) == 1 else self.ravel([d for d, _ in ga], [n for _, n in ga])
            out.extend([f] if len(gb) == 1 else self._unravel(f, gb))
        it = iter(out)
        return [_ZERO if n == 1 else next(it) for n in dst]

    def _unravel(self, flat, shape) -> list[str]:
        out = []
        for k, d in enumerate(shape):
            if d == 1:
                out.append(_ZERO)
                continue
            stride = prod(shape[k + 1:])
            e = flat if stride == 1 else f"({flat} / {stride}u)"
            if prod(shape[:k]) > 1:
                e = f"{e} % {d}u"
            out.append(self.let(e, deps=[flat]))
        return out

    def bcast(self, idx: Idx, in_shape) -> Idx:
        """The index into an operand of shape `in_shape` that numpy-broadcasts to idx.shape."""
        in_shape = tuple(in_shape)
        if prod(in_shape) == prod(idx.shape):  # broadcasting only added size-1 dims
            return Idx(in_shape, flat=idx.flat(self))
        dims = idx.dims(self)
        r = len(idx.shape) - len(in_shape)
        return Idx(in_shape, dims=[_ZERO if in_shape[k] == 1 else dims[r + k]
                                   for k in range(len(in_shape))])

    # -- values
    def value(self, n: int, idx: Idx) -> str:
        if n in self.given:
            return self._hand(self.given[n])
        b = self.bound.get(n)
        if b is not None:
            if idx.known_flat != b[0]:
                raise AssertionError(f"kernel reads its own output %{n} at another index")
            return self._hand(b[1])
        if n not in self.compute:
            st = self.storage(n)
            if st is not None:
                return self.load(st, idx)
        node = self.g[n]
        fn = EXPR_RULES.get(node.op)
        if fn is None:
            raise AssertionError(f"%{n} {node.op} has no storage and no expression rule")
        self._frames.append(set())
        try:
            expr = fn(self, node, idx)
        finally:
            deps = self._frames.pop()
        return self.let(expr, deps=deps)

    def arg(self, node, k: int, idx: Idx) -> str:
        """Input k of an elementwise node at the broadcast index."""
        i = node.inputs[k]
        return self.value(i, self.bcast(idx, self.g[i].shape))

    def load(self, st: Storage, idx: Idx) -> str:
        name = self.k.binding(st.buffer, st.dtype, what=st.what, nbytes=st.nbytes)
        self._frames.append(set())
        try:
            flat = idx.flat(self)
        finally:
            deps = self._frames.pop() | {flat}
        at = flat if st.offset == 0 else f"{st.offset}u + {flat}"
        expr = f"f32({name}[{at}])" if st.dtype == "f16" else f"{name}[{at}]"
        return self.let(expr, deps=deps, kind="load", elem=wgsl_type(st.dtype), at=flat)

    def store(self, st: Storage, flat: str, value: str) -> None:
        name = self.k.binding(st.buffer, st.dtype, write=True, what=st.what, nbytes=st.nbytes)
        at = flat if st.offset == 0 else f"{st.offset}u + {flat}"
        if st.dtype == "f16":
            value = f"f16({value})"
        self.emit(f"{name}[{at}] = {value};", kind="store")
