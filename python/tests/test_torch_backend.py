"""torch.distributed on the "tutti" backend (tutti.torch): every collective x dtype x
reduce op at 2, 3 and 4 ranks against references computed here from every rank's known
inputs, async works, subgroups, errors (mismatch, killed rank, unsupported ops and
dtypes, monitored barrier), sparse allreduce, and DDP (dense and sparse gradients) whose
parameters match the same run on gloo."""
import contextlib
import datetime
import faulthandler
import functools
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

import pytest
from ranks import answer, collect

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
try:
    import tutti.torch  # noqa: F401  (registers the backend)
except ImportError as e:  # built without -Dtorch
    pytest.skip(f"tutti.torch not built: {e}", allow_module_level=True)

DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]
OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG"]
BITOPS = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}
# dtypes tutti has no type of its own for: data movement carries their bytes, bool reduces
MOVE_DTYPES = DTYPES + [torch.bool, torch.complex64, torch.complex128]
# bool's reductions as NCCL's backend maps them: SUM/MAX any, PRODUCT/MIN all, bitwise as is
BOOL_OPS = {"SUM": torch.logical_or, "MAX": torch.logical_or, "PRODUCT": torch.logical_and,
            "MIN": torch.logical_and, "BAND": torch.logical_and, "BOR": torch.logical_or,
            "BXOR": torch.logical_xor}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(fn, rank, size, init, tmo, limit, env, q):
    try:
        torch.set_num_threads(1)
        os.environ.update(env)
        faulthandler.dump_traceback_later(limit, exit=True)  # a hang shows where
        if init.startswith("env://"):
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=init[len("env://"):])
            init = "env://"
        dist.init_process_group("tutti", init_method=init, rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=tmo))
        try:
            answer(q, rank, "ok", fn(rank, size))
        finally:
            dist.destroy_process_group()
    except BaseException as e:
        answer(q, rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")


def launch(fn, size, timeout=60, init="file", group_timeout=20, env=None):
    """fn(rank, size) on `size` forked ranks in one tutti process group;
    {rank: ("ok", result) | ("error", text)}, ranks that did not answer are missing."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    got = {}
    with tempfile.TemporaryDirectory(prefix="tutti-torch-") as d:
        url = f"env://{_free_port()}" if init == "env" else f"file://{d}/rdv"
        procs = [ctx.Process(target=_child, args=(fn, r, size, url, group_timeout,
                                                     max(timeout - 5, 1), env or {}, q))
                 for r in range(size)]
        collect(procs, q, got, timeout)
    return got


def run(fn, size, **kw):
    got = launch(fn, size, **kw)
    missing = [r for r in range(size) if r not in got]
    assert not missing, f"ranks {missing} did not answer"
    errors = [f"rank {r}: {v}" for r, (k, v) in sorted(got.items()) if k == "error"]
    assert not errors, "\n".join(errors)
    return [got[r][1] for r in range(size)]


# ---- inputs and references ----

def inp(rank, dtype, op="SUM", n=6, salt=0):
    """Small integers, exact in every dtype (products of up to 4 ranks stay in int8)."""
    i = torch.arange(n, dtype=torch.int64)
    if op == "PRODUCT":
        v = (rank + i + salt) % 3 + 1
    elif op in BITOPS:  # 7 bits that differ between ranks (in int8's range)
        v = (rank * 37 + i * 11 + salt * 5 + 3) % 128
    else:
        v = (rank * 7 + i * 3 + salt) % 9 - 4
        if dtype == torch.uint8:
            v = v + 4
    if dtype == torch.bool:  # bit `rank` of masks where all, none, one or some ranks are
        # True: every logical reduction over 2-4 ranks gives both values across the indices
        masks = torch.tensor([0, 15, 1, 13, 3, 6])
        return (masks[(i + salt + rank // 4) % 6] >> (rank % 4)) % 2 == 1
    if dtype.is_complex:
        return torch.complex(v.double(), (v * 3 + rank + 1).double()).to(dtype)
    return v.to(dtype)


def reduce_ref(xs, op, dtype, size):
    if op in BITOPS:
        return functools.reduce(BITOPS[op], xs)
    s = torch.stack([x.double() for x in xs])
    if op == "SUM":
        r = s.sum(0)
    elif op == "PRODUCT":
        r = s.prod(0)
    elif op == "MIN":
        r = s.min(0).values
    elif op == "MAX":
        r = s.max(0).values
    else:
        r = s.sum(0) / size
        if not dtype.is_floating_point:
            r = torch.trunc(r)
    return r.to(dtype)


def same(got, want):
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if want.dtype in (torch.float16, torch.bfloat16):
        return torch.allclose(got.double(), want.double(), rtol=1e-2, atol=1e-2)
    if want.is_floating_point():
        return torch.allclose(got, want, rtol=1e-6, atol=1e-6)
    return torch.equal(got, want)


class Checker:
    def __init__(self):
        self.bad = []
        self.count = 0

    def __call__(self, what, got, want):
        self.count += 1
        if not same(got, want):
            self.bad.append(f"{what}: got {got.tolist()}, want {want.tolist()}")


# ---- every collective x dtype x op ----

def reductions(rank, size, ck):
    for dt in DTYPES:
        for name in OPS + ([] if dt.is_floating_point else list(BITOPS)):
            op = getattr(dist.ReduceOp, name)
            all_in = [inp(r, dt, name) for r in range(size)]
            want = reduce_ref(all_in, name, dt, size)
            t = inp(rank, dt, name)
            dist.all_reduce(t, op)
            ck(f"all_reduce {dt} {name}", t, want)
            root = (size - 1) % size
            t = inp(rank, dt, name)
            dist.reduce(t, root, op)
            ck(f"reduce {dt} {name}", t, want if rank == root else inp(rank, dt, name))
            # reduce_scatter: rank r's block b is inp(r, salt=b)
            blocks = [inp(rank, dt, name, salt=b) for b in range(size)]
            want_rs = reduce_ref([inp(r, dt, name, salt=rank) for r in range(size)], name, dt,
                                 size)
            out = torch.empty(6, dtype=dt)
            dist.reduce_scatter(out, blocks, op)
            ck(f"reduce_scatter {dt} {name}", out, want_rs)
            out = torch.empty(6, dtype=dt)
            dist._reduce_scatter_base(out, torch.cat(blocks), op)
            ck(f"_reduce_scatter_base {dt} {name}", out, want_rs)
            # NCCL's in place: the output is this rank's chunk of the input
            whole = torch.cat(blocks)
            mine = whole.chunk(size)[rank]
            dist._reduce_scatter_base(mine, whole, op)
            ck(f"_reduce_scatter_base in place {dt} {name}", mine, want_rs)
            for b in range(size):
                if b != rank:
                    ck(f"_reduce_scatter_base in place {dt} {name}: block {b} unchanged",
                       whole.chunk(size)[b], blocks[b])
            ts = [inp(rank, dt, name, n=3), inp(rank, dt, name, n=5, salt=1)]
            dist.all_reduce_coalesced(ts, op)
            ck(f"all_reduce_coalesced[0] {dt} {name}", ts[0],
               reduce_ref([inp(r, dt, name, n=3) for r in range(size)], name, dt, size))
            ck(f"all_reduce_coalesced[1] {dt} {name}", ts[1],
               reduce_ref([inp(r, dt, name, n=5, salt=1) for r in range(size)], name, dt, size))


def bool_reductions(rank, size, ck):
    dt = torch.bool
    for name, fn in BOOL_OPS.items():
        op = getattr(dist.ReduceOp, name)
        want = functools.reduce(fn, [inp(r, dt, name) for r in range(size)])
        t = inp(rank, dt, name)
        dist.all_reduce(t, op)
        ck(f"all_reduce bool {name}", t, want)
        t = inp(rank, dt, name)
        dist.reduce(t, 0, op)
        ck(f"reduce bool {name}", t, want if rank == 0 else inp(rank, dt, name))
        out = torch.empty(6, dtype=dt)
        dist.reduce_scatter(out, [inp(rank, dt, name, salt=b) for b in range(size)], op)
        ck(f"reduce_scatter bool {name}", out,
           functools.reduce(fn, [inp(r, dt, name, salt=rank) for r in range(size)]))
    try:
        dist.all_reduce(inp(rank, dt), dist.ReduceOp.AVG)
        ck("all_reduce bool AVG refused", torch.tensor(False), torch.tensor(True))
    except RuntimeError as e:
        ck(f"all_reduce bool AVG refused: {e}", torch.tensor("does not apply to bool" in str(e)),
           torch.tensor(True))


def premul_op(f):
    try:
        return dist._make_nccl_premul_sum(f)
    except TypeError:  # torch 1.13 takes a tensor factor as a list of one
        return dist._make_nccl_premul_sum([f])


def premul_sums(rank, size):
    """PREMUL_SUM (torch's _make_nccl_premul_sum, NCCL's ncclRedOpCreatePreMulSum): the sum
    of every rank's input times the factor, a number or a one-element tensor, cast to the
    tensor's dtype first as NCCL's backend does (3.0 and 2.5 are 3 and 2 for integers);
    inputs that are only read stay as they were."""
    ck = Checker()
    for dt in DTYPES:
        for f in (0.5, 3.0, torch.tensor([2.5], dtype=torch.float64)):
            fv = float(f) if not torch.is_tensor(f) else float(f.item())
            if not dt.is_floating_point:
                fv = float(int(fv))
            if fv == 0:
                continue
            what = f"{dt} x {f.tolist() if torch.is_tensor(f) else f}"

            def ref(**kw):
                return sum(inp(r, dt, **kw).double() * fv for r in range(size)).to(dt)

            op = premul_op(f)
            t = inp(rank, dt)
            dist.all_reduce(t, op)
            ck(f"all_reduce PREMUL_SUM {what}", t, ref())
            t = inp(rank, dt)
            dist.reduce(t, 0, op)
            ck(f"reduce PREMUL_SUM {what}", t, ref() if rank == 0 else inp(rank, dt))
            blocks = [inp(rank, dt, salt=b) for b in range(size)]
            out = torch.empty(6, dtype=dt)
            dist.reduce_scatter(out, blocks, op)
            ck(f"reduce_scatter PREMUL_SUM {what}", out, ref(salt=rank))
            whole = torch.cat(blocks)
            out = torch.empty(6, dtype=dt)
            dist._reduce_scatter_base(out, whole, op)
            ck(f"_reduce_scatter_base PREMUL_SUM {what}", out, ref(salt=rank))
            ck(f"_reduce_scatter_base PREMUL_SUM {what}: input unchanged", whole,
               torch.cat([inp(rank, dt, salt=b) for b in range(size)]))
            ts = [inp(rank, dt, n=3), inp(rank, dt, n=5, salt=1)]
            dist.all_reduce_coalesced(ts, op)
            ck(f"all_reduce_coalesced PREMUL_SUM {what}", torch.cat(ts),
               torch.cat([ref(n=3), ref(n=5, salt=1)]))
    try:
        dist.all_reduce(inp(rank, torch.bool), dist._make_nccl_premul_sum(2.0))
        ck("all_reduce bool PREMUL_SUM refused", torch.tensor(False), torch.tensor(True))
    except RuntimeError as e:
        ck(f"all_reduce bool PREMUL_SUM refused: {e}",
           torch.tensor("PREMUL_SUM does not apply to bool" in str(e)), torch.tensor(True))
    return ck.count, ck.bad


@pytest.mark.parametrize("size", [2, 3])
def test_premul_sum(size):
    for count, bad in run(premul_sums, size, timeout=120):
        assert count == 133 and not bad, (count, "\n".join(bad[:20]))


def movers(rank, size, ck):
    for dt in MOVE_DTYPES:
        mine = inp(rank, dt)
        for root in range(size):
            t = inp(rank, dt)
            dist.broadcast(t, root)
            ck(f"broadcast {dt} root {root}", t, inp(root, dt))
        outs = [torch.empty(6, dtype=dt) for _ in range(size)]
        dist.all_gather(outs, mine)
        for r in range(size):
            ck(f"all_gather {dt} [{r}]", outs[r], inp(r, dt))
        out = torch.empty(6 * size, dtype=dt)
        dist._all_gather_base(out, mine)
        ck(f"_all_gather_base {dt}", out, torch.cat([inp(r, dt) for r in range(size)]))
        lists = [[torch.empty(2, dtype=dt), torch.empty(4, dtype=dt)] for _ in range(size)]
        dist.all_gather_coalesced(lists, [inp(rank, dt, n=2), inp(rank, dt, n=4, salt=5)])
        for r in range(size):
            ck(f"all_gather_coalesced {dt} [{r}][0]", lists[r][0], inp(r, dt, n=2))
            ck(f"all_gather_coalesced {dt} [{r}][1]", lists[r][1], inp(r, dt, n=4, salt=5))
        root = 1 % size
        outs = [torch.empty(6, dtype=dt) for _ in range(size)] if rank == root else None
        dist.gather(mine, outs, dst=root)
        if rank == root:
            for r in range(size):
                ck(f"gather {dt} [{r}]", outs[r], inp(r, dt))
        out = torch.empty(6, dtype=dt)
        ins = [inp(root, dt, salt=b) for b in range(size)] if rank == root else None
        dist.scatter(out, ins, src=root)
        ck(f"scatter {dt}", out, inp(root, dt, salt=rank))
        alltoalls(rank, size, dt, ck)
        p2p(rank, size, dt, ck)


def alltoalls(rank, size, dt, ck):
    # block b of rank r: inp(r, salt=b), 2 elements per block
    send = torch.cat([inp(rank, dt, n=2, salt=b) for b in range(size)])
    out = torch.empty(2 * size, dtype=dt)
    dist.all_to_all_single(out, send)
    ck(f"all_to_all_single {dt}", out, torch.cat([inp(r, dt, n=2, salt=rank)
                                                   for r in range(size)]))
    # uneven: rank r sends r+b+1 rows of 2 to rank b
    rows = lambda r, b: r + b + 1  # noqa: E731
    send = torch.cat([inp(rank, dt, n=2 * rows(rank, b), salt=b) for b in range(size)])
    send = send.view(-1, 2)
    out = torch.empty(sum(rows(r, rank) for r in range(size)), 2, dtype=dt)
    dist.all_to_all_single(out, send, [rows(r, rank) for r in range(size)],
                           [rows(rank, b) for b in range(size)])
    ck(f"all_to_all_single splits {dt}", out.reshape(-1),
       torch.cat([inp(r, dt, n=2 * rows(r, rank), salt=rank) for r in range(size)]))
    outs = [torch.empty(rows(r, rank), dtype=dt) for r in range(size)]
    dist.all_to_all(outs, [inp(rank, dt, n=rows(rank, b), salt=b) for b in range(size)])
    for r in range(size):
        ck(f"all_to_all {dt} [{r}]", outs[r], inp(r, dt, n=rows(r, rank), salt=rank))


def p2p(rank, size, dt, ck):
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    got = torch.empty(6, dtype=dt)
    reqs = [dist.isend(inp(rank, dt, salt=9), nxt, tag=7), dist.irecv(got, prv, tag=7)]
    for w in reqs:
        w.wait()
    ck(f"isend/irecv {dt}", got, inp(prv, dt, salt=9))
    if rank == 0:
        dist.send(inp(rank, dt, salt=3), size - 1)
    elif rank == size - 1:
        t = torch.empty(6, dtype=dt)
        dist.recv(t, 0)
        ck(f"send/recv {dt}", t, inp(0, dt, salt=3))


def noncontiguous(rank, size, ck):
    base = torch.arange(12, dtype=torch.float32).view(3, 4) + rank
    t = base.t()  # not contiguous
    dist.all_reduce(t)
    want = sum(torch.arange(12, dtype=torch.float32).view(3, 4) + r for r in range(size)).t()
    ck("all_reduce non-contiguous", t.contiguous(), want.contiguous())
    t = (torch.arange(12, dtype=torch.float64).view(3, 4) * (rank + 1))[:, ::2]
    dist.broadcast(t, 0)
    ck("broadcast non-contiguous", t.contiguous(),
       torch.arange(12, dtype=torch.float64).view(3, 4)[:, ::2].contiguous())


def uneven(rank, size, ck):
    """all_gather and reduce_scatter of lists whose tensors differ in length (as NCCL's
    backend takes them; gloo refuses them): rank r's block has 2r elements (none on rank
    0) in all_gather, r + 1 in reduce_scatter."""
    for dt in MOVE_DTYPES:
        outs = [torch.full((2 * r,), 7).to(dt) for r in range(size)]
        dist.all_gather(outs, inp(rank, dt, n=2 * rank))
        for r in range(size):
            ck(f"uneven all_gather {dt} [{r}]", outs[r], inp(r, dt, n=2 * r))
    for dt in DTYPES:
        for name in ("SUM", "MAX", "AVG", "PRODUCT"):
            out = torch.zeros(rank + 1).to(dt)
            dist.reduce_scatter(out, [inp(rank, dt, name, n=i + 1, salt=i) for i in range(size)],
                                getattr(dist.ReduceOp, name))
            want = reduce_ref([inp(r, dt, name, n=rank + 1, salt=rank) for r in range(size)],
                              name, dt, size)
            ck(f"uneven reduce_scatter {dt} {name}", out, want)


def everything(rank, size):
    ck = Checker()
    reductions(rank, size, ck)
    bool_reductions(rank, size, ck)
    movers(rank, size, ck)
    uneven(rank, size, ck)
    noncontiguous(rank, size, ck)
    dist.barrier()
    tutti.torch.monitored_barrier(timeout=datetime.timedelta(seconds=10), wait_all_ranks=True)
    assert not ck.bad, f"{len(ck.bad)} of {ck.count} wrong:\n" + "\n".join(ck.bad[:20])
    return ck.count


@pytest.mark.parametrize("size,init,transport", [(2, "file", "shm"), (3, "env", "tcp"),
                                                (4, "file", "shm"), (4, "env", "tcp")])
def test_every_collective(size, init, transport):
    counts = run(everything, size, timeout=120, init=init, env={"TUTTI_TRANSPORT": transport})
    assert min(counts) > 300


def coalesced_into_tensors(rank, size):
    """torch 2.x's batches of all_gather_into_tensor and reduce_scatter_tensor (issued by
    dist._coalescing_manager, FSDP-style): through the backend's own methods on every
    torch, and through the coalescing manager where torch has it (2.1 on)."""
    from torch.distributed import distributed_c10d as c10d
    pg = c10d._get_default_group()
    if not isinstance(pg, tutti.torch.ProcessGroupTutti):  # torch 2.x: the CPU backend
        pg = pg._get_backend(torch.device("cpu"))
    ck = Checker()
    f32 = torch.float32
    for dt in (f32, torch.int64, torch.bfloat16):
        ins = [inp(rank, dt, n=3), inp(rank, dt, n=5, salt=1)]
        outs = [torch.empty(3 * size, dtype=dt), torch.empty(5, size, dtype=dt).t()]
        pg.allgather_into_tensor_coalesced(outs, ins).wait()
        ck(f"allgather_into_tensor_coalesced {dt} [0]", outs[0],
           torch.cat([inp(r, dt, n=3) for r in range(size)]))
        ck(f"allgather_into_tensor_coalesced {dt} [1] (non-contiguous)", outs[1],
           torch.stack([inp(r, dt, n=5, salt=1) for r in range(size)]))
        for name in ("SUM", "MAX"):
            ins = [inp(rank, dt, name, n=2 * size, salt=2),
                   inp(rank, dt, name, n=4 * size, salt=3).view(size, 4)]
            outs = [torch.empty(2, dtype=dt), torch.empty(4, dtype=dt)]
            opts = dist.ReduceScatterOptions()
            opts.reduceOp = getattr(dist.ReduceOp, name)
            pg.reduce_scatter_tensor_coalesced(outs, ins, opts).wait()
            for i, (n, salt) in enumerate(((2, 2), (4, 3))):
                whole = reduce_ref([inp(r, dt, name, n=n * size, salt=salt) for r in range(size)],
                                   name, dt, size)
                ck(f"reduce_scatter_tensor_coalesced {dt} {name} [{i}]", outs[i],
                   whole[rank * n:(rank + 1) * n])
    for bad, why in ((lambda: pg.allgather_into_tensor_coalesced([torch.empty(2)], []),
                      "needs as many outputs as inputs (at least one), got 1 and 0"),
                     (lambda: pg.reduce_scatter_tensor_coalesced(
                         [torch.empty(2), torch.empty(2)], [torch.empty(5), torch.empty(6)]),
                      "input 0 of 5 elements, needs 3 x 2")):
        try:
            bad()
            ck(f"refused: {why}", torch.tensor(0), torch.tensor(1))
        except RuntimeError as e:
            ck(f"refused: {e}", torch.tensor(why in str(e)), torch.tensor(True))
    if hasattr(c10d, "_coalescing_manager") and int(torch.__version__.split(".")[0]) >= 2:
        outs = [torch.empty(2 * size), torch.empty(3 * size)]
        with c10d._coalescing_manager():
            dist.all_gather_into_tensor(outs[0], inp(rank, f32, n=2))
            dist.all_gather_into_tensor(outs[1], inp(rank, f32, n=3, salt=4))
        ck("_coalescing_manager all_gather_into_tensor [0]", outs[0],
           torch.cat([inp(r, f32, n=2) for r in range(size)]))
        ck("_coalescing_manager all_gather_into_tensor [1]", outs[1],
           torch.cat([inp(r, f32, n=3, salt=4) for r in range(size)]))
    assert not ck.bad, "\n".join(ck.bad)
    return ck.count


def coalesced_p2p(rank, size):
    """Sends and receives issued between startCoalescing and endCoalescing, waited on as
    one (torch 2.x: what batch_isend_irecv does for CUDA tensors, through
    _coalescing_manager with a device; torch 1.x: the backend's own methods)."""
    from torch.distributed import distributed_c10d as c10d
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    got = [torch.zeros(4), torch.zeros(3, dtype=torch.int64)]
    if int(torch.__version__.split(".")[0]) >= 2:
        with c10d._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
            dist.isend(torch.full((4,), float(rank)), nxt)
            dist.isend(torch.arange(3) + 10 * rank, nxt, tag=1)
            dist.irecv(got[0], prv)
            dist.irecv(got[1], prv, tag=1)
        cm.wait()
        works = cm.works
    else:
        pg = c10d._get_default_group()
        pg.start_coalescing()
        pg.send([torch.full((4,), float(rank))], nxt, 0)
        pg.send([torch.arange(3) + 10 * rank], nxt, 1)
        pg.recv([got[0]], prv, 0)
        pg.recv([got[1]], prv, 1)
        works = [pg.end_coalescing()]
        works[0].wait()
        try:
            pg.end_coalescing()
            works.append("no error")
        except RuntimeError as e:
            works.append(str(e))
        assert "without startCoalescing" in works[1], works[1]
    assert torch.equal(got[0], torch.full((4,), float(prv))), got
    assert torch.equal(got[1], torch.arange(3) + 10 * prv), got
    assert works[0].is_completed() and works[0].is_success()
    assert len(works[0].get_future().wait()) == 4
    # a batch never ended (torch's manager does not end one whose body raised): the next
    # start drops it (a warning), and an empty batch completes at once
    be = c10d._get_default_group()
    if not isinstance(be, tutti.torch.ProcessGroupTutti):
        be = be._get_backend(torch.device("cpu"))
    be.start_coalescing()
    be.start_coalescing()
    empty = be.end_coalescing()
    assert empty.is_completed() and empty.wait() and empty.result() == []
    return len(works[0].result())


def test_coalesced_p2p():
    assert run(coalesced_p2p, 3) == [4, 4, 4]


def test_coalesced_into_tensors():
    for count in run(coalesced_into_tensors, 3):
        assert count >= 20, count


# ---- CUDA tensors (staged through host memory): only where a GPU is ----

# torch.set_default_device (2.0 on) makes every tensor the checks above create, inputs and
# references alike, a tensor of the rank's GPU; ranks share GPUs where there are fewer
# (asked through NVML: CUDA itself in this process would make it unusable in the forked
# ranks, "Cannot re-initialize CUDA in forked subprocess")
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
NEEDS_GPU = pytest.mark.skipif(not torch.cuda.is_available()
                               or not hasattr(torch, "set_default_device"),
                               reason="needs a GPU and torch >= 2.0")


def _gpu(rank):
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    return dev


def on_gpu(rank, size):
    torch.set_default_device(_gpu(rank))
    return everything(rank, size)


@NEEDS_GPU
@pytest.mark.parametrize("size,transport", [(2, "shm"), (3, "tcp")])
def test_every_collective_on_cuda_tensors(size, transport):
    counts = run(on_gpu, size, timeout=240, env={"TUTTI_TRANSPORT": transport})
    assert min(counts) > 300


def cuda_streams(rank, size):
    """Kernels queued on a side stream made current, before the call, that write the
    input (all_reduce) or the output (a broadcast's receivers, where nothing is copied in):
    the staging copy and the copy back run on that stream, after them. Async works and
    their futures hold CUDA tensors; a continuation sees the result."""
    dev = _gpu(rank)
    side = torch.cuda.Stream(dev)
    with torch.cuda.stream(side):
        x = torch.empty(1 << 20, device=dev)
        torch.cuda._sleep(50_000_000)  # the fill below runs only after this kernel
        x.fill_(rank + 1.0)
        w = dist.all_reduce(x, async_op=True)
        fut = w.get_future().then(lambda f: f.value()[0] * 2)
        y = torch.empty(1 << 20, device=dev)
        torch.cuda._sleep(50_000_000)
        y.fill_(-1.0 if rank else 7.0)  # the receivers' old value, the root's data
        b = dist.broadcast(y, 0, async_op=True)
    w.wait()
    b.wait()
    torch.cuda.synchronize(dev)
    total = size * (size + 1) / 2
    out = [x.min().item(), x.max().item(), fut.wait().min().item(), y.min().item(),
           y.max().item()]
    assert out == [total, total, 2 * total, 7.0, 7.0], out
    return out


def cuda_batch_p2p(rank, size):
    """batch_isend_irecv of CUDA tensors, a ring of 3 (torch 2.1-2.5 batch every CUDA
    batch_isend_irecv, 2.6 on those of backends that say supports_coalescing, which
    tutti's does: one work for the batch, startCoalescing/endCoalescing)."""
    dev = _gpu(rank)
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    send = torch.full((5,), float(rank), device=dev)
    recv = torch.zeros(5, device=dev)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt),
                                   dist.P2POp(dist.irecv, recv, prv)])
    for r in reqs:
        r.wait()
    torch.cuda.synchronize(dev)
    assert recv.tolist() == [float(prv)] * 5, recv
    from torch.distributed import distributed_c10d as c10d
    be = c10d._get_default_group()._get_backend(dev)
    if hasattr(be, "supports_coalescing"):
        assert be.supports_coalescing
    assert len(reqs) == 1, reqs
    return len(reqs)


