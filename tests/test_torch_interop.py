"""c.to_torch(), webgrad.from_torch_state_dict and c.load_state_dict against webgrad itself:
the exported torch.nn.Module has c's parameter names and values, its forward equals c.run
(bit for bit against the torch backend, within f32 rounding against the numpy reference),
its autograd gradients equal webgrad's own, its step counter keys dropout as webgrad's does,
and DistributedDataParallel on 2 gloo processes equals one process on the whole batch.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import ddp_worker
import models
import test_checkpoint as ck
import webgrad as wg
from webgrad import FeedError


def tensors(feed: dict) -> dict:
    return {k: torch.tensor(v, dtype=torch.int32 if k in ("idx", "target") else torch.float32)
            for k, v in feed.items()}


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_forward_and_grads_equal_webgrad(backend):
    c = models.compile_transformer(backend, seed=3, optimizer=None)
    feed = models.reversal_batch(seed=4)
    m = c.to_torch().eval()
    params = c.download_params()
    assert sorted(dict(m.named_parameters())) == sorted(c.param_names) == sorted(m.state_dict())
    for k, v in m.state_dict().items():
        assert np.array_equal(v.numpy(), params[k]), k
    loss = m(**tensors(feed))
    want = c.run(feed)
    if backend == "torch":
        assert loss.item() == want
    else:
        assert loss.item() == pytest.approx(want, rel=1e-6)
    loss.backward()
    assert c.step(feed) == pytest.approx(want, rel=1e-6)     # gradients only: params stay
    grads = c.download_param_grads()
    for name, p in m.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), grads[name], rtol=1e-4, atol=1e-6, err_msg=name)
    # positional inputs, in the declared order
    assert m(*tensors(feed).values()).item() == loss.item()


def test_compiled_forward_to_torch():
    c = models.compile_transformer("torch", seed=1)
    f = c.compile_forward(lambda m, inp: models.transformer_logits(m, inp["idx"]),
                          inputs={"idx": ([2, models.SEQ], "i32")})
    idx = models.reversal_batch(seed=0, b=2)["idx"]
    m = f.to_torch()
    assert np.array_equal(m(idx=torch.tensor(idx, dtype=torch.int32)).detach().numpy(),
                          f.run({"idx": idx}))


def test_dropout_follows_the_step_counter():
    """Training-mode forwards advance the counter as webgrad's steps do (same masks)."""
    c = ck.compile_net("torch", optimizer="sgd")
    m = c.to_torch()
    c2 = wg.compile_module(ck.Net, ck.loss_fn, inputs={"x": [ck.B, ck.D_IN], "y": [ck.B, 1]},
                           optimizer=None, backend="torch")
    feed = ck.batch(0)
    want = [c2.step(feed) for _ in range(3)]              # no update: only the step moves
    assert len(set(want)) == 3                            # the masks do change
    got = [m(**tensors(feed)).item() for _ in range(3)]
    assert got == want and m.step.item() == 3.0
    m.eval()
    assert m(**tensors(feed)).item() == c2.run(feed) and m.step.item() == 3.0


def test_torch_training_comes_back():
    c = models.compile_transformer("torch", seed=2)
    m = c.to_torch()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    feed = models.reversal_batch(seed=1)
    for _ in range(3):
        opt.zero_grad()
        m(**tensors(feed)).backward()
        opt.step()
    c.load_state_dict(m.state_dict())
    m.eval()
    assert c.run(feed) == m(**tensors(feed)).item()
    got = c.download_params()
    for k, v in m.state_dict().items():
        assert np.array_equal(got[k], v.numpy()), k


def test_state_dict_errors_change_nothing():
    c = models.compile_transformer("reference", seed=2)
    before = c.download_params()
    sd = {k: torch.from_numpy(v.copy()) for k, v in before.items()}
    with pytest.raises(FeedError, match="'head'.*shape \\[32, 12\\]"):
        c.load_state_dict(sd | {"head": torch.zeros(12, 32)})
    with pytest.raises(FeedError, match="unknown parameter 'extra'"):
        c.load_state_dict(sd | {"extra": torch.zeros(1)})
    with pytest.raises(FeedError, match="missing 'head'"):
        c.load_state_dict({k: v for k, v in sd.items() if k != "head"})
    with pytest.raises(FeedError, match=r"'head': expects f32\[32, 12\], got dtype int64"):
        c.load_state_dict(sd | {"head": torch.zeros(32, 12, dtype=torch.int64)})
    with pytest.raises(FeedError, match=r"'head': NaN at index \[0, 1\]"):
        c.load_state_dict(sd | {"head": torch.zeros(32, 12).index_fill_(1, torch.tensor([1]),
                                                                        float("nan"))})
    after = c.download_params()
    assert all(np.array_equal(after[k], before[k]) for k in before)
    # DDP's "module." prefix and other float dtypes are accepted; partial with strict=False
    c.load_state_dict({"module." + k: v.double() for k, v in sd.items()})
    c.load_state_dict({"head": torch.ones(32, 12)}, strict=False)
    assert np.all(c.download_params()["head"] == 1)
    with pytest.raises(FeedError, match="forward\\(\\): input 'idx' expects shape \\[16, 8\\]"):
        c.to_torch()(idx=torch.zeros(2, 8, dtype=torch.int32),
                     target=torch.zeros(16, 4, dtype=torch.int32))


