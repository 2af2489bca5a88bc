#!/usr/bin/env python3
"""Where a training step's wall time goes beyond its GPU work (native WebGPU, Dawn).

    python3 bench/step_span.py --rows small64 [--submit-first 32,8] [--spin-wait 1,0] [--steps 20]

For a bench/gpt2_train.py row, per setting of webgpu_native.SUBMIT_FIRST (the step's first
submission; the parts after it double) and of webgpu_native.SPIN_WAIT (the loss read back
waited for by polling Dawn's events, or blocking), the median over --steps steps of:
  wall       c.step() as a user calls it (feed checks, writes, encoding, submission, the
             loss read back)
  span       GPU timestamps written at the start of the step's first compute pass and at the
             end of its last one: the GPU's time from its first kernel to its last, gaps
             between dependent dispatches included
  gpu start  when encoding the first submission ended (the GPU can start then), from the
             step's start, CPU clock
  encoded    when the last submission was encoded
and, once, the kernels' sum from c.profile() (each dispatch in a pass of its own).
wall - span is what the step spends outside the GPU's work: before its first kernel and
after its last one. The timestamps need the adapter's 'timestamp-query'.
"""
from __future__ import annotations

import argparse
import statistics
import struct
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "pkg"), str(Path(__file__).parent)]


class SpanRecorder:
    """Replaces NativeHost._encode: the first pass of a step's first part writes a
    timestamp at its start, the last dispatch of its last part (in a pass of its own)
    one at its end, and that part's encoder resolves both; every call's end time is kept."""

    def __init__(self, native, host):
        self.native, self.host, self.marks = native, host, []
        lib, dev = host.lib, host.device
        self.qs = dev.create_query_set(type=lib.QueryType.timestamp, count=2)
        self.res = dev.create_buffer(size=16, usage=lib.BufferUsage.QUERY_RESOLVE
                                     | lib.BufferUsage.COPY_SRC)
        self.commands = None

    def encode(self, enc, commands, timestamps=None, keep=None):
        first = commands[0] is self.commands[0]
        last = commands[-1] is self.commands[-1]
        dispatches = [i for i, c in enumerate(commands) if c[0] == "dispatch"]
        cpass = None
        for i, c in enumerate(commands):
            if c[0] != "dispatch":
                if cpass is not None:
                    cpass.end()
                    cpass = None
                enc.copy_buffer_to_buffer(*c[1:6])
                continue
            if cpass is not None and last and i == dispatches[-1]:
                cpass.end()  # the last dispatch in a pass of its own, for the end stamp
                cpass = None
            if cpass is None:
                stamps = {}
                if first and i == dispatches[0]:
                    stamps["beginning_of_pass_write_index"] = 0
                if last and i == dispatches[-1]:
                    stamps["end_of_pass_write_index"] = 1
                cpass = enc.begin_compute_pass(
                    timestamp_writes=dict(stamps, query_set=self.qs) if stamps else None)
                if keep is not None:
                    keep.append(cpass)
            cpass.set_pipeline(c[1])
            cpass.set_bind_group(0, c[2])
            cpass.dispatch_workgroups(*c[3])
        if cpass is not None:
            cpass.end()
        if last:
            enc.resolve_query_set(self.qs, 0, 2, self.res, 0)
        self.marks.append(time.perf_counter())

    def span_ms(self) -> float:
        t0, t1 = struct.unpack("<2Q", bytes(self.host.device.queue.read_buffer(self.res))[:16])
        return (t1 - t0) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="small64")
    ap.add_argument("--submit-first", default="32,8")
    ap.add_argument("--spin-wait", default="1")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    import numpy as np
    import gpt2_train as G
    import webgrad as wg
    from webgrad import optim
    from webgrad.backends import webgpu_native as native
    for row in args.rows.split(","):
        d, layers, heads, vocab, context, B, T = G.ROWS[row]
        factory, loss_fn = G.webgrad_model(d, layers, heads, vocab, context)
        c = wg.compile_module(factory, loss_fn, backend="webgpu",
                              inputs={"idx": ([B, T], "i32"), "target": ([B, T], "i32")},
                              optimizer=optim.AdamW(lr=G.LR, weight_decay=G.WD))
        feeds = [dict(zip(("idx", "target"), G.batch(np, vocab, B, T, s))) for s in range(4)]
        for s in range(5):
            c.step(feeds[s % 4])
        host = c._train.backend.host
        prog = host._programs[c._train.exe.program]
        rec = SpanRecorder(native, host)
        rec.commands = prog.commands
        saved = native.NativeHost.__dict__["_encode"], native.SUBMIT_FIRST, native.SPIN_WAIT
        print(f"{row}: {c.kernel_count} kernels")
        print("| submit first | spin wait | wall ms | span ms | wall - span | gpu start ms | encoded ms |")
        print("|---|---|---|---|---|---|---|")
        settings = [(int(f), w == "1") for f in args.submit_first.split(",")
                    for w in args.spin_wait.split(",")]
        try:
            native.NativeHost._encode = staticmethod(rec.encode)
            for first, spin in settings:
                native.SUBMIT_FIRST, native.SPIN_WAIT = first, spin
                wall, span, start, done = [], [], [], []
                for s in range(args.steps):
                    rec.marks = []
                    t0 = time.perf_counter()
                    c.step(feeds[s % 4])
                    wall.append(1e3 * (time.perf_counter() - t0))
                    span.append(rec.span_ms())
                    start.append(1e3 * (rec.marks[0] - t0))
                    done.append(1e3 * (rec.marks[-1] - t0))
                w, sp = statistics.median(wall), statistics.median(span)
                print(f"| {first} | {spin} | {w:.2f} | {sp:.2f} | {w - sp:.2f} | "
                      f"{statistics.median(start):.2f} | {statistics.median(done):.2f} |")
        finally:
            native.NativeHost._encode, native.SUBMIT_FIRST, native.SPIN_WAIT = saved
        prof = c.profile(feeds[0])
        print(f"kernel sum (profile, a pass per dispatch): {1e3 * prof.total_seconds:.2f} ms")
        c.destroy()


if __name__ == "__main__":
    main()