@NEEDS_GPU
def test_batch_isend_irecv_of_cuda_tensors():
    run(cuda_batch_p2p, 3, timeout=90)


@NEEDS_GPU
def test_cuda_tensors_follow_the_callers_stream():
    run(cuda_streams, 2, timeout=90)


# ---- async works ----

def async_works(rank, size):
    late = datetime.timedelta(milliseconds=300)
    t = torch.full((4,), float(rank + 1))
    if rank == 1:
        time.sleep(1.5)
    w = dist.all_reduce(t, async_op=True)
    res = {}
    if rank == 0:
        res["done_early"] = w.is_completed()
        try:
            w.wait(timeout=late)
            res["timeout"] = "no error"
        except RuntimeError as e:
            res["timeout"] = str(e)
    assert w.wait(timeout=datetime.timedelta(seconds=10))
    assert w.is_completed() and w.is_success()
    fut = w.get_future()
    value = fut.wait()
    assert torch.equal(value[0], torch.full((4,), 3.0)), value
    assert torch.equal(t, torch.full((4,), 3.0)), t
    assert w.result()[0] is not None
    # a continuation issuing another collective (as DDP's hooks do)
    t2 = torch.ones(2)
    chained = dist.all_reduce(t2, async_op=True).get_future().then(
        lambda f: dist.all_reduce(f.value()[0].mul(10), async_op=True).get_future()
        .wait()[0])
    assert torch.equal(chained.wait(), torch.full((2,), 40.0)), chained.value()
    return res


