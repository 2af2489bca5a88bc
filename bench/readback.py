#!/usr/bin/env python3
"""Reading results back from the GPU: GB/s of run() outputs and download_params, natively.

    python3 bench/readback.py                 # 100 MB (a GPU machine)
    python3 bench/readback.py --mb 8 --reps 3 # lavapipe

run(): a forward program whose output is --mb megabytes (an input row broadcast to
[rows, 1000] times 1), timed from the call to the numpy array in hand (feed upload of one
row, one tiny kernel, the read-back); the kernel's own GPU time, from the profiler, is
printed beside it. download_params(): a module with one parameter of --mb megabytes.
torch: `.cpu()` of a CUDA tensor of the same size (pageable memory, as webgrad's result is),
on the same GPU in the same process. Medians of --reps after one warm-up.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pkg"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def median_time(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def phases(p, nbytes, reps):
    """copy to a staging buffer + map, then the copy out of the mapping, timed apart."""
    backend = p.owner.backend
    host = backend.host
    prog, buf = backend.store["W"].home
    hp = host._programs[prog]
    lib, dev = host.lib, host.device
    size = hp.sizes[buf]
    s = dev.create_buffer(size=size, usage=lib.BufferUsage.MAP_READ | lib.BufferUsage.COPY_DST)
    for _ in range(reps):
        t0 = time.perf_counter()
        enc = dev.create_command_encoder()
        enc.copy_buffer_to_buffer(hp.buffers[buf], 0, s, 0, size)
        dev.queue.submit([enc.finish()])
        s.map_sync(lib.MapMode.READ)
        t1 = time.perf_counter()
        view = s.read_mapped(copy=False)
        t2 = time.perf_counter()
        data = bytes(view)
        t3 = time.perf_counter()
        del view
        s.unmap()
        ba = bytearray(size)
        t4 = time.perf_counter()
        ba[:] = data
        t5 = time.perf_counter()
        print(f"  copy+map {1e3 * (t1 - t0):.1f} ms, read_mapped {1e3 * (t2 - t1):.1f} ms, "
              f"bytes(mapped) {1e3 * (t3 - t2):.1f} ms ({nbytes / (t3 - t2) / 1e9:.2f} GB/s), "
              f"host memcpy {1e3 * (t5 - t4):.1f} ms ({nbytes / (t5 - t4) / 1e9:.2f} GB/s)")
    s.destroy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=100.0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--phases", action="store_true", help="time the read's phases apart")
    args = ap.parse_args()
    from matmul import pick_lib
    lib = pick_lib()
    import numpy as np
    import webgrad as wg
    from webgrad import Module, ops
    cols = 1000
    rows = max(1, int(args.mb * 1e6 / 4 / cols))
    nbytes = 4 * rows * cols

    class Empty(Module):
        pass

    class Big(Module):
        def __init__(self):
            super().__init__()
            self.W = self.param([rows, cols], init="randn")

    f = wg.compile_forward(Empty, lambda m, x: ops.broadcast_to(x["x"], (rows, cols)) * 1.0,
                           inputs={"x": [cols]}, backend="webgpu")
    print(f"webgpu: {f.owner.backend.host.info}  (library {lib}); {nbytes / 1e6:.1f} MB")
    x = np.arange(cols, dtype=np.float32)
    out = f.run({"x": x})
    assert out.shape == (rows, cols) and np.array_equal(out[-1], x), "wrong result"
    t_run = median_time(lambda: f.run({"x": x}), args.reps)
    kernel = f.profile({"x": x}).total_seconds
    p = wg.compile_forward(Big, lambda m, x: ops.sum_all(m.W) * x["x"], inputs={"x": [1]},
                           backend="webgpu")
    t_dl = median_time(p.download_params, args.reps)
    print(f"run() output      {t_run * 1e3:8.1f} ms  {nbytes / t_run / 1e9:6.2f} GB/s  "
          f"(its kernel {kernel * 1e3:.2f} ms on the GPU)")
    print(f"download_params() {t_dl * 1e3:8.1f} ms  {nbytes / t_dl / 1e9:6.2f} GB/s")
    if args.phases:
        phases(p, nbytes, args.reps)
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        t = torch.ones(rows, cols, device="cuda")
        torch.cuda.synchronize()
        t_torch = median_time(lambda: t.cpu(), args.reps)
        print(f"torch .cpu()      {t_torch * 1e3:8.1f} ms  {nbytes / t_torch / 1e9:6.2f} GB/s")


if __name__ == "__main__":
    main()
