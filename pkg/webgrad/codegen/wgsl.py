"""The WGSL builder: the one module where WebGPU's rules and quirks live.

Everything else in codegen/ writes kernel *bodies* as text and asks a `Kernel` for the rest:
  * binding layout: every buffer a kernel touches is one `var<storage>` binding in group 0,
    numbered in first-use order (binding k = plan command's bindings[k]); a buffer both read
    and written is bound once, read_write (WebGPU refuses a writable binding that aliases
    another binding of the same buffer in one dispatch);
  * limits: `Limits` holds the device's numbers (the WebGPU defaults when a host does not
    say); too many bindings or a binding larger than maxStorageBufferBindingSize raise
    `LimitError` naming the tensor;
  * workgroup sizing and dispatch splitting: a kernel asks for N workgroups, `grid(N)` splits
    them over x/y/z so that no dimension exceeds maxComputeWorkgroupsPerDimension (65535),
    and the kernel reads its linear workgroup index from `wg_linear()`; workgroups past N
    return at once (a workgroup-uniform test, so barriers after it stay legal).
    `thread_index` / `workgroup_index` emit that preamble for the two kernel shapes (one
    thread per item / one workgroup per item), so builders never spell it out;
  * literals: f32 values are written so that they round back to the same float32
    (inf/nan through bitcast, negative numbers parenthesised so `a - -1` never forms `--`),
    as `Literal`s, which the emitter names as they are (no `let`);
  * workgroup reductions (`workgroup_reduce`): a shared-memory tree, or subgroup operations
    where the device was requested with the 'subgroups' feature and they measured faster
    (`use_subgroups`, KernelOptions.subgroup_default).
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from .options import DEFAULT, KernelOptions

# the entry point's parameters (Kernel.source): names in every body (emit.Emitter.names)
ENTRY_NAMES = ("wid", "lid")
WG = 256  # default workgroup size for one-thread-per-element kernels (WebGPU's default max)
# Loop iterations one invocation may run on a CPU adapter (Limits.cpu). lavapipe stops an
# invocation's loops after 65535 iterations in all, silently: in one shader, a loop of 40000
# then another of 40000 ran 40000 and 25534 times, and every later loop (nested or not) once.
# Kernels whose loops a long axis drives keep each invocation under this on those adapters
# (reduce.py's tree for long rows, matmul_config.cpu_splits); a margin is left for small loops.
CPU_LOOP_ITERATIONS = 60000
# The reductions that take the subgroup form by default where the device has 'subgroups'
# (use_subgroups; KernelOptions.subgroup_default, KernelOptions.subgroups forces either form):
# measured on an H200 through Dawn (bench/subgroups.py, bench/README.md),
# the one-pass logsumexp's (max, sum) pairs over [4096, 50257] took 0.73x the tree's time;
# single values (layer norm and its backward, softmax, sums) took 1.0x over [4096, 50257]
# and 1.3-4.5x over rows of 512-768, so they keep the tree unless KernelOptions.subgroups
# forces it.


class LimitError(ValueError):
    """A program needs more than the WebGPU device allows."""


class BindingTypeClash(AssertionError):
    """One kernel asked for one buffer with two element types (a binding has one)."""


@dataclass
class Limits:
    """The device limits codegen obeys (names as wgpu-py/JS give them, snake_case)."""
    max_storage_buffer_binding_size: int = 134217728
    max_buffer_size: int = 268435456
    max_compute_workgroups_per_dimension: int = 65535
    max_compute_invocations_per_workgroup: int = 256
    max_compute_workgroup_size_x: int = 256
    max_compute_workgroup_storage_size: int = 16384
    max_storage_buffers_per_shader_stage: int = 8
    cpu: bool = False  # a CPU-emulated adapter (SwiftShader, lavapipe): avoid barriers
    adapter: str = ""  # the adapter's description (codegen/matmul_config.py's table of tilings)
    subgroups: bool = False  # the device was requested with the 'subgroups' feature
    shader_f16: bool = False  # ... with 'shader-f16' (f16 in WGSL)
    # ... with 'chromium-experimental-subgroup-matrix': the adapter's configurations, each
    # (component type, result type, M, N, K, min subgroup size, max subgroup size)
    subgroup_matrix: tuple = ()
    # WGSL's packed 4x8 integer dot products (dot4I8Packed: the language feature
    # packed_4x8_integer_dot_product, which Tint and naga have; in a browser, where
    # navigator.gpu.wgslLanguageFeatures lists it)
    packed_dot: bool = False
    options: KernelOptions = DEFAULT  # every switch that changes the WGSL (options.py)

    @classmethod
    def from_host(cls, limits: dict | None) -> "Limits":
        out = cls()
        for k, v in (limits or {}).items():
            k = k.replace("-", "_")
            if hasattr(out, k) and isinstance(v, int):
                setattr(out, k, v)
        return out


# ---------------------------------------------------------------- literals

class Literal(str):
    """The WGSL text of a literal (f32_lit, i32_lit, u32_lit, zero): the emitter takes it
    as a value's name as it is (emit.Emitter.let), where any other expression gets a `let`.
    What is text made from it (an f-string, a concatenation) is a plain str again."""

    def negated(self) -> str:
        """-self: a literal where self has no sign (f32_lit writes a negative number as
        "(-2.5f)"), else an expression."""
        return Literal(f"(-{self})") if not self.startswith("(") else f"(-{self})"


def f32_lit(v: float) -> str:
    """A WGSL f32 literal that rounds back to float32(v)."""
    v = float(v)
    if math.isfinite(v):
        try:
            v = struct.unpack("<f", struct.pack("<f", v))[0]
        except OverflowError:  # beyond float32's range: float32(v) is infinite
            v = math.copysign(math.inf, v)
    # Not bitcast<f32>(0x...u): a const-expression that is inf/nan is a shader-creation error
    # (Tint, so Chrome, enforces it; naga does not). Kernel.source declares these variables.
    if math.isnan(v):
        return "bitcast<f32>(wg_nan_bits)"
    if math.isinf(v):
        return "bitcast<f32>(wg_pinf_bits)" if v > 0 else "bitcast<f32>(wg_ninf_bits)"
    if v == 0.0:
        return Literal("(-0.0f)" if math.copysign(1.0, v) < 0 else "0.0f")
    text = repr(v)
    if "e" not in text and "." not in text:
        text += ".0"
    if "inf" in text or "nan" in text:  # unreachable: handled above
        raise ValueError(v)
    return Literal(f"({text}f)" if v < 0 else f"{text}f")


def i32_lit(v: int) -> str:
    v = int(v)
    if v == -2**31:
        return "bitcast<i32>(0x80000000u)"
    if not -2**31 < v < 2**31:
        raise LimitError(f"integer constant {v} does not fit in i32")
    return Literal(f"({v}i)" if v < 0 else f"{v}i")


def u32_lit(v: int) -> str:
    v = int(v)
    if not 0 <= v < 2**32:
        raise LimitError(f"index constant {v} does not fit in u32")
    return Literal(f"{v}u")


def lit(v, dtype: str) -> str:
    return f32_lit(v) if dtype == "f32" else i32_lit(v)


def wgsl_type(dtype: str) -> str:
    return {"f32": "f32", "i32": "i32", "u32": "u32", "atomic_u32": "atomic<u32>",
            "vec4_f32": "vec4<f32>", "f16": "f16", "vec4_f16": "vec4<f16>",
            "vec4_u32": "vec4<u32>", "vec2_u32": "vec2<u32>"}[dtype]


def zero(dtype: str) -> str:
    return Literal("0.0f" if dtype == "f32" else "0i")


def pow2ceil(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def thread_xy(WX: int, WY: int, warp_tiles: bool) -> list[str]:
    """WGSL lets of `tx`, `ty`: a thread's column and row in a WY x WX workgroup grid, from
    `lid`. Row by row; or, with warp_tiles (where WX is a multiple of 8 above 8 and WY of
    4), each 32 consecutive ids a 4 x 8 patch (a warp on NVIDIA GPUs): a warp's reads of a
    tile's k then cover 4 row vectors and 8 column vectors (one 128-byte shared-memory
    wavefront each) where 2 rows of 16 threads read 2 and 16 (two wavefronts)."""
    if warp_tiles and WX % 8 == 0 and WY % 4 == 0 and WX > 8:
        return ["let wq = lid / 32u;",
                f"let tx = (wq % {WX // 8}u) * 8u + lid % 8u;",
                f"let ty = (wq / {WX // 8}u) * 4u + (lid % 32u) / 8u;"]
    return [f"let tx = lid % {WX}u;", f"let ty = lid / {WX}u;"]


# ---------------------------------------------------------------- the kernel builder

@dataclass
class Binding:
    buffer: int      # plan buffer id
    elem: str        # WGSL element type of the array view
    write: bool
    what: str        # the tensor(s) it holds, for error messages


class Kernel:
    """Collects the module-scope parts of one WGSL compute shader and assembles it."""

    def __init__(self, limits: Limits, name: str):
        self.limits, self.name = limits, name
        self.bindings: list[Binding] = []
        self._by_buffer: dict[int, int] = {}
        self.decls: list[str] = []          # module-scope declarations (shared memory, ...)
        self._helpers: dict[str, str] = {}  # helper functions by name (erf, hash, ...)
        self.functions: list[str] = []      # generated functions (epilogues)
        self.epilogues: dict = {}           # name -> emit.Epilogue (program.GroupCtx.epilogue)
        self.workgroup_size = WG
        self.nx = self.ny = self.nz = 1
        self.subgroups = False  # the body uses subgroup operations (enable_subgroups)
        self.f16 = False  # the body converts to f16 (`enable f16;`, the shader-f16 feature)

    # -- buffers
    def binding(self, buffer: int, dtype: str, *, write: bool = False, what: str = "",
                nbytes: int = 0) -> str:
        """The WGSL name of `buffer`'s binding (created on first use)."""
        if nbytes > self.limits.max_storage_buffer_binding_size:
            raise LimitError(
                f"{what or 'a tensor'} needs {nbytes} bytes in one storage binding but this "
                f"device allows {self.limits.max_storage_buffer_binding_size} "
                "(maxStorageBufferBindingSize); use smaller shapes (split the batch) or a GPU "
                "with a larger limit")
        k = self._by_buffer.get(buffer)
        if k is None:
            k = len(self.bindings)
            self._by_buffer[buffer] = k
            self.bindings.append(Binding(buffer, wgsl_type(dtype), write, what))
            if dtype in ("f16", "vec4_f16"):  # f16 storage (program.py's half_storage)
                self.f16 = True
        else:
            b = self.bindings[k]
            b.write = b.write or write
            if b.elem != wgsl_type(dtype):
                raise BindingTypeClash(f"buffer {buffer} bound as {b.elem} and {dtype} in one kernel")
        return f"b{k}"

    def helper(self, name: str, code: str) -> str:
        self._helpers.setdefault(name, code)
        return name

    def enable_subgroups(self) -> tuple[str, str]:
        """Declare that the body uses subgroup operations: the module gets `enable
        subgroups;` and main starts with this invocation's rank among the active
        invocations of its subgroup and their count (names returned). Rank and count,
        rather than the subgroup_invocation_id / subgroup_size builtins: a subgroup may
        run with inactive lanes (a workgroup smaller than the subgroup, or not a multiple
        of it), and no API ties subgroups to ranges of local_invocation_index, so the
        reductions below index nothing by subgroup number."""
        self.subgroups = True
        return "wg_sg_rank", "wg_sg_count"

    # -- dispatch
    def grid(self, workgroups: int) -> list[int]:
        """Split `workgroups` over x/y/z within maxComputeWorkgroupsPerDimension."""
        m = self.limits.max_compute_workgroups_per_dimension
        n = max(1, int(workgroups))
        if n <= m:
            x, y, z = n, 1, 1
        elif n <= m * m:
            y = -(-n // m)
            x, z = -(-n // y), 1
        else:
            z = -(-n // (m * m))
            if z > m:
                raise LimitError(f"{self.name}: {n} workgroups exceed even a 3-D grid of {m}^3")
            x, y = m, m
        self.nx, self.ny, self.nz = x, y, z
        return [x, y, z]

    def wg_linear(self) -> str:
        """WGSL expression of the linear workgroup index (valid after grid())."""
        parts = ["wid.x"]
        if self.ny > 1 or self.nz > 1:
            parts.append(f"wid.y * {self.nx}u")
        if self.nz > 1:
            parts.append(f"wid.z * {self.nx * self.ny}u")
        return " + ".join(parts)

    def thread_index(self, em, total: int, var: str = "o", wgs: int = WG) -> list[int]:
        """One thread per item of `total`: size the grid (ceil(total / wgs) workgroups of
        `wgs` threads), emit `let {var}` = the thread's item index into `em` and return at
        once from threads past the end. Returns the grid for the dispatch. The return is
        not workgroup-uniform: kernels using it must not barrier afterwards."""
        grid = self.grid(-(-total // wgs))
        em.emit(f"let {var} = ({self.wg_linear()}) * {wgs}u + lid;")
        em.declare(var)
        em.emit(f"if ({var} >= {total}u) {{ return; }}")
        return grid

    def workgroup_index(self, em, total: int, var: str = "o") -> list[int]:
        """One workgroup per item of `total`: size the grid, emit `let {var}` = the
        workgroup's item index into `em` and return from workgroups past the end (a
        workgroup-uniform test, so barriers after it stay legal). Returns the grid."""
        grid = self.grid(total)
        em.emit(f"let {var} = {self.wg_linear()};")
        em.declare(var)
        em.emit(f"if ({var} >= {total}u) {{ return; }}")
        return grid

    # -- assembly
    def module_scope(self) -> list[str]:
        """The module's declarations after its `enable` directives: bindings, private
        constants, workgroup arrays, helpers and generated functions (a kernel that writes
        its own entry point, matmul_mma.py, takes these)."""
        out = []
        for k, b in enumerate(self.bindings):
            access = "read_write" if b.write else "read"
            out.append(f"@group(0) @binding({k}) var<storage, {access}> b{k}: array<{b.elem}>;")
        out += ["var<private> wg_pinf_bits: u32 = 0x7f800000u;",  # see f32_lit
                "var<private> wg_ninf_bits: u32 = 0xff800000u;",
                "var<private> wg_nan_bits: u32 = 0x7fc00000u;"]
        return out + self.decls + list(self._helpers.values()) + self.functions

    def source(self, body: list[str], *, workgroup_size: int | None = None) -> str:
        wgs = workgroup_size or self.workgroup_size
        if wgs > self.limits.max_compute_invocations_per_workgroup:
            raise LimitError(f"{self.name}: workgroup of {wgs} invocations exceeds the device's "
                             f"{self.limits.max_compute_invocations_per_workgroup}")
        if len(self.bindings) > self.limits.max_storage_buffers_per_shader_stage:
            names = ", ".join(b.what for b in self.bindings)
            raise LimitError(f"{self.name}: needs {len(self.bindings)} storage buffers in one "
                             f"kernel ({names}) but the device allows "
                             f"{self.limits.max_storage_buffers_per_shader_stage}")
        out = [f"// webgrad: {self.name}"]
        if self.f16:
            out.append("enable f16;")
        if self.subgroups:
            out.append("enable subgroups;")
        out += self.module_scope()
        out.append(f"@compute @workgroup_size({wgs})")
        out.append("fn main(@builtin(workgroup_id) wid: vec3<u32>, "
                   "@builtin(local_invocation_index) lid: u32) {")
        if self.subgroups:  # at the top of main: control flow is uniform here
            out += ["  let wg_sg_rank = subgroupExclusiveAdd(1u);",
                    "  let wg_sg_count = subgroupAdd(1u);"]
        out += body
        out.append("}")
        return "\n".join(out) + "\n"


def tree_reduce(lines: list[str], ind: str, arr: str, wgs: int, combine,
                pos: str = "lid", stride: int = 1, *, by_index: bool = False) -> None:
    """Append a shared-memory tree reduction over `arr[0..wgs)` (unrolled; result in arr[0]).
    `combine(a, b)` -> WGSL statement(s) that fold element b into a (strings of lvalues);
    by_index: `combine(i, j)` gets the two indices instead, for a tree over several arrays
    at once (rowfuse.py's (max, sum) pairs in red and red2).
    Several trees side by side: `pos` is the invocation's place in its tree (0..wgs) and
    `stride` the distance in `arr` between neighbours of one tree (each tree's result in its
    invocation at pos 0): a row's lanes (pos `lane`, stride 1), or a column's rows (pos
    `ty`, stride the workgroup's width)."""
    lines.append(f"{ind}workgroupBarrier();")
    s = wgs // 2
    while s >= 1:
        i, j = "lid", f"lid + {s * stride}u"
        step = combine(i, j) if by_index else combine(f"{arr}[{i}]", f"{arr}[{j}]")
        lines.append(f"{ind}if ({pos} < {s}u) {{ {step} }}")
        lines.append(f"{ind}workgroupBarrier();")
        s //= 2


def use_subgroups(limits: Limits, what: str = "values") -> bool:
    """Whether a workgroup reduction of `what` ("values": workgroup_reduce; "pairs": the
    one-pass logsumexp's (max, sum) pairs, rowfuse.py) uses subgroup operations: where the
    device was requested with the 'subgroups' feature (Limits.subgroups; the hosts request
    it where the adapter has it: Dawn on GPUs, Chromium's SwiftShader; wgpu-native on
    lavapipe names no such feature and its WGSL compiler takes no `enable subgroups;`) and
    `what` is in KernelOptions.subgroup_default (measured faster there); the options'
    `subgroups` forces either form."""
    opts = limits.options
    if opts.subgroups is not None:
        return bool(opts.subgroups)
    return bool(limits.subgroups) and what in opts.subgroup_default


def workgroup_reduce(em, wgs: int, value: str, kind: str, combine, dtype: str = "f32",
                     arr: str = "red") -> str:
    """The total of `value` (one per invocation) over a workgroup of `wgs` invocations, as a
    `let` that every invocation holds. `arr` is a `var<workgroup>` array of wgs elements
    that the caller declared; the caller puts a barrier after its last read of the total
    before `arr` is written again. kind 'sum' or 'max'; `combine(a, b)` -> the statement
    folding b into a (as tree_reduce's). Call in workgroup-uniform control flow.

    Tree (no subgroups): every invocation writes arr[lid], log2(wgs) halving steps each
    behind a barrier, then everyone reads arr[0].
    Subgroups (use_subgroups): each subgroup reduces in registers (subgroupAdd/Max); its
    first active invocation writes the subgroup's total to arr[lid], every other one the
    identity (so every element is written and no slot depends on how the hardware groups
    invocations); one barrier; then in every subgroup lane i folds arr[i], arr[i + n], ...
    (n active lanes) and one more subgroup operation gives the total to every invocation.
    Two barriers in all (with the caller's) instead of log2(wgs) + 2, but on an H200 no
    faster for these single values (subgroup_default: the tree stays unless forced). A
    subgroup max of a NaN need not be NaN, so callers whose max must propagate NaN
    (max_last) keep the tree; the row ops' later passes see the NaN themselves."""
    ind = "  " * em._ind
    if not use_subgroups(em.k.limits):
        em.emit(f"{arr}[lid] = {value};")
        tree_reduce(em.lines, ind, arr, wgs, combine)
        return em.snapshot(f"{arr}[0]")
    assert kind == "sum" or dtype == "f32", (kind, dtype)
    rank, count = em.k.enable_subgroups()
    op = {"sum": "subgroupAdd", "max": "subgroupMax"}[kind]
    ident = ("0.0f" if dtype == "f32" else "0i") if kind == "sum" else "bitcast<f32>(wg_ninf_bits)"
    part = em.snapshot(f"{op}({value})")
    em.emit(f"{arr}[lid] = select({ident}, {part}, {rank} == 0u);")
    em.emit("workgroupBarrier();")
    acc = em.var(wgsl_type(dtype), ident)
    with em.block(f"for (var wg_k = {rank}; wg_k < {wgs}u; wg_k += {count})"):
        em.emit(combine(acc, em.snapshot(f"{arr}[wg_k]")))
    return em.snapshot(f"{op}({acc})")