def test_async_works():
    res = run(async_works, 2)
    assert res[0]["done_early"] is False
    assert "Timed out after 300 ms (not done)" in res[0]["timeout"], res[0]


def absent_peer(rank, size):
    if rank == 1:
        time.sleep(4.5)  # never joins; leaves after rank 0 gave up
        return None
    t0 = time.monotonic()
    w = dist.all_reduce(torch.ones(4), async_op=True)
    try:
        w.wait()  # no timeout given: the group's (3 s) bounds it
        return "no error", 0
    except RuntimeError as e:
        return str(e), time.monotonic() - t0


def test_wait_is_bounded_by_the_group_timeout():
    text, secs = run(absent_peer, 2, group_timeout=3)[0]
    assert "allreduce" in text and "rank 0" in text and "rank 1" in text, text
    assert 2.5 < secs < 5, (secs, text)


def _late_peer(rank, call):
    """Rank 1 never joins; rank 0's call(t) fails: its text and how long it took."""
    if rank == 1:
        time.sleep(4.5)  # leaves after rank 0 gave up
        return None
    t0 = time.monotonic()
    try:
        call(torch.ones(4)).wait()
        return "no error", 0
    except RuntimeError as e:
        return str(e), time.monotonic() - t0


def per_call_timeout(rank, size):
    pg = dist.group.WORLD
    opts = dist.AllreduceOptions()
    opts.timeout = datetime.timedelta(seconds=5)
    t = torch.full((3,), float(rank + 1))
    pg.allreduce([t], opts).wait()
    assert t.tolist() == [3.0] * 3, t
    kept = tutti.torch._tutti_pg(None).timeout  # the group's own, untouched by the call's
    opts.timeout = datetime.timedelta(0)
    try:
        pg.allreduce([t], opts)
        zero = "no error"
    except RuntimeError as e:
        zero = str(e)
    opts.timeout = datetime.timedelta(milliseconds=600)
    return kept, zero, _late_peer(rank, lambda x: pg.allreduce([x], opts))


def test_a_calls_own_timeout():
    """A call's options.timeout bounds that call (as gloo's backend does), the group's
    other calls keep the group's; 0 is refused, saying why."""
    (kept, zero, (text, secs)), (kept1, zero1, _) = run(per_call_timeout, 2, group_timeout=20)
    assert kept == kept1 == datetime.timedelta(seconds=20), (kept, kept1)
    assert "set_timeout: 0 ms" in zero and "always bounded" in zero, zero
    assert "Timed out" in text and "within 600 ms" in text and "rank 1" in text, text
    assert 0.4 < secs < 3, (secs, text)


def group_set_timeout(rank, size):
    try:
        tutti.torch.set_timeout(datetime.timedelta(0))
        zero = "no error"
    except RuntimeError as e:
        zero = str(e)
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t.tolist() == [2.0, 2.0], t
    tutti.torch.set_timeout(datetime.timedelta(milliseconds=700))
    now = tutti.torch._tutti_pg(None).timeout
    return now, zero, _late_peer(rank, lambda x: dist.all_reduce(x, async_op=True))


def test_set_timeout_of_a_group():
    """tutti.torch.set_timeout (torch's _set_pg_timeout for gloo and nccl) bounds the
    group's later calls: 700 ms instead of the 20 s the group was made with."""
    (now, zero, (text, secs)), _ = run(group_set_timeout, 2, group_timeout=20)
    assert now == datetime.timedelta(milliseconds=700), now
    assert "set_timeout" in zero and "1 ms" in zero, zero
    assert "Timed out" in text and "within 700 ms" in text and "rank 1" in text, text
    assert 0.5 < secs < 3, (secs, text)


# ---- subgroups ----

def subgroup(rank, size):
    g = dist.new_group([0, 2])
    out = None
    if rank in (0, 2):
        t = torch.full((3,), float(rank + 1))
        dist.all_reduce(t, group=g)
        out = t.tolist()
        b = torch.full((2,), float(rank))
        dist.broadcast(b, src=2, group=g)
        assert b.tolist() == [2.0, 2.0], b
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == size
    return out


def test_new_group():
    res = run(subgroup, 4)
    assert res[0] == [4.0] * 3 and res[2] == [4.0] * 3
    assert res[1] is None and res[3] is None


# ---- errors ----

def mismatch(rank, size):
    t = torch.ones(4)
    try:
        if rank == 0:
            dist.all_reduce(t)
        else:
            dist.broadcast(t, 1)
        # a broadcast's root checks the others' agreement later (TUTTI_AGREE_LAG): it
        # returns, and fails at its next call
        dist.barrier()
    except RuntimeError as e:
        return str(e)
    return "no error"


def test_mismatched_collectives_raise():
    got = run(mismatch, 2, group_timeout=10)
    for text in got:
        assert "mismatch" in text.lower(), got


def killed(rank, size):
    t = torch.ones(1 << 14)
    dist.all_reduce(t)
    return rank_1_killed(lambda: dist.all_reduce(t))


