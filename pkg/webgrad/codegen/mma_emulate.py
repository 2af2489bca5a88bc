"""A subgroup-matrix kernel rewritten in plain WGSL, for adapters that have no subgroup
matrices (KernelOptions.mma_emulate: the tests on lavapipe, whose Vulkan driver has no
cooperative matrices). Each 16x16 matrix is spread over the 32 invocations of an emulated
subgroup as hardware spreads it, eight elements each (invocation l: row l / 2, columns
8 (l % 2) ..); loads and stores read and write those; a product puts both operands into
the subgroup's scratch in workgroup memory between barriers and each invocation sums its
eight results from there (the kernels multiply in workgroup-uniform control flow, as
subgroup matrices need). Slow, and only for the forms webgrad's kernels write (16x16x16
configurations, matrix loads and stores on named arrays), but exact: the kernel's index
arithmetic, barriers, staging and roundings run as written, with f32 accumulation.

subgroup_id becomes local_invocation_index / 32 (the emulated configuration's subgroup
size) and subgroup_invocation_id its remainder; the `enable subgroups;` and
`enable chromium_experimental_subgroup_matrix;` directives go. (A first form held each
matrix whole in every invocation: Mesa's compiler turns the dynamic indexing of such
private arrays into select ladders and took minutes over one kernel.)
"""
from __future__ import annotations

import re

SIZE = 32   # the emulated configuration's subgroup size
EMULATOR_BYTES = 2 * 4 * 256   # the products' scratch in workgroup memory, per subgroup


def _mma(nsg: int) -> list[str]:
    body = ["struct wg_sm { v: array<f32, 8> }",
            "var<private> wg_sm_lid: u32;",
            f"var<workgroup> wg_sm_a: array<f32, {256 * nsg}>;",
            f"var<workgroup> wg_sm_b: array<f32, {256 * nsg}>;",
            "fn wg_sm_mma(a: wg_sm, b: wg_sm, c: wg_sm) -> wg_sm {",
            "  let l = wg_sm_lid % 32u;",
            "  let s = (wg_sm_lid / 32u) * 256u + (l / 2u) * 16u + (l % 2u) * 8u;",
            "  workgroupBarrier();"]
    body += [f"  wg_sm_a[s + {i}u] = a.v[{i}]; wg_sm_b[s + {i}u] = b.v[{i}];" for i in range(8)]
    body += ["  workgroupBarrier();", "  var o = c;",
             "  let ra = (wg_sm_lid / 32u) * 256u + (l / 2u) * 16u;",
             "  let cb = (wg_sm_lid / 32u) * 256u + (l % 2u) * 8u;",
             "  for (var k = 0u; k < 16u; k++) {", "    let x = wg_sm_a[ra + k];"]
    body += [f"    o.v[{i}] = fma(x, wg_sm_b[cb + k * 16u + {i}u], o.v[{i}]);" for i in range(8)]
    body += ["  }", "  return o;", "}"]
    return ["\n".join(body)]


def _arrays(src: str) -> dict[str, str]:
    """{name: element type} of the module's workgroup and storage arrays."""
    out = {}
    for m in re.finditer(r"var<(?:workgroup|storage[^>]*)> (\w+): array<([\w<>]+?)(?:, \d+)?>;", src):
        out[m.group(1)] = m.group(2)
    return out


def emulate_mma(src: str) -> str:
    """src with its subgroup-matrix types and builtins replaced (module docstring)."""
    if "chromium_experimental_subgroup_matrix" not in src:
        return src
    arrays = _arrays(src)
    used_load, used_store = set(), set()

    def load(m):
        used_load.add(m.group(1))
        return f"wg_sm_load_{m.group(1)}("
    src = re.sub(r"subgroupMatrixLoad<subgroup_matrix_\w+<[^>]*>>\(&(\w+),\s*", load, src)

    def store(m):
        used_store.add(m.group(1))
        return f"wg_sm_store_{m.group(1)}("
    src = re.sub(r"subgroupMatrixStore\(&(\w+),\s*", store, src)
    src = re.sub(r"subgroup_matrix_(left|right|result)<[^>]*>", "wg_sm", src)
    src = src.replace("subgroupMatrixMultiplyAccumulate(", "wg_sm_mma(")
    # (naga, the WGSL compiler of wgpu-native, takes no bitcast of a u32 to vec2<f16>)
    src = src.replace("bitcast<vec2<f16>>(", "wg_sm_halves(")
    src = src.replace("enable chromium_experimental_subgroup_matrix;\n", "")
    src = src.replace("enable subgroups;\n", "")
    # the builtins: parameters of main become lets at its top
    lets = []
    li = re.search(r"@builtin\(local_invocation_index\) (\w+): u32", src).group(1)
    for builtin, expr in (("subgroup_id", f"{li} / {SIZE}u"),
                          ("subgroup_invocation_id", f"{li} % {SIZE}u")):
        m = re.search(rf",\s*@builtin\({builtin}\) (\w+): u32", src)
        if m:
            src = src[:m.start()] + src[m.end():]
            lets.append(f"  let {m.group(1)} = {expr};")
    main = re.search(r"fn main\((?:[^()]|\([^()]*\))*\)\s*\{\n", src)
    lets.insert(0, f"  wg_sm_lid = {li};")
    src = src[:main.end()] + "".join(x + "\n" for x in lets) + src[main.end():]
    nsg = int(re.search(r"@workgroup_size\((\d+)\)", src).group(1)) // SIZE
    fns = _mma(nsg) + ["fn wg_sm_halves(x: u32) -> vec2<f16> { return vec2<f16>(unpack2x16float(x)); }"]
    lane = ["  let l = wg_sm_lid % 32u;", "  let r = l / 2u;", "  let c0 = (l % 2u) * 8u;"]

    def at(i):
        return f"select(off + r * st + c0 + {i}u, off + (c0 + {i}u) * st + r, cm)"
    for name in sorted(used_load):
        fns.append("\n".join([f"fn wg_sm_load_{name}(off: u32, cm: bool, st: u32) -> wg_sm {{",
                              "  var m: wg_sm;", *lane]
                             + [f"  m.v[{i}] = f32({name}[{at(i)}]);" for i in range(8)]
                             + ["  return m;", "}"]))
    for name in sorted(used_store):
        fns.append("\n".join([f"fn wg_sm_store_{name}(off: u32, m: wg_sm, cm: bool, st: u32) {{", *lane]
                             + [f"  {name}[{at(i)}] = {arrays[name]}(m.v[{i}]);" for i in range(8)]
                             + ["}"]))
    # the functions after the module's declarations (they name its arrays), before main
    cut = src.index("@compute")
    return src[:cut] + "\n".join(fns) + "\n" + src[cut:]


__all__ = ["emulate_mma"]
