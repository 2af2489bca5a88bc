"""Which form codegen's workgroup reductions take (codegen/wgsl.py, workgroup_reduce): subgroup
operations where the device was requested with 'subgroups' (Limits.subgroups, or the
KernelOptions.subgroups option), else the shared-memory tree. lavapipe, the native adapter here, offers no
'subgroups' (its WGSL compiler takes no `enable subgroups;`): the backend keeps the tree there,
and the records with long rows and workgroup sums still agree with torch. The subgroup form
runs against torch in headless Chromium (tests/browser/test_subgroups_browser.py)."""
from __future__ import annotations

import pytest

import oracle
from webgrad.codegen import KernelOptions, Limits, lower
from webgrad.compile import build_train_graph, parse_inputs

# row kernels, the one-pass logsumexp, layer norm's backward, one- and two-pass sums
RECORDS = ("log_softmax_last/long_rows", "nn.cross_entropy_last/vocab_50257",
           "nn.LayerNorm/width_768", "i32/sum_wide")


def _kernels(name: str, limits: Limits) -> list[tuple[str, str]]:
    factory, loss_fn, inputs, _ = oracle.build_record(oracle.BY_NAME[name])
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    low, names = lower(g, limits)
    cmds = [c for c in low.plan["commands"] if c["op"] == "dispatch"]
    return [(n, low.plan["pipelines"][c["pipeline"]]["wgsl"]) for n, c in zip(names, cmds)]


def _reducing(kernels):
    return [(n, w) for n, w in kernels if "var<workgroup> red" in w]


@pytest.mark.parametrize("name", RECORDS)
def test_subgroup_form_only_where_the_device_has_them(name):
    """Limits() (no 'subgroups'): every reduction is a tree. Limits(subgroups=True): the
    one-pass logsumexp takes subgroups (KernelOptions.subgroup_default, measured faster on an
    H200), the other reductions keep the tree; KernelOptions(subgroups=True) puts every one in
    subgroup form, with fewer barriers than its tree."""
    tree = _reducing(_kernels(name, Limits()))
    default = _reducing(_kernels(name, Limits(subgroups=True)))
    forced = _reducing(_kernels(name, Limits(subgroups=True, options=KernelOptions(subgroups=True))))
    assert tree and [n for n, _ in tree] == [n for n, _ in default] == [n for n, _ in forced]
    for (n, t), (_, d), (_, s) in zip(tree, default, forced):
        assert "subgroup" not in t and "enable subgroups;" not in t, n
        assert ("enable subgroups;" in d) == n.startswith("logsumexp_last"), n
        assert s.startswith(f"// webgrad: {n}\nenable subgroups;\n"), n
        assert "subgroupAdd(" in s, n
        # a reduction costs 2 barriers (1 + the caller's) instead of log2(wgs) + 2
        assert s.count("workgroupBarrier") < t.count("workgroupBarrier"), n


def test_the_option_forces_either_form():
    name = "nn.cross_entropy_last/vocab_50257"
    on, off = KernelOptions(subgroups=True), KernelOptions(subgroups=False)
    assert any("enable subgroups;" in w for _, w in _kernels(name, Limits(subgroups=True)))
    assert not any("subgroup" in w for _, w in _kernels(name, Limits(subgroups=True, options=off)))
    assert any("enable subgroups;" in w for _, w in _kernels(name, Limits(options=on)))


def test_same_graph_options_and_adapter_give_the_same_wgsl():
    """Lowering depends on nothing but the graph, the limits and their options: options
    for one lowering leave the next one with the defaults as it was."""
    name = "nn.cross_entropy_last/vocab_50257"
    before = _kernels(name, Limits(subgroups=True))
    _kernels(name, Limits(subgroups=True, options=KernelOptions(subgroups=False, rows_tiled=True)))
    assert _kernels(name, Limits(subgroups=True)) == before


@pytest.mark.webgpu
@pytest.mark.parametrize("name", RECORDS)
def test_native_adapter_without_subgroups_keeps_the_tree(name):
    try:
        from webgrad.backends.webgpu import WebGPUBackend
        be = WebGPUBackend()
    except Exception as e:
        pytest.skip(f"no native WebGPU adapter: {e}")
    if "subgroups" in be.host.features:
        pytest.skip(f"this adapter ({be.host.info}) has 'subgroups'")
    assert be.limits.subgroups is False
    kernels = _kernels(name, be.limits)
    assert _reducing(kernels) and not any("subgroup" in w for _, w in kernels)
    oracle.check(oracle.BY_NAME[name], be)