def rank_1_killed(call):
    """Rank 1 dies; the others call() until it raises: (its words, the seconds it took)."""
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        for _ in range(1000):
            call()
    except RuntimeError as e:
        return str(e), time.monotonic() - t0
    return "no error", 0


def assert_rank_1_named(got, within=8):
    """What rank_1_killed returned on ranks 0 and 2: rank 1 named, in time."""
    assert 1 not in got
    for r in (0, 2):
        kind, value = got[r]
        assert kind == "ok", value
        text, secs = value
        assert "rank 1" in text, text
        assert secs < within, secs


def test_killed_rank_is_named():
    assert_rank_1_named(launch(killed, 3, timeout=40, group_timeout=8))


def skips_one(d):
    def body(rank, size):
        t = torch.ones(8)
        dist.all_reduce(t)
        if rank == 2:  # busy elsewhere: never makes the second call
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if any(f.endswith(".rank2.json") for f in os.listdir(d)):
                    return "idle"
                time.sleep(0.05)
            return "no record"
        try:
            dist.all_reduce(t)
        except RuntimeError as e:
            return str(e)
        return "no error"
    return body


def test_flight_records_name_the_rank_that_never_called():
    import subprocess
    import sys
    with tempfile.TemporaryDirectory(prefix="tutti-fr-") as d:
        got = launch(skips_one(d), 3, timeout=50, group_timeout=3,
                     env={"TUTTI_TRACE_DIR": d})
        assert got[2] == ("ok", "idle"), got
        for r in (0, 1):
            assert got[r][0] == "ok" and "timed out" in got[r][1], got
        tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                            "tutti-trace")
        r = subprocess.run([sys.executable, tool, d], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "allreduce seq 1 (8 x f32, sum" in r.stdout, r.stdout
        assert "=> rank 2 never called seq 1" in r.stdout, r.stdout


def traced(rank, size):
    dist.all_reduce(torch.ones(3))
    dist.broadcast(torch.zeros(2, dtype=torch.int64), src=1)
    return [(o["op"], o["seq"], o["dtype"], o["count"], o["state"], o.get("root"))
            for o in tutti.torch.trace()["ops"]][-2:]


def test_trace_of_a_group():
    for ops in run(traced, 2):
        assert ops == [("allreduce", ops[0][1], "f32", 3, "completed", None),
                       ("broadcast", ops[0][1] + 1, "i64", 2, "completed", 1)], ops


def unsupported(rank, size):
    msgs = []
    for call in (lambda: dist.all_reduce(torch.ones(2), dist.ReduceOp.BAND),
                 lambda: dist.all_reduce(torch.ones(2, dtype=torch.float64), dist.ReduceOp.BXOR),
                 lambda: dist.reduce(torch.ones(2, dtype=torch.complex64), 0,
                                     dist.ReduceOp.MAX),
                 # an uneven list whose place for this rank is not its tensor's length
                 lambda: dist.all_gather([torch.zeros(1), torch.zeros(3)], torch.zeros(2)),
                 # a list of another length, and coalesced sizes that differ: what they got
                 lambda: dist.all_gather([torch.zeros(2)] * 3, torch.zeros(2)),
                 lambda: dist.all_gather_coalesced(
                     [[torch.zeros(2), torch.zeros(3)]] * size, [torch.zeros(2), torch.zeros(4)])):
        try:
            call()
            msgs.append("no error")
        except RuntimeError as e:
            msgs.append(str(e))
    t = torch.ones(2)  # the group still works
    dist.all_reduce(t)
    assert t.tolist() == [size] * 2
    return msgs


def test_unsupported_ops_and_dtypes_are_named():
    res = run(unsupported, 2)
    band, bxor, cplx, _, listlen, coalesced = res[0]
    assert "all_gather: takes a list of 2 tensors (one per rank), got 3" in listlen or \
        "allgather: takes a list of 2 tensors (one per rank), got 3" in listlen, listlen
    assert ("allgather_coalesced: output tensor 1 has 3 elements, input 1 has 4"
            in coalesced), coalesced
    for rank, (slot, n) in enumerate(((res[0][3], 1), (res[1][3], 3))):
        assert (f"allgather on rank {rank}: this rank's tensor has 2 elements, its place in "
                f"the list {n}") in slot, slot
    assert "op band reduces integer dtypes only, not f32" in band, band
    assert "op bxor reduces integer dtypes only, not f64" in bxor, bxor
    assert "op max does not reduce complex numbers (c64): sum, prod and avg do" in cplx, cplx


def complex_tensors(rank, size):
    """complex64/complex128 reductions reach the backend as complex (dist.reduce passes
    them as they are; the group's own allreduce too, where dist.all_reduce would view them
    as real): Gaussian integers, exact in any order, against torch's own sum and prod."""
    from torch.distributed import distributed_c10d as c10d
    out = []
    for dt in (torch.complex64, torch.complex128):
        mk = lambda r: torch.arange(5, dtype=torch.float64).add(r).remainder(3).add(  # noqa: E731
            1) + 1j * torch.arange(5, dtype=torch.float64).add(2 * r).remainder(3).sub(1)
        stack = torch.stack([mk(r).to(dt) for r in range(size)])
        t = mk(rank).to(dt)
        dist.reduce(t, size - 1, dist.ReduceOp.PRODUCT)
        if rank == size - 1:
            out.append(torch.equal(t, stack.prod(0)))
        t = mk(rank).to(dt)
        opts = c10d.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.PRODUCT
        c10d._get_default_group().allreduce([t], opts).wait()
        out.append(torch.equal(t, stack.prod(0)))
        t = mk(rank).to(dt)
        dist.all_reduce(t)  # (torch's view_as_real: fp32/fp64 sums)
        out.append(torch.equal(t, stack.sum(0)))
    return out


def test_complex_tensors():
    for got in run(complex_tensors, 3):
        assert got and all(got), got


def float8_tensors(rank, size):
    """float8_e4m3fn and float8_e5m2 tensors reduce as fp8 (torch 2.1 on): a sum of small
    integers (exact in any grouping) against the sum of their float values, a max of
    every rank's values, and an all_gather of the bytes."""
    out = []
    for dt in (torch.float8_e4m3fn, torch.float8_e5m2):
        vals = [torch.arange(40, dtype=torch.float32).add(r).remainder(3) for r in range(size)]
        t = vals[rank].to(dt)
        dist.all_reduce(t)
        out.append(torch.equal(t.float(), torch.stack(vals).sum(0)))
        t = vals[rank].mul(rank + 1).to(dt)
        dist.all_reduce(t, dist.ReduceOp.MAX)
        want = torch.stack([v.mul(r + 1).to(dt).float() for r, v in enumerate(vals)]).amax(0)
        out.append(torch.equal(t.float(), want))
        got = [torch.zeros(40, dtype=dt) for _ in range(size)]
        dist.all_gather(got, vals[rank].to(dt))
        out.append(all(torch.equal(g.float(), v.to(dt).float()) for g, v in zip(got, vals)))
    return out


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="torch < 2.1: no float8")
def test_float8_tensors():
    for got in run(float8_tensors, 3):
        assert got and all(got), got


def any_source(rank, size):
    """Every other rank sends its rank (tag 5) after a delay that puts rank size-1 first;
    rank 0 receives without naming a source."""
    if rank:
        time.sleep(0.3 * (size - 1 - rank))
        dist.send(torch.full((3,), float(rank), dtype=torch.float64), 0, tag=5)
        return None
    got = []
    for _ in range(size - 1):
        t = torch.zeros(3, dtype=torch.float64)
        src = dist.recv(t, tag=5)
        assert torch.equal(t, torch.full((3,), float(src), dtype=torch.float64)), (src, t)
        got.append(src)
    return got


def test_recv_from_any_source():
    assert run(any_source, 4)[0] == [3, 2, 1]


def negative_tag(rank, size):
    """A negative tag is refused on the calling rank, as gloo's checkTag does (-1 would
    be tutti's ANY_TAG), and the group goes on."""
    said = []
    for call in (lambda: dist.send(torch.zeros(1), 1 - rank, tag=-1),
                 lambda: dist.recv(torch.zeros(1), 1 - rank, tag=-1),
                 lambda: dist.recv(torch.zeros(1), tag=-5)):
        try:
            call()
            said.append(None)
        except RuntimeError as e:
            said.append("nonnegative" in str(e))
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return said, t.item()


def test_negative_tag_refused():
    for said, total in run(negative_tag, 2):
        assert said == [True, True, True] and total == 3.0, (said, total)


# ---- sparse allreduce (gloo's: SUM of COO tensors; DDP's sparse gradients) ----

SPARSE_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                 torch.int32, torch.int8, torch.bool]
SPARSE_CASES = ["2d", "hybrid", "one-empty", "all-empty", "3d"]
# through the group's own allreduce (DDP's reducer calls it so): torch's all_reduce makes
# a complex tensor a real view, which a sparse one has not
SPARSE_COMPLEX = [torch.complex64, torch.complex128]


def sparse_inp(rank, dtype, case, salt=0):
    """Rank's uncoalesced COO tensor: indices drawn with repeats (within the rank and
    across ranks), small integer values (every sum exact in every dtype)."""
    g = torch.Generator().manual_seed(7919 * salt + 31 * SPARSE_CASES.index(case) + rank)
    shape, sd = {"2d": ((5, 4), 2), "hybrid": ((6, 3), 1), "one-empty": ((5, 4), 2),
                 "all-empty": ((5, 4), 2), "3d": ((3, 4, 2), 3)}[case]
    nnz = 3 + 2 * rank
    if case == "all-empty" or (case == "one-empty" and rank == 1):
        nnz = 0
    cpu = dict(generator=g, device="cpu")
    idx = torch.stack([torch.randint(0, shape[d], (nnz,), **cpu) for d in range(sd)])
    vals = torch.randint(-3, 4, (nnz,) + shape[sd:], **cpu).to(dtype)
    if dtype.is_complex:
        vals = torch.complex(vals.real.double(),
                             torch.randint(-3, 4, vals.shape, **cpu).double()).to(dtype)
    # on the default device (a GPU's in the CUDA test)
    return torch.sparse_coo_tensor(idx, vals, shape).to(torch.empty(0).device)


def sparse_ref(size, dtype, case, salt=0):
    acc = torch.complex128 if dtype.is_complex else torch.float64
    return sum(sparse_inp(r, dtype, case, salt).to_dense().to(acc)
               for r in range(size)).to(dtype)


