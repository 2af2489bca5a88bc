#!/usr/bin/env python3
"""Diagnostics: where a webgrad training step's wall time goes beyond the GPU's (host side).

    python3 bench/diag_step.py --row small64
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pkg"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--row", default="small64")
    args = ap.parse_args()
    import numpy as np
    from gpt2_train import ROWS, batch, webgrad_model
    import webgrad as wg
    from webgrad import optim
    from webgrad.compiled import run_blocking
    d, layers, heads, vocab, context, B, T = ROWS[args.row]
    f, loss = webgrad_model(d, layers, heads, vocab, context)
    c = wg.compile_module(f, loss, backend="webgpu", inputs={"idx": ([B, T], "i32"), "target": ([B, T], "i32")},
                          optimizer=optim.AdamW(lr=3e-4))
    idx, tgt = batch(np, vocab, B, T, 0)
    feed = {"idx": idx, "target": tgt}
    for _ in range(3):
        c.step(feed)

    def med(fn, n=5):
        ts = []
        for _ in range(n):
            t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(ts)
    print("step wall ms", med(lambda: c.step(feed)))
    exe = c._train.exe
    host = exe.backend.host
    dev = host.device
    writes = {exe.lowered.feeds[k]: v.tobytes() for k, v in c._train.check_feed(feed, "x").items()}

    def submit_only():
        run_blocking(host.run(exe.program, writes, []))
        dev.queue.on_submitted_work_done_sync()
    print("run(no reads)+work_done ms", med(submit_only))

    def enc_only():
        t0 = time.perf_counter()
        run_blocking(host.run(exe.program, writes, []))
        return time.perf_counter() - t0
    ts = [enc_only() for _ in range(3)]
    dev.queue.on_submitted_work_done_sync()
    print("encode+submit only ms", [round(t * 1e3, 2) for t in ts])
    p = c.profile(feed)
    print("profile GPU total ms", p.total_seconds * 1e3)
    pr = cProfile.Profile(); pr.enable()
    c.step(feed)
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
