"""Bad arguments, mismatched calls and dead ranks raise tutti errors naming what went
wrong; nothing crashes or hangs; the GIL is free while a call blocks."""
import os
import signal
import threading
import time

import numpy as np
import pytest

import tutti
from ranks import answer, launch, run


def test_error_classes_follow_the_status_list():
    assert issubclass(tutti.TimeoutError, tutti.Error)
    assert issubclass(tutti.TimeoutError, TimeoutError)
    assert issubclass(tutti.InvalidArgError, ValueError)
    assert tutti.MismatchError.status == -5 and tutti.InUseError.status == -18
    assert tutti.PeerError("x").status_name == "TUTTI_ERR_PEER"


def bad_arguments(comm):
    seen = []

    def expect(cls, fn, *words):
        try:
            fn()
        except cls as e:
            missing = [w for w in words if w not in str(e)]
            seen.append(f"{cls.__name__}: {e}" if not missing else f"MISSING {missing}: {e}")
        else:
            seen.append(f"no {cls.__name__}")

    a = np.zeros(8, np.float32)
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    expect(tutti.InvalidArgError, lambda: comm.allreduce(a, np.zeros(9, np.float32)),
           "32 bytes", "36")
    expect(tutti.InvalidArgError, lambda: comm.allreduce(a, ro), "read-only")
    expect(tutti.InvalidArgError, lambda: comm.allreduce(np.zeros((4, 4))[:, 1]), "contiguous")
    expect(tutti.InvalidArgError, lambda: comm.allreduce(np.zeros(4, np.complex64)), "element type")
    expect(tutti.InvalidArgError, lambda: comm.allreduce(a, np.zeros(8, np.int32)), "f32", "i32")
    expect(tutti.InvalidArgError, lambda: comm.allreduce(a, op="band"), "band")
    expect(tutti.InvalidArgError, lambda: comm.allreduce(a, dtype="f64"), "8-byte")
    expect(tutti.InvalidArgError, lambda: comm.allreduce(a, dtype=99), "not a tutti dtype")
    expect(tutti.InvalidArgError, lambda: comm.allreduce(a, dtype="f128"), "unknown dtype")
    expect(TypeError, lambda: comm.allreduce(3.5), "neither a buffer")
    expect(tutti.InvalidArgError, lambda: comm.broadcast(a, root=comm.size), "root")
    expect(tutti.InvalidArgError, lambda: comm.allgather(a, np.zeros(3, np.float32)), "bytes")
    expect(tutti.InvalidArgError, lambda: comm.alltoall(np.zeros(3 * comm.size + 1)), "blocks")
    expect(tutti.InvalidArgError, lambda: comm.allgatherv(a, a, [1]), "entries")
    c16 = np.zeros(2, np.complex128)  # carried as 16 bytes an item: counts x 16 overflow
    expect(tutti.InvalidArgError,
           lambda: comm.allgatherv(c16, np.zeros(2 * comm.size, np.complex128),
                                   [2**60 + 1] * comm.size), "too large")
    # the communicator still works after all that
    b = np.ones(3, np.int32)
    comm.allreduce(b)
    seen.append(b.tolist())
    return seen


def test_bad_arguments_raise_clearly():
    for rank_seen in run(bad_arguments, 2):
        assert rank_seen[-1] == [2, 2, 2]
        assert not [s for s in rank_seen[:-1] if s.startswith(("no ", "MISSING"))], rank_seen


def mismatched(comm):
    a = np.zeros(10 + comm.rank, np.float32)
    try:
        comm.allreduce(a)
    except tutti.MismatchError as e:
        return str(e)
    return "no error"


def test_mismatched_collective_raises_on_every_rank():
    got = run(mismatched, 2, stall_check_ms=200)
    for text in got:
        assert "mismatch" in text.lower() or "10" in text, got
        assert "no error" not in text


def killed(comm):
    a = np.ones(1 << 16, np.float32)
    comm.allreduce(a)
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        for _ in range(1000):
            comm.allreduce(a)
    except tutti.Error as e:
        return type(e).__name__, str(e), time.monotonic() - t0
    return "no error", "", 0


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_killed_rank_is_named(transport):
    got = launch(killed, 3, timeout=30, transport=transport, timeout_ms=5000)
    assert 1 not in got
    for r in (0, 2):
        kind, (cls, text, secs) = got[r]
        assert kind == "ok" and cls != "no error", got[r]
        assert "rank 1" in text, text
        assert secs < 5.5, secs


def gil_free(comm):
    a = np.ones(4, np.float32)
    if comm.rank == 0:
        time.sleep(1.0)
        comm.allreduce(a)
        return None
    ticks = [0]
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    t = threading.Thread(target=tick)
    t.start()
    comm.allreduce(a)  # blocks ~1 s waiting for rank 0
    stop.set()
    t.join()
    return ticks[0]


def test_gil_is_released_while_blocking():
    ticks = run(gil_free, 2)[1]
    assert ticks > 200, ticks


def work_timeout(comm):
    a = np.ones(4, np.float32)
    if comm.rank == 0:
        w = comm.allreduce(a, async_op=True)
        t0 = time.monotonic()
        try:
            w.wait(timeout=0.3)
            r = "no timeout"
        except tutti.TimeoutError:
            r = round(time.monotonic() - t0, 1)
        done_before = w.is_completed()
        comm.barrier()  # rank 1 joins the allreduce, then the barrier
        w.wait()
        return r, done_before, a.tolist()
    time.sleep(1.0)
    comm.allreduce(a)
    comm.barrier()
    return None