def sparse_sums(rank, size):
    bad, count = [], 0
    for dt in SPARSE_DTYPES + SPARSE_COMPLEX:
        for case in SPARSE_CASES:
            t = sparse_inp(rank, dt, case)
            if dt.is_complex:
                w = dist.distributed_c10d._get_default_group().allreduce([t])
            else:
                w = dist.all_reduce(t, async_op=True)
            got = w.get_future().wait()[0]
            count += 1
            want = sparse_ref(size, dt, case)
            # coalesced indeed: indices unique and in order (as torch recomputes them)
            again = torch.sparse_coo_tensor(t._indices(), t._values(), t.shape).coalesce()
            if not (got is t and t.is_sparse and t.is_coalesced() and t.dtype == dt
                    and torch.equal(t.to_dense(), want)
                    and torch.equal(again._indices(), t._indices())):
                bad.append(f"{dt} {case}: got {t}, want {want.to_sparse()}")
    # several in flight with dense ones between them (rank 1 late), waited last first
    if rank == 1:
        time.sleep(0.5)
    ts = [sparse_inp(rank, torch.float64, c, salt=1) for c in SPARSE_CASES]
    dense = torch.full((3,), float(rank + 1))
    works = []
    for i, t in enumerate(ts):
        works.append(dist.all_reduce(t, async_op=True))
        if i == 1:
            works.append(dist.all_reduce(dense, async_op=True))
    for w in reversed(works):
        w.wait()
    for c, t in zip(SPARSE_CASES, ts):
        count += 1
        if not torch.equal(t.to_dense(), sparse_ref(size, torch.float64, c, salt=1)):
            bad.append(f"in flight {c}: {t}")
    count += 1
    if not torch.equal(dense, torch.full((3,), size * (size + 1) / 2)):
        bad.append(f"dense between: {dense}")
    assert not bad, f"{len(bad)} of {count} wrong:\n" + "\n".join(bad[:10])
    return count


@pytest.mark.parametrize("size,transport", [(2, "shm"), (3, "tcp")])
def test_sparse_allreduce(size, transport):
    assert run(sparse_sums, size, timeout=120,
               env={"TUTTI_TRANSPORT": transport}) == \
        [len(SPARSE_DTYPES + SPARSE_COMPLEX) * 5 + 6] * size


def sparse_on_gpu(rank, size):
    torch.set_default_device(_gpu(rank))
    return sparse_sums(rank, size)


@NEEDS_GPU
def test_sparse_allreduce_of_cuda_tensors():
    assert run(sparse_on_gpu, 2, timeout=120) == [len(SPARSE_DTYPES) * 5 + 6] * 2


def sparse_refused(rank, size):
    msgs = []
    for t, op in ((sparse_inp(rank, torch.float32, "2d") if rank == 0 else
                   torch.sparse_coo_tensor(torch.zeros(2, 1, dtype=torch.long), [1.0], (5, 5)),
                   dist.ReduceOp.SUM),
                  (sparse_inp(rank, torch.float32 if rank == 0 else torch.float64, "2d"),
                   dist.ReduceOp.SUM),
                  (sparse_inp(rank, torch.float32, "2d"), dist.ReduceOp.MAX),
                  (torch.eye(3).to_sparse_csr(), dist.ReduceOp.SUM)):
        try:
            dist.all_reduce(t, op)
            msgs.append("no error")
        except RuntimeError as e:
            msgs.append(str(e))
    t = sparse_inp(rank, torch.float32, "hybrid")  # the group still works, sparse too
    dist.all_reduce(t)
    assert torch.equal(t.to_dense(), sparse_ref(size, torch.float32, "hybrid")), t
    return msgs


def test_sparse_allreduce_errors_are_named():
    for rank, (shape, dtype, op, csr) in enumerate(run(sparse_refused, 2)):
        assert (f"allreduce of a sparse tensor on rank {rank}: rank 1's tensor is "
                "Float [5, 5] (2 sparse dims), rank 0's Float [5, 4] (2 sparse dims)") in shape
        assert "rank 1's tensor is Double [5, 4] (2 sparse dims), rank 0's Float" in dtype
        assert "only ReduceOp.SUM is supported" in op, op
        assert "only dense (strided) tensors are supported" in csr, csr


def sparse_reentered(rank, size):
    """A callback of a sparse allreduce's future makes a sparse allreduce of its own and
    waits for it (the outer one has no elements: it completes as its second stage is
    issued, on the thread that issues second stages)."""
    if rank == 1:
        time.sleep(0.5)
    res = {}

    def inner(f):
        t = sparse_inp(rank, torch.float32, "2d", salt=3)
        dist.all_reduce(t)
        res["inner"] = torch.equal(t.to_dense(), sparse_ref(size, torch.float32, "2d", salt=3))

    e = sparse_inp(rank, torch.float32, "all-empty")
    dist.all_reduce(e, async_op=True).get_future().then(inner).wait()
    return res.get("inner")


def test_sparse_allreduce_from_a_callback_of_another():
    assert run(sparse_reentered, 2, timeout=40, group_timeout=5) == [True, True]


SPARSE_MARKER = 0x7475737061727365  # the first stage's marker (process_group.cpp)


def sparse_forged(rank, size):
    """Rank 1 answers rank 0's sparse allreduces' first stage (an allgather of 32 int64s)
    with rows a tutti rank never sends: a negative size, more elements than the sizes
    have places, a byte count that does not fit. Rank 0 names rank 1 and sends no second
    stage; the group then works."""
    t = sparse_inp(rank, torch.float32, "2d")
    dist.all_reduce(t)  # both ranks' sparse communicators made
    huge = (1 << 31, 1 << 31)  # 2^62 places: more than the bound a count may reach
    float32 = 6  # c10::ScalarType::Float
    rows = ([float32, 2, 0, 1, 2, -5, 4],  # a negative size
            [float32, 2, 0, 21, 2, 5, 4],  # 21 elements in 5 x 4 places
            [float32, 2, 0, 1 << 61, 2, *huge])  # 2^61 elements of 20 bytes each
    msgs = []
    for row in rows:
        if rank == 0:
            shape = (5, 4) if row[6] != huge[0] else huge
            t = torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), [], shape)
            try:
                dist.all_reduce(t)
                msgs.append("no error")
            except RuntimeError as e:
                msgs.append(str(e))
        else:
            mine = torch.zeros(32, dtype=torch.long)
            mine[0] = SPARSE_MARKER
            mine[1:1 + len(row)] = torch.tensor(row)
            out = [torch.zeros(32, dtype=torch.long) for _ in range(size)]
            dist.all_gather(out, mine)
            msgs.append(int(out[0][0]) == SPARSE_MARKER)
    t = sparse_inp(rank, torch.float32, "hybrid")
    dist.all_reduce(t)
    assert torch.equal(t.to_dense(), sparse_ref(size, torch.float32, "hybrid")), t
    return msgs


def test_sparse_allreduce_refuses_forged_sizes():
    got = run(sparse_forged, 2)
    assert got[1] == [True] * 3, got[1]
    neg, many, big = got[0]
    assert "allreduce of a sparse tensor on rank 0: rank 1 sent malformed sizes" in neg, neg
    assert "on rank 0: rank 1 sent 21 elements for 20 places" in many, many
    assert "on rank 0: the ranks' pieces up to rank 1 add up to more bytes than fit" in big, big


def unchecked_coalesced(idx, vals, shape):
    """A COO tensor that says it is coalesced without torch checking anything: its indices
    as given (out of order, repeated, outside the sizes), what a rank that is not tutti's,
    or a bug, could send."""
    return torch._sparse_coo_tensor_unsafe(torch.tensor(idx), torch.tensor(vals),
                                           shape)._coalesced_(True)


def sparse_unchecked(rank, size):
    """Rank 1's tensor claims to be coalesced but is not: its indices out of order and
    repeated (every rank's sum takes the sort's way, coalesce, and is right), then one
    index outside the sizes (every rank refuses it, naming rank 1; the group goes on)."""
    def piece(r):  # rank r's ([rows, cols], values)
        if r == 1:
            return [[3, 1, 3, 0], [0, 2, 0, 3]], [1.0, 2.0, 4.0, 8.0]
        return [[0, 2, 4][:r + 1], [1, 1, 3][:r + 1]], [16.0, 32.0, 64.0][:r + 1]

    out = {}
    mine = piece(rank)
    ref = torch.zeros(5, 4)
    for r in range(size):  # every rank's (index, value), repeats added: plain Python
        (rows, cols), vals = piece(r)
        for i, j, v in zip(rows, cols, vals):
            ref[i, j] += v
    t = unchecked_coalesced(*mine, (5, 4)) if rank == 1 else \
        torch.sparse_coo_tensor(torch.tensor(mine[0]), torch.tensor(mine[1]), (5, 4))
    dist.all_reduce(t)
    key = t._indices()[0] * 4 + t._indices()[1]
    out["unordered"] = (torch.equal(t.to_dense(), ref), t.is_coalesced(),
                        bool((key[1:] > key[:-1]).all()))
    t = unchecked_coalesced([[1, 7], [0, 2]], [1.0, 2.0], (5, 4)) if rank == 1 else \
        sparse_inp(rank, torch.float32, "2d")
    try:
        dist.all_reduce(t)
        out["outside"] = "no error"
    except RuntimeError as e:
        out["outside"] = str(e)
    t = sparse_inp(rank, torch.float32, "hybrid")
    dist.all_reduce(t)
    out["after"] = torch.equal(t.to_dense(), sparse_ref(size, torch.float32, "hybrid"))
    return out


def test_sparse_allreduce_of_a_tensor_not_as_coalesced_as_it_says():
    for rank, got in enumerate(run(sparse_unchecked, 3, timeout=60)):
        assert got["unordered"] == (True, True, True), (rank, got)
        assert "rank 1 sent index 7 in dimension 0 of size 5" in got["outside"], (rank, got)
        assert got["after"], (rank, got)


def sparse_then_gone(rank, size):
    """A subgroup destroyed with sparse calls in flight finishes them first; then rank 1
    dies and a sparse allreduce on the world names it."""
    g = dist.new_group(list(range(size)))
    ts = [sparse_inp(rank, torch.float32, c, salt=2) for c in SPARSE_CASES]
    works = [dist.all_reduce(t, group=g, async_op=True) for t in ts]
    dist.destroy_process_group(g)
    del g
    import gc
    gc.collect()
    for c, t, w in zip(SPARSE_CASES, ts, works):
        w.wait()
        assert torch.equal(t.to_dense(), sparse_ref(size, torch.float32, c, salt=2)), (c, t)
    t = sparse_inp(rank, torch.float32, "2d")
    dist.all_reduce(t)
    return rank_1_killed(lambda: dist.all_reduce(sparse_inp(rank, torch.float32, "hybrid")))


def test_sparse_allreduce_in_flight_at_destroy_and_a_killed_rank():
    assert_rank_1_named(launch(sparse_then_gone, 3, timeout=40, group_timeout=8))


def monitored(rank, size):
    """Two groups of all ranks: in the first rank 2 skips the monitored barrier, in the
    second ranks 1 and 2 do (wait_all_ranks)."""
    out = []
    for skip, wait_all in (({2}, False), ({1, 2}, True)):
        g = dist.new_group(list(range(size)))
        if rank in skip:
            time.sleep(1.5)  # past rank 0's 700 ms
            out.append("skipped")
            continue
        try:
            tutti.torch.monitored_barrier(g, timeout=datetime.timedelta(milliseconds=700),
                                   wait_all_ranks=wait_all)
            out.append("passed")
        except RuntimeError as e:
            out.append(str(e))
    return out


def _tls_sum(rank, size):
    t = torch.arange(100000, dtype=torch.float64) * (rank + 1)
    dist.all_reduce(t)
    return t