def test_state_dict_of_nested_lists_and_load_state_dicts_own_words():
    """Values that are not tensors (a state dict saved as JSON lists) are checked against the
    parameter's shape; errors name load_state_dict and its keyword, not upload_params."""
    c = models.compile_transformer("reference", seed=2)
    m = models.compile_transformer("torch", seed=5).to_torch()
    c.load_state_dict({k: v.tolist() for k, v in m.state_dict().items()})
    got = c.download_params()
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(got[k], v.numpy(), err_msg=k)
    before = c.download_params()
    with pytest.raises(FeedError, match="load_state_dict\\(\\): missing 'head'.*strict=False"):
        c.load_state_dict({k: v.tolist() for k, v in m.state_dict().items() if k != "head"})
    with pytest.raises(FeedError, match="load_state_dict\\(\\): 'head': expects shape \\[32, 12\\]"):
        c.load_state_dict({k: v.tolist() for k, v in m.state_dict().items()} | {"head": [[0.0] * 32] * 12})
    with pytest.raises(FeedError, match="pass a dict name -> tensor"):
        c.load_state_dict(list(m.state_dict().items()))
    after = c.download_params()
    assert all(np.array_equal(after[k], before[k]) for k in before)


def test_ddp_two_processes_equal_one_process_on_the_whole_batch(tmp_path):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    out = tmp_path / "ddp.safetensors"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    worker = str(Path(ddp_worker.__file__))
    procs = [subprocess.Popen([sys.executable, worker, str(r), "2", str(tmp_path / "store"), str(out)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    assert all(f"rank {r} done" in log for r, log in enumerate(logs)), "\n".join(logs)

    whole = ddp_worker.compile_for(ddp_worker.GLOBAL_B)
    single = whole.to_torch()
    ddp_worker.train(single)
    import safetensors.torch
    ddp = safetensors.torch.load_file(str(out))
    init = whole.download_params()
    for k, v in single.state_dict().items():
        assert not np.allclose(v.numpy(), init[k]) or k.startswith("blocks.0.b"), k   # trained
        np.testing.assert_allclose(ddp[k].numpy(), v.numpy(), rtol=1e-5, atol=1e-6, err_msg=k)
    # half the batch alone gives something else: the comparison can tell
    half = ddp_worker.compile_for(ddp_worker.GLOBAL_B // 2).to_torch()
    ddp_worker.train(half, slice(0, ddp_worker.GLOBAL_B // 2))
    assert not torch.allclose(half.state_dict()["head"], single.state_dict()["head"], rtol=1e-3)
    # and back into webgrad
    whole.load_state_dict(ddp)
    feed = models.reversal_batch(seed=9)
    assert whole.run(feed) == pytest.approx(single.eval()(**tensors(feed)).item(), rel=1e-5)


def test_bench_ddp_gpt2_world_1_and_2_on_gloo():
    """bench/ddp_gpt2.py with a tiny GPT-2: DDP and FSDP at world sizes 1 and 2 equal one
    process on the whole batch and webgrad's own AdamW steps, and the DDP weights decode
    through load_state_dict and the KV cache as transformers' GPT2LMHeadModel does."""
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    pytest.importorskip("transformers")
    script = Path(__file__).resolve().parents[1] / "bench" / "ddp_gpt2.py"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(script), "--config", "tiny", "--world", "1,2",
                        "--steps", "3", "--cpu"], env=env, capture_output=True, text=True,
                       timeout=300)
    log = r.stdout + r.stderr
    assert r.returncode == 0 and "all checks passed" in log, log
    for line in ("ddp x 1 weights", "ddp x 2 weights", "webgrad (torch) weights", "decode (ddp x 2"):
        assert any(line in s and s.endswith("ok") for s in log.splitlines()), (line, log)
