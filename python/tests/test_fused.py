"""FusedDataParallel (tutti's fuser driven by gradient hooks) against a reference
computed in the test without any communication: every rank rebuilds every rank's batch
and averages the gradients of a local copy of the model."""
import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")
from ranks import run  # noqa: E402


def _fused_module():
    # tutti.torch needs the C++ extension; fused.py itself does not.
    src = os.path.join(os.path.dirname(__file__), "..", "tutti", "torch", "fused.py")
    spec = importlib.util.spec_from_file_location("tutti_fused", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Net(torch.nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        self.a = torch.nn.Linear(8, 32)
        self.b = torch.nn.Linear(32, 32)
        self.c = torch.nn.Linear(32, 4)
        self.spare = torch.nn.Linear(4, 4) if unused else None
        self.register_buffer("steps", torch.zeros(1))

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)


def train(comm, steps, kwargs, unused=False):
    FDP = _fused_module().FusedDataParallel
    torch.manual_seed(comm.rank)  # different starts: the broadcast must fix them
    model = Net(unused)
    ref = Net(unused)
    torch.manual_seed(0)
    ref.load_state_dict(Net(unused).state_dict())  # rank 0's initial state (seed 0)
    if comm.rank == 0:
        model.load_state_dict(ref.state_dict())
    ddp = FDP(model, comm, **kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        x, y = batch(comm.rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        # the reference: the average of every rank's gradient, no communication
        grads = None
        for r in range(comm.size):
            ref.zero_grad()
            xr, yr = batch(r, step)
            torch.nn.functional.mse_loss(ref(xr), yr).backward()
            g = [p.grad.clone() for p in ref.parameters() if p.grad is not None]
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        for p, g in zip([p for p in ref.parameters() if p.grad is not None], grads):
            p.grad = g / comm.size
        ref_opt.step()
    worst = max((a - b).abs().max().item()
                for a, b in zip(model.state_dict().values(), ref.state_dict().values()))
    buckets = ddp._fuser.num_buckets
    ddp.destroy()
    return worst, buckets


@pytest.mark.parametrize("kwargs,tol", [
    ({}, 1e-5),
    ({"bucket_views": False}, 1e-5),
    ({"bucket_cap_mb": 0.001}, 1e-5),
    ({"compression": "fp16"}, 5e-3),
    ({"compression": "bf16"}, 5e-2),
])
def test_matches_reference(kwargs, tol):
    got = run(lambda comm: train(comm, 5, kwargs), 2, transport="shm")
    for worst, buckets in got:
        assert worst < tol, (kwargs, worst)
    if "bucket_cap_mb" in kwargs:
        assert got[0][1] > 1


def test_unused_parameters():
    got = run(lambda comm: train(comm, 3, {"find_unused_parameters": True}, unused=True), 2)
    for worst, _ in got:
        assert worst < 1e-5


def dropped(comm):
    """A FusedDataParallel dropped without destroy(): the gradients it left in the
    parameters still hold their values after the garbage collector ran and the heap was
    reused (they were views of the freed buckets)."""
    import gc
    FDP = _fused_module().FusedDataParallel
    torch.manual_seed(0)
    model = Net()
    ddp = FDP(model, comm)
    x, y = batch(comm.rank, 0)
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    before = [p.grad.clone() for p in model.parameters()]
    del ddp
    gc.collect()
    # reuse the freed heap: chunks of the buckets' sizes and around them
    junk = [torch.full((n,), 7.0) for n in (64, 256, 1024, 2048, 4096) for _ in range(40)]
    after = [p.grad for p in model.parameters()]
    del junk
    return all(torch.equal(a, b) for a, b in zip(before, after))


def test_dropped_without_destroy_keeps_gradients():
    assert run(dropped, 2, transport="shm") == [True, True]