@pytest.mark.parametrize("names", ["tutti", "gloo"])
def test_tls_from_the_environment(tmp_path, names):
    """TLS on the group's tcp links from the environment: ours (TUTTI_TLS_*) or a Gloo
    user's TCP_TLS settings (GLOO_DEVICE_TRANSPORT_TCP_TLS_*), certificates made here by
    the openssl command; the sum against torch's own, and CAs that do not verify the
    certificate failing the group on both ranks naming TLS. tests/test_tls.c checks that
    nothing crosses in the clear."""
    if not shutil.which("openssl"):
        pytest.skip("no openssl command to make certificates with (Debian: openssl)")
    ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    subprocess.run(
        f"openssl req -x509 {ec} -keyout ca.key -out ca.pem -days 2 -subj /CN=ca && "
        f"openssl req -x509 {ec} -keyout other.key -out other.pem -days 2 -subj /CN=other && "
        f"openssl req {ec} -keyout node.key -out node.csr -subj /CN=node && "
        "openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
        "-out node.pem -days 2", shell=True, cwd=tmp_path, check=True, capture_output=True,
        timeout=60)
    pre = "TUTTI_TLS_" if names == "tutti" else "GLOO_DEVICE_TRANSPORT_TCP_TLS_"
    env = {"TUTTI_TRANSPORT": "tcp", pre + "CERT": str(tmp_path / "node.pem"),
           pre + ("KEY" if names == "tutti" else "PKEY"): str(tmp_path / "node.key"),
           pre + "CA_FILE": str(tmp_path / "ca.pem")}
    got = launch(_tls_sum, 2, env=env)
    if any(k == "error" and "without OpenSSL" in v for k, v in got.values()):
        pytest.skip("tutti was built without OpenSSL")
    out = run(_tls_sum, 2, env=env)
    want = torch.arange(100000, dtype=torch.float64) * 3
    for r in range(2):
        assert torch.equal(out[r], want), r
    env[pre + "CA_FILE"] = str(tmp_path / "other.pem")
    got = launch(_tls_sum, 2, env=env)
    assert sorted(got) == [0, 1], got
    for r, (kind, value) in got.items():
        assert kind == "error" and "TLS" in value, (r, value[:2000])


def test_monitored_barrier_names_missing_ranks():
    res = run(monitored, 3)
    assert "Rank 2 failed to pass monitoredBarrier in 700 ms" in res[0][0], res[0]
    assert "Ranks 1, 2 failed to pass monitoredBarrier in 700 ms" in res[0][1], res[0]
    assert "monitoredBarrier" in res[1][0], res[1]  # rank 0 never released it
    for r in range(2):  # torch's backtrace left out (its C++ frames followed the message)
        assert not any("Exception raised from" in m for m in res[r]), res[r]


# ---- DDP against gloo ----

class Net(torch.nn.Module):
    def __init__(self, unused):
        super().__init__()
        self.l1 = torch.nn.Linear(8, 16)
        self.l2 = torch.nn.Linear(16, 4)
        self.spare = torch.nn.Linear(4, 4) if unused else None  # takes no part

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


def ddp_params(pg, setup, device=None):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = Net(setup.get("unused", False)).to(device or "cpu")
    opts = dict(setup.get("opts", {}))
    if device is not None:
        opts["device_ids"] = [device]
    ddp = DDP(model, process_group=pg, **opts)
    if "hook" in setup:
        state, hook = setup["hook"](pg)
        ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    averager = None
    if setup.get("average"):
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        averager = PeriodicModelAverager(period=2, warmup_steps=2, process_group=pg)
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    for _ in range(5):
        opt.zero_grad()
        # gradient accumulation: micro-batches under no_sync() (no allreduce), the last
        # one's backward reducing the sum
        for micro in range(setup.get("accumulate", 1)):
            x = torch.randn(32, 8, generator=gen).to(device or "cpu")
            y = torch.randn(32, 4, generator=gen).to(device or "cpu")
            last = micro == setup.get("accumulate", 1) - 1
            with contextlib.nullcontext() if last else ddp.no_sync():
                torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        if averager:
            averager.average_parameters(ddp.module.parameters())
    return [p.detach().clone() for p in ddp.module.parameters()]


def _fp16(pg):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return pg, default_hooks.fp16_compress_hook


def _bf16(pg):
    """default_hooks.bf16_compress_hook's steps (torch 1.13's own refuses to run without
    NCCL): the bucket averaged in bfloat16."""
    def hook(group, bucket):
        buf = bucket.buffer()
        comp = buf.to(torch.bfloat16).div_(group.size())
        if dist.get_backend(group) != "gloo":
            fut = dist.all_reduce(comp, group=group, async_op=True).get_future()
            return fut.then(lambda f: buf.copy_(f.value()[0]))
        # gloo has no bfloat16: the same sum, exact in float32, rounded once
        parts = [torch.empty_like(buf) for _ in range(group.size())]
        dist.all_gather(parts, comp.float(), group=group)
        fut = torch.futures.Future()
        fut.set_result(buf.copy_(sum(parts).to(torch.bfloat16)))
        return fut
    return pg, hook


def _powersgd(pg):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
    if torch.cuda.is_available():
        # torch 2.x's hook calls torch.cuda.synchronize(the bucket's device) whenever a GPU
        # is present, which raises for CPU buckets (gloo's too); a CPU device has nothing
        # to synchronize
        sync = torch.cuda.synchronize
        torch.cuda.synchronize = lambda device=None: (
            None if device is not None and torch.device(device).type == "cpu" else sync(device))
    return ps.PowerSGDState(process_group=pg, matrix_approximation_rank=1,
                            start_powerSGD_iter=2, random_seed=0), ps.powerSGD_hook


def _localsgd(pg):
    """post-localSGD: from step 2 each rank steps alone, parameters averaged every 2."""
    from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as pl
    return pl.PostLocalSGDState(process_group=pg, subgroup=pg, start_localSGD_iter=2,
                                post_local_gradient_allreduce=False), pl.post_localSGD_hook


DDP_SETUPS = {
    "default": {},
    "bucket_cap_mb": {"opts": {"bucket_cap_mb": 0.0005}},
    "static_graph": {"opts": {"static_graph": True}},
    "gradient_as_bucket_view": {"opts": {"gradient_as_bucket_view": True}},
    "find_unused_parameters": {"opts": {"find_unused_parameters": True}, "unused": True},
    "no_sync": {"accumulate": 3},
    "fp16_compress_hook": {"hook": _fp16},
    "bf16_compress_hook": {"hook": _bf16},
    "powerSGD": {"hook": _powersgd},
    "post_localSGD": {"hook": _localsgd, "average": True},
}


def ddp_parity(rank, size):
    gloo = dist.new_group(list(range(size)), backend="gloo")
    tutti_pg = dist.new_group(list(range(size)))
    diffs = {}
    for name, setup in DDP_SETUPS.items():
        want = ddp_params(gloo, setup)
        got = ddp_params(tutti_pg, setup)
        diffs[name] = max((a - b).abs().max().item() for a, b in zip(got, want))
    # training moved the parameters (the comparison is not between two untouched models)
    torch.manual_seed(0)
    fresh = torch.nn.Linear(8, 16).weight
    diffs["moved"] = (fresh - ddp_params(tutti_pg, {})[0]).abs().max().item()
    return diffs


def ddp_cuda_parity(rank, size):
    """DDP of a model on the rank's GPU: tutti's parameters after 5 steps against gloo's
    (which stages CUDA tensors through host memory too) for a few setups."""
    dev = _gpu(rank)
    gloo = dist.new_group(list(range(size)), backend="gloo")
    tutti_pg = dist.new_group(list(range(size)))
    diffs = {}
    for name in ("default", "gradient_as_bucket_view", "fp16_compress_hook", "powerSGD"):
        want = ddp_params(gloo, DDP_SETUPS[name], dev)
        got = ddp_params(tutti_pg, DDP_SETUPS[name], dev)
        assert all(p.is_cuda for p in got)
        diffs[name] = max((a - b).abs().max().item() for a, b in zip(got, want))
    return diffs


@NEEDS_GPU
def test_ddp_on_cuda_matches_gloo():
    for diffs in run(ddp_cuda_parity, 2, timeout=150):
        bad = {k: v for k, v in diffs.items() if v > 1e-6}
        assert not bad, diffs


def into_parameters(rank, size):
    """Results written into tensors that require grad (as DDP's start-up broadcast and
    model averaging do), non-contiguous ones too (copied back, not written in place), on
    the completion thread (the wait comes after the op is done)."""
    p = torch.nn.Parameter(torch.zeros(3, 4).t())  # a leaf that requires grad, 4 x 3
    q = torch.nn.Parameter(torch.zeros(4, 3))
    with torch.no_grad():
        if rank == 0:
            p.copy_(torch.arange(12.0).view(4, 3))
        q.fill_(rank + 1.0)
    out = []
    for op in (lambda: dist.broadcast(p, 0, async_op=True),
               lambda: dist.all_reduce(p, async_op=True),
               lambda: dist.all_reduce(q, async_op=True)):
        w = op()
        time.sleep(0.3)
        w.wait()
        out.append(None)
    assert torch.equal(p.detach(), torch.arange(12.0).view(4, 3) * size), p
    assert torch.equal(q.detach(), torch.full((4, 3), size * (size + 1) / 2)), q
    assert p.requires_grad and p.grad_fn is None and q.is_leaf
    return len(out)


def test_results_go_into_parameters():
    assert run(into_parameters, 2) == [3, 3]


def test_ddp_matches_gloo():
    res = run(ddp_parity, 2, timeout=150)
    for rank, diffs in enumerate(res):
        moved = diffs.pop("moved")
        assert moved > 1e-3, moved
        bad = {k: v for k, v in diffs.items() if v > 1e-6}
        assert not bad, f"rank {rank}: parameters differ from gloo's: {bad}"


class SparseNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(40, 4, sparse=True)
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, idx):
        return self.lin(self.emb(idx).sum(1))


def ddp_sparse_params(pg):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    ddp = DDP(SparseNet(), process_group=pg)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(200 + dist.get_rank())
    for _ in range(5):
        # each rank looks up rows of its own half of the table (and row 0)
        idx = torch.randint(0, 20, (8, 3), generator=gen) + 20 * dist.get_rank()
        idx[0, 0] = 0
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(idx), torch.randn(8, 2, generator=gen)).backward()
        assert ddp.module.emb.weight.grad.is_sparse
        opt.step()
    return [p.detach().clone() for p in ddp.module.parameters()]


def ddp_sparse_parity(rank, size):
    gloo = dist.new_group(list(range(size)), backend="gloo")
    got = ddp_sparse_params(dist.new_group(list(range(size))))
    want = ddp_sparse_params(gloo)
    torch.manual_seed(0)
    fresh = SparseNet().emb.weight.detach()
    # rows only the other rank looked up moved here too: the gradients were summed
    other = slice(20, 40) if rank == 0 else slice(0, 20)
    return {"diff": max((a - b).abs().max().item() for a, b in zip(got, want)),
            "other_moved": (got[0][other] - fresh[other]).abs().max().item(),
            "emb": got[0]}


