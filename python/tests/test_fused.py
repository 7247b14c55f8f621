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


# ---- a reference for any loop: every rank's gradient, averaged, without communication

def ref_average(ref, batches, comm_size, loss_of=None):
    """The average over ranks of each ref parameter's gradient, summed over the
    micro-batches batches(r) gives for rank r (None where no rank's gradient reaches
    the parameter)."""
    loss_of = loss_of or (lambda m, x, y: torch.nn.functional.mse_loss(m(x), y))
    total = [None] * len(list(ref.parameters()))
    for r in range(comm_size):
        for x, y in batches(r):
            ref.zero_grad(set_to_none=True)
            loss_of(ref, x, y).backward()
            for k, p in enumerate(ref.parameters()):
                if p.grad is not None:
                    g = p.grad / comm_size
                    total[k] = g if total[k] is None else total[k] + g
    return total


def start(comm, unused=False, cls=None, **kwargs):
    """FusedDataParallel over a fresh model on every rank (different seeds: the
    broadcast must fix them) and a reference copy of rank 0's initial state."""
    cls = cls or (lambda: Net(unused))
    FDP = _fused_module().FusedDataParallel
    torch.manual_seed(0)
    ref = cls()
    torch.manual_seed(100 + comm.rank)
    model = cls()
    ddp = FDP(model, comm, **kwargs)
    return model, ddp, ref


def worst_grad(model, want):
    """The largest difference between model's gradients and want (None matches None)."""
    worst = 0.0
    for p, g in zip(model.parameters(), want):
        if g is None or p.grad is None:
            assert g is None and p.grad is None, (p.shape, p.grad is None, g is None)
            continue
        assert p.grad.shape == g.shape
        if g.numel():
            worst = max(worst, (p.grad - g).abs().max().item())
    return worst


def grad_error(model, ref, batches, comm_size, loss_of=None):
    """worst_grad of model's gradients against ref_average's for batches, ref loaded
    with model's state first."""
    ref.load_state_dict(model.state_dict())
    return worst_grad(model, ref_average(ref, batches, comm_size, loss_of))


def check_step(comm, model, ddp, ref, step):
    """A synchronized step on this rank's batch `step`; its gradients' grad_error against
    the average of every rank's."""
    x, y = batch(comm.rank, step)
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    return grad_error(model, ref, lambda r: [batch(r, step)], comm.size)


def sgd(model, lr=0.05):
    """A plain SGD step on model's gradients."""
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad


class Heads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x, use_b=True):
        y = torch.relu(self.a(x))
        return self.b(y) if use_b else y[:, :4]


def recover(comm, views):
    model, ddp, ref = start(comm, cls=Heads, bucket_views=views)
    x, y = batch(comm.rank, 0)
    raised = None
    try:
        torch.nn.functional.mse_loss(ddp(x, use_b=False), y).backward()
    except Exception as e:  # noqa: BLE001 (any error: the step must fail, and be closed)
        raised = type(e).__name__
    live = True
    if views:
        live = all(p.grad.data_ptr() == ddp._fuser.address(ddp._index[p])
                   for p in model.parameters())
    worst = 0.0
    for step in range(1, 5):
        for _ in range(3):
            model.zero_grad()  # writes through the gradients: into live memory only
        worst = max(worst, check_step(comm, model, ddp, ref, step))
        sgd(model)
    ddp.destroy()
    return raised, live, worst


@pytest.mark.parametrize("views", [True, False])
def test_failed_first_step_recovers(views):
    for raised, live, worst in run(lambda comm: recover(comm, views), 2, transport="shm"):
        assert raised == "InvalidArgError"
        assert live, "gradients left pointing into the freed buckets"
        assert worst < 1e-5, worst


