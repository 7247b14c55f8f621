"""Every collective x dtype x op on 2, 3 and 4 ranks, against NumPy references computed
here from every rank's inputs (which each rank can rebuild: they depend on the rank)."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import tutti
from ranks import run

# (tutti dtype, NumPy storage type): bf16 travels as its 16 bits in uint16.
DTYPES = [("i8", np.int8), ("u8", np.uint8), ("i32", np.int32), ("i64", np.int64),
          ("f16", np.float16), ("bf16", np.uint16), ("f32", np.float32), ("f64", np.float64),
          ("i16", np.int16), ("u16", np.uint16), ("u32", np.uint32), ("u64", np.uint64)]
INTS = ("i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64")
UNSIGNED = ("u8", "u16", "u32", "u64")
OPS = ["sum", "prod", "min", "max", "avg"]
N = 37  # elements per rank: not a multiple of anything the algorithms chunk by


def values(rank, dt, n=N, op="sum"):
    """Small integers, exact in every dtype and every reduction of up to 4 ranks."""
    rng = np.random.default_rng(1000 + rank)
    lo, hi = (0, 3) if dt in UNSIGNED else (-2, 3)
    v = rng.integers(lo, hi, n).astype(np.float64)
    if op == "prod":
        v[v == 0] = 1
    return v


def encode(v, dt, storage):
    if dt == "bf16":
        return (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return v.astype(storage)


def decode(a, dt):
    if dt == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def reference(op, dt, size, n=N):
    stack = np.stack([values(r, dt, n, op) for r in range(size)])
    if op == "sum":
        return stack.sum(0)
    if op == "prod":
        return stack.prod(0)
    if op == "min":
        return stack.min(0)
    if op == "max":
        return stack.max(0)
    s = stack.sum(0) / size
    return np.trunc(s) if dt in INTS else s


def close(got, want, dt):
    tol = {"f16": 1e-3, "bf16": 1e-2, "f32": 1e-6}.get(dt, 1e-12)
    return np.allclose(got, want, rtol=tol, atol=tol)


def reductions(comm):
    """allreduce (in and out of place, async), reduce, reduce_scatter(v): every dtype
    and op. Returns a list of failures (empty when all agree)."""
    bad, size, rank = [], comm.size, comm.rank
    for dt, storage in DTYPES:
        for op in OPS:
            want = reference(op, dt, size)
            mine = encode(values(rank, dt, op=op), dt, storage)
            a = mine.copy()
            comm.allreduce(a, op=op, dtype=dt)
            out = np.zeros_like(mine)
            comm.allreduce(mine, out, op=op, dtype=dt, async_op=True).wait()
            for name, got in (("allreduce in place", a), ("allreduce", out)):
                if not close(decode(got, dt), want, dt):
                    bad.append(f"{name} {dt} {op}")
            red = np.zeros_like(mine)
            comm.reduce(mine, red if rank == 1 % size else None, op=op, root=1 % size,
                        dtype=dt)
            if rank == 1 % size and not close(decode(red, dt), want, dt):
                bad.append(f"reduce {dt} {op}")
            big = encode(np.concatenate([values(rank * 10 + b, dt, 5, op)
                                         for b in range(size)]), dt, storage)
            rs = np.zeros(5, storage)
            comm.reduce_scatter(big, rs, op=op, dtype=dt)
            want_rs = np.stack([values(r * 10 + rank, dt, 5, op) for r in range(size)])
            want_rs = {"sum": want_rs.sum(0), "prod": want_rs.prod(0), "min": want_rs.min(0),
                       "max": want_rs.max(0), "avg": want_rs.sum(0) / size}[op]
            if op == "avg" and dt in INTS:
                want_rs = np.trunc(want_rs)
            if not close(decode(rs, dt), want_rs, dt):
                bad.append(f"reduce_scatter {dt} {op}")
    return bad


BITWISE = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor,
           "land": np.logical_and, "lor": np.logical_or, "lxor": np.logical_xor}


def prefix_reference(op, dt, k, n=N):
    """The reduction of ranks 0..k-1's values (k >= 1), "avg" divided by k."""
    return reference(op, dt, k, n)


def scans(comm):
    """scan and exscan, every dtype and op, out of place, in place and async, against
    NumPy folds of ranks 0..r (scan) and 0..r-1 (exscan); rank 0's exscan output left as
    it was; a defined op that does not commute (rank order) through both."""
    bad, rank = [], comm.rank
    for dt, storage in DTYPES:
        for op in OPS:
            mine = encode(values(rank, dt, op=op), dt, storage)
            for name in ("scan", "exscan"):
                call = getattr(comm, name)
                k = rank + 1 if name == "scan" else rank
                out = np.full_like(mine, 7)
                a = mine.copy()
                call(mine, out, op=op, dtype=dt)
                call(a, op=op, dtype=dt, async_op=True).wait()
                for how, got in (("", out), (" in place, async", a)):
                    if k == 0:
                        kept = np.full_like(mine, 7) if how == "" else mine
                        if not np.array_equal(got, kept):
                            bad.append(f"{name}{how} {dt} {op} wrote rank 0's output")
                    elif not close(decode(got, dt), prefix_reference(op, dt, k), dt):
                        bad.append(f"{name}{how} {dt} {op}")
    with np.errstate(over="ignore"), tutti.Op(matmul16) as mm:
        for name in ("scan", "exscan"):
            k = rank + 1 if name == "scan" else rank
            out = np.zeros(N, np.uint64)
            getattr(comm, name)(user_inputs(rank), out, op=mm)
            if k:
                want = user_inputs(0)
                for r in range(1, k):
                    matmul16(want.copy(), user_inputs(r), want)
                if not np.array_equal(out, want):
                    bad.append(f"{name} of matmul16 (rank order)")
    comm.barrier()
    return bad


