#!/usr/bin/env python3
"""GPT-2 built by webgrad, trained by PyTorch's DDP and FSDP on any number of processes,
checked against one process on the whole batch and against webgrad's own steps.

    python3 bench/ddp_gpt2.py --config gpt2 --world 1 --steps 20   # one GPU (NCCL)
    python3 bench/ddp_gpt2.py --config gpt2 --world 2 --steps 20   # two GPUs of one host
    python3 bench/ddp_gpt2.py --config tiny --world 2 --steps 3    # CPU (gloo): the CI test
    torchrun --nproc-per-node 2 bench/ddp_gpt2.py --config gpt2   # the same under torchrun

What it does, in order:
  1. webgrad builds and initialises GPT2Module (webgrad.models.gpt2: transformers' names and
     layouts) and compiles its loss for each rank's share of the batch (gradients only);
     `c.to_torch()` exports it as a torch.nn.Module with the same parameters.
  2. Each of --world processes (torch.multiprocessing.spawn, or torchrun's) trains --steps
     AdamW steps on its rows of each global batch, under DistributedDataParallel and then
     under FSDP (torch.distributed.fsdp.fully_shard), NCCL on GPUs (NVLink multicast off:
     NCCL_NVLS_ENABLE=0), gloo on CPUs. Rank 0 writes the trained weights.
  3. One process trains the same steps on the whole batch (to_torch of a whole-batch program):
     DDP's and FSDP's weights must equal its within f32 tolerance (--atol, --rtol).
  4. webgrad trains the same steps itself (its own AdamW, --webgrad-backend: webgpu on a GPU
     machine, the torch executor on CPU) from the same initial weights: equal within the same
     tolerance, and its losses equal torch's step by step.
  5. The DDP weights go back into webgrad with `c.load_state_dict()`, `GPT2.from_compiled`
     decodes a prompt token by token with the KV cache, and every step's logits must equal
     transformers' GPT2LMHeadModel given the same weights (an independent implementation).

Tokens/s: the global batch's tokens over the median step time of steps 2.. (the first
step holds one-off work), for DDP, FSDP, the single process and webgrad. Batches are
uniform random token ids (numpy, one seed per step). Exit status 1 when a check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")   # never NVLink multicast (shared hosts)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pkg"))

CONFIGS = {  # name: (GPT2Config args n_layer, n_head, n_embd, n_ctx, vocab), B, T
    "gpt2": ((12, 12, 768, 1024, 50257), 8, 512),
    "tiny": ((2, 2, 64, 64, 256), 4, 16),
}
LR, WD = 3e-4, 0.01


def config(args):
    from webgrad.models.gpt2 import GPT2Config
    dims, B, T = CONFIGS[args.config]
    return GPT2Config(*dims), args.batch or B, args.seq or T


def compiled(cfg, batch, T, backend="torch", optimizer=None):
    import webgrad as wg
    from webgrad.models.gpt2 import GPT2Module, lm_loss
    return wg.compile_module(lambda: GPT2Module(cfg), lm_loss, backend=backend, seed=0,
                             inputs={"tokens": ([batch, T], "i32"), "targets": ([batch, T], "i32")},
                             optimizer=optimizer)


def global_batch(cfg, B, T, step):
    import numpy as np
    rng = np.random.default_rng(1000 + step)
    ids = rng.integers(0, cfg.vocab_size, size=(B, T + 1), dtype=np.int32)
    return ids[:, :T].copy(), ids[:, 1:].copy()


def train(module, cfg, B, T, steps, rows=slice(None), device="cpu", sync=None):
    """`steps` AdamW steps of `module` (maybe wrapped) on rows `rows` of each global batch.
    -> (losses: the whole batch's mean when sync all-reduces, step times in s)."""
    import torch
    opt = torch.optim.AdamW(module.parameters(), lr=LR, weight_decay=WD)
    losses, times = [], []
    for s in range(steps):
        tok, tgt = (torch.from_numpy(a[rows]).to(device) for a in global_batch(cfg, B, T, s))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = module(tokens=tok, targets=tgt)
        loss.backward()
        opt.step()
        loss = loss.detach()
        if sync:
            loss = sync(loss)
        losses.append(loss.item())     # a host read each step, as webgrad's step returns a float
        times.append(time.perf_counter() - t0)
    return losses, times


def rank_main(rank, world, args, out_dir, init_method):
    import safetensors.torch
    import torch
    import torch.distributed as dist
    cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // (2 * world)))
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init_method,
                            rank=rank, world_size=world)
    cfg, B, T = config(args)
    if B % world:
        raise SystemExit(f"--batch {B} does not split over {world} processes; give a multiple")
    share = B // world
    rows = slice(rank * share, (rank + 1) * share)
    c = compiled(cfg, share, T)

    def mean_loss(x):
        dist.all_reduce(x)
        return x / world

    out = {}
    for mode in args.modes.split(","):
        m = c.to_torch().to(device)
        if mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP
            wrapped = DDP(m, device_ids=[device.index] if cuda else None)
        elif mode == "fsdp":
            try:
                from torch.distributed.fsdp import fully_shard
                wrapped = fully_shard(m)
            except Exception as e:   # a backend or build without FSDP: say so, carry on
                out[mode] = {"skipped": f"{type(e).__name__}: {e}"}
                continue
        else:
            raise SystemExit(f"--modes: unknown {mode!r} (ddp, fsdp)")
        try:
            losses, times = train(wrapped, cfg, B, T, args.steps, rows, device, mean_loss)
        except Exception as e:
            if mode != "fsdp":
                raise
            out[mode] = {"skipped": f"{type(e).__name__}: {e}"}
            continue
        sd = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().contiguous()
              for k, v in m.state_dict().items()}
        if rank == 0:
            safetensors.torch.save_file(sd, str(Path(out_dir) / f"{mode}.safetensors"))
        out[mode] = {"losses": losses, "times": times}
        del wrapped, m
        dist.barrier()
    if rank == 0:
        (Path(out_dir) / "ranks.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


def _spawned(rank, world, args, out_dir):
    rank_main(rank, world, args, out_dir, f"file://{out_dir}/store")
    sys.stdout.flush()
    os._exit(0)   # gloo's threads can outlive the interpreter's teardown (tests/ddp_worker.py)


def tok_s(B, T, times):
    t = times[1:] or times
    return B * T / statistics.median(t)


def check(args, runs: dict) -> bool:
    """runs: {world size: the folder its ranks wrote}. Prints the checks; True if all pass."""
    import numpy as np
    import safetensors.torch
    import torch
    from webgrad import optim
    from webgrad.models.gpt2 import GPT2
    cfg, B, T = config(args)
    cuda = torch.cuda.is_available() and not args.cpu
    device = "cuda:0" if cuda else "cpu"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    ok = True

    def compare(name, got: dict, want: dict):
        nonlocal ok
        worst, where = 0.0, ""
        for k, w in want.items():
            g = np.asarray(got[k], dtype=np.float64).reshape(w.shape)
            excess = np.abs(g - w) - (args.atol + args.rtol * np.abs(w))
            if excess.max() > worst or not where:
                worst, where = float(excess.max()), k
        d = max(float(np.abs(np.asarray(got[k], dtype=np.float64).reshape(w.shape) - w).max())
                for k, w in want.items())
        good = worst <= 0
        ok &= good
        print(f"  {name}: max |diff| {d:.3g} (atol {args.atol:g}, rtol {args.rtol:g}) "
              f"{'ok' if good else 'FAIL at ' + where}")

    # the single process on the whole batch
    whole = compiled(cfg, B, T)
    init = {k: np.asarray(v, dtype=np.float64) for k, v in whole.download_params().items()}
    single = whole.to_torch().to(device)
    losses1, times1 = train(single, cfg, B, T, args.steps, device=device)
    ref = {k: v.detach().cpu().double().numpy() for k, v in single.state_dict().items()}
    moved = sum(float(np.abs(ref[k] - init[k]).max()) > 0 for k in ref)
    print(f"\n== GPT-2 {cfg.n_layer} layers, d {cfg.n_embd}, vocab {cfg.vocab_size}; global batch "
          f"{B} x {T}, {args.steps} AdamW steps, world {', '.join(map(str, runs))}, "
          f"{'NCCL on CUDA' if cuda else 'gloo on CPU'}")
    print(f"  single process: losses {losses1[0]:.5f} .. {losses1[-1]:.5f}, "
          f"{tok_s(B, T, times1):.0f} tok/s; {moved}/{len(ref)} tensors trained")
    if moved < len(ref):
        print("  FAIL: the single-process run left some tensors as they were")
        ok = False
    rows = [("single process", tok_s(B, T, times1))]
    trained = None
    for world, out_dir in runs.items():
        ranks = json.loads((Path(out_dir) / "ranks.json").read_text())
        for mode, r in ranks.items():
            if "skipped" in r:
                print(f"  {mode} x {world}: skipped: {r['skipped']}")
                continue
            st = safetensors.torch.load_file(str(Path(out_dir) / f"{mode}.safetensors"))
            if trained is None or mode == "ddp":   # decode the widest DDP run's weights
                trained, first = st, f"{mode} x {world}"
            sd = {k: v.double().numpy() for k, v in st.items()}
            dl = max(abs(a - b) for a, b in zip(r["losses"], losses1))
            print(f"  {mode} x {world}: {tok_s(B, T, r['times']):.0f} tok/s; losses vs single: max "
                  f"|diff| {dl:.3g}")
            ok &= dl <= args.atol * 100 + 1e-4
            rows.append((f"{mode} x {world}", tok_s(B, T, r["times"])))
            compare(f"{mode} x {world} weights vs single process", sd, ref)
    # webgrad's own steps from the same initial weights
    wb = args.webgrad_backend or ("webgpu" if cuda else "torch")
    cw = compiled(cfg, B, T, backend=wb, optimizer=optim.AdamW(lr=LR, weight_decay=WD))
    start = cw.download_params()
    same_init = all(np.array_equal(np.asarray(start[k], dtype=np.float64).reshape(v.shape), v)
                    for k, v in init.items())
    print(f"  webgrad ({wb}): initial weights {'equal' if same_init else 'DIFFER'}")
    ok &= same_init
    lw, tw = [], []
    for s in range(args.steps):
        tok, tgt = global_batch(cfg, B, T, s)
        t0 = time.perf_counter()
        lw.append(float(cw.step({"tokens": tok, "targets": tgt})))
        tw.append(time.perf_counter() - t0)
    dl = max(abs(a - b) for a, b in zip(lw, losses1))
    print(f"  webgrad ({wb}): {tok_s(B, T, tw):.0f} tok/s; losses vs single: max |diff| {dl:.3g}")
    rows.append((f"webgrad {wb}", tok_s(B, T, tw)))
    ok &= dl <= args.atol * 100 + 1e-4
    compare(f"webgrad ({wb}) weights vs single process", cw.download_params(), ref)
    # back into webgrad: load_state_dict, then decode with the KV cache
    if trained is None:
        print("  FAIL: no distributed run wrote weights")
        return False
    cw.load_state_dict(trained)
    try:
        g = GPT2.from_compiled(cw, cfg)
    except ValueError:   # a device that splits the token table: through the host
        g = GPT2.from_hf_state_dict(cfg, trained, backend=cw.backend)
    prompt = [int(t) for t in global_batch(cfg, 1, 12, 99)[0][0]]
    cache = g.new_cache()
    got = [np.asarray(g.logits_step(prompt[:4], cache), dtype=np.float64)]
    for t in prompt[4:]:
        got.append(np.asarray(g.logits_step([t], cache), dtype=np.float64))
    import transformers
    hf_cfg = transformers.GPT2Config(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                                     n_positions=cfg.n_ctx, vocab_size=cfg.vocab_size,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     layer_norm_epsilon=cfg.layer_norm_epsilon,
                                     bos_token_id=0, eos_token_id=0)
    hf = transformers.GPT2LMHeadModel(hf_cfg).to(device).eval()
    missing, unexpected = hf.transformer.load_state_dict(trained, strict=False)
    if unexpected or any(not k.endswith((".attn.bias", ".attn.masked_bias")) for k in missing):
        print(f"  FAIL: transformers refused the weights: missing {missing[:3]} unexpected {unexpected[:3]}")
        ok = False
    hf.tie_weights()
    with torch.no_grad():
        want = hf(torch.tensor([prompt], device=device)).logits[0].double().cpu().numpy()
    d = max(float(np.abs(got[i] - want[3 + i]).max()) for i in range(len(got)))
    scale = float(np.abs(want).max())
    good = d <= 1e-4 * max(1.0, scale) + 1e-4
    ok &= good
    print(f"  decode ({first} weights, load_state_dict, KV cache, {len(got)} steps) vs transformers "
          f"GPT2LMHeadModel: max |diff| {d:.3g} of logits up to {scale:.3g} {'ok' if good else 'FAIL'}")
    print("\n| run | tokens/s |\n|---|---|")
    for name, v in rows:
        print(f"| {name} | {v:.0f} |")
    cw.destroy()
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="gpt2", choices=sorted(CONFIGS))
    ap.add_argument("--world", default=None,
                    help="processes, or several counts run one after the other: 1,2 "
                    "(default: the GPUs, or 2 on CPU)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=None, help="global batch (default: the config's)")
    ap.add_argument("--seq", type=int, default=None, help="sequence length (default: the config's)")
    ap.add_argument("--modes", default="ddp,fsdp", help="comma-separated: ddp, fsdp")
    ap.add_argument("--cpu", action="store_true", help="gloo on CPU even where CUDA is present")
    ap.add_argument("--webgrad-backend", default=None,
                    help="webgrad's own steps (default: webgpu with CUDA, else torch)")
    ap.add_argument("--atol", type=float, default=None,
                    help="default: 1e-5 tiny; gpt2 the learning rate, one AdamW step: where a "
                    "gradient is near zero, two f32 summation orders can move Adam's update of "
                    "that element by a good part of lr (H200, webgpu vs torch, 20 steps: 1.2e-4)")
    ap.add_argument("--rtol", type=float, default=1e-4)
    args = ap.parse_args()
    if args.atol is None:
        args.atol = 1e-5 if args.config == "tiny" else LR
    import torch
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:   # torchrun
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        out_dir = os.environ.get("DDP_GPT2_DIR") or tempfile.gettempdir() + "/ddp_gpt2"
        os.makedirs(out_dir, exist_ok=True)
        rank_main(rank, world, args, out_dir, "env://")
        if rank == 0:
            sys.exit(0 if check(args, {world: out_dir}) else 1)
        return
    cuda = torch.cuda.is_available() and not args.cpu
    worlds = [int(w) for w in args.world.split(",")] if args.world else \
        [torch.cuda.device_count() if cuda else 2]
    for world in worlds:
        if world < 1 or (cuda and world > torch.cuda.device_count()):
            raise SystemExit(f"--world {world}: give 1 to {torch.cuda.device_count()} here (NCCL "
                             "wants one process per GPU; --cpu runs gloo on CPU)")
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for world in worlds:
            runs[world] = f"{tmp}/world{world}"
            os.makedirs(runs[world])
            mp.spawn(_spawned, args=(world, args, runs[world]), nprocs=world, join=True)
        ok = check(args, runs)
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