def test_ddp_with_sparse_gradients_matches_gloo():
    res = run(ddp_sparse_parity, 2, timeout=120)
    for rank, r in enumerate(res):
        assert r["diff"] <= 1e-6, f"rank {rank}: {r['diff']}"
        assert r["other_moved"] > 1e-3, r["other_moved"]
    assert torch.equal(res[0]["emb"], res[1]["emb"])


def objects_and_join(rank, size):
    """torch's object collectives (pickles in byte tensors: sizes first, then the bytes),
    and DDP's join() with uneven inputs (rank r has 3 + 2r batches; the ranks done early
    shadow the others' allreduces), its parameters against the same run on gloo."""
    out = {}
    objs = [None] * size
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * (rank * 100)})
    out["all_gather_object"] = objs == [{"rank": r, "s": "x" * (r * 100)} for r in range(size)]
    lst = [rank, "a" * (7 + rank), {1: 2}] if rank == 1 else [None, None, None]
    dist.broadcast_object_list(lst, src=1)
    out["broadcast_object_list"] = lst == [1, "a" * 8, {1: 2}]
    got = [None] * size if rank == 0 else None
    dist.gather_object(("r", rank), got, dst=0)
    out["gather_object"] = rank != 0 or got == [("r", r) for r in range(size)]
    one = [None]
    dist.scatter_object_list(one, [[i] * i for i in range(size)] if rank == 0 else None, src=0)
    out["scatter_object_list"] = one[0] == [rank] * rank
    from torch.nn.parallel import DistributedDataParallel as DDP
    params = {}
    for backend in ("gloo", None):
        pg = dist.new_group(list(range(size)), backend=backend)
        torch.manual_seed(0)
        ddp = DDP(torch.nn.Linear(4, 2), process_group=pg)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(rank)
        with ddp.join():
            for _ in range(3 + 2 * rank):
                opt.zero_grad()
                ddp(torch.randn(5, 4, generator=gen)).sum().backward()
                opt.step()
        params[backend] = [p.detach().clone() for p in ddp.module.parameters()]
    out["join_diff"] = max((a - b).abs().max().item()
                           for a, b in zip(params["gloo"], params[None]))
    torch.manual_seed(0)
    out["join_moved"] = (torch.nn.Linear(4, 2).weight - params[None][0]).abs().max().item()
    return out


def test_object_collectives_and_ddp_join():
    for rank, res in enumerate(run(objects_and_join, 3, timeout=90)):
        assert res.pop("join_diff") <= 1e-6, (rank, res)
        assert res.pop("join_moved") > 1e-3, (rank, res)
        assert all(res.values()), (rank, res)


# torchrun's usage under tutti-run: a script that calls init_process_group("tutti") with
# no arguments (env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the launcher)
LAUNCHED = """
import os, sys, torch, torch.distributed as dist, tutti.torch
dist.init_process_group("tutti")
r, n = dist.get_rank(), dist.get_world_size()
t = torch.arange(4, dtype=torch.float64) * (r + 1)
dist.all_reduce(t)
e = os.environ
line = (f"rank {r} of {n} local {e['LOCAL_RANK']} {e['LOCAL_WORLD_SIZE']} "
        f"group {e['GROUP_RANK']} {e['GROUP_WORLD_SIZE']} "
        f"sum {' '.join(str(int(x)) for x in t.tolist())}\\n")
os.write(1, line.encode())  # one write: the ranks share the pipe
dist.destroy_process_group()
"""


def _launched(nodes, np_, extra):
    """Runs LAUNCHED under `nodes` tutti-runs of np_ ranks each; their outputs."""
    runner = os.environ.get("TUTTI_RUN")
    if not runner:
        pytest.skip("TUTTI_RUN (the tutti-run to test) not set")
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "TUTTI_JOB_ID", "TORCHELASTIC_RUN_ID")}
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "s.py"), "w") as f:
            f.write(LAUNCHED)
        procs = [subprocess.Popen([runner, "-np", str(np_)] + extra(d, k)
                                  + [sys.executable, os.path.join(d, "s.py")],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) for k in range(nodes)]
        outs = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise
            outs.append((p.returncode, out))
    return outs