@pytest.mark.parametrize("algo", [None, "scan:linear;exscan:linear", "scan:rd;exscan:rd"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("size", [1, 3, 4])
def test_scans(size, transport, algo):
    opts = {"algo": algo} if algo else {}
    assert run(scans, size, transport=transport, **opts) == [[]] * size


def blocking_returns(comm):
    """A blocking collective returns None, on the library's blocking path and on the
    interruptible one (issued async, waited for on the main thread); a blocking recv
    returns the sending rank."""
    got, size, rank = [], comm.size, comm.rank
    try:
        for interruptible in (False, True):
            tutti.interruptible = interruptible
            x = np.ones(4, np.float32)
            got.append(("allreduce", interruptible, comm.allreduce(x)))
            got.append(("barrier", interruptible, comm.barrier()))
            got.append(("broadcast", interruptible, comm.broadcast(x, root=size - 1)))
            got.append(("allgather", interruptible,
                        comm.allgather(x, np.zeros(4 * size, np.float32))))
            if size > 1:
                peer = (rank + 1) % size
                prev = (rank - 1) % size
                for tag, source in ((3, None), (4, prev)):  # any rank, then a named one
                    w = comm.send(np.full(1, rank, np.float32), peer, tag=tag, async_op=True)
                    src = comm.recv(np.zeros(1, np.float32), peer=source, tag=tag)
                    w.wait()
                    got.append(("recv", interruptible, src == prev))
    finally:
        tutti.interruptible = False
    return got


@pytest.mark.parametrize("size", [1, 2])
def test_blocking_calls_return_none(size):
    for got in run(blocking_returns, size):
        for name, interruptible, value in got:
            want = True if name == "recv" else None
            assert value is want, (name, interruptible, value)


def bits(rank, storage, op, n=N):
    """Random bits of every width; BAND's inputs are 3 bits in 4 set and BOR's 1 in 4,
    so that neither result is all zeros or all ones; the logical ops' are 0 or odd (LAND's
    0 one time in 4, LOR's three in 4, LXOR's half), each result both ways."""
    rng = np.random.default_rng(2000 + rank)
    v = [rng.integers(0, 256, n * np.dtype(storage).itemsize, dtype=np.uint8).view(storage)
         for _ in range(2)]
    q = rng.integers(0, 4, n)
    odd = v[1] | np.ones(1, storage)
    zero = np.zeros(1, storage)
    return {"band": v[0] | v[1], "bor": v[0] & v[1], "bxor": v[0],
            "land": np.where(q == 0, zero, odd), "lor": np.where(q != 0, zero, odd),
            "lxor": np.where(q % 2 == 0, zero, odd)}[op]


def bitwise(comm):
    """allreduce, reduce and reduce_scatter with BAND, BOR, BXOR, LAND, LOR and LXOR on
    every integer dtype against NumPy's bitwise and logical reductions (those as 1 or 0
    in the dtype); a float buffer is refused naming both."""
    bad, size, rank = [], comm.size, comm.rank
    for dt, storage in [d for d in DTYPES if d[0] in INTS]:
        for op, fn in BITWISE.items():
            want = fn.reduce(np.stack([bits(r, storage, op) for r in range(size)]),
                             0).astype(storage)
            a = bits(rank, storage, op)
            comm.allreduce(a, op=op)
            out = np.zeros(N, storage)
            comm.allreduce(bits(rank, storage, op), out, op=getattr(tutti, op.upper()),
                           async_op=True).wait()
            red = np.zeros(N, storage)
            comm.reduce(bits(rank, storage, op), red if rank == 0 else None, op=op, root=0)
            big = np.concatenate([bits(rank * 10 + b, storage, op, 5) for b in range(size)])
            rs = np.zeros(5, storage)
            comm.reduce_scatter(big, rs, op=op)
            want_rs = fn.reduce(np.stack([bits(r * 10 + rank, storage, op, 5)
                                          for r in range(size)]), 0).astype(storage)
            for name, got, exp in (("allreduce in place", a, want), ("allreduce", out, want),
                                   ("reduce", red if rank == 0 else want, want),
                                   ("reduce_scatter", rs, want_rs)):
                if not np.array_equal(got, exp):
                    bad.append(f"{name} {dt} {op}")
    for dt, op in ((np.float32, "bxor"), (np.float64, "bxor"), (np.float32, "land")):
        try:
            comm.allreduce(np.ones(4, dt), op=op)
            bad.append(f"{op} on {np.dtype(dt)} was not refused")
        except tutti.InvalidArgError as e:
            if f"op {op} reduces integer dtypes only" not in str(e):
                bad.append(f"{op} on {np.dtype(dt)}: {e}")
    comm.barrier()
    return bad


# Element types for the calls that only move data: int64, complex (a dtype since session
# 100), and bool, which tutti has no dtype for (carried as bytes), each from distinct
# integers v (bool: bits that differ per block).
MOVED = {"int64": lambda v: v, "complex128": lambda v: v + 1j * (v * 3 + 1),
         "bool": lambda v: (v * 2654435761 >> 7) % 2 == 1,
         "complex64": lambda v: (v + 1j * (v * 3 + 1)).astype(np.complex64)}


def movements(comm, kind="int64"):
    """broadcast, allgather(v), gather(v), scatter(v), alltoall(v), send/recv, barrier on
    bytes-exact data of one MOVED kind; returns the failures."""
    bad, size, rank = [], comm.size, comm.rank
    conv = MOVED[kind]
    blk = lambda r, n=6: conv(np.arange(n, dtype=np.int64) + 100 * r + 1)  # noqa: E731
    dt = blk(0).dtype
    b = blk(rank) if rank == 0 else np.zeros(6, dt)
    comm.broadcast(b, root=0)
    bad += [] if np.array_equal(b, blk(0)) else ["broadcast"]
    ag = np.zeros(6 * size, dt)
    comm.allgather(blk(rank), ag)
    bad += [] if np.array_equal(ag, np.concatenate([blk(r) for r in range(size)])) else ["allgather"]
    counts = [r + 1 for r in range(size)]
    agv = np.zeros(sum(counts), dt)
    comm.allgatherv(blk(rank, counts[rank]), agv, counts)
    want = np.concatenate([blk(r, counts[r]) for r in range(size)])
    bad += [] if np.array_equal(agv, want) else ["allgatherv"]
    root = size - 1
    g = np.zeros(6 * size, dt)
    comm.gather(blk(rank), g, root=root)
    if rank == root and not np.array_equal(g, np.concatenate([blk(r) for r in range(size)])):
        bad.append("gather")
    gv = np.zeros(sum(counts), dt)
    comm.gatherv(blk(rank, counts[rank]), gv, counts, root=root)
    if rank == root and not np.array_equal(gv, want):
        bad.append("gatherv")
    s = np.zeros(6, dt)
    comm.scatter(np.concatenate([blk(r) for r in range(size)]), s, root=root)
    bad += [] if np.array_equal(s, blk(rank)) else ["scatter"]
    sv = np.zeros(counts[rank], dt)
    comm.scatterv(want, counts, sv, root=root)
    bad += [] if np.array_equal(sv, blk(rank, counts[rank])) else ["scatterv"]
    a2a = np.concatenate([blk(rank * size + j, 3) for j in range(size)])
    out = np.zeros_like(a2a)
    comm.alltoall(a2a, out)
    want = np.concatenate([blk(i * size + rank, 3) for i in range(size)])
    bad += [] if np.array_equal(out, want) else ["alltoall"]
    sc = [j + 1 for j in range(size)]          # rank -> j: j+1 elements
    rc = [rank + 1] * size                     # from every i: rank+1 elements
    send = np.concatenate([blk(rank * size + j, sc[j]) for j in range(size)])
    recv = np.zeros(sum(rc), dt)
    comm.alltoallv(send, sc, recv, rc)
    want = np.concatenate([blk(i * size + rank, rank + 1) for i in range(size)])
    bad += [] if np.array_equal(recv, want) else ["alltoallv"]
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    got = np.zeros(4, dt)
    w = comm.recv(got, prv, tag=7, async_op=True)
    comm.send(blk(rank, 4), nxt, tag=7)
    w.wait()
    bad += [] if np.array_equal(got, blk(prv, 4)) else ["send/recv"]
    if kind == "bool":  # reductions are logical (test_bool_reductions); avg is refused
        try:
            comm.allreduce(blk(rank), op="avg")
            bad.append(f"allreduce avg of {kind} was not refused")
        except tutti.InvalidArgError as e:
            bad += [] if "bool" in str(e) else [f"allreduce avg of {kind}: {e}"]
    comm.barrier()
    return [f"{b} ({kind})" for b in bad]


def user_inputs(rank, n=N):
    """Rank r's uint64 elements for the defined ops."""
    return np.random.default_rng(3000 + rank).integers(0, 1 << 63, n, dtype=np.uint64)


def plus_times(a, b, out):
    """a + b + a b (mod 2^64): (a + 1)(b + 1) - 1, associative and commutative."""
    np.add(np.add(a, b), np.multiply(a, b), out=out)


def matmul16(a, b, out):
    """Each uint64 a 2x2 matrix of 16-bit entries; out = a @ b mod 2^16: associative,
    not commutative."""
    x = a.view(np.uint16).reshape(-1, 4).astype(np.uint32)
    y = b.view(np.uint16).reshape(-1, 4).astype(np.uint32)
    m = np.stack([x[:, 0] * y[:, 0] + x[:, 1] * y[:, 2], x[:, 0] * y[:, 1] + x[:, 1] * y[:, 3],
                  x[:, 2] * y[:, 0] + x[:, 3] * y[:, 2], x[:, 2] * y[:, 1] + x[:, 3] * y[:, 3]],
                 1)
    out[:] = (m & 0xFFFF).astype(np.uint16).reshape(-1).view(np.uint64)


def user_ops(comm):
    """tutti.Op: a commutative op and one that is not (rank order), through allreduce
    (async too), reduce to every root, reduce_scatter and allreduce_coalesced, against
    the ranks' inputs folded in rank order here; an exception in the function raised by
    the call; a freed op refused."""
    import tutti.fuse
    bad, size, rank = [], comm.size, comm.rank
    with np.errstate(over="ignore"):
        for fn, commutative in ((plus_times, True), (matmul16, False)):
            with tutti.Op(fn, commutative=commutative) as op:
                if op.is_commutative != commutative:
                    bad.append(f"is_commutative {op.is_commutative}, made {commutative}")
                want = user_inputs(0)
                for r in range(1, size):
                    fn(want.copy(), user_inputs(r), want)
                a = user_inputs(rank)
                comm.allreduce(a, op=op)
                out = np.zeros(N, np.uint64)
                comm.allreduce(user_inputs(rank), out, op=op, async_op=True).wait()
                got = [("allreduce", a, want), ("allreduce async", out, want)]
                for root in range(size):
                    red = np.zeros(N, np.uint64)
                    comm.reduce(user_inputs(rank), red if rank == root else None, op=op,
                                root=root)
                    if rank == root:
                        got.append((f"reduce to {root}", red, want))
                rs = np.zeros(N // size, np.uint64)
                comm.reduce_scatter(user_inputs(rank)[:N // size * size], rs, op=op)
                blk = N // size
                got.append(("reduce_scatter", rs, want[rank * blk:(rank + 1) * blk]))
                counts = [r + 2 for r in range(size)]
                rv = np.zeros(counts[rank], np.uint64)
                comm.reduce_scatterv(user_inputs(rank)[:sum(counts)], rv, counts, op=op)
                lo = sum(counts[:rank])
                got.append(("reduce_scatterv", rv, want[lo:lo + counts[rank]]))
                c = user_inputs(rank)
                tutti.fuse.allreduce_coalesced(comm, [c[:10], c[10:]], op=op)
                got.append(("allreduce_coalesced", c, want))
                bad += [f"{name} ({fn.__name__})" for name, g, w in got
                        if not np.array_equal(g, w)]
                comm.barrier()

    # fp16 reaches fn as float16 arrays
    def halves(a, b, out):
        assert a.dtype == np.float16 and out.dtype == np.float16, (a.dtype, out.dtype)
        np.add(a, b, out=out)
    with tutti.Op(halves, commutative=True) as op:
        h = np.full(N, rank + 1, np.float16)
        comm.allreduce(h, op=op)
        if not np.array_equal(h, np.full(N, size * (size + 1) // 2, np.float16)):
            bad.append(f"fp16 op: {h[:4]}")

    # an exception in fn: raised by the call in flight (blocking, then through wait()),
    # on the rank whose fn raised (linear: rank 0 reduces); not by a later call
    raising = [True]

    def fails(a, b, out):
        if comm.rank == 0 and raising[0]:
            raise ValueError("no reduction today")
        matmul16(a, b, out)
    op = tutti.Op(fails, commutative=False)
    for how in ("blocking", "async"):
        try:
            if how == "async":
                w = comm.allreduce(user_inputs(rank), op=op, async_op=True)
                if rank == 0 and size > 1 and not isinstance(w.exception(), (ValueError,
                                                                              type(None))):
                    bad.append(f"exception(): {w.exception()!r}")
                w.wait()
            else:
                comm.allreduce(user_inputs(rank), op=op)
            if rank == 0 and size > 1:  # one rank reduces nothing
                bad.append(f"the function's exception was not raised ({how})")
        except ValueError as e:
            if rank != 0 or "no reduction today" not in str(e):
                bad.append(f"rank {rank} raised {e!r} ({how})")
    raising[0] = False
    a = user_inputs(rank)
    comm.allreduce(a, op=op)  # raises nothing: the earlier exceptions were the earlier calls'
    # a call that completed before fn raised in a later one: its wait() raises nothing
    w = comm.allreduce(user_inputs(rank), op=op, async_op=True)
    deadline = time.monotonic() + 20
    while not w.is_completed() and time.monotonic() < deadline:  # its fn is done
        time.sleep(0.001)
    raising[0] = True
    try:
        comm.allreduce(user_inputs(rank), op=op)  # runs after w's call (one queue)
    except ValueError:
        pass
    raising[0] = False
    try:
        w.wait()
        if w.exception() is not None:
            bad.append(f"exception() of an earlier call: {w.exception()!r}")
    except ValueError as e:
        bad.append(f"wait() of an earlier call raised a later call's {e!r}")
    op.free()
    try:
        comm.allreduce(user_inputs(rank), op=op)
        bad.append("a freed op was not refused")
    except tutti.InvalidArgError as e:
        if "freed" not in str(e):
            bad.append(f"freed op: {e}")
    comm.barrier()
    return bad


@pytest.mark.parametrize("algo", [None, "allreduce:ring;reduce:tree;reduce_scatter:ring"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_user_ops(size, transport, algo):
    """algo: the algorithms asked for (the non-commutative op must still come out in rank
    order); None: the model's."""
    opts = {"algo": algo} if algo else {}
    assert run(user_ops, size, transport=transport, **opts) == [[]] * size


POLLED = """
import os
import numpy as np
import tutti
store, rank, size = tutti.Store.from_env()
comm = tutti.Communicator(store, rank, size, timeout_ms=20000)
def add(a, b, out):
    np.add(a, b, out=out)
op = tutti.Op(add, commutative=True)
x = np.ones(16, np.float32)
for i in range(3000):
    x.fill(1)
    w = comm.allreduce(x, op=op, async_op=True)
    while not w.is_completed():
        pass
    del w
y = np.full(16, rank + 1, np.float32)
comm.allreduce(y, op=op)
ok = np.array_equal(y, np.full(16, size * (size + 1) / 2, np.float32))
os.write(1, f"rank {rank} {'ok' if ok else y[:2]}\\n".encode())  # one write: a shared pipe
comm.destroy()
store.close()
"""


def test_polled_op_works_dropped(tmp_path):
    """Works of calls with a tutti.Op, polled with is_completed() until done and then
    dropped, in fresh interpreters (tutti-run): the library ran a work's done callback
    after the work read as done, and the dropped Work had freed the callback (every rank
    died of SIGSEGV within 3000 calls, found by review; in forked ranks it did not show)."""
    runner = os.environ.get("TUTTI_RUN")
    if not runner:
        pytest.skip("TUTTI_RUN (the tutti-run to test) not set")
    script = tmp_path / "polled.py"
    script.write_text(POLLED)
    env = {k: v for k, v in os.environ.items() if k not in ("TUTTI_JOB_ID", "TUTTI_STORE")}
    p = subprocess.run([runner, "-np", "2", sys.executable, str(script)], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:]
    assert sorted(l for l in p.stdout.splitlines() if l.startswith("rank ")) == \
        ["rank 0 ok", "rank 1 ok"], p.stdout[-3000:]


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("size", [2, 3, 4])
def test_reductions(size, transport):
    assert run(reductions, size, transport=transport) == [[]] * size


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("size", [2, 3])
def test_bitwise(size, transport):
    assert run(bitwise, size, transport=transport) == [[]] * size


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("size", [2, 3, 4])
def test_movements(size, transport):
    assert run(movements, size, transport=transport) == [[]] * size


@pytest.mark.parametrize("kind", ["complex128", "bool", "complex64"])
def test_movements_of_any_element_type(kind):
    assert run(lambda comm: movements(comm, kind), 3, transport="shm") == [[]] * 3


def complex_values(rank, n, dt):
    """Gaussian integers with parts in -1..3: sums and products exact in any order."""
    i = np.arange(n)
    return ((rank + i) % 3 + 1 + 1j * ((2 * rank + i) % 3 - 1)).astype(dt)


def complex_reductions(comm):
    """numpy complex64/complex128 (and a torch complex tensor through DLPack): allreduce
    sum, prod and avg, reduce prod, scan prod, against NumPy over every rank's input;
    max refused."""
    bad, size, rank, n = [], comm.size, comm.rank, 41
    for dt in (np.complex64, np.complex128):
        stack = np.stack([complex_values(r, n, dt) for r in range(size)])
        for op, want in (("sum", stack.sum(0)), ("prod", stack.prod(0)),
                         ("avg", stack.sum(0) / dt(size))):
            x = complex_values(rank, n, dt)
            comm.allreduce(x, op=op)
            if x.dtype != dt or not np.array_equal(x, want.astype(dt)):
                bad.append((np.dtype(dt).name, op, x[:3].tolist(), want[:3].tolist()))
        out = np.zeros(n, dt)
        comm.reduce(complex_values(rank, n, dt), out, op="prod", root=size - 1)
        if rank == size - 1 and not np.array_equal(out, stack.prod(0)):
            bad.append((np.dtype(dt).name, "reduce prod"))
        out = np.zeros(n, dt)
        comm.scan(complex_values(rank, n, dt), out, op="prod")
        if not np.array_equal(out, stack[:rank + 1].prod(0)):
            bad.append((np.dtype(dt).name, "scan prod"))
        try:
            comm.allreduce(complex_values(rank, n, dt), op="max")
            bad.append((np.dtype(dt).name, "max not refused"))
        except tutti.InvalidArgError as e:
            if "does not reduce complex numbers" not in str(e):
                bad.append((np.dtype(dt).name, "max", str(e)))
    try:
        import torch
    except ImportError:
        return bad
    t = torch.from_numpy(complex_values(rank, n, np.complex64))
    comm.allreduce(t, op="prod")
    want = np.stack([complex_values(r, n, np.complex64) for r in range(size)]).prod(0)
    if not np.array_equal(t.numpy(), want):
        bad.append(("torch complex64", "prod"))
    return bad


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("size", [2, 3])
def test_complex_reductions(size, transport):
    assert run(complex_reductions, size, transport=transport) == [[]] * size


def test_torch_tensors_through_dlpack():
    torch = pytest.importorskip("torch")

    def body(comm):
        t = torch.full((3, 4), float(comm.rank + 1), dtype=torch.bfloat16)
        comm.allreduce(t)
        o = torch.zeros(8, dtype=torch.float64)
        comm.allgather(torch.arange(4, dtype=torch.float64) + comm.rank, o)
        return t.float().sum().item(), o.tolist()

    got = run(body, 2)
    assert got[0] == got[1] == (12 * 3.0, [0, 1, 2, 3, 1, 2, 3, 4])


class DLPackOnly:
    """An object that offers DLPack and nothing else (no buffer protocol)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_dlpack_objects():
    def body(comm):
        a = np.arange(6, dtype=np.int64) + comm.rank
        comm.allreduce(DLPackOnly(a))  # in place, through the capsule's pointer
        out = np.zeros(6, np.int64)
        comm.allreduce(DLPackOnly(np.arange(6, dtype=np.int64)), DLPackOnly(out), op="max")
        return a.tolist(), out.tolist()

    got = run(body, 2)
    assert got[0] == got[1] == ([1, 3, 5, 7, 9, 11], [0, 1, 2, 3, 4, 5])


@pytest.mark.parametrize("name,vtype", [("float_int", np.float32), ("double_int", np.float64),
                                        ("long_int", np.int64), ("2int", np.int32),
                                        ("short_int", np.int16)])
def test_minloc_maxloc_of_structured_arrays(name, vtype):
    """MPI's MAXLOC/MINLOC on NumPy structured arrays of (value, int32) pairs in C's
    layout (align=True), named by dtype= or read off the array: each rank offers (value, its rank); the reference is NumPy's
    argmax/argmin over the ranks' values (the first, so the least rank, on ties)."""
    n = 40

    def vals(r):
        return (np.arange(n) * (r + 1)) % 7 - 3

    def body(comm):
        dt = np.dtype([("v", vtype), ("i", np.int32)], align=True)
        hi = np.zeros(n, dt)
        hi["v"], hi["i"] = vals(comm.rank), comm.rank
        lo = hi.copy()
        comm.allreduce(hi, op="maxloc", dtype=name)
        out = np.zeros(n, dt)
        comm.allreduce(lo, out, op=tutti.MINLOC)  # the dtype read off the structured array

        def maxloc(a, b, o):  # a defined op sees the pairs as the same structured arrays
            take = (b["v"] > a["v"]) | ((b["v"] == a["v"]) & (b["i"] < a["i"]))
            o[:] = np.where(take, b, a)
        mine = np.zeros(n, dt)
        mine["v"], mine["i"] = vals(comm.rank), comm.rank
        comm.allreduce(mine, op=tutti.Op(maxloc, commutative=True))
        assert (mine == hi).all(), (mine, hi)
        return dt.itemsize, hi["v"].tolist(), hi["i"].tolist(), out["v"].tolist(), out["i"].tolist()

    size = 3
    allv = np.stack([vals(r) for r in range(size)])
    for itemsize, hv, hiq, lv, liq in run(body, size):
        assert itemsize == {"float_int": 8, "double_int": 16, "long_int": 16, "2int": 8,
                            "short_int": 8}[name]
        assert hiq == allv.argmax(axis=0).tolist() and hv == allv.max(axis=0).tolist()
        assert liq == allv.argmin(axis=0).tolist() and lv == allv.min(axis=0).tolist()


def objects(comm):
    r, n = comm.rank, comm.size
    mine = {"rank": r, "data": list(range(r * 300)), "arr": np.arange(r + 1, dtype=np.int16)}
    got = {
        "bcast": comm.broadcast_object(("from root", "y" * 5000) if r == min(1, n - 1) else None,
                                       root=min(1, n - 1)),
        "allgather": comm.allgather_object(mine),
        "gather": comm.gather_object(("g", r, b"\0" * r), root=n - 1),
        "scatter": comm.scatter_object([f"to {i}" * (i + 1) for i in range(n)] if r == 0
                                       else None),
    }
    if r == 0:  # from any rank, in whatever order they come; then from a named one
        if n == 1:  # to itself
            comm.send_object(None, 0, tag=8)
        froms = sorted((comm.recv_object(tag=7) for _ in range(n - 1)), key=lambda t: t[1])
        got["p2p"] = froms + [comm.recv_object(n - 1, tag=8)]
    else:
        comm.send_object({"hello": r, "pad": "z" * (r * 70000)}, 0, tag=7)
        if r == n - 1:
            comm.send_object(None, 0, tag=8)
    return got


@pytest.mark.parametrize("size", [1, 3])
def test_python_objects(size):
    """mpi4py's lowercase calls (torch's *_object): objects of each rank's own size,
    pickled, through broadcast, allgather, gather, scatter, and send/recv from any rank
    (recv_object probes the size first)."""
    res = run(objects, size)
    for r, got in enumerate(res):
        assert got["bcast"] == ("from root", "y" * 5000)
        ag = got["allgather"]
        assert [a["rank"] for a in ag] == list(range(size))
        for i, a in enumerate(ag):
            assert a["data"] == list(range(i * 300))
            assert a["arr"].dtype == np.int16 and a["arr"].tolist() == list(range(i + 1))
        assert got["gather"] == ([("g", i, b"\0" * i) for i in range(size)]
                                 if r == size - 1 else None)
        assert got["scatter"] == f"to {r}" * (r + 1)
        if r == 0:
            want = [({"hello": i, "pad": "z" * (i * 70000)}, i) for i in range(1, size)]
            assert got["p2p"][:-1] == want
            assert got["p2p"][-1] == (None, size - 1)


def test_scatter_object_refuses_a_list_of_another_length():
    def body(comm):
        try:
            comm.scatter_object([1, 2])
            return "no error"
        except tutti.InvalidArgError as e:
            return str(e)

    msg = run(body, 1)[0]
    assert "rank 0: scatter_object: root's objs must be 1 objects" in msg and "got 2" in msg, msg


def objects_failing(comm):
    """Each object call with one rank that cannot send its object (an unpicklable lambda,
    a scatter list of another length): that rank raises its own error, the others
    PeerError naming it at once, and the communicator goes on."""
    import time
    r, out = comm.rank, []

    def attempt(fn):
        t0 = time.monotonic()
        try:
            fn()
            out.append(("no error", 0.0))
        except Exception as e:  # noqa: BLE001 (what each rank raised is the result)
            out.append((f"{type(e).__name__}: {e}", time.monotonic() - t0))

    attempt(lambda: comm.broadcast_object((lambda: 0) if r == 1 else None, root=1))
    attempt(lambda: comm.allgather_object((lambda: 0) if r == 2 else r))
    attempt(lambda: comm.gather_object((lambda: 0) if r == 0 else r, root=2))
    attempt(lambda: comm.scatter_object([1, 2] if r == 1 else None, root=1))
    ok = comm.allgather_object(("after", r))  # the communicator goes on
    return out, ok


def test_object_calls_fail_together():
    res = run(objects_failing, 3)
    bad = {0: 1, 1: 2, 2: 0, 3: 1}  # the rank that cannot send, per call
    names = ["broadcast_object", "allgather_object", "gather_object", "scatter_object"]
    for r, (out, ok) in enumerate(res):
        assert ok == [("after", i) for i in range(3)]
        for k, (msg, secs) in enumerate(out):
            if r == bad[k]:
                want = "InvalidArgError: tutti: rank 1: scatter_object: root's objs must be 3" \
                    if k == 3 else "lambda"
                assert want in msg and "PeerError" not in msg, (r, k, msg)
            else:
                assert msg.startswith(f"PeerError: tutti: rank {r}: {names[k]}: rank(s) "
                                      f"{bad[k]} could not send its object"), (r, k, msg)
                assert secs < 5, (r, k, secs)  # at once, not at the 20 s timeout


def more_objects(comm):
    """mpi4py's comm.allreduce/reduce/scan/exscan/alltoall/sendrecv of objects: numbers,
    lists (op + concatenates, in rank order), a custom op; alltoall of objects of each
    pair's own size; sendrecv round a ring."""
    r, n = comm.rank, comm.size
    got = {
        "sum": comm.allreduce_object(r + 1),
        "cat": comm.allreduce_object([r] * (r + 1)),
        "max": comm.allreduce_object((r * 7) % 5, op=max),
        "reduce": comm.reduce_object(r * r, root=n - 1),
        "scan": comm.scan_object([r]),
        "exscan": comm.exscan_object(r + 1),
        "a2a": comm.alltoall_object([("from", r, "to", j, "x" * (r * 1000 + j))
                                     for j in range(n)]),
        "ring": comm.sendrecv_object({"r": r}, (r + 1) % n, (r - 1) % n),
    }
    try:
        comm.alltoall_object([1])
        got["short"] = "no error"
    except tutti.Error as e:
        got["short"] = type(e).__name__
    return got


@pytest.mark.parametrize("size", [1, 3])
def test_more_python_objects(size):
    res = run(more_objects, size)
    for r, got in enumerate(res):
        assert got["sum"] == size * (size + 1) // 2
        assert got["cat"] == [i for i in range(size) for _ in range(i + 1)]
        assert got["max"] == max((i * 7) % 5 for i in range(size))
        assert got["reduce"] == (sum(i * i for i in range(size)) if r == size - 1 else None)
        assert got["scan"] == list(range(r + 1))
        assert got["exscan"] == (None if r == 0 else sum(range(1, r + 1)))
        assert got["a2a"] == [("from", i, "to", r, "x" * (i * 1000 + r)) for i in range(size)]
        assert got["ring"] == ({"r": (r - 1) % size}, (r - 1) % size)
        # a list of another length: InvalidArgError on every rank (all send one), or with
        # one rank, itself
        assert got["short"] == ("InvalidArgError" if size != 1 else "no error"), got["short"]


def test_sendrecv_round_a_ring():
    """comm.sendrecv (MPI_Sendrecv): 8 MiB round a ring of 3, which blocking sends before
    receives would deadlock; from any source too."""
    def body(comm):
        r, n = comm.rank, comm.size
        a = np.arange(1 << 21, dtype=np.int32) * 3 + r
        b = np.zeros_like(a)
        src = comm.sendrecv(a, (r + 1) % n, b, (r - 1) % n, sendtag=4, recvtag=4)
        c = np.zeros_like(a)
        src2 = comm.sendrecv(a, (r + 1) % n, c, None, sendtag=5, recvtag=5)
        left = (r - 1) % n
        want = np.arange(1 << 21, dtype=np.int32) * 3 + left
        return src, src2, bool((b == want).all()), bool((c == want).all())

    for r, got in enumerate(run(body, 3)):
        assert got == ((r - 1) % 3, (r - 1) % 3, True, True), (r, got)


def test_reduce_local():
    """tutti.reduce_local (MPI_Reduce_local): out = buf op out on this rank, built-in ops,
    bool as logical, a defined op that does not commute (buf's elements first), and what
    it refuses; against NumPy."""
    a = np.arange(6, dtype=np.float64) - 2.5
    b = np.linspace(1, 3, 6)
    out = b.copy()
    tutti.reduce_local(a, out)
    assert out.tolist() == (a + b).tolist()
    x, y = np.array([5, -3, 7], np.int32), np.array([2, 2, 9], np.int32)
    tutti.reduce_local(x, y, op="min")
    assert y.tolist() == [2, -3, 7]
    p, q = np.array([True, False, True]), np.array([True, True, False])
    tutti.reduce_local(p, q, op="prod")  # logical and
    assert q.tolist() == [True, False, False]
    with tutti.Op(lambda u, v, o: np.subtract(u, v, out=o)) as sub:
        out = b.copy()
        tutti.reduce_local(a, out, op=sub)
        assert out.tolist() == (a - b).tolist()
    with pytest.raises(tutti.InvalidArgError, match="op avg is a mean over the ranks"):
        tutti.reduce_local(a, b.copy(), op="avg")
    with pytest.raises(tutti.InvalidArgError, match="the input is 6 x f64, the output 5 x f64"):
        tutti.reduce_local(a, np.zeros(5))


def test_dup():
    """Communicator.dup (MPI_Comm_dup): the same ranks in the same order; an allreduce on
    each, issued in the other order on odd ranks, gives each its own sum."""
    def body(comm):
        copy = comm.dup()
        a = np.full(50000, comm.rank, np.int64)
        b = np.full(50000, 10 * (comm.rank + 1), np.int64)
        if comm.rank % 2:
            wa, wb = comm.allreduce(a, async_op=True), copy.allreduce(b, async_op=True)
        else:
            wb, wa = copy.allreduce(b, async_op=True), comm.allreduce(a, async_op=True)
        wa.wait()
        wb.wait()
        got = (copy.rank, copy.size, int(a[0]), int(a[-1]), int(b[0]), int(b[-1]))
        copy.destroy()
        return got

    n = 3
    got = run(body, n)
    assert got == [(r, n, 3, 3, 60, 60) for r in range(n)], got


def test_unique_id_bootstrap():
    """tutti.get_unique_id / Communicator.from_unique_id (NCCL's bootstrap): rank 0 makes
    the id, the ranks pass it on with broadcast_object (as with mpi4py's bcast), and a
    communicator of the id's job allreduces; a short or foreign id is refused."""
    def body(comm):
        uid = comm.broadcast_object(tutti.get_unique_id() if comm.rank == 0 else None)
        job = tutti.Communicator.from_unique_id(uid, comm.rank, comm.size, timeout_ms=10000)
        a = np.arange(4, dtype=np.int64) + comm.rank
        job.allreduce(a)
        job.destroy()
        comm.barrier()  # (every rank done with the id's store)
        errs = []
        for bad in (uid[:20], b"x" * 128):
            try:
                tutti.Communicator.from_unique_id(bad, 0, 1)
                errs.append("no error")
            except tutti.InvalidArgError as e:
                errs.append(str(e))
        if comm.rank == 0:
            tutti.release_unique_id(uid)
        return a.tolist(), len(uid), errs

    n = 3
    for got, size, errs in run(body, n):
        assert got == [sum(i + r for r in range(n)) for i in range(4)] and size == 128, got
        assert "uid must be the 128 bytes tutti.get_unique_id made, not bytes of 20" in errs[0]
        assert "the id is not one tutti_get_unique_id made" in errs[1], errs


def test_init_all_from_one_thread():
    """Communicator.init_all (ncclCommInitAll): three ranks in this process, driven from
    one thread by async calls and tutti.wait_all; the sums checked against NumPy's."""
    comms = tutti.Communicator.init_all(3, timeout_ms=20000)
    try:
        assert [(c.rank, c.size) for c in comms] == [(0, 3), (1, 3), (2, 3)]
        bufs = [np.arange(1000, dtype=np.float32) * (r + 1) for r in range(3)]
        want = sum(b.copy() for b in bufs)
        tutti.wait_all([c.allreduce(b, async_op=True) for c, b in zip(comms, bufs)],
                       timeout=20)
        for b in bufs:
            assert np.array_equal(b, want)
    finally:
        for c in comms:
            c.destroy()
    with pytest.raises(tutti.InvalidArgError, match="n must be 1 or more"):
        tutti.Communicator.init_all(0)


def test_split_type_host():
    """Communicator.split_type("host") (MPI_Comm_split_type, COMM_TYPE_SHARED): the ranks
    here share one host, so one communicator of them, ordered by key (reversed); kind
    None takes part and gets None; another kind on one rank fails the call on every rank
    naming it, and the communicator goes on. (The hosts told apart:
    tests/test_split.c's split_by_host.)"""
    def body(comm):
        try:
            comm.split_type("socket" if comm.rank == 1 else "host")
            bad = "no error"
        except tutti.InvalidArgError as e:
            bad = str(e)
        node = comm.split_type(None if comm.rank == 2 else "host", key=-comm.rank)
        if node is None:
            return (None, bad)
        a = np.array([comm.rank], np.int64)
        order = np.zeros(node.size, np.int64)
        node.allgather(a, order)
        got = (node.rank, node.size, order.tolist())
        node.destroy()
        return (got, bad)

    got = run(body, 3)
    assert [g[0] for g in got] == [(1, 2, [1, 0]), (0, 2, [1, 0]), None], got
    assert all("rank 1 passed type 0" in g[1] for g in got), got
    assert "split_type's kind is \"host\" or None, not 'socket'" in got[1][1], got


def test_split():
    def body(comm):
        half = comm.split(comm.rank % 2, key=-comm.rank)  # reversed order within a color
        a = np.array([comm.rank], np.int64)
        half.allreduce(a)
        got = (half.rank, half.size, int(a[0]))
        half.destroy()
        own = comm.split(comm.rank % 2, timeout_ms=4321)  # options of its own
        got += (own.timeout_ms, comm.timeout_ms != 4321)
        own.destroy()
        none = comm.split(-1 if comm.rank == 3 else 0)
        if none is not None:
            b = np.ones(1, np.int32)
            none.allreduce(b)
            got += (none.size, int(b[0]))
            none.destroy()
        return got

    got = run(body, 4)
    # color 0: ranks 0, 2 (keys 0, -2: rank 2 first); color 1: ranks 1, 3
    assert got == [(1, 2, 2, 4321, True, 3, 3), (1, 2, 4, 4321, True, 3, 3),
                   (0, 2, 2, 4321, True, 3, 3), (0, 2, 4, 4321, True)], got


def _from_env_rank(rank, size, url, q):
    import os
    os.environ.update({"TUTTI_RANK": str(rank), "TUTTI_WORLD_SIZE": str(size),
                       "TUTTI_STORE": url, "TUTTI_JOB_ID": "from-env-test"})
    with tutti.Communicator.from_env() as comm:
        a = np.full(3, comm.rank + 1, np.int32)
        comm.allreduce(a)
        q.put((comm.rank, comm.size, a.tolist()))


def test_from_env(tmp_path):
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_from_env_rank, args=(r, 3, f"file://{tmp_path}", q))
             for r in range(3)]
    for p in procs:
        p.start()
    try:
        got = sorted(q.get(timeout=30) for _ in range(3))
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    assert got == [(r, 3, [6, 6, 6]) for r in range(3)]


def in_place_forms(comm):
    """The in-place forms against NumPy references: reduce_scatter(x, x) (the result in
    x's first block), allgather(v) with buf None or out itself, gather(v) and scatter(v)
    in place at the root; a defined op passed by its value."""
    bad, size, rank = [], comm.size, comm.rank
    vals = lambda r, n: np.arange(n, dtype=np.float64) * (r + 1) + 10 * r  # noqa: E731
    x = vals(rank, 2 * size)
    comm.reduce_scatter(x, x)
    total = sum(vals(r, 2 * size) for r in range(size))
    if not np.array_equal(x[:2], total[2 * rank:2 * rank + 2]) or \
            not np.array_equal(x[2:], vals(rank, 2 * size)[2:]):
        bad.append(f"reduce_scatter in place: {x}")
    blocks = [np.full(3, r + 1, np.int64) for r in range(size)]
    for form in ("None", "same"):
        out = np.zeros(3 * size, np.int64)
        out[3 * rank:3 * rank + 3] = blocks[rank]
        comm.allgather(None if form == "None" else out, out)
        if not np.array_equal(out, np.concatenate(blocks)):
            bad.append(f"allgather in place ({form}): {out}")
    counts = [r + 1 for r in range(size)]
    displs = [sum(counts[:r]) + r for r in range(size)]  # a gap after each block
    out = np.full(sum(counts) + size, -1, np.int64)
    out[displs[rank]:displs[rank] + counts[rank]] = rank + 5
    comm.allgatherv(None, out, counts, displs)
    want = np.full(sum(counts) + size, -1, np.int64)
    for r in range(size):
        want[displs[r]:displs[r] + counts[r]] = r + 5
    if not np.array_equal(out, want):
        bad.append(f"allgatherv in place: {out}")
    root = size - 1
    g = np.zeros(3 * size, np.int64)
    if rank == root:
        g[3 * root:3 * root + 3] = blocks[root]
        comm.gather(g, g, root=root)
        if not np.array_equal(g, np.concatenate(blocks)):
            bad.append(f"gather in place: {g}")
    else:
        comm.gather(blocks[rank], None, root=root)
    gv = np.full(sum(counts) + size, -1, np.int64)
    if rank == root:
        gv[displs[root]:displs[root] + counts[root]] = root + 5
        comm.gatherv(None, gv, counts, displs, root=root)
        if not np.array_equal(gv, want):
            bad.append(f"gatherv in place: {gv}")
    else:
        comm.gatherv(np.full(counts[rank], rank + 5, np.int64), None, counts, root=root)
    if rank == root:
        src = np.concatenate(blocks)
        comm.scatter(src, None, root=root)
        if not np.array_equal(src, np.concatenate(blocks)):
            bad.append("scatter in place changed the root's input")
        comm.scatterv(want, counts, None, displs, root=root)
    else:
        s = np.zeros(3, np.int64)
        comm.scatter(None, s, root=root)
        if not np.array_equal(s, blocks[rank]):
            bad.append(f"scatter to {rank}: {s}")
        sv = np.zeros(counts[rank], np.int64)
        comm.scatterv(None, counts, sv, root=root)
        if not np.array_equal(sv, np.full(counts[rank], rank + 5)):
            bad.append(f"scatterv to {rank}: {sv}")
    # a defined op by its value: taken while its Op lives (which the call keeps alive)
    op = tutti.Op(lambda a, b, o: np.maximum(a, b, out=o), commutative=True)
    m = np.array([rank, -rank], np.int32)
    comm.allreduce(m, op=op.value)
    if m.tolist() != [size - 1, 0]:
        bad.append(f"allreduce with op {op.value}: {m}")
    value = op.value
    op.free()
    try:
        comm.allreduce(m, op=value)
        bad.append("a freed op's value was taken")
    except tutti.InvalidArgError as e:
        if "not an op defined here" not in str(e):
            bad.append(str(e))
    comm.barrier()
    return bad


@pytest.mark.parametrize("size", [2, 3])
def test_in_place_forms(size):
    assert run(in_place_forms, size, transport="shm") == [[]] * size


def bools(comm):
    """bool arrays reduce logically (as NCCL's torch backend maps them): sum and max are
    or, prod and min and, the bitwise ops as they are; avg is refused; dtype= reads them
    as bytes instead. Checked against NumPy over every rank's pattern."""
    rank, size = comm.rank, comm.size
    rng = np.random.default_rng(7)
    pats = rng.random((size, 64)) < 0.6  # every rank's values, known to all
    mine = pats[rank].copy()
    want = {"sum": pats.any(0), "max": pats.any(0), "prod": pats.all(0), "min": pats.all(0),
            "band": pats.all(0), "bor": pats.any(0), "bxor": pats.sum(0) % 2 == 1,
            "land": pats.all(0), "lor": pats.any(0), "lxor": pats.sum(0) % 2 == 1}
    bad = []
    for op, w in want.items():
        out = np.zeros(64, bool)
        comm.allreduce(mine, out, op=op)
        if not (out == w).all():
            bad.append(f"allreduce {op}")
        buf = mine.copy()
        comm.allreduce(buf, op=op)  # in place
        if not (buf == w).all():
            bad.append(f"allreduce {op} in place")
    out = np.zeros(64, bool)
    comm.reduce(mine, out if rank == 0 else None, op="sum", root=0)
    if rank == 0 and not (out == pats.any(0)).all():
        bad.append("reduce")
    blk = np.zeros(64 // size if 64 % size == 0 else 0, bool)
    if blk.size:
        comm.reduce_scatter(np.tile(mine[:blk.size], size), blk, op="prod")
        if not (blk == pats[:, :blk.size].all(0)).all():
            bad.append("reduce_scatter")
    pre = np.zeros(64, bool)
    comm.scan(mine, pre, op="max")
    if not (pre == pats[:rank + 1].any(0)).all():
        bad.append("scan")
    n8 = np.zeros(64, np.uint8)
    comm.allreduce(mine, n8.view(bool), op="sum", dtype="uint8")  # bytes: a count
    if not (n8 == pats.sum(0)).all():
        bad.append("dtype=uint8")
    try:
        comm.allreduce(mine.copy(), op="avg")
        bad.append("avg not refused")
    except tutti.InvalidArgError as e:
        if "bool" not in str(e):
            bad.append(f"avg message: {e}")
    return bad


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("size", [1, 2, 4])
def test_bool_reductions(size, transport):
    assert run(bools, size, transport=transport) == [[]] * size


def fp8_values(e5):
    """Every code's value in OCP E4M3 ("fn": no infinity, S.1111.111 NaN) or E5M2, from
    the formats' definitions."""
    c = np.arange(256)
    mb, bias = (2, 15) if e5 else (3, 7)
    e, m = (c >> mb) & (31 if e5 else 15), c & ((1 << mb) - 1)
    v = np.where(e > 0, np.ldexp((1 << mb) + m, e - bias - mb), np.ldexp(m, 1 - bias - mb))
    if e5:
        v = np.where(e == 31, np.where(m == 0, np.inf, np.nan), v)
    else:
        v = np.where(c & 0x7f == 0x7f, np.nan, v)
    return np.where(c & 0x80, -v, v)


def fp8_code(x, e5):
    """The nearest code to each of x (ties to the even code; past the largest finite
    value that value, as NCCL's fp8 reductions saturate)."""
    vals = fp8_values(e5)[:0x80]
    codes = np.flatnonzero(np.isfinite(vals))
    ax = np.abs(np.asarray(x, float))
    d = np.abs(vals[codes][None, :] - ax[:, None])
    tie = d == d.min(1, keepdims=True)  # the nearest (two on a tie): the even code
    best = codes[np.argmin(np.where(tie, codes[None, :] & 1, 2), 1)]
    best = np.where(ax >= vals[codes[-1]], codes[-1], best)
    return (best | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def fp8(comm):
    """fp8 (float8_e4m3fn, float8_e5m2) as bytes read by dtype=: sum of small integers
    (exact in any grouping), max of any codes (NaN on any rank: NaN), avg whose sum is
    past the largest value but whose mean fits; against NumPy's reading of the codes."""
    rank, size = comm.rank, comm.size
    bad = []
    for e5, name in ((0, "float8_e4m3fn"), (1, "float8_e5m2")):
        vals = fp8_values(e5)
        ints = (np.arange(300)[None, :] + np.arange(size)[:, None]) % (3 if e5 else 4)
        mine = fp8_code(ints[rank], e5)
        out = np.zeros(300, np.uint8)
        comm.allreduce(mine, out, op="sum", dtype=name)
        if not (out == fp8_code(ints.sum(0), e5)).all():
            bad.append(f"{name} sum")
        rng = np.random.default_rng(11 + e5)
        codes = rng.integers(0, 256, (size, 500)).astype(np.uint8)
        codes[codes == 0x80] = 0  # no -0 beside +0: their order is the algorithm's
        buf = codes[rank].copy()
        comm.allreduce(buf, op="max", dtype=name)  # in place
        got, want = vals[buf], vals[codes].max(0)  # NaN anywhere: NaN
        if not ((got == want) | (np.isnan(got) & np.isnan(want))).all():
            bad.append(f"{name} max")
        a = 32768.0 if e5 else 256.0  # every rank; 1.5 a on none or two ranks
        two = np.arange(200) % 2 == 1
        x = np.where(two & ((np.arange(200) % size == rank) |
                            ((np.arange(200) + 1) % size == rank)), 1.5 * a, a)
        out = np.zeros(200, np.uint8)
        comm.allreduce(fp8_code(x, e5), out, op="avg", dtype=name)
        nb = np.where(two, min(2, size), 0)
        want = fp8_code(((size - nb) * a + nb * 1.5 * a) / size, e5)
        if not (out == want).all():
            bad.append(f"{name} avg")
    return bad


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("size", [1, 3, 4])
def test_fp8_bytes(size, transport):
    assert run(fp8, size, transport=transport) == [[]] * size


def fortran_order(comm):
    """Arrays in Fortran order are taken in their memory order, as mpi4py takes them:
    elementwise calls give the same array as in C order, and the rest move memory as it
    lies."""
    rank, size = comm.rank, comm.size
    base = np.arange(12, dtype=np.float64).reshape(3, 4)
    bad = []
    a = np.asfortranarray(base * (rank + 1))
    comm.allreduce(a)  # in place
    if not (np.array_equal(a, base * size * (size + 1) / 2) and a.flags.f_contiguous):
        bad.append("allreduce in place")
    o = np.zeros((3, 4), order="F")
    comm.allreduce(np.asfortranarray(base + rank), o, op="max")
    if not np.array_equal(o, base + size - 1):
        bad.append("allreduce")
    b = np.asfortranarray(base) if rank == 0 else np.zeros((3, 4), order="F")
    comm.broadcast(b, root=0)
    if not np.array_equal(b, base):
        bad.append("broadcast")
    g = np.zeros((12, size), order="F")  # column r: rank r's memory
    comm.allgather(np.asfortranarray(base + rank), g)
    want = np.stack([np.asfortranarray(base + r).ravel(order="K") for r in range(size)], 1)
    if not np.array_equal(g, want):
        bad.append("allgather")
    return bad


@pytest.mark.parametrize("size", [1, 3])
def test_fortran_order(size):
    assert run(fortran_order, size, transport="shm") == [[]] * size


def topology_calls(comm):
    """Topologies from Python: a 2 x 2 grid periodic along its first dimension, and a
    graph with a self loop and a repeated edge, their neighbourhood collectives checked
    against references built here from every rank's arguments."""
    r, n = comm.rank, comm.size
    out = {"dims": tutti.dims_create(n, np.int64(2)), "dims3": tutti.dims_create(12, [0, 3, 0])}
    try:
        tutti.dims_create(4, -1)
        out["dims_neg"] = None
    except tutti.InvalidArgError as e:
        out["dims_neg"] = str(e)
    try:
        tutti.dims_create(7, [2, 0])
        out["dims_bad"] = None
    except tutti.InvalidArgError as e:
        out["dims_bad"] = str(e)
    cart = comm.create_cart([2, 2], [True, False])
    out["cart"] = (cart.topology, cart.cart_get(), cart.cart_coords(3), cart.cart_rank([3, 1]),
                   cart.cart_shift(0), cart.cart_shift(1), cart.neighbors)
    row = cart.cart_sub([False, True])
    out["row"] = (row.size, row.rank, row.cart_get(), row.allgather_object(r))
    row.destroy()
    try:  # rank 1's list is of another length: every rank fails, none waits
        cart.cart_sub([True] if r == 1 else [True, False])
        out["sub_bad"] = None
    except tutti.InvalidArgError as e:
        out["sub_bad"] = str(e)
    send = np.array([r * 10 + b for b in range(4) for _ in range(2)], np.float64)
    got = np.full(8, -1.0)
    cart.neighbor_alltoall(send, got)
    out["cart_a2a"] = got.tolist()
    # graph: from r - 1 (twice) and from itself; to r + 1 (twice) and to itself
    nxt, prv = (r + 1) % n, (r - 1) % n
    g = comm.create_dist_graph_adjacent([prv, r, prv], [nxt, r, nxt])
    out["graph"] = (g.topology, g.neighbors, comm.topology)
    buf = np.arange(r + 1, dtype=np.int32) + 100 * r
    counts = [prv + 1, r + 1, prv + 1]
    res = np.full(sum(counts) + 3, -7, np.int32)
    g.neighbor_allgatherv(buf, res, counts, [0, counts[0] + 1, counts[0] + counts[1] + 2])
    out["agv"] = res.tolist()
    sc = [1, 2, 3]
    s = np.arange(6, dtype=np.int64) + 1000 * r
    rv = np.zeros(6, np.int64)
    w = g.neighbor_alltoallv(s, sc, rv, [1, 2, 3], async_op=True)
    w.wait()
    out["a2av"] = rv.tolist()
    po, pi = np.zeros(3, np.int16), np.array([r], np.int16)
    p = g.persistent(g.neighbor_allgather, pi, po)
    rounds = []
    for k in range(2):
        pi[0] = r + 10 * k
        p.start()
        p.wait()
        rounds.append(po.tolist())
    out["persist"] = rounds
    try:
        comm.create_dist_graph_adjacent([], [nxt] if r == 0 else [])
        out["half"] = None
    except tutti.InvalidArgError as e:
        out["half"] = str(e)
    try:
        comm.neighbor_alltoall(send, got)
        out["none"] = None
    except tutti.InvalidArgError as e:
        out["none"] = str(e)
    # the ring again, every edge named by rank 0
    gd = comm.create_dist_graph(list(range(n)) if r == 0 else [], [1] * n if r == 0 else [],
                                [(q + 1) % n for q in range(n)] if r == 0 else [])
    out["general"] = gd.neighbors
    gd.destroy()
    g.destroy()
    cart.destroy()
    return out


def test_topology():
    n = 4
    got = run(topology_calls, n)
    for r, o in enumerate(got):
        assert o["dims"] == [2, 2] and o["dims3"] == [2, 3, 2], o
        assert "12" not in o["dims_bad"] and "7 ranks" in o["dims_bad"], o["dims_bad"]
        assert "ndims -1" in o["dims_neg"], o["dims_neg"]
        coords = [r // 2, r % 2]
        back0, fwd0 = ((coords[0] - 1) % 2) * 2 + coords[1], ((coords[0] + 1) % 2) * 2 + coords[1]
        back1 = coords[0] * 2 + coords[1] - 1 if coords[1] > 0 else tutti.PROC_NULL
        fwd1 = coords[0] * 2 + coords[1] + 1 if coords[1] < 1 else tutti.PROC_NULL
        nb = [back0, fwd0, back1, fwd1]
        assert o["cart"] == ("cart", ([2, 2], [True, False], coords), [1, 1], 3, (back0, fwd0),
                             (back1, fwd1), (nb, nb)), (r, o["cart"])
        assert o["row"] == (2, r % 2, ([2], [False], [r % 2]), [r - r % 2, r - r % 2 + 1]), \
            o["row"]
        # slot 2i from the one back (its block 2i + 1), 2i + 1 from the front (its 2i)
        want = []
        for slot, q in enumerate(nb):
            blk = slot + 1 if slot % 2 == 0 else slot - 1
            want += [-1.0, -1.0] if q == tutti.PROC_NULL else [q * 10 + blk] * 2
        assert o["cart_a2a"] == want, (r, o["cart_a2a"], want)
        prv = (r - 1) % n
        assert o["graph"] == ("graph", ([prv, r, prv], [(r + 1) % n, r, (r + 1) % n]), None)
        pb = (np.arange(prv + 1) + 100 * prv).tolist()
        mine = (np.arange(r + 1) + 100 * r).tolist()
        assert o["agv"] == pb + [-7] + mine + [-7] + pb + [-7], (r, o["agv"])
        # from prv's sends 0 (1 element) and 2 (3), in that order; from itself its block 1
        ps = (np.arange(6) + 1000 * prv).tolist()
        me = (np.arange(6) + 1000 * r).tolist()
        assert o["a2av"] == ps[0:1] + me[1:3] + ps[3:6], (r, o["a2av"])
        assert o["persist"] == [[prv + 10 * k, r + 10 * k, prv + 10 * k] for k in range(2)], \
            o["persist"]
        assert "rank 1 lists rank 0 0 times among its sources" in o["half"], o["half"]
        assert "no topology" in o["none"], o["none"]
        assert o["general"] == ([prv], [(r + 1) % n]), o["general"]
        assert ("1 remain_dims for a grid of 2" if r == 1 else "rank 1's remain_dims[0] is -1") \
            in o["sub_bad"], o["sub_bad"]