def set_to_none(comm, views, where, steps=3):
    """zero_grad(set_to_none=True) before the forward ("top") or between forward and
    backward ("mid"): autograd makes a new .grad, which the fuser must reduce (it
    reduced the stale bucket, or the tensor registered at construction)."""
    model, ddp, ref = start(comm, bucket_views=views)
    worst = 0.0
    for step in range(steps):
        x, y = batch(comm.rank, step)
        if where == "top":
            model.zero_grad(set_to_none=True)
            out = ddp(x)
        else:
            out = ddp(x)
            model.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(out, y).backward()
        worst = max(worst, grad_error(model, ref, lambda r: [batch(r, step)], comm.size))
        sgd(model)
    ddp.destroy()
    return worst


@pytest.mark.parametrize("views", [True, False])
@pytest.mark.parametrize("where", ["top", "mid"])
def test_set_to_none(views, where):
    for worst in run(lambda comm: set_to_none(comm, views, where), 2, transport="shm"):
        assert worst < 1e-5, worst


def unused_stay_none(comm, views):
    """find_unused_parameters: a parameter no rank uses keeps grad None, as with DDP,
    so weight decay leaves it alone (it got zeros, and SGD's weight decay moved it)."""
    model, ddp, ref = start(comm, unused=True, bucket_views=views,
                            find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.1)
    spare = [p.detach().clone() for p in model.spare.parameters()]
    worst, nones = 0.0, True
    for step in range(3):
        opt.zero_grad()
        worst = max(worst, check_step(comm, model, ddp, ref, step))  # spare: None on both
        nones &= all(p.grad is None for p in model.spare.parameters())
        opt.step()
    moved = max((p - q).abs().max().item() for p, q in zip(model.spare.parameters(), spare))
    ddp.destroy()
    return worst, nones, moved


@pytest.mark.parametrize("views", [True, False])
def test_unused_parameters_keep_no_gradient(views):
    for worst, nones, moved in run(lambda comm: unused_stay_none(comm, views), 2,
                                   transport="shm"):
        assert nones, "an unused parameter got a gradient"
        assert moved == 0, moved
        assert worst < 1e-5, worst


def accumulate(comm, views):
    """no_sync(): two backward passes accumulate this rank's own gradients, with no
    communication; the third, synchronized, averages the sum of all three over the
    ranks."""
    model, ddp, ref = start(comm, bucket_views=views)
    worst_local, worst = 0.0, 0.0
    for step in range(2):
        model.zero_grad()
        micro = lambda r: [batch(r, 10 * step + k) for k in range(3)]  # noqa: E731
        mine = micro(comm.rank)
        with ddp.no_sync():
            for x, y in mine[:2]:
                torch.nn.functional.mse_loss(ddp(x), y).backward()
        # this rank's sum, nothing averaged
        worst_local = max(worst_local, grad_error(model, ref, lambda r: mine[:2], 1))
        x, y = mine[2]
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        worst = max(worst, grad_error(model, ref, micro, comm.size))
        sgd(model)
    ddp.destroy()
    return worst_local, worst


@pytest.mark.parametrize("views", [True, False])
def test_no_sync(views):
    for worst_local, worst in run(lambda comm: accumulate(comm, views), 2, transport="shm"):
        assert worst_local < 1e-5, worst_local
        assert worst < 1e-5, worst


def accumulate_then_unused(comm, views, find_unused):
    """A parameter that got gradients under no_sync() only (b: used in the accumulated
    passes, not in the synchronized one) is reduced with the rest at the synchronized
    step, not declared unused (its sum dropped) or forgotten (the wait failed)."""
    model, ddp, ref = start(comm, cls=Heads, bucket_views=views,
                            find_unused_parameters=find_unused)
    with_b = lambda m, x, y: torch.nn.functional.mse_loss(m(x), y)  # noqa: E731
    without_b = lambda m, x, y: torch.nn.functional.mse_loss(m(x, False), y)  # noqa: E731
    worst = 0.0
    for step in range(2):
        model.zero_grad()
        micro = lambda r: [batch(r, 10 * step + k) for k in range(3)]  # noqa: E731
        mine = micro(comm.rank)
        with ddp.no_sync():
            for x, y in mine[:2]:
                with_b(ddp, x, y).backward()
        x, y = mine[2]
        without_b(ddp, x, y).backward()
        ref.load_state_dict(model.state_dict())
        first = ref_average(ref, lambda r: micro(r)[:2], comm.size, with_b)
        last = ref_average(ref, lambda r: micro(r)[2:], comm.size, without_b)
        want = [a if b is None else a + b for a, b in zip(first, last)]
        worst = max(worst, worst_grad(model, want))
        sgd(model)
    ddp.destroy()
    return worst


