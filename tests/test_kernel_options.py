"""Kernel options (codegen/options.py): every switch that changes the generated WGSL is a
KernelOptions field carried on Limits, none a module global, and the benches' --set
spelling (a field, or the old MODULE.ATTR) maps onto the fields."""
from __future__ import annotations

import importlib
from dataclasses import fields, replace

import pytest

import oracle
from webgrad.codegen import KernelOptions, Limits, lower
from webgrad.codegen.options import OLD_NAMES, field_for, with_setting
from webgrad.compile import build_train_graph, parse_inputs


def _wgsl(name: str, limits: Limits) -> list[str]:
    factory, loss_fn, inputs, _ = oracle.build_record(oracle.BY_NAME[name])
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    return [p["wgsl"] for p in lower(g, limits)[0].plan["pipelines"]]


@pytest.mark.parametrize("old", sorted(OLD_NAMES))
def test_old_switches_are_gone_from_their_modules(old):
    """A module global of the old name would be a switch nothing reads (or, worse, one
    something still reads): the option is the one place."""
    mod, attr = old.rsplit(".", 1)
    assert not hasattr(importlib.import_module(f"webgrad.codegen.{mod}"), attr), old
    assert field_for(f"webgrad.codegen.{old}") == OLD_NAMES[old]


def test_every_old_name_maps_to_a_field():
    names = {f.name for f in fields(KernelOptions)}
    assert set(OLD_NAMES.values()) <= names
    with pytest.raises(KeyError, match="no KernelOptions field"):
        field_for("webgrad.codegen.matmul.NO_SUCH_SWITCH")


def test_settings_parse_onto_fields():
    o = with_setting(KernelOptions(), "webgrad.codegen.matmul.K_UNROLL=(512, 4)")
    o = with_setting(o, "tiled_transpose=False")
    assert (o.k_unroll, o.tiled_transpose) == ((512, 4), False)
    assert KernelOptions().with_attn_opts(exact=False).attn_opt("exact") is False
    with pytest.raises(KeyError):
        KernelOptions().with_attn_opts(no_such=True)


def test_options_change_the_wgsl_only_of_their_own_lowering():
    """Same graph, options and adapter: the same WGSL, whatever was lowered in between."""
    name = "matmul/tiles_odd"
    before = _wgsl(name, Limits())
    forced = _wgsl(name, Limits(options=KernelOptions(force_direct=True, k_loop=1)))
    assert forced != before
    assert _wgsl(name, Limits()) == before
    assert _wgsl(name, Limits(options=replace(KernelOptions(), force_direct=True, k_loop=1))) == forced
