"""f16 matmul on subgroup matrices (tensor cores through WGSL's
chromium_experimental_subgroup_matrix): C[M, N] = A[M, K] @ B[K, N], row-major, A and B f16
in storage, f32 accumulation, C f32 or f16.

A workgroup computes a BM x BN tile of C with SG_M x SG_N subgroups, each a (BM/SG_M) x
(BN/SG_N) block of MxN result matrices (the adapter's configuration, e.g. 16x16x16 f16 ->
f32). K is walked in steps of BK: the workgroup's threads copy A's BM x BK and B's BK x BN
slabs from storage (16-byte loads, eight f16 each) into workgroup memory with PAD halves at
the end of each row (fewer bank conflicts; rows stay 16-byte aligned), then every subgroup
loads its left and right matrices from there and multiply-accumulates. With `prefetch`, the
next slab's storage loads are issued into registers before this slab's products, and stored
to workgroup memory after them (one buffer, two barriers a step; `peel` takes the last step
out of the loop, whose loads then need no branch); with `double_buffer`, two workgroup
buffers alternate (one barrier a step). `frag` orders the fragment loads of a K slice from
workgroup memory ("row": a left matrix just before its row of products, fewer live).

Tint wants every matrix load and store offset uniform: they are built only from
workgroup_id, @builtin(subgroup_id) and loop counters (never local_invocation_index). The
kernel assumes subgroups of exactly `subgroup_size` invocations (the configuration's min ==
max on NVIDIA: 32), and shapes that are whole multiples of the tile (MmaTiling.check says
what to change otherwise). f16 C goes through per-subgroup f32 staging matrices in
workgroup memory (as the epilogue's), converted and stored by the subgroup's own
invocations, 32 neighbouring elements a store (or out_vec neighbours a word each), `stage`
matrices of a row a round. The staging's size counts: on the H200 the 128 x 128 tile ran
at 237 TFLOP/s with one matrix staged (23 KB of workgroup memory) and 154 with a row of
four (35 KB), so one matrix is the compiler's default for f16 C and epilogues
(KernelOptions.mma_stage, mma_epi_stage).

`mma_matmul_wgsl(M, N, K, tiling)` returns the WGSL and the dispatch size; bindings: 0 A
(array<vec4<u32>>, f16 pairs; vec2<u32> or u32 with `width` 4 or 2), 1 B (likewise), 2 C
(array<f32> or array<f16>). An epilogue's results can also go in rounds of several rows of
result matrices (epi_rows, where workgroup memory allows) and several neighbours per
invocation (epi_vec): epilogue_rounds. The compiler (matmul._build_mma) passes its own declarations instead (Kernel.module_scope: the group's
bindings and epilogue function), a batch (workgroup_id.z, with each operand's offset as a
WGSL expression of it) and the epilogue's name: C's elements then go to `epi(flat, v)` from
workgroup memory, a row of each subgroup's result matrices at a time.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace


_LATER_FIELDS = ("frag", "peel", "width", "epi_rows", "epi_vec", "out_vec", "epi_ahead", "a_t", "b_t",
                 "a_x", "b_x")
# the storage element holding this many f16 halves (the copies' width, the bindings')
_WORDS = {8: "vec4<u32>", 4: "vec2<u32>", 2: "u32"}


@dataclass(frozen=True, repr=False)
class MmaTiling:
    bm: int = 128            # workgroup tile rows of C
    bn: int = 128            # workgroup tile columns of C
    bk: int = 32             # K per slab
    sg_m: int = 2            # subgroups along M
    sg_n: int = 2            # subgroups along N
    m: int = 16              # the subgroup-matrix configuration: M x N result, K inner
    n: int = 16
    k: int = 16
    subgroup_size: int = 32
    pad: int = 8             # f16 padding at the end of each workgroup-memory row
    prefetch: bool = True
    double_buffer: bool = False
    out: str = "f32"         # C's type: f32 or f16
    swizzle: int = 0         # > 0: workgroups walk C in bands of this many tile rows, column
                             # by column (tiles running together share more of A and B in L2)
    copy: str = "threads"    # storage -> workgroup memory: "threads" (16-byte loads, f16
                             # stores) or "matrix" (subgroupMatrixLoad from storage, then
                             # subgroupMatrixStore: the driver's own wide accesses)
    stage: int = 0           # f16 C and an epilogue: result matrices of a row staged at a time
                             # (0: the row's tn). Workgroup memory decides how many workgroups
                             # an SM holds: on the H200 the 128x128 tile's slabs and a row's
                             # staging (35 KB) ran f16 C at 154 TFLOP/s, with one matrix
                             # staged (23 KB) 237, as f32 C (KernelOptions.mma_stage, mma_epi_stage)
    frag: str = "all"        # a K slice's fragments from workgroup memory: "all" (its tm left
                             # and tn right matrices, then the tm x tn products) or "row" (the
                             # tn right ones, then each left one followed by its row of tn
                             # products: tn + 1 fragments live instead of tm + tn)
    peel: bool = False       # prefetch without double_buffer: the last K step out of the loop,
                             # so the loop's next-slab loads need no branch around them
    width: int = 8           # copy="threads": halves per storage load, 8 (vec4<u32>), 4
                             # (vec2<u32>) or 2 (u32). Each f16 store of the copy then has
                             # neighbouring invocations 2 * width bytes apart in workgroup
                             # memory: 8 puts a subgroup's 32 stores on 8 of the 32 banks
                             # (4-way conflicts), 2 on 32 (none). Below 8: the kernel's own
                             # bindings (the compiler binds vec2<u32> for 4: KernelOptions.
                             # mma_width), or 4 from vec4<u32> ones (mma_matmul_wgsl's bound)
    epi_rows: int = 1        # an epilogue's rows of result matrices staged a round (divides
                             # tm): fewer rounds, two barriers each (KernelOptions.mma_epi_rows)
    epi_vec: int = 1         # an epilogue's consecutive elements per invocation a step (1: 32
                             # neighbours a call; v: each invocation reads v neighbouring f32
                             # of the staging and calls the epilogue on v neighbouring flat
                             # indices; KernelOptions.mma_epi_vec)

    out_vec: int = 1         # f16 C without an epilogue: halves each invocation converts and
                             # stores at once (1: one f16 a store; 2, 4, 8: a u32, vec2<u32>
                             # or vec4<u32> of neighbours, C bound as such; KernelOptions.
                             # mma_out_vec)
    epi_ahead: bool = False  # an epilogue whose loads go first (epi_ld): each round's loads
                             # issued before the round ahead of it is handed over (the first
                             # round's before its staging), so they are in flight across the
                             # barriers and stores (KernelOptions.mma_epi_ahead)
    a_t: bool = False        # A stored transposed, [K, M] with M fastest (x^T of a weight
                             # gradient): its slab staged k by rows as stored, the left
                             # matrices loaded column-major from there (copy "threads")
    b_t: bool = False        # B stored transposed, [N, K] with K fastest (W^T of an input
                             # gradient): likewise, the right matrices loaded column-major
    a_x: bool = False        # the copy transposes A's slab on its way to workgroup memory
                             # (copy "threads"): consecutive invocations take consecutive rows
                             # of the slab as stored and put each of their halves in a row of
                             # its own, so a subgroup's f16 stores fill consecutive words (with
                             # 16-byte rows, four invocations share a bank); the left matrices
                             # are then loaded with the other major (column-major for row-major A)
    b_x: bool = False        # likewise for B's slab and the right matrices

    def __repr__(self) -> str:
        # the fields added after the kernel's first measurements appear only where they
        # differ from their defaults, so the kernels emitted before them keep their first
        # line (the WGSL names its tiling there) and their hashes
        out = []
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name not in _LATER_FIELDS or v != f.default:
                out.append(f"{f.name}={v!r}")
        return f"MmaTiling({', '.join(out)})"

    @property
    def threads(self) -> int:
        return self.sg_m * self.sg_n * self.subgroup_size

    @property
    def tm(self) -> int:     # result matrices per subgroup along M
        return self.bm // self.sg_m // self.m

    @property
    def tn(self) -> int:
        return self.bn // self.sg_n // self.n

    @property
    def staged(self) -> int:  # staged matrices per round (f16 C, an epilogue)
        return self.stage or self.tn

    def slab_rows(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """(rows, row length) of A's and B's slab in workgroup memory, before padding: as
        they are stored (a_t: k rows of m; b_t: n rows of k)."""
        return ((self.bk, self.bm) if self.a_t else (self.bm, self.bk),
                (self.bn, self.bk) if self.b_t else (self.bk, self.bn))

    def shared_rows(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """(rows, row length) of A's and B's slab in workgroup memory, before padding: as
        stored, or the other way round where the copy transposes it (a_x, b_x)."""
        return tuple((c, r) if x else (r, c)
                     for (r, c), x in zip(self.slab_rows(), (self.a_x, self.b_x)))

    def workgroup_bytes(self) -> int:
        slabs = 2 * sum(r * (c + self.pad) for r, c in self.shared_rows())
        staging = 4 * self.m * self.n * self.staged * self.sg_m * self.sg_n if self.out == "f16" else 0
        return slabs * (2 if self.double_buffer else 1) + staging

    def check(self, M: int, N: int, K: int, max_workgroup_bytes: int | None = None) -> None:
        """A clear ValueError for a tiling or shape the kernel cannot take."""
        def need(ok, what):
            if not ok:
                raise ValueError(f"mma matmul {M}x{K} @ {K}x{N} with {self}: {what}")
        need(self.out in ("f32", "f16"), "out must be 'f32' or 'f16'")
        need(self.copy in ("threads", "matrix"), "copy must be 'threads' or 'matrix'")
        need(self.frag in ("all", "row"), "frag must be 'all' or 'row'")
        need(self.width in (2, 4, 8), "width must be 2, 4 or 8 halves")
        need(self.epi_rows >= 1 and self.tm % self.epi_rows == 0,
             f"epi_rows must divide the {self.tm} rows of result matrices of a subgroup")
        need(self.epi_vec in (1, 2, 4, 8) and (self.tn * self.n) % self.epi_vec == 0,
             "epi_vec must be 1, 2, 4 or 8 and divide a row of result matrices")
        need(self.bm % (self.sg_m * self.m) == 0 and self.bn % (self.sg_n * self.n) == 0,
             "bm must be a multiple of sg_m * m and bn of sg_n * n")
        need(self.bk % self.k == 0 and self.bk % 8 == 0, "bk must be a multiple of k and of 8")
        need(self.pad % 8 == 0, "pad must be a multiple of 8 halves (16-byte rows)")
        need(M % self.bm == 0 and N % self.bn == 0 and K % self.bk == 0,
             f"M must be a multiple of bm {self.bm}, N of bn {self.bn}, K of bk {self.bk} "
             "(pad the operands, or pick a tiling that divides them)")
        need(self.copy == "threads" or not (self.a_t or self.b_t or self.a_x or self.b_x),
             "a transposed operand (a_t, b_t) or copy (a_x, b_x) is copied by the threads "
             "(copy='threads')")
        for (rows, cols), (r, c) in zip(self.slab_rows(), ((self.m, self.k), (self.k, self.n))):
            if self.copy == "threads":
                need((rows * cols // self.width) % self.threads == 0,
                     f"a {rows}x{cols} slab must split evenly over {self.threads} invocations "
                     f"({self.width} halves each)")
            else:
                need((rows // r) * (cols // c) % (self.sg_m * self.sg_n) == 0,
                     f"a {rows}x{cols} slab's {r}x{c} matrices must split evenly over "
                     f"{self.sg_m * self.sg_n} subgroups")
        need(self.out_vec in (1, 2, 4, 8), "out_vec must be 1, 2, 4 or 8 halves")
        need(self.stage >= 0 and self.tn % self.staged == 0,
             f"stage must divide the {self.tn} matrices of a row")
        if self.out == "f16":
            need((self.m * self.n) % self.subgroup_size == 0, "m * n must split over a subgroup")
            need((self.m * self.n * self.staged) % (self.subgroup_size * self.out_vec) == 0,
                 "out_vec must split a staging round's elements over a subgroup")
        if max_workgroup_bytes is not None:
            need(self.workgroup_bytes() <= max_workgroup_bytes,
                 f"{self.workgroup_bytes()} bytes of workgroup memory, the device allows "
                 f"{max_workgroup_bytes}")


def transposed_views_for(limits):
    """The precision pass's transposed_views for a mixed program lowered with `limits`
    (KernelOptions.mma_transposed; None: True where the products run on subgroup matrices,
    an adapter with shader-f16 and an f16 -> f32 configuration, else False: the views would
    only move the transposes into the other kernels' reads)."""
    mode = getattr(getattr(limits, "options", None), "mma_transposed", False)
    if mode is not None:
        return mode
    return bool(getattr(limits, "shader_f16", False) and
                config_for(getattr(limits, "subgroup_matrix", ())))


def config_for(configs):
    """The (m, n, k, subgroup size) of an f16 configuration among the adapter's
    (codegen Limits.subgroup_matrix tuples), preferring 16x16x16; None if there is none."""
    best = None
    for comp, res, m, n, k, lo, hi in configs:
        if comp != "f16" or res != "f32" or lo != hi:   # f32 accumulation, a fixed subgroup size
            continue
        key = (m * n * k, m == n)
        if best is None or key > best[0]:
            best = (key, (m, n, k, lo))
    return best and best[1]


@dataclass(frozen=True)
class Slab:
    """One operand's slab of a K step, as mma_matmul_wgsl copies it: `name` ("a" / "b":
    its registers p<name>* / r<name>*), storage array `arr`, workgroup arrays `shared`<b>;
    as subgroup matrices (`matrix` type, `matrices` per subgroup, `per_row` of them per
    slab row, each mr x mc), or as loads of t.width halves (`vecs` per invocation,
    `vec_row` per slab row); storage rows `ld` halves long, workgroup rows `stride`;
    origin(kexpr): the slab's (first row, first column) in storage, as WGSL; `off`: the
    batch element's offset added to each storage index ("" or " + ab", in the loads' units);
    xpose: consecutive invocations take consecutive stored rows, their halves each stored
    to a row of its own."""
    name: str
    arr: str
    shared: str
    matrix: str
    matrices: int
    per_row: int
    mr: int
    mc: int
    ld: int
    stride: int
    vecs: int
    vec_row: int
    origin: object
    off: str = ""
    rows: int = 0            # xpose: the slab's rows as stored (invocation i takes row i % rows)
    xpose: bool = False      # the copy transposes (MmaTiling.a_x / b_x): workgroup row c of
                             # the slab holds its column c as stored


def slab_loads(t: MmaTiling, sl: Slab, kexpr: str, bound: int = 0) -> list[str]:
    """The slab's storage loads into its registers, for the K step at `kexpr`; bound: the
    halves of the storage array's element where it is wider than t.width (the compiler's
    vec4<u32> with width 4: the vec4 holding the invocation's four halves, and that half)."""
    row0, col0 = sl.origin(kexpr)
    out = []
    if t.copy == "matrix":   # matrix q of the slab: uniform (subgroup_id, loop counter)
        for r in range(sl.matrices):
            q = f"(sg * {sl.matrices}u + {r}u)"
            out.append(f"    p{sl.name}{r} = subgroupMatrixLoad<{sl.matrix}>(&{sl.arr}, ({row0} + "
                       f"({q} / {sl.per_row}u) * {sl.mr}u) * {sl.ld}u + {col0} + ({q} % "
                       f"{sl.per_row}u) * {sl.mc}u{sl.off}, false, {sl.ld}u);")
        return out
    for r in range(sl.vecs):
        i = f"i{sl.name}{r}"
        row, vec = ((f"{i} % {sl.rows}u", f"{i} / {sl.rows}u") if sl.xpose else
                    (f"{i} / {sl.vec_row}u", f"{i} % {sl.vec_row}u"))
        unit = (f"({row0} + {row}) * {sl.ld // t.width}u + {col0} / {t.width}u + "
                f"{vec}{sl.off}")
        out.append(f"    let {i} = li + {r * t.threads}u;")
        if bound and bound != t.width:   # (check_bound: 4 halves of a vec4)
            u, x = f"u{sl.name}{r}", f"x{sl.name}{r}"
            out += [f"    let {u} = {unit};",
                    f"    let {x} = {sl.arr}[{u} / 2u];",
                    f"    r{sl.name}{r} = select({x}.xy, {x}.zw, ({u} & 1u) == 1u);"]
        else:
            out.append(f"    r{sl.name}{r} = {sl.arr}[{unit}];")
    return out


def slab_stores(t: MmaTiling, sl: Slab, b: int) -> list[str]:
    """The slab's registers stored into workgroup buffer `b` (As<b> / Bs<b>)."""
    arr, out = f"{sl.shared}{b}", []
    if t.copy == "matrix":
        for r in range(sl.matrices):
            q = f"(sg * {sl.matrices}u + {r}u)"
            out.append(f"    subgroupMatrixStore(&{arr}, ({q} / {sl.per_row}u) * "
                       f"{sl.mr * sl.stride}u + ({q} % {sl.per_row}u) * {sl.mc}u, "
                       f"p{sl.name}{r}, false, {sl.stride}u);")
        return out
    for r in range(sl.vecs):
        if sl.xpose:   # half c of stored row i % rows, vector i / rows: workgroup row
            # (i / rows) * width + c, column i % rows
            out.append(f"    {{ let i = li + {r * t.threads}u; let o = (i / {sl.rows}u) * "
                       f"{t.width * sl.stride}u + i % {sl.rows}u;")
            at = [f"o + {c * sl.stride}u" for c in range(t.width)]
        else:
            out.append(f"    {{ let i = li + {r * t.threads}u; let o = (i / {sl.vec_row}u) * "
                       f"{sl.stride}u + (i % {sl.vec_row}u) * {t.width}u;")
            at = [f"o + {c}u" for c in range(t.width)]
        for c, comp in enumerate("xyzw"[:t.width // 2]):
            part = f".{comp}" if t.width > 2 else ""
            out.append(f"      let h{c} = bitcast<vec2<f16>>(r{sl.name}{r}{part}); "
                       f"{arr}[{at[2 * c]}] = h{c}.x; {arr}[{at[2 * c + 1]}] = h{c}.y;")
        out.append("    }")
    return out


def mma_matmul_wgsl(M: int, N: int, K: int, t: MmaTiling = MmaTiling(),
                    max_workgroup_bytes: int | None = None, *, batch: int = 1,
                    a_base: str = "", b_base: str = "", header: list[str] | None = None,
                    names: tuple[str, str, str] = ("A", "B", "C"),
                    epi: str | None = None, lda: int | None = None, ldb: int | None = None,
                    epi_ld: int = 0, bound: int | None = None) -> tuple[str, tuple[int, int, int]]:
    """(WGSL, workgroups) of C = A @ B with tiling t (see the module docstring).

    batch > 1: workgroup_id.z is the batch element; a_base / b_base are WGSL expressions of
    `wg.z` giving that element's offset into A / B in halves (multiples of 8, for the
    16-byte loads; "" for 0: a shared operand), and C's is wg.z * M * N. header: the
    module's declarations in place of the three bindings (codegen's Kernel.module_scope,
    binding names `names`); epi: the name of a WGSL `fn epi(f: u32, v: f32)` in it that
    takes each result at its flat index f (the group's epilogue: bias, GELU, residual adds,
    f16 stores), called per element from workgroup memory: each subgroup stores a row of
    its result matrices (tn of them, an m x tn n block), then its invocations take the
    block's elements in order (32 neighbours a call: coalesced loads and stores in the
    epilogue), two barriers per row. lda: A's row length in halves where it is longer than
    K (a K chunk of a split product, mma_splits: chunk wg.z at a_base = wg.z * K); ldb:
    B's where it is stored transposed (b_t) and its rows are longer than K (such a chunk).
    epi_ld: the epilogue was split (matmul_epilogue.prefetch_epilogue: `epi_ld(f)` loads,
    `epi(f, v, p)` the rest): each invocation calls epi_ld for that many of its elements
    before their epi calls, so their loads are in flight together (the GPU's compiler keeps
    a load after any earlier storage store: one element after another waits out a memory
    latency). bound: halves per element of A's and B's bindings (default: t.width for the
    kernel's own, 8 with a header: the compiler binds vec4<u32>); a width-4 tiling reads
    those vec4s for its halves (slab_loads). t.epi_rows and t.epi_vec (above 1) take the
    epilogue's results in larger rounds and several neighbours per invocation
    (epilogue_rounds)."""
    staging = epilogue_staging_bytes(t) if epi is not None else 0
    t.check(M, N, K, None if max_workgroup_bytes is None else max_workgroup_bytes - staging)
    if epi is not None and (t.out != "f32" or (t.m * t.n) % t.subgroup_size):
        raise ValueError(f"mma matmul with an epilogue: {t} must have out='f32' and m * n a "
                         "multiple of the subgroup size")
    An, Bn, Cn = names
    if (lda is not None and t.a_t) or (ldb is not None and not t.b_t):
        raise ValueError(f"mma matmul with {t}: lda is A's row length along K (not with "
                         "a_t), ldb B's where b_t")
    (ra_, ca_), (rb_, cb_) = t.slab_rows()           # as stored
    (wra, wca), (wrb, wcb) = t.shared_rows()         # in workgroup memory
    sa, sb = wca + t.pad, wcb + t.pad              # workgroup row strides (halves)
    a_size, b_size = wra * sa, wrb * sb
    w = t.width
    va, vb = t.bm * t.bk // w // t.threads, t.bk * t.bn // w // t.threads   # loads each
    rows_a, rows_b = ca_ // w, cb_ // w            # loads per slab row
    nbuf = 2 if t.double_buffer else 1
    bound = bound or (8 if header is not None else w)
    if t.copy == "threads" and bound != w and (bound, w) != (8, 4):
        raise ValueError(f"mma matmul with {t}: width {w} from bindings of {bound} halves; "
                         "the kernel reads width 4 from vec4<u32> (8) or its own bindings "
                         "of the width (header=None)")
    vec = _WORDS[w]
    elem = _WORDS[bound] if t.copy == "threads" else "f16"
    nsg = t.sg_m * t.sg_n
    ma, mb = (t.bm // t.m) * (t.bk // t.k) // nsg, (t.bk // t.k) * (t.bn // t.n) // nsg
    what = (f"{batch} x " if batch > 1 else "") + f"{M}x{K} @ {K}x{N} -> " + ("epilogue" if epi else t.out)
    L = [f"// webgrad mma matmul {what}: {t}",
         "enable f16;", "enable subgroups;", "enable chromium_experimental_subgroup_matrix;", ""]
    if header is None:
        L += [f"@group(0) @binding(0) var<storage, read> A: array<{elem}>;",
              f"@group(0) @binding(1) var<storage, read> B: array<{elem}>;",
              f"@group(0) @binding(2) var<storage, read_write> C: array<{c_elem(t)}>;"]
    else:
        L += header
    for b in range(nbuf):
        L += [f"var<workgroup> As{b}: array<f16, {a_size}>;",
              f"var<workgroup> Bs{b}: array<f16, {b_size}>;"]
    if epi is not None:
        L.append(f"var<workgroup> Cs: array<f32, {epilogue_staging_bytes(t) // 4}>;")
    elif t.out == "f16":
        L.append(f"var<workgroup> Cs: array<f32, {t.m * t.n * t.staged * t.sg_m * t.sg_n}>;")
    left = f"subgroup_matrix_left<f16, {t.k}, {t.m}>"
    right = f"subgroup_matrix_right<f16, {t.n}, {t.k}>"
    res = f"subgroup_matrix_result<f32, {t.n}, {t.m}>"
    L += ["", f"@compute @workgroup_size({t.threads})",
          "fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32,",
          "        @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {"]
    gx, gy = N // t.bn, M // t.bm
    if t.swizzle and gy % t.swizzle == 0:
        g = t.swizzle
        L += [f"  let pid = wg.y * {gx}u + wg.x;",
              f"  let m0 = ((pid / {g * gx}u) * {g}u + pid % {g}u) * {t.bm}u;",
              f"  let n0 = ((pid % {g * gx}u) / {g}u) * {t.bn}u;"]
    else:
        L += [f"  let m0 = wg.y * {t.bm}u;",
              f"  let n0 = wg.x * {t.bn}u;"]
    L += [
          f"  let sm = (sg / {t.sg_n}u) * {t.bm // t.sg_m}u;   // this subgroup's block in the tile",
          f"  let sn = (sg % {t.sg_n}u) * {t.bn // t.sg_n}u;"]
    # batch element wg.z: the operands' offsets (load units for the thread copies, halves
    # for matrix loads) and C's
    unit = f" / {w}u" if t.copy == "threads" else ""
    ao = f" + ab" if a_base else ""
    bo = f" + bb" if b_base else ""
    if a_base:
        L.append(f"  let ab = ({a_base}){unit};")
    if b_base:
        L.append(f"  let bb = ({b_base}){unit};")
    cb = ""
    if batch > 1:
        L.append(f"  let cb = wg.z * {M * N}u;")
        cb = "cb + "
    for i in range(t.tm):
        for j in range(t.tn):
            L.append(f"  var acc{i}_{j} = {res}();")
    # the two slabs a K step copies: A's bm x bk (m x k matrices) and B's bk x bn (k x n)
    # (transposed: A's k rows of m from storage [K, M], B's n rows of k from [N, K])
    slabs = (Slab("a", An, "As", left, ma, t.bk // t.k, t.m, t.k, M if t.a_t else lda or K, sa,
                  va, rows_a, (lambda kexpr: (f"({kexpr})", "m0")) if t.a_t else
                  (lambda kexpr: ("m0", f"({kexpr})")), ao, ra_, t.a_x),
             Slab("b", Bn, "Bs", right, mb, t.bn // t.n, t.k, t.n, ldb or K if t.b_t else N, sb, vb,
                  rows_b, (lambda kexpr: ("n0", f"({kexpr})")) if t.b_t else
                  (lambda kexpr: (f"({kexpr})", "n0")), bo, rb_, t.b_x))

    def left_at(kk, i):   # (offset, column-major) of left matrix i of K slice kk in As
        return ((f"{kk * t.k * sa}u + sm + {i * t.m}u", "true") if t.a_t != t.a_x else
                (f"(sm + {i * t.m}u) * {sa}u + {kk * t.k}u", "false"))

    def right_at(kk, j):
        return ((f"(sn + {j * t.n}u) * {sb}u + {kk * t.k}u", "true") if t.b_t != t.b_x else
                (f"{kk * t.k * sb}u + sn + {j * t.n}u", "false"))

    def loads(kexpr):  # one slab pair's storage loads into registers (pa*, pb* / ra*, rb*)
        return [ln for sl in slabs for ln in slab_loads(t, sl, kexpr, bound)]

    def stores(b):  # ... and their stores into workgroup buffer `b`
        return [ln for sl in slabs for ln in slab_stores(t, sl, b)]

    def products(b):
        out = []
        for kk in range(t.bk // t.k):
            lefts = [f"    let a{kk}_{i} = subgroupMatrixLoad<{left}>(&As{b}, "
                     f"{', '.join(left_at(kk, i))}, {sa}u);" for i in range(t.tm)]
            for j in range(t.tn):
                out.append(f"    let b{kk}_{j} = subgroupMatrixLoad<{right}>(&Bs{b}, "
                           f"{', '.join(right_at(kk, j))}, {sb}u);")
            if t.frag == "all":
                out[len(out) - t.tn:len(out) - t.tn] = lefts   # the lefts first, as measured
            for i in range(t.tm):
                if t.frag == "row":
                    out.append(lefts[i])
                for j in range(t.tn):
                    out.append(f"    acc{i}_{j} = subgroupMatrixMultiplyAccumulate("
                               f"a{kk}_{i}, b{kk}_{j}, acc{i}_{j});")
        return out

    for sl in slabs:
        L += ([f"  var p{sl.name}{r} = {sl.matrix}();" for r in range(sl.matrices)]
              if t.copy == "matrix" else [f"  var r{sl.name}{r}: {vec};" for r in range(sl.vecs)])
    steps = K // t.bk
    if t.double_buffer:
        L += ["  {"] + loads("0u") + stores(0) + ["  }", "  workgroupBarrier();"]
        L.append(f"  for (var s = 0u; s < {steps}u; s += 2u) {{")
        for cur in (0, 1):
            nxt = 1 - cur
            step = "s" if cur == 0 else "s + 1u"
            L.append(f"   if ({step} < {steps}u) {{")
            L.append(f"    let more = {step} + 1u < {steps}u;")
            L += ["    if (more) {"] + ["  " + x for x in loads(f"({step} + 1u) * {t.bk}u")] + ["    }"]
            L += products(cur)
            L += ["    if (more) {"] + ["  " + x for x in stores(nxt)] + ["    }"]
            L.append("    workgroupBarrier();")
            L.append("   }")
        L.append("  }")
    else:
        if t.prefetch:
            L += ["  {"] + loads("0u") + ["  }"]
        peel = t.peel and t.prefetch
        L.append(f"  for (var s = 0u; s < {steps - 1 if peel else steps}u; s++) {{")
        if not t.prefetch:
            L += loads(f"s * {t.bk}u")
        L += stores(0) + ["    workgroupBarrier();"]
        if peel:
            L += loads(f"(s + 1u) * {t.bk}u")
        elif t.prefetch:
            L += [f"    if (s + 1u < {steps}u) {{"] + ["  " + x for x in loads(f"(s + 1u) * {t.bk}u")] + ["    }"]
        L += products(0) + ["    workgroupBarrier();", "  }"]
        if peel:   # the last slab, already in registers
            L += ["  {"] + stores(0) + ["    workgroupBarrier();"] + products(0) + \
                ["    workgroupBarrier();", "  }"]
    # the results
    def put(flat, v):  # one element from the staging matrices: the epilogue, or f16 C
        return f"    {epi}({flat}, {v});" if epi is not None else f"    {Cn}[{flat}] = f16({v});"
    staged = epi is not None or t.out == "f16"
    if epi is not None and (t.epi_rows > 1 or t.epi_vec > 1):
        L += epilogue_rounds(t, N, epi, epi_ld, cb)
        staged = False
    c = t.staged                                     # matrices a round: a row, or t.stage
    for i, j0 in ((i, j0) for i in range(t.tm if staged else 0) for j0 in range(0, t.tn, c)):
        w = c * t.n                                    # the staged block's width
        base = f"sg * {t.m * w}u"
        L += [f"  subgroupMatrixStore(&Cs, {base} + {j * t.n}u, acc{i}_{j0 + j}, false, {w}u);"
              for j in range(c)]
        def flat(q):
            col = f" + {j0 * t.n}u" if j0 else ""
            return f"{cb}(m0 + sm + {i * t.m}u + {q} / {w}u) * {N}u + n0 + sn{col} + {q} % {w}u"
        count = t.m * w // t.subgroup_size
        if epi is None and t.out_vec > 1:   # v neighbours converted, one store of their words
            v = t.out_vec
            count //= v
            # each half the f16() conversion of the one-a-store path (the same rounding), its
            # pair packed exactly (naga refuses bitcast<u32>(vec2<f16>))
            halves = [f"f32(f16(Cs[x + {k}u]))" for k in range(v)]
            words = [f"pack2x16float(vec2<f32>({halves[k]}, {halves[k + 1]}))" for k in range(0, v, 2)]
            value = words[0] if v == 2 else f"{_WORDS[v]}({', '.join(words)})"
            body = [f"    let q = (e * {t.subgroup_size}u + lane) * {v}u;",
                    f"    let x = {base} + q;",
                    f"    {Cn}[({flat('q')}) / {v}u] = {value};"]
            step = "e++"
        elif epi_ld:   # u elements' loads, then their calls (u divides count)
            u = next(u for u in (epi_ld, 4, 2, 1) if count % u == 0)
            body = [f"    let q{k} = (e + {k}u) * {t.subgroup_size}u + lane;\n"
                    f"    let p{k} = {epi}_ld({flat(f'q{k}')});" for k in range(u)]
            body += [f"    {epi}({flat(f'q{k}')}, Cs[{base} + q{k}], p{k});" for k in range(u)]
            step = f"e += {u}u"
        else:
            body = [f"    let q = e * {t.subgroup_size}u + lane;", put(flat("q"), f"Cs[{base} + q]")]
            step = "e++"
        L += ["  workgroupBarrier();", f"  for (var e = 0u; e < {count}u; {step}) {{", *body, "  }",
              "  workgroupBarrier();"]
    for i in range(t.tm if not staged and epi is None else 0):
        for j in range(t.tn):
            off = f"{cb}(m0 + sm + {i * t.m}u) * {N}u + n0 + sn + {j * t.n}u"
            L.append(f"  subgroupMatrixStore(&{Cn}, {off}, acc{i}_{j}, false, {N}u);")
    L.append("}")
    return "\n".join(L) + "\n", (N // t.bn, M // t.bm, batch)


def c_elem(t: MmaTiling) -> str:
    """The WGSL element type of C's binding: f32, f16, or the words of t.out_vec halves."""
    return _WORDS[t.out_vec] if t.out == "f16" and t.out_vec > 1 else t.out


def epilogue_rounds(t: MmaTiling, N: int, epi: str, epi_ld: int, cb: str) -> list[str]:
    """The results handed to the epilogue `epi` in rounds of t.epi_rows rows of result
    matrices (an epi_rows * m x tn * n block per subgroup in Cs), each invocation taking
    t.epi_vec neighbouring elements of the block a step: element j of lane l is block index
    ((j / v) * subgroup_size + l) * v + j % v, so its v reads of Cs are neighbours (one
    wide workgroup load where the GPU's compiler merges them) and so are its v flat indices
    (neighbouring storage stores). A subgroup reads only the block it stored, but WGSL has
    no subgroup barrier, and its memory model orders another invocation's workgroup store
    only through workgroupBarrier (Dawn's own subgroup-matrix tests put one between a
    subgroupMatrixStore and the loads of it): two barriers a round, none after the last.
    epi_ld as mma_matmul_wgsl's: the loads of max(epi_ld, v) elements before their calls."""
    r, v, S = t.epi_rows, t.epi_vec, t.subgroup_size
    c = t.staged                                       # matrices of a row a round (t.stage)
    w = c * t.n                                        # the block's width
    count = r * t.m * w // S                           # elements per invocation a round
    if count % v:
        raise ValueError(f"mma matmul with {t}: {count} elements per invocation a round do "
                         f"not split into epi_vec {v}")
    per = max(epi_ld, v) // v if epi_ld else 1         # steps of v elements an iteration
    while (count // v) % per:
        per -= 1
    base = f"sg * {r * t.m * w}u"
    out = []
    rounds = [(i0, j0) for i0 in range(0, t.tm, r) for j0 in range(0, t.tn, c)]
    if epi_ld and t.epi_ahead:
        return _rounds_ahead(t, N, epi, cb, rounds, count, base)
    for i0, j0 in rounds:
        out += _round_stores(t, base, i0, j0)

        def flat(q):
            return _round_flat(t, N, cb, i0, j0, q)
        ks = range(per * v)
        body = [f"    let q{k} = ((e + {k // v}u) * {S}u + lane) * {v}u + {k % v}u;" for k in ks]
        body += [f"    let c{k} = Cs[{base} + q{k}];" for k in ks]
        if epi_ld:
            body += [f"    let p{k} = {epi}_ld({flat(f'q{k}')});" for k in ks]
            body += [f"    {epi}({flat(f'q{k}')}, c{k}, p{k});" for k in ks]
        else:
            body += [f"    {epi}({flat(f'q{k}')}, c{k});" for k in ks]
        out += ["  workgroupBarrier();", f"  for (var e = 0u; e < {count // v}u; e += {per}u) {{",
                *body, "  }"]
        if (i0, j0) != rounds[-1]:
            out.append("  workgroupBarrier();")
    return out


def _round_stores(t: MmaTiling, base: str, i0: int, j0: int) -> list[str]:
    """The subgroup's result matrices of the epilogue round at (i0, j0) stored into Cs: its
    epi_rows rows of t.staged matrices, a block t.staged * n wide."""
    w = t.staged * t.n
    return [f"  subgroupMatrixStore(&Cs, {base} + {ii * t.m * w + j * t.n}u, "
            f"acc{i0 + ii}_{j0 + j}, false, {w}u);"
            for ii in range(t.epi_rows) for j in range(t.staged)]


def _round_flat(t: MmaTiling, N: int, cb: str, i0: int, j0: int, q: str) -> str:
    """C's flat index of element q (a WGSL expression) of the round's block at (i0, j0)."""
    w = t.staged * t.n
    col = f" + {j0 * t.n}u" if j0 else ""
    return f"{cb}(m0 + sm + {i0 * t.m}u + {q} / {w}u) * {N}u + n0 + sn{col} + {q} % {w}u"


def _rounds_ahead(t: MmaTiling, N: int, epi: str, cb: str, rounds, count: int,
                  base: str) -> list[str]:
    """epilogue_rounds with t.epi_ahead: the loop over a round's `count` elements a lane
    unrolled, each round's epi_ld loads issued before the previous round's elements are
    handed over (round 0's before its staging), held in registers p<round>_<k> until then:
    two rounds' loads live at once."""
    v, S = t.epi_vec, t.subgroup_size

    def q(k):   # block index of lane `lane`'s element k, as epilogue_rounds' e loop gives it
        return f"(({k // v}u * {S}u + lane) * {v}u + {k % v}u)"

    def flat(i0, j0, k):
        return _round_flat(t, N, cb, i0, j0, q(k))

    def loads(n):
        i0, j0 = rounds[n]
        return [f"  let p{n}_{k} = {epi}_ld({flat(i0, j0, k)});" for k in range(count)]
    out = loads(0)
    for n, (i0, j0) in enumerate(rounds):
        out += _round_stores(t, base, i0, j0)
        if n + 1 < len(rounds):
            out += loads(n + 1)
        out.append("  workgroupBarrier();")
        out += [f"  {epi}({flat(i0, j0, k)}, Cs[{base} + {q(k)}], p{n}_{k});" for k in range(count)]
        if n + 1 < len(rounds):
            out.append("  workgroupBarrier();")
    return out


def epilogue_staging_bytes(t: MmaTiling) -> int:
    """Workgroup memory of mma_matmul_wgsl's epilogue staging: t.epi_rows rows of t.staged
    result matrices (f32) per subgroup."""
    return 4 * t.m * t.n * t.staged * t.sg_m * t.sg_n * t.epi_rows


def tiling_for(limits, M: int, N: int, K: int, out: str = "f32",
               epilogue: bool = False, streams: bool = False, a_t: bool = False,
               b_t: bool = False) -> MmaTiling | None:
    """The tiling for an [M, K] @ [K, N] f16 product on the device of codegen `limits`, or
    None where this kernel cannot run (no shader-f16, no f16 -> f32 subgroup-matrix
    configuration, or a shape no tiling divides): the caller keeps its f32 kernels then.
    epilogue: the kernel also holds mma_matmul_wgsl's staging matrices for an epilogue;
    streams: one whose loads are issued ahead (mma_epi_load_stage in place of mma_epi_stage);
    a_t, b_t: an operand stored transposed (MmaTiling.a_t / b_t: its slab's workgroup memory).
    128x128x32 on 2x2 subgroups measured best at 4096^3 on the H200 (bench/README.md).
    KernelOptions.mma_tiling (on limits.options) replaces fields of the default MmaTiling
    where the result divides the shape and fits the device; elsewhere the table decides.
    KernelOptions.mma_width (copy width 4 from the vec4 bindings), mma_out_vec (f16 C's
    stores), mma_stage and mma_epi_stage (matrices staged a round), mma_epi_rows and
    mma_epi_vec (the epilogue's rounds) and mma_xcopy (the copies transposing: a_x, b_x)
    apply to whichever tiling that is, each where it divides the tile and fits (epi_rows:
    the most rows up to it that do), else left at their defaults: they never change which
    tile a product gets."""
    if not getattr(limits, "shader_f16", False):
        return None
    cfg = config_for(getattr(limits, "subgroup_matrix", ()))
    if cfg is None:
        return None
    m, n, k, size = cfg
    room = getattr(limits, "max_compute_workgroup_storage_size", None)

    def fits(t):
        staging = epilogue_staging_bytes(t) if epilogue else 0
        try:
            t.check(M, N, K, None if room is None else room - staging)
        except ValueError:
            return False
        return t.threads <= getattr(limits, "max_compute_invocations_per_workgroup", 256) and \
            t.width in (4, 8)   # (the compiler's bindings are vec4<u32>: 8, or 4 from them)
    opts = getattr(limits, "options", None)
    epi_stage = "mma_epi_load_stage" if streams else "mma_epi_stage"

    xcopy = getattr(opts, "mma_xcopy", False)

    def chosen(t):  # t with the options' copy width and epilogue form, where they fit
        if xcopy and t.copy == "threads":
            t = replace(t, a_x=t.a_x or xcopy in (True, "a"), b_x=t.b_x or xcopy in (True, "b"))
        for rows in range(min(getattr(opts, "mma_epi_rows", 1), t.tm) if epilogue else 1, 0, -1):
            v = replace(t, width=getattr(opts, "mma_width", 8) if t.width == 8 else t.width,
                        epi_rows=rows if t.tm % rows == 0 else 1,
                        epi_vec=getattr(opts, "mma_epi_vec", 1) if epilogue else 1,
                        out_vec=getattr(opts, "mma_out_vec", 1) if out == "f16" else 1,
                        epi_ahead=bool(getattr(opts, "mma_epi_ahead", False)) and streams,
                        stage=t.stage or (getattr(opts, "mma_stage", 0) if out == "f16" else
                                          getattr(opts, epi_stage, 0) if epilogue else 0))
            for u in (v, replace(v, width=t.width), replace(v, epi_vec=1),
                      replace(v, width=t.width, epi_vec=1), replace(v, out_vec=1),
                      replace(v, width=t.width, out_vec=1), replace(v, stage=t.stage),
                      replace(v, stage=t.stage, width=t.width, epi_vec=1, out_vec=1)):
                if fits(u):
                    return u
        return t if fits(t) else None
    over = getattr(opts, "mma_tiling", ())
    if over:   # a variant (bench/matmul_f16.py --sweep): where it divides the shape and fits
        t = chosen(with_overrides(MmaTiling(m=m, n=n, k=k, subgroup_size=size, out=out,
                                            a_t=a_t, b_t=b_t), over))
        if t is not None:
            return t
    for bm, bn, sgm, sgn, stage in ((128, 128, 2, 2, 0), (64, 64, 2, 2, 0), (64, 64, 2, 2, 1),
                                    (32, 32, 1, 1, 0)):
        if stage and out != "f16":
            continue   # (f16 C staged a matrix at a time where a row does not fit)
        t = chosen(MmaTiling(bm=bm, bn=bn, bk=32, sg_m=sgm, sg_n=sgn, m=m, n=n, k=k,
                             subgroup_size=size, out=out, stage=stage, a_t=a_t, b_t=b_t))
        if t is not None:
            return t
    return None


def with_overrides(t: MmaTiling, over) -> MmaTiling:
    """t with KernelOptions.mma_tiling's (field, value) pairs applied (the adapter's
    configuration m, n, k, subgroup_size and C's type stay t's)."""
    names = {f.name for f in fields(MmaTiling)}
    d = dict(over)
    bad = set(d) - names or set(d) & {"m", "n", "k", "subgroup_size", "out"}
    if bad:
        raise KeyError(f"KernelOptions.mma_tiling: {sorted(bad)} cannot be set "
                       f"(MmaTiling fields but m, n, k, subgroup_size, out)")
    return replace(t, **d)


def mma_splits(t: MmaTiling, M: int, N: int, K: int, batch: int, below: int) -> int:
    """K chunks (a power of two) for a product of tiling t: one where it has `below` tiles
    or more (KernelOptions.mma_split_below; 0: never), or a batch; else doubled while the
    tiles number under 2 * below and chunks stay whole slabs of at least 256. A product of
    fewer tiles than the GPU has multiprocessors leaves some idle and the rest running one
    tile each, whose loads nothing hides: the folded weight gradients of GPT-2 124M on the
    H200, [768 x 4096] @ [4096 x 3072] on 144 tiles, 42 TFLOP/s, against 103 for
    [4096 x 3072] @ [3072 x 768] on 192 (bench/README.md)."""
    tiles = (M // t.bm) * (N // t.bn) * batch
    S = 1
    if batch != 1 or not below or tiles >= below:
        return S
    while tiles * S < 2 * below and K % (2 * S * t.bk) == 0 and K // (2 * S) >= 256:
        S *= 2
    return S
