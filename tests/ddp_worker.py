"""One rank of the DistributedDataParallel test (tests/test_torch_interop.py).

    python3 tests/ddp_worker.py RANK WORLD STORE_FILE OUT_FILE

Each rank compiles the tiny transformer of tests/models.py for its share of the batch,
exports it with c.to_torch(), wraps it in DDP (gloo, CPU) and trains STEPS Adam steps on its
rows of each global batch; rank 0 writes the trained state dict (safetensors) to OUT_FILE.
The test repeats the same steps in one process on the whole batch and compares.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "pkg"), str(HERE)]

import models  # noqa: E402
import webgrad as wg  # noqa: E402

GLOBAL_B, STEPS, LR = 16, 4, 0.01


def compile_for(batch: int):
    """The transformer with gradients only (torch's optimizer does the updates)."""
    inputs = {"idx": ([batch, models.SEQ], "i32"), "target": ([batch, models.HALF], "i32")}
    return wg.compile_module(models.Transformer, models.transformer_loss, inputs=inputs,
                             optimizer=None, backend="torch", seed=0)


def global_batch(step: int):
    import torch
    b = models.reversal_batch(seed=100 + step, b=GLOBAL_B)
    return torch.tensor(b["idx"], dtype=torch.int32), torch.tensor(b["target"], dtype=torch.int32)


def train(module, rows: slice | None = None, wrap=None):
    """STEPS Adam steps; each sees rows `rows` of the global batch. Returns the losses."""
    import torch
    model = wrap(module) if wrap else module
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        idx, target = global_batch(step)
        if rows is not None:
            idx, target = idx[rows], target[rows]
        opt.zero_grad()
        loss = model(idx=idx, target=target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    import safetensors.torch
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world, store, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    share = GLOBAL_B // world
    module = compile_for(share).to_torch()
    train(module, slice(rank * share, (rank + 1) * share), wrap=DDP)
    if rank == 0:
        safetensors.torch.save_file({k: v.contiguous() for k, v in module.state_dict().items()}, out)
    dist.barrier()
    dist.destroy_process_group()
    # Gloo's threads can still be winding down when the interpreter tears down its C++
    # statics; once in a while that ends in std::terminate and a failed exit status after all
    # the work is done and written. Leave without running those destructors.
    print(f"rank {rank} done", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