def _check_launched(outs, nodes, np_):
    n = nodes * np_
    want = " ".join(str(i * n * (n + 1) // 2) for i in range(4))
    lines = sorted(l for _, out in outs for l in out.splitlines() if l.startswith("rank "))
    for rc, out in outs:
        assert rc == 0, out
    assert len(lines) == n, outs
    for r in range(n):
        node = [l for l in lines if l.startswith(f"rank {r} of {n} ")]
        assert len(node) == 1, lines
        assert node[0].endswith(f" sum {want}"), node[0]
        # the ranks of a node are consecutive, numbered by node
        assert f" local {r % np_} {np_} group {r // np_} {nodes} " in node[0], node[0]


def test_tutti_run_env_init():
    outs = _launched(1, 2, lambda d, k: [])
    _check_launched(outs, 1, 2)


TUTTI_INIT = """
import sys, torch, torch.distributed as dist, tutti.torch
given = {} if len(sys.argv) < 2 else {"rank": int(sys.argv[1]), "world_size": int(sys.argv[2])}
try:
    dist.init_process_group("tutti", init_method="tutti://", **given)
except ValueError as e:
    print(f"refused: {e}", flush=True)
    sys.exit(0)
r, n = dist.get_rank(), dist.get_world_size()
t = torch.arange(4, dtype=torch.float64) * (r + 1)
dist.all_reduce(t)
print(f"rank {r} of {n} sum {' '.join(str(int(x)) for x in t.tolist())}", flush=True)
dist.destroy_process_group()
"""


def _ompi_ranks(n, args=lambda r: [], script=TUTTI_INIT):
    """n processes of TUTTI_INIT with Open MPI's variables (every rank on this host, a job
    id): what mpirun gives, with no store and no torch variable named; their outputs."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "TUTTI_STORE")}
    env.update(TUTTI_JOB_ID=f"tutti-init-{os.getpid()}-{time.monotonic_ns()}",
               OMPI_COMM_WORLD_SIZE=str(n), OMPI_COMM_WORLD_LOCAL_SIZE=str(n))
    procs = [subprocess.Popen([sys.executable, "-c", script] + [str(a) for a in args(r)],
                              env=dict(env, OMPI_COMM_WORLD_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(n)]
    outs = []
    for p in procs:
        try:
            outs.append((p.communicate(timeout=120)[0], p.returncode))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    return outs


def test_tutti_init_method_from_the_launchers_environment():
    """init_method="tutti://": rank, size and store from mpirun's variables alone (the
    library's loopback store for a job on one host, served by rank 0)."""
    n = 3
    want = " ".join(str(i * n * (n + 1) // 2) for i in range(4))
    outs = _ompi_ranks(n)
    for r, (out, rc) in enumerate(outs):
        assert rc == 0 and f"rank {r} of {n} sum {want}" in out, out


TUTTI_REINIT = """
import datetime, torch, torch.distributed as dist, tutti.torch
from torch.distributed import distributed_c10d as c10d
for i in range(2):
    dist.init_process_group("tutti", init_method="tutti://")
    r = dist.get_rank()
    t = torch.ones(3) * (r + 1)
    dist.all_reduce(t)
    print(f"init {i} rank {r} sum {t.tolist()}", flush=True)
    if i == 0 and r == 0:  # torch's store calls, as torch's own stores answer them
        st = c10d._get_default_store()  # a PrefixStore over tutti.torch.Store
        st.set("k", "v")
        print("delete", st.delete_key("k"), st.delete_key("k"), flush=True)
        print("compare_set", st.compare_set("missing", "exp", "des"), flush=True)
        try:
            st.wait(["never"], datetime.timedelta(seconds=0.3))
        except RuntimeError:
            print("wait: RuntimeError", flush=True)
    dist.barrier()
    dist.destroy_process_group()
"""


def test_tutti_init_method_twice_and_torchs_store_calls():
    """Two tutti:// inits in one process (the first group destroyed): the second meets at
    a job and port of its own; torch's store calls on the default store answer as torch's
    stores do (delete_key through a PrefixStore, compare_set of a missing key, a wait's
    timeout a RuntimeError)."""
    outs = _ompi_ranks(2, script=TUTTI_REINIT)
    for r, (out, rc) in enumerate(outs):
        assert rc == 0, out
        for i in range(2):
            assert f"init {i} rank {r} sum [3.0, 3.0, 3.0]" in out, out
    out0 = outs[0][0]
    assert "delete True False" in out0 and "compare_set b'exp'" in out0 and \
        "wait: RuntimeError" in out0, out0


def test_store_set_timeout(tmp_path):
    """tutti.torch.Store's get and wait take the bound set_timeout last gave (torch's
    stores' way), not only the one it was made with."""
    import tutti.torch
    s = tutti.torch.Store(tutti.Store(f"file://{tmp_path}"), timeout=datetime.timedelta(seconds=60))
    s.set_timeout(datetime.timedelta(milliseconds=300))
    assert s.timeout == datetime.timedelta(milliseconds=300)
    for call in (lambda: s.get("never"), lambda: s.wait(["never"])):
        t0 = time.monotonic()
        with pytest.raises(RuntimeError):
            call()
        assert time.monotonic() - t0 < 10
    s.set("k", "v")
    assert s.get("k") == b"v"


def test_set_up_failure_says_why(tmp_path):
    """A group whose other rank never comes: the error carries the library's explanation
    (the keys it waited for, whose), read where a failed init leaves it (it said
    "TUTTI_ERR_TIMEOUT ()": the store's last error, empty)."""
    import tutti.torch
    store = dist.FileStore(str(tmp_path / "f"), 2)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as e:
        tutti.torch._create(store, 0, 2, datetime.timedelta(milliseconds=1500))
    msg = str(e.value)
    assert "communicator set-up failed: TUTTI_ERR_TIMEOUT (rank 0: " in msg, msg
    assert "missing those of rank 1" in msg or "rank 1" in msg.split("(", 1)[1], msg
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("kind", ["file", "tcp"])
def test_store_num_keys(tmp_path, kind):
    """num_keys counts the keys set and added, as torch's stores do (a PrefixStore asks the
    store under it, which counts every key); tutti.Store.count counts a view's own keys,
    or those under a prefix. Checked against the keys the test set."""
    import tutti.torch
    base = tutti.Store(f"file://{tmp_path}" if kind == "file" else "tcp://127.0.0.1:0",
                       **({} if kind == "file" else {"is_server": True}))
    view = base.prefixed("job/")
    s = tutti.torch.Store(view)
    assert s.num_keys() == 0
    keys = ["a", "b/1", "b/2", "counter"]
    for k in keys[:3]:
        s.set(k, "v")
    s.add("counter", 5)
    assert s.num_keys() == len(keys)
    p = dist.PrefixStore("p", s)
    p.set("x", "y")  # "p/x" in s
    keys.append("p/x")
    assert p.num_keys() == len(keys) == s.num_keys()
    assert s.delete_key("b/1")
    keys.remove("b/1")
    assert s.num_keys() == len(keys)
    for prefix in ("", "b/", "p/", "c", "none"):
        assert view.count(prefix) == sum(k.startswith(prefix) for k in keys), prefix
    base.set("outside", b"1")
    assert base.count("job/") == len(keys) and base.count() == len(keys) + 1
    view.close()
    base.close()


def test_tutti_init_method_refuses_another_rank():
    """A rank given to init_process_group that the environment contradicts is refused,
    naming both (here rank 0 told it is 1)."""
    outs = _ompi_ranks(1, lambda r: [1, 2])
    out, rc = outs[0]
    assert rc == 0 and "refused: tutti:// rendezvous: rank=1 given" in out and \
        "makes this process rank 0" in out, out


def test_tutti_run_elastic_env_init():
    outs = _launched(2, 2, lambda d, k: ["--nnodes", "2:2", "--store", f"file://{d}/store"])
    _check_launched(outs, 2, 2)


def _future_done_at_wait(rank, size):
    """A work polled until is_completed() (and one waited for) has its future done and
    its value right: the backend woke waiters before completing the future (torch's
    completed() assert on 7-16 of 3000 calls, found by review; gloo completes the future
    first)."""
    t = torch.ones(1 << 12)
    not_done = 0
    for i in range(1500):
        t.fill_(rank + 1)
        w = dist.all_reduce(t, async_op=True)
        f = w.get_future()
        if i % 2:
            w.wait()
        else:
            while not w.is_completed():
                pass
        not_done += not f.done()
        if f.done():
            f.value()  # raises if the future is not completed
    return not_done, float(t[0]) == size * (size + 1) / 2


def test_future_completed_before_wait_returns():
    got = run(_future_done_at_wait, 2)
    assert got == [(0, True), (0, True)], got


def _blocking_continuations(rank, size):
    """Twelve continuations, each waiting on a later all_reduce's future (as torch 1.13's
    PowerSGD hook does inside one): the completion pool stopped at 8 threads, and the
    ninth continuation's all_reduce never completed (hung past the group timeout)."""
    works = [dist.all_reduce(torch.ones(100) * (rank + 1), async_op=True) for _ in range(12)]

    def cb(f):
        y = torch.ones(10) * (rank + 1)
        return dist.all_reduce(y, async_op=True).get_future().wait()[0]
    futs = [w.get_future().then(cb) for w in works]
    return [float(f.wait()[0]) for f in futs]


def test_blocking_continuations_do_not_starve():
    got = run(_blocking_continuations, 2, timeout=60, group_timeout=20)
    assert got == [[3.0] * 12] * 2, got


def _allgather_coalesced_value(rank, size):
    """all_gather_coalesced's future value: a list per rank of that rank's tensors, as
    gloo's (it was one flat list)."""
    outs = [[torch.zeros(2), torch.zeros(3)] for _ in range(size)]
    fut = dist.all_gather_coalesced(outs, [torch.ones(2) * rank, torch.ones(3) * rank],
                                    async_op=True)
    fut = fut.get_future() if hasattr(fut, "get_future") else fut
    v = fut.wait()
    return [[t.tolist() for t in lst] for lst in v]


def test_allgather_coalesced_future_value_is_per_rank():
    got = run(_allgather_coalesced_value, 2)
    want = [[[0.0, 0.0], [0.0, 0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0, 1.0]]]
    assert got == [want, want], got


def forked_child_is_refused(rank, size):
    t = torch.ones(1000) * (rank + 1)
    dist.all_reduce(t)
    pid = os.fork()
    if pid == 0:  # a DataLoader worker's case: the parent's group, inherited
        code = 0
        try:
            signal.alarm(10)  # a hang: killed by SIGALRM
            try:
                dist.all_reduce(torch.zeros(4))
                code = 2
            except RuntimeError as e:
                if "used in pid %d, a forked child" % os.getpid() not in str(e) or \
                        "the process group was made by pid" not in str(e):
                    print(f"child of rank {rank}: {e}", flush=True)
                    code = 3
            dist.destroy_process_group()  # drops the group: its destructor runs here
            print(f"child of rank {rank}: destroyed", flush=True)
        except BaseException as e:
            print(f"child of rank {rank}: {type(e).__name__}: {e}", flush=True)
            code = 4
        os._exit(code)
    deadline = time.monotonic() + 15
    while True:
        r, s = os.waitpid(pid, os.WNOHANG)
        if r or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if not r:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return "child hung"
    for i in range(10):
        x = torch.arange(1000, dtype=torch.float32) * (rank + 1) + i
        dist.all_reduce(x)
        want = torch.arange(1000, dtype=torch.float32) * sum(range(1, size + 1)) + i * size
        if not torch.equal(x, want):
            return f"allreduce {i} after the child: wrong"
    # (no new group: torch's FileStore, dropped in the children, counted them out and
    # removed its file, as it would on gloo)
    g = [torch.zeros(3) for _ in range(size)]
    dist.all_gather(g, torch.ones(3) * rank)
    dist.barrier()
    return f"child status {s}, gathered {[t.tolist() for t in g]}"


def test_forked_child_is_refused():
    """A forked child's collective on the parent's group is refused (naming both pids)
    before any lock, and its destructor leaves the parent's communicator, threads and
    store alone; the parents' collectives work after."""
    got = launch(forked_child_is_refused, 2, timeout=60)
    for r in range(2):
        assert got.get(r) == ("ok", "child status 0, gathered [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]"), got


def test_store_timeouts_as_torch_means_them():
    """tutti.torch.Store's call timeouts: torch's 0 (no limit) and anything beyond a C int
    are the longest a call takes (2**31 - 1 ms); -1 was the tutti store's own default (1 s
    here), and 30 days wrapped (review, session 100)."""
    import tutti.torch as tt
    assert tt._ms(datetime.timedelta(0)) == 2**31 - 1
    assert tt._ms(datetime.timedelta(days=30)) == 2**31 - 1
    assert tt._ms(datetime.timedelta(seconds=2)) == 2000


def isend_over_all_reduce(rank, size):
    """An isend left outstanding over an all_reduce its peer enters first (gloo's
    programs do this; before session 101 it failed the group with a mismatch)."""
    t = torch.arange(100000, dtype=torch.float32)
    w = dist.isend(t + 7, 1, tag=3) if rank == 0 else None
    x = torch.full((4,), rank + 1.0)
    dist.all_reduce(x)
    ok = True
    if rank == 1:
        got = torch.zeros(100000)
        dist.recv(got, 0, tag=3)
        ok = torch.equal(got, t + 7)
    if w is not None:
        w.wait()
    return x.tolist(), ok


def test_isend_over_all_reduce():
    for x, ok in run(isend_over_all_reduce, 3):
        assert x == [6.0] * 4 and ok


def all_to_all_with_itself(rank, size):
    """batch_isend_irecv of an all-to-all that includes the rank itself (NCCL's backend
    takes the send to oneself; tutti does since session 101)."""
    outs = [torch.full((5,), 10.0 * rank + p) for p in range(size)]
    ins = [torch.zeros(5) for _ in range(size)]
    ops = [dist.P2POp(dist.irecv, ins[p], p) for p in range(size)]
    ops += [dist.P2POp(dist.isend, outs[p], p) for p in range(size)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    return [t[0].item() for t in ins]


def test_all_to_all_with_itself():
    res = run(all_to_all_with_itself, 3)
    assert res == [[10.0 * p + r for p in range(3)] for r in range(3)], res


def tags_out_of_order(rank, size):
    """Receives posted in another tag order than the sends (gloo matches tags; before
    session 101 tutti failed the group with a mismatch)."""
    if rank == 0:
        works = [dist.isend(torch.full((3 + t,), float(t)), 1, tag=t) for t in (1, 2, 3)]
        for w in works:
            w.wait()
        return []
    got = []
    for t in (3, 1, 2):
        x = torch.zeros(3 + t)
        dist.recv(x, 0, tag=t)
        got.append(x.tolist())
    return got


def test_tags_out_of_order():
    res = run(tags_out_of_order, 2)
    assert res[1] == [[3.0] * 6, [1.0] * 4, [2.0] * 5], res


def recv_by_bytes(rank, size):
    """A receive takes any message that fits its tensor's bytes, as gloo's: a shorter one
    (the rest left as it was), one of another dtype; one too big raises naming both and
    stays for a receive with room, and the group goes on (tutti failed the group on
    anything but the same count and dtype; found by review)."""
    if rank == 0:
        dist.send(torch.arange(4.0), 1)
        dist.send(torch.tensor([1.0, 2.0, 3.0, 4.0]), 1, tag=1)
        dist.send(torch.arange(8, dtype=torch.int32), 1, tag=2)
        t = torch.ones(2)
        dist.all_reduce(t)
        return t.tolist()
    bigger = torch.full((6,), -1.0)
    dist.recv(bigger, 0)
    other = torch.zeros(2, dtype=torch.float64)
    dist.recv(other, 0, tag=1)
    small = torch.zeros(4, dtype=torch.int32)
    try:
        dist.recv(small, 0, tag=2)
        err = "no error"
    except RuntimeError as e:
        err = str(e)
    room = torch.zeros(8, dtype=torch.int32)
    dist.recv(room, 0, tag=2)
    t = torch.ones(2)
    dist.all_reduce(t)
    same = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(torch.float64).tolist()
    return bigger.tolist(), other.tolist() == same, err, room.tolist(), t.tolist()


def test_recv_takes_a_message_that_fits():
    res = run(recv_by_bytes, 2)
    bigger, same, err, room, after = res[1]
    assert bigger == [0.0, 1.0, 2.0, 3.0, -1.0, -1.0] and same, (bigger, same)
    assert "rank 0's message is 8 x i32 (32 bytes): more than the receive has room for" in err, err
    assert room == list(range(8)) and after == res[0] == [2.0, 2.0], (room, after, res[0])


def lists_as_gloo(rank, size):
    """gloo's lists of several tensors (torch 1.x's *_multigpu calls, CPU tensors too):
    allreduce across the list and the ranks, broadcast of the root's tensors[src_tensor]
    into every one, allgather of every rank's inputs into every output list; against
    gloo's results in the same run (tutti refused lists; carried since session 96)."""
    gloo = dist.new_group(list(range(size)), backend="gloo")
    out = []
    for pg in (None, gloo):
        res = []
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT):
            ts = [torch.arange(4.0) * (rank + 1) + 1, torch.arange(4.0) - rank * 2]
            dist.all_reduce_multigpu(ts, op, group=pg)
            res.append([t.tolist() for t in ts])
        ts = [torch.full((3,), float(rank)), torch.full((3,), 10.0 + rank), torch.zeros(3)]
        dist.broadcast_multigpu(ts, 1, group=pg, src_tensor=1)
        res.append([t.tolist() for t in ts])
        ins = [torch.full((2,), float(rank)), torch.full((2,), 10.0 * (rank + 1))]
        outs = [[torch.zeros(2) for _ in range(2 * size)] for _ in range(2)]
        dist.all_gather_multigpu(outs, ins, group=pg)
        res.append([[t.tolist() for t in o] for o in outs])
        out.append(res)
    return out


@pytest.mark.skipif(not hasattr(dist, "all_reduce_multigpu"), reason="torch 2.x has no *_multigpu")
def test_tensor_lists_as_gloo():
    for rank, (mine, gloos) in enumerate(run(lists_as_gloo, 2)):
        assert mine == gloos, (rank, mine, gloos)
