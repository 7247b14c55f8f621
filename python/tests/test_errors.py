"""Bad arguments, mismatched calls and dead ranks raise tutti errors naming what went
wrong; nothing crashes or hangs; the GIL is free while a call blocks."""
import functools
import multiprocessing
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
    # (a 1-D column is taken in place since session 110: test_p2p strided_outputs_in_place)
    expect(tutti.InvalidArgError, lambda: comm.allreduce(np.zeros((4, 4))[:2, :2]), "contiguous")
    expect(tutti.InvalidArgError, lambda: comm.allreduce(np.zeros(4, np.complex64), op="max"),
           "complex")
    expect(tutti.InvalidArgError, lambda: comm.allreduce(np.zeros(4, np.bool_), op="avg"),
           "bool")
    expect(tutti.InvalidArgError, lambda: comm.allreduce(np.zeros(4, np.longdouble)),
           "element type")
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
    s16 = np.dtype([("re", np.float64), ("im", np.float64)])  # (complex is a dtype now)
    c16 = np.zeros(2, s16)  # carried as 16 bytes an item: counts x 16 overflow
    expect(tutti.InvalidArgError,
           lambda: comm.allgatherv(c16, np.zeros(2 * comm.size, s16),
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


def set_timeout(comm):
    before = comm.timeout_ms
    try:
        comm.timeout_ms = 0
        zero = "no error"
    except tutti.InvalidArgError as e:
        zero = str(e)
    a = np.full(4, comm.rank + 1.0, np.float32)
    comm.allreduce(a)  # under the communicator's first timeout still
    comm.timeout_ms = 500
    if comm.rank == 1:
        time.sleep(3.0)  # never joins the next one
        return None
    t0 = time.monotonic()
    try:
        comm.allreduce(a)
        late = "no error"
    except tutti.TimeoutError as e:
        late = str(e)
    return before, zero, a.tolist(), comm.timeout_ms, late, time.monotonic() - t0


def test_set_timeout_bounds_later_calls():
    before, zero, vals, now, late, secs = run(set_timeout, 2, timeout_ms=20000)[0]
    assert before == 20000 and now == 500 and vals == [3.0] * 4
    assert "set_timeout: 0 ms" in zero and "stays 20000 ms" in zero, zero
    assert "within 500 ms" in late and "rank 1" in late, late
    assert 0.4 < secs < 2.5, (secs, late)


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


def agree_after_death(comm):
    a = np.ones(8, dtype=np.float32)
    comm.allreduce(a)
    # everyone here: the AND of four flags, nobody absent
    whole = comm.agree(0xFF ^ (1 << comm.rank))
    with pytest.raises(ValueError, match="unsigned 32-bit"):
        comm.agree(-1)
    if comm.rank == 2:
        os._exit(0)  # dies without a word
    ok = 1
    try:
        comm.allreduce(a)
    except tutti.Error:
        ok = 0
    # MPIX_Comm_agree's use: did the step work everywhere? The ranks left take one path.
    flag, absent = comm.agree((ok << 8) | 0xFF ^ (1 << comm.rank), wait_ms=1500)
    small = comm.shrink(absent)
    out = (whole, flag, absent, small.rank, small.size)
    small.destroy()
    return out


def test_agree_after_a_rank_died():
    got = launch(agree_after_death, 4, timeout=60, timeout_ms=3000)
    assert 2 not in got
    left = (0, 1, 3)
    want = 0xFF
    for r in left:
        want &= 0xFF ^ (1 << r)
    for new, r in enumerate(left):
        kind, value = got[r]
        assert kind == "ok", value
        assert value == ((0xF0, []), want, [2], new, 3), value


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


def layouts_and_integers(comm):
    """v-collectives whose counts or displacements reach past a buffer, integers ctypes
    would truncate, and items in the other byte order: refused in Python, naming the
    argument; then right calls give the right values."""
    seen, rank, size = [], comm.rank, comm.size

    def expect(fn, *words):
        try:
            fn()
        except tutti.InvalidArgError as e:
            missing = [w for w in words if w not in str(e)]
            seen.append(f"MISSING {missing}: {e}" if missing else "ok")
        except Exception as e:  # noqa: B902
            seen.append(f"wrong {type(e).__name__}: {e}")
        else:
            seen.append(f"no error for {words}")

    i8 = lambda n: np.zeros(n, np.int64)  # noqa: E731
    expect(lambda: comm.allgatherv(i8(4), i8(2), [4] * size), "allgatherv", "counts",
           "the output")
    expect(lambda: comm.allgatherv(i8(1), i8(200), [100] * size), "counts[%d]" % rank,
           "the input")
    expect(lambda: comm.allgatherv(i8(1), i8(2), [1] * size, [0, 1 << 40][:size]),
           "displs[1]", "rank 1's block")
    expect(lambda: comm.reduce_scatterv(np.ones(2, np.float32), np.zeros(1, np.float32),
                                        [1 << 20] * size), "sum(counts)", "reduce_scatterv")
    expect(lambda: comm.alltoallv(np.ones(2, np.float32), [1] * size, np.zeros(2, np.float32),
                                  [1 << 20] * size), "recv_counts", "alltoallv")
    expect(lambda: comm.alltoallv(np.ones(2, np.float32), [3] * size, np.zeros(8, np.float32),
                                  [1] * size), "send_counts", "the input")
    expect(lambda: comm.gatherv(np.ones(1, np.float32), np.zeros(2, np.float32), [1] * size,
                                [0, 1 << 22][:size], root=rank), "displs[1]", "gatherv")
    expect(lambda: comm.scatterv(np.ones(2, np.float32), [2] * size, np.zeros(2, np.float32),
                                 root=rank), "counts", "scatterv", "the input")
    odd = np.ones(2 * size + 1)
    expect(lambda: comm.reduce_scatter(odd, odd), "split into")  # in place
    expect(lambda: comm.broadcast(np.ones(2), root=2**32 + 1), "root", "4294967297")
    expect(lambda: comm.send(np.ones(1), peer=1 - rank, tag=2**32 + 5), "tag")
    expect(lambda: comm.recv(np.ones(1), peer=2**32, tag=0), "peer")
    expect(lambda: comm.split(2**31), "color")
    expect(lambda: comm.allreduce(np.ones(2), op=2**32), "op")
    expect(lambda: comm.allreduce(np.ones(2), op=200), "not an op defined here")
    expect(lambda: comm.barrier(async_op=True).wait(timeout=float("nan")), "NaN")
    be = np.array([1.0, 2.0 + rank], dtype=">f4")
    expect(lambda: comm.allreduce(be), "big-endian")
    comm.barrier()
    # the right calls, and data moved in the other byte order, bytes as they are
    comm.broadcast(be, root=0)
    seen.append(be.astype("<f4").tolist())
    out = np.zeros(2 * size, np.int64)
    comm.allgatherv(np.full(2, rank + 1, np.int64), out, [2] * size)
    seen.append(out.tolist())
    return seen


def test_layouts_and_integers_are_checked():
    for rank_seen in run(layouts_and_integers, 2):
        assert rank_seen[-2:] == [[1.0, 2.0], [1, 1, 2, 2]], rank_seen
        assert [s for s in rank_seen[:-2] if s != "ok"] == [], rank_seen


def shared_work(comm):
    """One Work waited for on one thread and polled on another: the handle is freed once,
    after both are out of the library (freed under the waiter: SIGABRT or a wrong
    status)."""
    errs, sums = [], set()
    for i in range(400):
        x = np.full(16, float(i + comm.rank))
        w = comm.allreduce(x, async_op=True)

        def poll(w):  # this iteration's Work, not the next one's
            try:
                while not w.is_completed():
                    pass
            except Exception as e:  # noqa: B902
                errs.append(repr(e))
        t = threading.Thread(target=poll, args=(w,))
        t.start()
        try:
            w.wait(timeout=10)
        except Exception as e:  # noqa: B902
            errs.append(repr(e))
        t.join(10)
        if t.is_alive():
            errs.append(f"poller still running (iteration {i})")
        sums.add(float(x[0]) - (2 * i + 1))
    return errs, sorted(sums)


def test_work_shared_by_threads():
    for errs, sums in run(shared_work, 2, timeout=120):
        assert errs == [] and sums == [0.0], (errs[:3], sums)


def dropped_in_op(comm):
    """A Work dropped (in a reference cycle) while a garbage collection runs inside an
    Op's function on the progress thread: its __del__ must not wait there (the progress
    thread would wait for itself until the timeout)."""
    import gc

    def add(a, b, out):
        gc.collect()
        np.add(a, b, out=out)
    op = tutti.Op(add, commutative=True)
    x, y = np.ones(4, np.float32), np.ones(1 << 16, np.float32)
    t0 = time.monotonic()
    w = comm.allreduce(x, op=op, async_op=True)
    w2 = comm.allreduce(y, op="sum", async_op=True)
    cyc = [w2]
    cyc.append(cyc)
    del w2, cyc
    w.wait(timeout=20)
    comm.barrier()  # reaps the dropped one
    return x.tolist(), float(y[0]), float(y[-1]), time.monotonic() - t0


def test_work_dropped_inside_an_op_does_not_block():
    for xs, y0, y1, secs in run(dropped_in_op, 2, timeout=60, timeout_ms=10000):
        assert xs == [2.0] * 4 and (y0, y1) == (2.0, 2.0)
        assert secs < 5, secs


def forked_child_exits(comm):
    """A child forked by a rank exits normally: its atexit must not destroy (and wait on)
    the parent's communicator, which still works afterwards."""
    x = np.ones(4)
    comm.allreduce(x)
    took = None
    if comm.rank == 0:
        pid = os.fork()
        if pid == 0:
            import atexit
            try:
                atexit._run_exitfuncs()  # a normal exit's: tutti._close_all
            finally:
                os._exit(0)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:
            if os.waitpid(pid, os.WNOHANG)[0]:
                took = time.monotonic() - t0
                break
            time.sleep(0.02)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    comm.allreduce(x)
    return x.tolist(), took


def test_forked_child_leaves_the_parents_communicator():
    (x0, took), (x1, _) = run(forked_child_exits, 2, timeout=60, timeout_ms=5000)
    assert x0 == x1 == [4.0] * 4
    assert took is not None and took < 3, took


def interrupted(comm, was_interrupted):
    """Ctrl-C during a blocking recv on the main thread (tutti.interruptible): a
    KeyboardInterrupt at once, not at the communicator's timeout; the receive goes on
    (its buffer kept) and lands once its message comes. Rank 1 sends once rank 0 was
    interrupted (was_interrupted, an Event): after a fixed 1.5 s, a loaded machine's late
    Ctrl-C found the receive done, rank 0 returned "no interrupt" without the barrier and
    destroyed its communicator, and rank 1's barrier failed on that close."""
    if comm.rank == 1:
        assert was_interrupted.wait(30), "rank 0 was not interrupted within 30 s"
        comm.send(np.full(3, 7.0), peer=0, tag=4)
        comm.barrier()
        return None
    tutti.interruptible = True
    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    buf = np.zeros(3)
    t0 = time.monotonic()
    try:
        comm.recv(buf, peer=1, tag=4)
        return "no interrupt"
    except KeyboardInterrupt:
        took = time.monotonic() - t0
        was_interrupted.set()
    finally:
        tutti.interruptible = False
    comm.barrier()  # after the receive, in issue order
    return took, buf.tolist()


def test_ctrl_c_interrupts_a_blocking_call():
    ev = multiprocessing.get_context("fork").Event()  # the ranks are forked: they share it
    took, got = run(functools.partial(interrupted, was_interrupted=ev), 2, timeout=60,
                    timeout_ms=15000)[0]
    assert took < 1.0, took
    assert got == [7.0] * 3


def own_messages(comm):
    """Failures explained by their own call's message while another thread polls a
    pending Work (wait(timeout=0) noted the timeout in last_error, which the failing
    call could read), and a Work.wait timeout naming the rank, the op and its peer."""
    if comm.rank == 1:
        time.sleep(3)
        comm.send(np.zeros(1), peer=0, tag=9)
        return None
    w = comm.recv(np.zeros(1), peer=1, tag=9, async_op=True)
    stop, wrong = [], []

    def poll():
        while not stop:
            try:
                w.wait(timeout=0)
            except tutti.TimeoutError as e:  # says who and what
                if "rank 0: recv from rank 1 (tag 9)" not in str(e):
                    wrong.append(str(e))
    t = threading.Thread(target=poll)
    t.start()
    for _ in range(500):
        try:
            comm.allreduce(np.ones(4, np.float32), op="band")
        except tutti.Error as e:
            if "band" not in str(e):
                wrong.append(str(e))
    stop.append(1)
    t.join(10)
    if t.is_alive():
        wrong.append("poller still running")
    w.wait(timeout=10)
    return wrong[:3]


def test_failure_messages_are_the_calls_own():
    assert run(own_messages, 2, timeout=60)[0] == []