def test_work_wait_timeout_then_completes():
    r, done_before, vals = run(work_timeout, 2)[0]
    assert r == 0.3 and done_before is False and vals == [2.0] * 4


def test_store_close_refused_while_used(tmp_path):
    store = tutti.Store(f"file://{tmp_path}")
    comm = tutti.Communicator(store, 0, 1, job_id="close-test")
    with pytest.raises(tutti.Error, match="still used by 1 communicator"):
        store.close()
    comm.destroy()
    store.close()


def test_failed_setup_says_why(tmp_path):
    """A communicator that cannot be set up raises with the library's cause (there is no
    communicator to ask: tutti_comm_last_error(NULL)), here a tuning file's bad line."""
    bad = tmp_path / "bad.tune"
    bad.write_text("shm 1 allreduce:ring\nnonsense\n")
    store = tutti.Store(f"file://{tmp_path}")
    with pytest.raises(tutti.Error, match=r"bad\.tune, line 2: expected"):
        tutti.Communicator(store, 0, 1, job_id="bad-tune", cost_model=f"tune={bad}")
    store.close()


def shrink_after_death(comm):
    a = np.ones(8, dtype=np.float32)
    comm.allreduce(a)
    if comm.rank == 2:
        os._exit(0)  # dies without a word: the others see it go
    with pytest.raises(tutti.Error, match="rank 2"):
        comm.allreduce(a)
    # named (ncclCommShrink), or agreed by the ranks that call it (MPIX_Comm_shrink)
    small = comm.shrink([2]) if os.environ.get("TT_SHRINK") == "named" else comm.shrink(wait_ms=2000)
    b = np.full(8, comm.rank + 1, dtype=np.float32)
    small.allreduce(b)
    out = (small.rank, small.size, b.tolist())
    small.destroy()
    return out


@pytest.mark.parametrize("how", ["named", "live"])
def test_shrink_after_a_rank_died(how, monkeypatch):
    monkeypatch.setenv("TT_SHRINK", how)
    got = launch(shrink_after_death, 4, timeout=60, timeout_ms=3000)
    assert 2 not in got
    for r, new in ((0, 0), (1, 1), (3, 2)):
        kind, value = got[r]
        assert kind == "ok", value
        assert value == (new, 3, [1.0 + 2.0 + 4.0] * 8)


def revoke_then_shrink(comm):
    a = np.ones(8, dtype=np.float32)
    comm.allreduce(a)
    if comm.rank == 2:
        time.sleep(6)  # hung: never in the second allreduce
        return None
    if comm.rank == 0:  # gives up on rank 2 after 0.3 s, from another thread
        threading.Timer(0.3, comm.revoke).start()
    t0 = time.monotonic()
    with pytest.raises(tutti.RevokedError, match="revoked"):
        comm.allreduce(a)
    took = time.monotonic() - t0
    small = comm.shrink([2])
    b = np.full(8, comm.rank + 1, dtype=np.float32)
    small.allreduce(b)
    out = (small.rank, small.size, b.tolist(), took)
    small.destroy()
    return out


def test_revoke_then_shrink():
    got = launch(revoke_then_shrink, 3, timeout=60, timeout_ms=20000)
    for r in (0, 1):
        kind, value = got[r]
        assert kind == "ok", value
        assert value[:3] == (r, 2, [3.0] * 8)
        assert value[3] < 5, f"rank {r} felt the revoke after {value[3]:.1f} s (timeout 20 s)"
    assert tutti.RevokedError.status == -19


def _grow_proc(proc, url, job, q):
    try:
        store = tutti.Store(url)
        if proc < 2:
            comm = tutti.Communicator(store, proc, 2, job_id=job, timeout_ms=20000)
            big = comm.grow(3)
        else:
            comm, big = None, tutti.Communicator.join(store, job_id=job, timeout_ms=20000)
        a = np.full(4, big.rank + 1, dtype=np.float64)
        big.allreduce(a)
        answer(q, proc, "ok", (big.rank, big.size, a.tolist()))
        big.destroy()
        if comm:
            comm.destroy()
        store.close()
    except BaseException as e:  # noqa: B902 (reported to the parent)
        answer(q, proc, "error", repr(e))


def test_grow_and_join(tmp_path):
    import multiprocessing as mp
    from ranks import collect
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    got = {}
    job = f"grow-{os.getpid()}"
    collect([ctx.Process(target=_grow_proc, args=(p, f"file://{tmp_path}", job, q))
             for p in range(3)], q, got, 60)
    assert {p: got.get(p, ("missing",))[0] for p in range(3)} == {0: "ok", 1: "ok", 2: "ok"}, got
    assert sorted(v[1][:2] for v in got.values()) == [(0, 3), (1, 3), (2, 3)]
    assert all(v[1][2] == [6.0] * 4 for v in got.values())
    with pytest.raises(tutti.TimeoutError, match="is growing"):
        tutti.Communicator.join(tutti.Store(f"file://{tmp_path}"), job_id="nobody", timeout_ms=200)
