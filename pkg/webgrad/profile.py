"""The profiler: where a WebGPU step's time goes, kernel by kernel.

`CompiledModule.profile(feed)` (and `profile_async`, `CompiledForward.profile`) runs one
step exactly as `step`/`run` would (the parameters advance), but encodes each dispatch in
its own compute pass with GPU timestamps around it, and returns a `Profile`: one row per
command of the plan with
  name        the kernel's name (codegen's, e.g. "matmul 512x1536 K=16384 tile 64x64x16")
  ops         the IR ops the kernel covers ("matmul+add+gelu"), and their node ids
  workgroups  the dispatch's grid, as a count
  bytes       compulsory global traffic, a floor (codegen/cost.py's model)
  flops       the kernel's arithmetic (codegen/cost.py's model)
  seconds     GPU time from timestamp queries where the adapter has 'timestamp-query',
              else the wall time of the dispatch submitted alone ("wall": includes a
              submission's latency), None where the host cannot time
and the achieved GB/s and GFLOP/s. (Dawn quantises timestamps, to 65.5 us on the H200: a
short kernel reads 0 or 0.066 ms, while sums over many kernels stay right on average.) `Profile.text(top=10)` prints the rows that took the
most time. The static columns (computed at lowering from fusion's groups, codegen/cost.py)
exist on every host; the timing is the host's `profile(program, writes)`: natively
backends/webgpu_native.py, in the browser backends/webgpu_browser.py over worker/replay.mjs's
`profile`, which asks for 'timestamp-query' where the adapter has it (headless Chromium's
SwiftShader does, with webgrad.browser.CHROMIUM_FLAGS alone). A browser may quantise the
timestamps (Chrome to 100 us without --enable-webgpu-developer-features): short kernels then
read 0 or 0.1 ms, sums stay right on average.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Row:
    name: str
    ops: str
    nodes: list
    workgroups: int
    bytes: int
    flops: int
    seconds: float | None

    @property
    def gbps(self):
        return self.bytes / self.seconds / 1e9 if self.seconds else None

    @property
    def gflops(self):
        return self.flops / self.seconds / 1e9 if self.seconds else None


@dataclass
class Profile:
    rows: list[Row]
    timing: str                # "timestamp", "wall" or "none"
    info: str = ""             # the adapter
    extra: dict = field(default_factory=dict)

    @property
    def total_seconds(self) -> float | None:
        ts = [r.seconds for r in self.rows if r.seconds is not None]
        return sum(ts) if ts else None

    def top(self, n: int = 10) -> list[Row]:
        return sorted(self.rows, key=lambda r: -(r.seconds or 0.0))[:n]

    def text(self, top: int | None = None) -> str:
        rows = self.top(top) if top else self.rows
        tot = self.total_seconds
        head = (f"{len(self.rows)} commands, GPU time {'-' if tot is None else f'{tot * 1e3:.3f} ms'}"
                f" ({self.timing}) on {self.info}")
        if top and top < len(self.rows):
            head += f"; the {top} that took longest:"
        lines = [head, f"{'#':>4} {'ms':>8} {'%':>5} {'GB/s':>7} {'GFLOP/s':>8} {'MB':>8} "
                       f"{'MFLOP':>8} {'wg':>7}  kernel [ops]"]
        index = {id(r): k for k, r in enumerate(self.rows)}
        for r in rows:
            ms = "-" if r.seconds is None else f"{r.seconds * 1e3:.3f}"
            pct = "-" if r.seconds is None or not tot else f"{100 * r.seconds / tot:.1f}"
            lines.append(f"{index[id(r)]:>4} {ms:>8} {pct:>5} {_g(r.gbps):>7} {_g(r.gflops):>8} "
                         f"{_g(r.bytes / 1e6):>8} {_g(r.flops / 1e6):>8} {r.workgroups:>7}  "
                         f"{r.name} [{r.ops}]")
        return "\n".join(lines)

    __str__ = text


def _g(v) -> str:
    """3 significant digits, no exponent below 1e6 (table cells)."""
    if v is None:
        return "-"
    if v == 0 or abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


async def profile_program(exe, feeds) -> Profile:
    """Run one step of a WebGPUProgram `exe` with per-command timing (see the header)."""
    low, host = exe.lowered, exe.backend.host
    writes = {low.feeds[k]: v.tobytes() for k, v in feeds.items() if k in low.feeds}
    prof = getattr(host, "profile", None)
    if prof is None:  # no timing on this host: the static columns alone, the step still runs
        await host.run(exe.program, writes, [])
        times, timing = [None] * len(low.kernels), "none"
    else:
        times, timing = await prof(exe.program, writes)
    rows = [Row(k["name"], k["ops"], k["nodes"], k["workgroups"], k["bytes"], k["flops"], t)
            for k, t in zip(low.kernels, times)]
    return Profile(rows, timing, str(getattr(host, "info", "")))


__all__ = ["Profile", "Row", "profile_program"]
