"""What the WebGPU test modules share (tests/test_webgpu*.py): the module-level skip where
no native adapter exists, forward programs over feeds, the lowered kernels of an oracle
record, the KernelOptions that force each matmul kernel or an H200 tiling, the
precision="mixed" training runs that compare attention kernel forms, and the f16 cached
decode check of the model tests."""
from __future__ import annotations

import pytest

import oracle
from backends import native_adapter_is_cpu
import webgrad as wg
from webgrad import Module
from webgrad.codegen import KernelOptions
from webgrad.codegen import matmul_config as mm


def mixed_runs(factory, loss, forms, *, B: int, T: int, vocab: int, steps: int, seed: int):
    """{name: (losses, parameters, attention kernel names)}: `steps` Adam steps (lr 3e-3) of
    a precision="mixed" language-model step from the same weights (`seed`) for each (name,
    backend, KernelOptions or None) of `forms`, every run fed the same random tokens and
    targets ([B, T] of RandomState(0) below `vocab`)."""
    import numpy as np
    from webgrad import optim
    out = {}
    for name, backend, opts in forms:
        kw = {} if opts is None else {"kernel_options": opts}
        c = wg.compile_module(factory, loss, inputs={"tokens": ([B, T], "i32"),
                                                     "targets": ([B, T], "i32")},
                              optimizer=optim.Adam(lr=3e-3), precision="mixed", seed=seed,
                              backend=backend, **kw)
        names = [] if backend == "reference" else \
            [k for k in c._train.exe.kernel_names if k.startswith("attn_")]
        rng = np.random.RandomState(0)
        losses = [float(c.step({k: rng.randint(0, vocab, size=(B, T)).astype(np.int32)
                                for k in ("tokens", "targets")})) for _ in range(steps)]
        out[name] = losses, {k: np.asarray(v) for k, v in c.download_params().items()}, names
    return out


def f16_cached_decode(load, backend, ids, *, prompt: int, new: int) -> list[str]:
    """A model held in f16 in precision="f16" (`load(backend)`) on `backend` against the
    reference executor's: the full forward within 3e-3 of the largest logit, each cached step
    (an id at a time) the full forward's row at its position, greedy generate of `new`
    tokens after ids[:prompt] the same tokens; returns the one-id step's kernel names."""
    import numpy as np

    def close(got, want):
        err = np.abs(np.asarray(got) - want).max() / np.abs(want).max()
        assert err <= 3e-3, f"max error {err:.2e} of the largest logit"
    m, ref = load(backend), load("reference")
    m.precision = ref.precision = "f16"
    full = np.asarray(m.forward(ids))
    close(full, np.asarray(ref.forward(ids)))
    cache = m.new_cache()
    for i, t in enumerate(ids):
        close(m.logits_step([t], cache), full[i])
    assert m.generate(ids[:prompt], max_new_tokens=new, temperature=0) == \
        ref.generate(ids[:prompt], max_new_tokens=new, temperature=0)
    return m._program("step", 1)._prog.exe.kernel_names


def require_native_adapter() -> None:
    """Skip the calling test module, at its import, where there is no native adapter."""
    try:
        from webgrad.backends.webgpu_native import NativeHost
        NativeHost()
    except Exception as e:  # no wgpu, no adapter: nothing here can run
        pytest.skip(f"no native WebGPU adapter: {e}", allow_module_level=True)


def forward(fn, inputs, backend="webgpu", options=None):
    """A forward program with no parameters: fn(feeds) over the declared inputs (its kernels
    generated with `options`, a KernelOptions, where given)."""
    return wg.compile_forward(Module, lambda m, i: fn(**i), inputs=inputs, backend=backend,
                              kernel_options=options)


def exe(c):
    """The WebGPUProgram behind a compiled module or forward program."""
    prog = c._train if hasattr(c, "_train") else c._prog
    return prog.exe


def lowered_kernel_names(record, options: KernelOptions = KernelOptions()) -> list[str]:
    """The kernel names of an oracle record's step (forward and gradients), lowered for
    WebGPU's default limits with `options`."""
    from webgrad.codegen import Limits, lower
    from webgrad.compile import build_train_graph, parse_inputs
    factory, loss_fn, inputs, _ = oracle.build_record(record)
    return lower(build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1],
                 Limits(options=options))[1]


def lowered_wgsl(record, options: KernelOptions = KernelOptions()) -> list[str]:
    """The WGSL of every pipeline of that step."""
    from webgrad.codegen import Limits, lower
    from webgrad.compile import build_train_graph, parse_inputs
    factory, loss_fn, inputs, _ = oracle.build_record(record)
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    return [p["wgsl"] for p in lower(g, Limits(options=options))[0].plan["pipelines"]]


# KernelOptions forcing codegen/matmul.py's kernels: barrier-free, tiled, and barrier-free
# with SwiftShader's small blocks and looped epilogue on every adapter ("" is in every
# description)
MATMUL_KERNELS = {"direct": KernelOptions(force_direct=True), "tiled": KernelOptions(force_direct=False),
                  "direct_small": KernelOptions(force_direct=True, small_block_adapters=("",),
                                                epi_loop_adapters=("",), epi_loop_lines=0)}
if native_adapter_is_cpu():  # its default is the direct kernel: test_oracle runs that form
    del MATMUL_KERNELS["direct"]


# the H200 row's tilings (codegen/matmul_config.py ADAPTER_TILINGS) and smaller tiles of the same
# kinds, so that the matmul records span several tiles: workgroups of 256, 128, 64 and 16
# threads, threads in warp tiles, 8 x 16 outputs per thread, K step 16, vec4 global loads,
# tile rows in runs (the last one shorter), split-K
H200_CONFIGS = {
    "wide": mm.Config(8, 8, 8, vload=True, epi_rows=1, warp_tiles=True),
    "split_group": mm.Config(8, 8, 8, vload=True, group=2, splits=3, warp_tiles=True),
    "wide_bk16_group_split": mm.Config(8, 16, 16, wx=8, wy=16, group=2, splits=3),
    "small_warp_tiles": mm.Config(4, 4, 8, wx=16, wy=8, vload=True, warp_tiles=True),
    "batched": mm.Config(8, 8, 8, wx=8, wy=8, vload=True),
    "mid": mm.Config(8, 8, 16, wx=8, wy=8, vload=True),
    "small_group": mm.Config(4, 4, 8, wx=4, wy=4, group=3, vload=True),
    "small_split_group": mm.Config(4, 8, 16, wx=4, wy=8, splits=2, group=4, vload=True),
    "odd_split": mm.Config(8, 8, 16, vload=True, splits=3, warp_tiles=True),
    "odd_group": mm.Config(8, 8, 16, vload=True, group=2, warp_tiles=True),
    "vocab_wgrad_group": mm.Config(16, 8, 8, vload=True, group=2, warp_tiles=True),
}