@pytest.mark.parametrize("views", [True, False])
@pytest.mark.parametrize("find_unused", [True, False])
def test_no_sync_then_unused(views, find_unused):
    for worst in run(lambda comm: accumulate_then_unused(comm, views, find_unused), 2,
                     transport="shm"):
        assert worst < 1e-5, worst


class Boom(torch.autograd.Function):
    """Identity whose backward raises while armed."""
    armed = False

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        if Boom.armed:
            raise RuntimeError("boom")
        return g


class Exploding(Net):
    def forward(self, x):
        return self.c(torch.relu(self.b(Boom.apply(torch.relu(self.a(x))))))


def backward_raised(comm):
    """A backward that raises halfway (c's and b's hooks ran, a's never did): autograd
    drops the queued end of the step, so the hooks' state stayed set and every later
    step hung or failed. The next forward closes that step; later ones average right."""
    model, ddp, ref = start(comm, cls=Exploding)
    Boom.armed = True
    x, y = batch(comm.rank, 0)
    try:
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        raised = False
    except RuntimeError as e:
        raised = "boom" in str(e)
    Boom.armed = False
    worst = 0.0
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(1, 3):
            model.zero_grad()
            worst = max(worst, check_step(comm, model, ddp, ref, step))
    ddp.destroy()
    return raised, worst, len(caught)


def test_backward_raised_recovers():
    for raised, worst, warned in run(backward_raised, 2, timeout=30, transport="shm"):
        assert raised
        assert warned == 1
        assert worst < 1e-5, worst


def different_shapes(comm):
    """Rank 1's first weight is transposed (8x32 against 32x8: the same count and dtype,
    so the broadcast, the buckets and the fuser's own check matched): refused at
    construction on every rank, as DDP does, not trained on rank 0's bytes reshaped."""
    FDP = _fused_module().FusedDataParallel
    model = Net()
    if comm.rank == 1:
        model.a.weight = torch.nn.Parameter(torch.zeros(8, 32))
    try:
        FDP(model, comm).destroy()
        return "accepted"
    except Exception as e:  # noqa: BLE001
        return type(e).__name__


def test_different_shapes_refused():
    assert run(different_shapes, 2, transport="shm") == ["MismatchError"] * 2


class WithEmpty(Net):
    def __init__(self):
        super().__init__()
        self.empty = torch.nn.Parameter(torch.zeros(0, 4))

    def forward(self, x):
        return super().forward(x) + self.empty.sum()


def empty_parameter(comm, views):
    model, ddp, ref = start(comm, cls=WithEmpty, bucket_views=views)
    worst = 0.0
    for step in range(2):
        model.zero_grad()
        worst = max(worst, check_step(comm, model, ddp, ref, step))
    ddp.destroy()
    return worst, tuple(model.empty.grad.shape)


@pytest.mark.parametrize("views", [True, False])
def test_zero_element_parameter(views):
    for worst, shape in run(lambda comm: empty_parameter(comm, views), 2, transport="shm"):
        assert worst < 1e-5, worst
        assert shape == (0, 4)


def negative_caps(comm):
    from tutti.fuse import Fuser
    FDP = _fused_module().FusedDataParallel
    out = []
    for kw in ({"bucket_cap_bytes": -1}, {"first_bucket_cap_bytes": -5},
               {"last_bucket_cap_bytes": -(1 << 20)}):
        try:
            Fuser(comm, **kw).destroy()
            out.append("accepted")
        except ValueError:
            out.append("ValueError")
    try:
        FDP(Net(), comm, bucket_cap_mb=-1).destroy()
        out.append("accepted")
    except ValueError:
        out.append("ValueError")
    return out


def test_negative_caps_refused():
    assert run(negative_caps, 1) == [["ValueError"] * 4]
