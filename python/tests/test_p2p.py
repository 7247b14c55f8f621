"""Receives from any source: peer=None (or tutti.ANY_SOURCE) takes whichever rank's
message of the tag comes, in each sender's order, and says who sent it."""
import time

import numpy as np
import pytest

import tutti
from ranks import run

K = 5  # messages per sender


def any_source(comm):
    rank, size = comm.rank, comm.size
    if rank > 0:
        for k in range(K):
            comm.send(np.full(8, rank * 100 + k, np.int64), 0, tag=3)
        comm.send(np.full(2, -rank, np.int64), 0, tag=4)
        return None
    works, bufs = [], []
    for i in range((size - 1) * K):
        bufs.append(np.zeros(8, np.int64))
        # half by None, half by the constant: both mean any source
        works.append(comm.recv(bufs[-1], None if i % 2 else tutti.ANY_SOURCE, tag=3,
                               async_op=True))
    seen = {s: [] for s in range(1, size)}
    for w, b in zip(works, bufs):
        w.wait()
        seen[w.source].append(int(b[0]))
        assert (b == b[0]).all()
    named = []
    for s in range(1, size):
        got = np.zeros(2, np.int64)
        named.append((comm.recv(got, s, tag=4), int(got[0])))
    return seen, named, works[0].source


def test_any_source():
    res = run(any_source, 3)
    seen, named, first_source = res[0]
    assert seen == {s: [s * 100 + k for k in range(K)] for s in (1, 2)}
    assert named == [(1, -1), (2, -2)]
    assert first_source in (1, 2)


def blocking_any(comm):
    if comm.rank == 1:
        comm.send(np.arange(4, dtype=np.float32), 0, tag=9)
        return None
    got = np.zeros(4, np.float32)
    src = comm.recv(got, tag=9)  # blocking, from any source: returns the sender
    return src, got.tolist()


def test_blocking_any_source():
    assert run(blocking_any, 2)[0] == (1, [0.0, 1.0, 2.0, 3.0])


def probes(comm):
    """Messages of sizes the receiver does not know: each sender sends rank * 3 + 1
    values of its own dtype; rank 0 probes, then receives what the probe said."""
    kinds = {1: np.int16, 2: np.float64, 3: np.uint8}
    if comm.rank > 0:
        n = comm.rank * 3 + 1
        comm.send(np.arange(n, dtype=kinds[comm.rank]) + comm.rank, 0, tag=21)
        comm.barrier()
        return None
    first = comm.iprobe(tag=21)  # (may already see one: no barrier before the sends)
    got = {}
    for _ in range(comm.size - 1):
        p = comm.probe(tag=21)
        again = comm.iprobe(p.source, tag=21)  # nothing was taken
        buf = bytearray(p.nbytes)
        assert comm.recv(buf, p.source, tag=21, dtype=p.dtype) == p.source
        got[p.source] = (p, again, np.frombuffer(buf, kinds[p.source]).tolist())
    # (before the barrier: after it, the others may have destroyed their communicators,
    # and an iprobe with every link closed fails, naming them)
    after = comm.iprobe(tag=21)
    comm.barrier()
    return first, got, after


def test_probe_then_receive_what_it_said():
    first, got, after = run(probes, 4)[0]
    assert first is None or first.source in (1, 2, 3)
    assert after is None
    names = {1: "i16", 2: "f64", 3: "u8"}
    for src in (1, 2, 3):
        p, again, vals = got[src]
        n = src * 3 + 1
        want = tutti.Probe(src, n, names[src], n * np.dtype(np.int16 if src == 1 else
                                                              np.float64 if src == 2 else
                                                              np.uint8).itemsize, 21)
        assert p == want and again == want, (p, again, want)
        assert vals == [src + i for i in range(n)], vals


def probe_timeout(comm):
    if comm.rank == 1:
        comm.barrier()
        return None
    comm.timeout_ms = 300
    try:
        comm.probe(1, tag=5)
        r = "no error"
    except tutti.TimeoutError as e:
        r = str(e)
    comm.timeout_ms = 20000
    comm.barrier()  # the communicator goes on
    return r


def test_probe_times_out_and_the_communicator_goes_on():
    r = run(probe_timeout, 2)[0]
    assert "probe from rank 1 (tag 5): no such message came within 300 ms" in r, r


def mprobes(comm):
    """mprobe takes what it found: a recv after it gets the next message of the tag;
    Message.recv checks the buffer, copies once; improbe from any source, polled."""
    if comm.rank == 1:
        comm.send(np.arange(3, dtype=np.int32), 0, tag=30)
        comm.send(np.array([0.5, -2.0]), 0, tag=30)
        comm.send(np.arange(5, dtype=np.uint8), 0, tag=31)
        comm.barrier()
        return None
    m = comm.mprobe(1, tag=30)
    head = (m.source, m.tag, m.count, m.dtype, m.nbytes)
    nxt = np.zeros(2)
    comm.recv(nxt, 1, tag=30)  # the second message: the first was taken
    errs = []
    for bad in (np.zeros(2, np.int32), np.zeros(3, np.float32)):
        try:
            m.recv(bad)
            errs.append("no error")
        except tutti.MismatchError as e:
            errs.append(str(e))
    out = np.zeros(3, np.int32)
    m.recv(out)
    try:
        m.recv(out)
        again = "no error"
    except tutti.InvalidArgError as e:
        again = str(e)
    im, t0 = None, time.monotonic()
    while im is None and time.monotonic() - t0 < 10:
        im = comm.improbe(tag=31)
    assert im is not None, "improbe saw nothing in 10 s"
    raw = im.recv()
    after = comm.improbe(tag=31)  # (before the barrier, as probes' above)
    comm.barrier()
    return head, nxt.tolist(), errs, out.tolist(), again, im.source, bytes(raw), after


def test_mprobe_takes_the_message():
    head, nxt, errs, out, again, isrc, raw, after = run(mprobes, 2)[0]
    assert head == (1, 30, 3, "i32", 12), head
    assert nxt == [0.5, -2.0] and out == [0, 1, 2]
    assert "mrecv of the message from rank 1 (tag 30, 3 x i32): the buffer holds 2 x i32" \
        in errs[0], errs
    assert "the buffer holds 3 x f32" in errs[1], errs
    assert "received (or freed) already" in again, again
    assert isrc == 1 and raw == bytes(range(5)) and after is None


def upto(comm):
    """recv_upto: a shorter message into a bigger buffer (the rest untouched), the count
    it had; bytes take any dtype; one that does not fit raises and stays; async, its
    Work's count and source."""
    if comm.rank == 1:
        comm.send(np.array([1.5, -2.0, 3.25], np.float32), 0, tag=5)
        comm.send(np.arange(4, dtype=np.int32), 0, tag=6)
        comm.send(np.arange(5, dtype=np.float32), 0, tag=7)
        comm.send(np.array([9, 8], np.int64), 0, tag=8)
        comm.barrier()
        return None
    a = np.full(8, -1, np.float32)
    r1 = comm.recv_upto(a, 1, tag=5)
    raw = bytearray(b"\xee" * 32)
    r2 = comm.recv_upto(raw, 1, tag=6)
    small = np.zeros(2, np.float32)
    try:
        comm.recv_upto(small, 1, tag=7)
        err = "no error"
    except tutti.MismatchError as e:
        err = str(e)
    big = np.zeros(5, np.float32)
    r3 = comm.recv_upto(big, 1, tag=7)
    c = np.zeros(4, np.int64)
    w = comm.recv_upto(c, None, tag=8, async_op=True)
    w.wait()
    comm.barrier()
    return (r1, a.tolist(), r2, bytes(raw[16:]), np.frombuffer(bytes(raw[:16]), np.int32).tolist(),
            err, r3, big.tolist(), w.source, w.count, c.tolist())


def test_recv_upto():
    (r1, a, r2, tail, ints, err, r3, big, src, cnt, c) = run(upto, 2)[0]
    assert r1 == (1, 3) and a == [1.5, -2.0, 3.25] + [-1.0] * 5, (r1, a)
    assert r2 == (1, 16) and tail == b"\xee" * 16 and ints == [0, 1, 2, 3], (r2, tail, ints)
    assert "rank 1's message is 5 x f32 (20 bytes): more than the receive has room for" in err, \
        err
    assert r3 == (1, 5) and big == [0.0, 1.0, 2.0, 3.0, 4.0], (r3, big)
    assert (src, cnt, c) == (1, 2, [9, 8, 0, 0]), (src, cnt, c)


def wait_sets(comm):
    """tutti.wait_any / wait_some / wait_all over receives from ranks 1 and 2: rank 2's
    comes at once, rank 1's only after a "go"; then works of two communicators; then a
    failed receive (a count mismatch, on a dup of its own) among good ones."""
    dup, bad = comm.dup(), comm.dup()
    go = np.ones(1, np.int32)
    if comm.rank == 1:
        comm.recv(np.zeros(1, np.int32), 0, tag=20)
        comm.send(np.array([100], np.int32), 0, tag=21)
        dup.send(np.array([124], np.int32), 0, tag=24)
        try:
            bad.send(np.zeros(4, np.int32), 0, tag=26)
        except tutti.Error:
            pass  # (the receiver's check)
        result = None
    elif comm.rank == 2:
        comm.send(np.array([200], np.int32), 0, tag=22)
        comm.recv(np.zeros(1, np.int32), 0, tag=20)
        comm.send(np.array([223], np.int32), 0, tag=23)
        comm.send(np.array([225], np.int32), 0, tag=25)
        result = None
    else:
        a, b = np.full(1, -1, np.int32), np.full(1, -1, np.int32)
        ws = [comm.recv(a, 1, tag=21, async_op=True), None,
              comm.recv(b, 2, tag=22, async_op=True)]
        first = tutti.wait_any(ws, timeout=20)
        got_b = int(b[0])
        ws[2] = None
        look = tutti.wait_any(ws, timeout=0)
        some_look = tutti.wait_some(ws, timeout=0)
        comm.send(go, 1, tag=20)
        all_ok = tutti.wait_all(ws, timeout=float("inf"))
        got_a = int(a[0])
        none = tutti.wait_any([None, None])
        c, d = np.full(1, -1, np.int32), np.full(1, -1, np.int32)
        ws = [comm.recv(c, 2, tag=23, async_op=True), dup.recv(d, 1, tag=24, async_op=True)]
        over_two = tutti.wait_any(ws, timeout=20)
        got_d = int(d[0])
        comm.send(go, 2, tag=20)
        ws[0].wait()
        some = tutti.wait_some(ws)
        e, v = np.full(1, -1, np.int32), np.zeros(3, np.int32)
        ws = [comm.recv(e, 2, tag=25, async_op=True), bad.recv(v, 1, tag=26, async_op=True)]
        try:
            tutti.wait_all(ws, timeout=20)
            err = "no error"
        except tutti.MismatchError as x:
            err = str(x)
        try:
            tutti.wait_any([a])
            typ = "no error"
        except TypeError as x:
            typ = str(x)
        bad_err, comm_err = bad.async_error(), comm.async_error()
        result = (first, got_b, look, some_look, all_ok, got_a, none, over_two, got_d, some,
                  c.tolist(), err, ws[0].exception(), int(e[0]), typ,
                  (type(bad_err).__name__, str(bad_err)), comm_err)
    bad.destroy()
    dup.barrier()
    dup.destroy()
    return result


def test_wait_any_some_all():
    (first, b, look, some_look, all_ok, a, none, over_two, d, some, c, err, good, e,
     typ, bad_err, comm_err) = run(wait_sets, 3)[0]
    assert bad_err[0] == "MismatchError" and "(count=4, i32, tag 26" in bad_err[1], bad_err
    assert comm_err is None, comm_err
    assert (first, b) == (2, 200), (first, b)
    assert look is None and some_look == [], (look, some_look)
    assert all_ok is True and a == 100 and none is None, (all_ok, a, none)
    assert (over_two, d) == (1, 124), (over_two, d)
    assert some == [0, 1] and c == [223], (some, c)
    assert "rank 1 sent point-to-point message #0 (count=4, i32, tag 26" in err, err
    assert good is None and e == 225, (good, e)
    assert "works[0] is ndarray, not a tutti.Work or None" in typ, typ


def halo_line(comm):
    """A halo exchange on a line (no wrap): the edge ranks' neighbour is tutti.PROC_NULL;
    then each call with it alone (a receive's buffer untouched, its source PROC_NULL and
    count 0; a probe's empty message; objects as mpi4py's: None from it)."""
    r, n, P = comm.rank, comm.size, tutti.PROC_NULL
    left, right = (r - 1 if r > 0 else P), (r + 1 if r < n - 1 else P)
    me = np.full(2, 10 * (r + 1), np.int32)
    from_left, from_right = np.full(2, -1, np.int32), np.full(2, -1, np.int32)
    s1 = comm.sendrecv(me, right, from_left, left, sendtag=31, recvtag=31)
    comm.sendrecv(me, left, from_right, right, sendtag=32, recvtag=32)
    x = np.full(1, 7, np.int32)
    comm.send(x, P, tag=33)
    w = comm.recv(x, P, tag=33, async_op=True)
    done_at_once = w.is_completed()
    w.wait()
    p = comm.iprobe(P, tag=33)
    m = comm.mprobe(P, tag=33)
    m.recv(np.zeros(3, np.float64))
    obj = comm.sendrecv_object({"r": r}, right, left, sendtag=34, recvtag=34)
    comm.barrier()
    return (s1, from_left.tolist(), from_right.tolist(), done_at_once, w.source, w.count,
            int(x[0]), tuple(p), m.source, obj)


def test_proc_null_halo_exchange():
    got = run(halo_line, 3)
    P = tutti.PROC_NULL
    for r in range(3):
        (s1, fl, fr, at_once, src, cnt, x, probe, msrc, obj) = got[r]
        assert s1 == (r - 1 if r else P), (r, s1)
        assert fl == ([10 * r] * 2 if r else [-1, -1]), (r, fl)
        assert fr == ([10 * (r + 2)] * 2 if r < 2 else [-1, -1]), (r, fr)
        assert at_once and (src, cnt, x) == (P, 0, 7), (r, at_once, src, cnt, x)
        assert probe == (P, 0, "u8", 0, tutti.ANY_TAG) and msrc == P, (r, probe, msrc)
        assert obj == (({"r": r - 1}, r - 1) if r else (None, P)), (r, obj)


def strided(comm):
    """A strided array (numpy, torch) sent, and as a collective's input: copied, its
    elements in order (it was refused on the sender alone, whose receiver then waited
    out its timeout); a strided output of two dimensions, or beside an input, is refused;
    a 1-D one is taken in place (test_strided_outputs_in_place)."""
    import torch
    r = comm.rank
    a = np.arange(20, dtype=np.float64) * (r + 1)
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # not contiguous
    if r == 1:
        comm.send(a[::3], 0, tag=2)
        comm.send(t, 0, tag=3)
    got = {}
    if r == 0:
        x = np.zeros(7)
        comm.recv(x, 1, tag=2)
        y = np.zeros(12, np.float32)
        comm.recv(y, 1, tag=3)
        got["p2p"] = (x.tolist(), y.tolist())
    out = np.zeros(10)
    comm.allreduce(a[::2], out)
    got["sum"] = out.tolist()
    try:
        comm.allreduce(np.zeros((4, 4))[:2, :2])  # in place: written, two dimensions
        got["inplace"] = "no error"
    except tutti.InvalidArgError as e:
        got["inplace"] = str(e)
    try:
        comm.allreduce(np.ones(4), np.zeros(8)[::2])  # written beside an input
        got["out"] = "no error"
    except tutti.InvalidArgError as e:
        got["out"] = str(e)
    return got


def test_strided_inputs_are_copied():
    pytest.importorskip("torch")
    res = run(strided, 2)
    x, y = res[0]["p2p"]
    assert x == [float(2 * i) for i in range(0, 20, 3)], x
    assert y == [float(v) for v in np.arange(12).reshape(3, 4).T.ravel()], y
    for got in res:
        assert got["sum"] == [3.0 * i for i in range(0, 20, 2)], got["sum"]
        assert "not contiguous" in got["inplace"] and "writes it" in got["inplace"], got
        assert "not contiguous" in got["out"] and "1-D" in got["out"], got


def strided_out(comm):
    """1-D strided outputs (a matrix column, every other element; numpy and torch)
    written in place through a derived type: the elements between them untouched."""
    import torch
    r, n = comm.rank, comm.size
    got = {}
    a = np.full((5, 3), -1.0)
    if r == 0:
        comm.send(np.arange(5, dtype=np.float64), 1, tag=1)
        comm.send(np.arange(5, dtype=np.float64) + 10, 1, tag=2)
    elif r == 1:
        comm.recv(a[:, 1], 0, tag=1)
        w = comm.recv_upto(a[:, 2], 0, tag=2, async_op=True)
        w.wait()
        got["recv"], got["upto"] = a.tolist(), w.count
    b = np.arange(15, dtype=np.float64).reshape(5, 3) * (r + 1)
    comm.allreduce(b[:, 2])
    got["allreduce"] = b.tolist()
    c = np.arange(8, dtype=np.int32) * (r + 1)
    comm.scan(c[::2], op="max")
    got["scan"] = c.tolist()
    t = torch.zeros(4, 2)
    if r == n - 1:
        t[:, 0] = torch.arange(4.0) + 1
    comm.broadcast(t[:, 0], root=n - 1)
    got["broadcast"] = t.tolist()
    return got


def test_strided_outputs_in_place():
    pytest.importorskip("torch")
    n = 3
    res = run(strided_out, n)
    recv = res[1]["recv"]
    for i in range(5):
        assert recv[i] == [-1.0, float(i), float(i + 10)], recv
    assert res[1]["upto"] == 5
    for r, got in enumerate(res):
        base = np.arange(15, dtype=np.float64).reshape(5, 3)
        want = base * (r + 1)
        want[:, 2] = base[:, 2] * sum(q + 1 for q in range(n))
        assert got["allreduce"] == want.tolist(), got["allreduce"]
        c = np.arange(8) * (r + 1)
        c[::2] = np.arange(0, 8, 2) * (r + 1)  # max over ranks 0..r: rank r's
        assert got["scan"] == c.tolist(), got["scan"]
        assert got["broadcast"] == [[float(i + 1), 0.0] for i in range(4)], got["broadcast"]


def objects_by_threads(comm):
    """Threads receiving objects of one tag from one rank at once each get one whole
    (recv_object takes it with mprobe; a probe then a receive could lose it to another
    thread, and receive with the other's size)."""
    import threading
    n = 64
    if comm.rank == 1:
        for i in range(n):
            comm.send_object(("obj", i, "x" * (i % 7 * 997)), 0, tag=4)
        comm.barrier()
        return None
    got, errs = [], []

    def take():
        try:
            for _ in range(n // 4):
                got.append(comm.recv_object(1, tag=4))
        except Exception as e:  # noqa: BLE001 (reported below)
            errs.append(repr(e))

    ths = [threading.Thread(target=take) for _ in range(4)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    comm.barrier()
    return errs, sorted(o for o, _ in got)


def test_recv_object_from_threads():
    errs, objs = run(objects_by_threads, 2)[0]
    assert errs == [] and objs == [("obj", i, "x" * (i % 7 * 997)) for i in range(64)], errs


def mismatch_any(comm):
    if comm.rank == 1:
        comm.send(np.arange(4, dtype=np.float32), 0, tag=9)
        try:
            comm.barrier()
        except tutti.Error:
            return "failed"
        return "ok"
    got = np.zeros(5, np.float32)
    try:
        comm.recv(got, tag=9)
    except tutti.MismatchError as e:
        return str(e)
    return "no error"


def test_any_source_mismatch():
    res = run(mismatch_any, 2)
    assert "count=5" in res[0] and "count=4" in res[0], res[0]
    assert res[1] == "failed"


def over_collectives(comm):
    """Point-to-point apart from the collectives (session 101): a send left outstanding
    over an allreduce the peer enters first, and a receive posted before one whose
    messages come first, each land in their own receive."""
    rank = comm.rank
    big = np.arange(1 << 18, dtype=np.float64)  # 2 MiB: past shm's and tcp's eager sizes
    out = []
    w = comm.send(big + 1, 1, tag=5, async_op=True) if rank == 0 else None
    x = np.full(3, rank + 1.0)
    comm.allreduce(x)
    out.append(x.tolist())
    if rank == 1:
        got = np.zeros_like(big)
        comm.recv(got, 0, tag=5)
        out.append(bool((got == big + 1).all()))
        r = comm.recv(got, 0, tag=6, async_op=True)
    if w is not None:
        w.wait()
    y = np.full(2, 10.0 * (rank + 1))
    comm.allreduce(y)
    out.append(y.tolist())
    if rank == 0:
        comm.send(big * 2, 1, tag=6)
    elif rank == 1:
        r.wait()
        out.append(bool((got == big * 2).all()))
    return out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_point_to_point_over_collectives(transport):
    res = run(over_collectives, 3, transport=transport)
    assert res[1] == [[6.0] * 3, True, [60.0] * 2, True], res[1]
    assert res[0] == [[6.0] * 3, [60.0] * 2] == res[2], res


def to_itself(comm):
    comm.send(np.arange(6, dtype=np.int32) + comm.rank, comm.rank, tag=2)
    got = np.zeros(6, np.int32)
    src = comm.recv(got, comm.rank, tag=2)
    return src, got.tolist()


@pytest.mark.parametrize("size", [1, 2])
def test_send_to_itself(size):
    assert run(to_itself, size) == [(r, list(range(r, r + 6))) for r in range(size)]


def any_tag(comm):
    """tutti.ANY_TAG: rank 1 sends tags 5 and 9, rank 2 an object of tag 12 and then an
    array of tag 13; rank 0 takes them by any tag and says what each was."""
    A = tutti.ANY_TAG
    refused = None
    try:
        comm.send(np.zeros(1, np.int32), (comm.rank + 1) % comm.size, tag=A)
    except tutti.InvalidArgError as e:
        refused = "TUTTI_ANY_TAG" in str(e)
    if comm.rank == 1:
        comm.send(np.arange(4, dtype=np.int32) * 5, 0, tag=5)
        comm.send(np.arange(4, dtype=np.int32) * 9, 0, tag=9)
    elif comm.rank == 2:
        comm.send_object({"tag": 12}, 0, tag=12)
        comm.send(np.arange(3, dtype=np.float64) + 0.5, 0, tag=13)
    if comm.rank != 0:
        comm.barrier()
        return refused
    a, b = np.zeros(4, np.int32), np.zeros(4, np.int32)
    w = comm.recv(a, 1, tag=A, async_op=True)
    w.wait()
    first = (w.source, w.tag, a.tolist())
    second = (comm.recv(b, 1, tag=A), b.tolist())
    p = comm.probe(2, tag=A)
    obj = comm.recv_object(p.source, p.tag)
    m = comm.mprobe(None, tag=A)
    got = np.zeros(m.count, np.float64)
    m.recv(got)
    comm.barrier()
    return refused, first, second, (p.source, p.tag, p.dtype), obj, (m.source, m.tag,
                                                                      got.tolist())


def test_any_tag():
    got = run(any_tag, 3)
    assert got[1] is True and got[2] is True, got
    refused, first, second, probe, obj, msg = got[0]
    assert refused is True
    assert first == (1, 5, (np.arange(4) * 5).tolist()), first
    assert second == (1, (np.arange(4) * 9).tolist()), second
    assert probe == (2, 12, "u8") and obj == ({"tag": 12}, 2), (probe, obj)
    assert msg == (2, 13, (np.arange(3) + 0.5).tolist()), msg


def cancelling(comm):
    """Work.cancel: rank 0's listener of any source and tag is taken back, then the
    message rank 1 sends after goes to the next receive."""
    if comm.rank == 1:
        comm.barrier()
        comm.send(np.arange(3, dtype=np.int64) * 7, 0, tag=44)
        comm.barrier()
        return None
    buf = np.full(3, -1, np.int64)
    w = comm.recv(buf, None, tag=tutti.ANY_TAG, async_op=True)
    took = w.cancel()
    try:
        w.wait()
        raised = None
    except tutti.CancelledError as e:
        raised = str(e)
    again = w.cancel()
    s = comm.send(np.zeros(1), 0, tag=3, async_op=True)
    try:
        s.cancel()
        send_refused = False
    except tutti.InvalidArgError as e:
        send_refused = "send" in str(e)
    comm.recv(np.zeros(1), 0, tag=3)
    s.wait()
    comm.barrier()
    got = np.zeros(3, np.int64)
    w2 = comm.recv(got, None, tag=tutti.ANY_TAG, async_op=True)
    w2.wait()
    comm.barrier()
    return (took, raised, again, w.is_completed(), buf.tolist(), send_refused, got.tolist(),
            w2.source, w2.tag)


def test_cancel():
    took, raised, again, done, buf, send_refused, got, src, tag = run(cancelling, 2)[0]
    assert took is True and again is False and done, (took, again, done)
    assert raised is not None and "cancelled" in raised, raised
    assert buf == [-1, -1, -1] and send_refused, (buf, send_refused)
    assert got == (np.arange(3) * 7).tolist() and (src, tag) == (1, 44), (got, src, tag)


def persistent_rounds(comm):
    """Persistent requests: a ring of send/recv and an allreduce, started each round on
    the same buffers with new data."""
    r, n = comm.rank, comm.size
    out, got = np.zeros(4, np.int32), np.zeros(4, np.int32)
    acc = np.zeros(6, np.float64)
    reqs = [comm.persistent(comm.recv, got, (r - 1) % n, tag=8),
            comm.persistent(comm.send, out, (r + 1) % n, tag=8),
            comm.persistent(comm.allreduce, acc)]
    rounds = []
    for k in range(3):
        out[:] = np.arange(4) + 100 * r + k
        acc[:] = np.arange(6) * (r + 1) + k
        works = tutti.start_all(reqs)
        tutti.wait_all(works)
        rounds.append((got.tolist(), acc.tolist()))
    active = None
    if r == 0:
        reqs[2].start()
        try:
            reqs[2].start()
        except tutti.InvalidArgError as e:
            active = "still active" in str(e)
    else:
        time.sleep(0.2)
        reqs[2].start()
    reqs[2].wait()
    return rounds, active


def test_persistent():
    n = 3
    got = run(persistent_rounds, n)
    for r, (rounds, active) in enumerate(got):
        for k, (ring, acc) in enumerate(rounds):
            assert ring == (np.arange(4) + 100 * ((r - 1) % n) + k).tolist(), (r, k, ring)
            want = sum(np.arange(6) * (q + 1) + k for q in range(n))
            assert acc == want.tolist(), (r, k, acc)
        assert active is (True if r == 0 else None), (r, active)


def with_status(comm):
    """status=: a blocking recv, recv_upto, sendrecv and recv_object say the tag they took
    (ANY_TAG), as mpi4py's status= does."""
    A = tutti.ANY_TAG
    if comm.rank == 1:
        comm.send(np.arange(3, dtype=np.int32), 0, tag=61)
        comm.send(np.arange(2, dtype=np.int32), 0, tag=62)
        comm.send_object("obj", 0, tag=63)
        got = np.zeros(1, np.int32)
        st = tutti.Status()
        comm.sendrecv(np.array([5], np.int32), 0, got, 0, sendtag=64, recvtag=A, status=st)
        comm.barrier()
        return (st.source, st.tag, st.count, got.tolist())
    out = []
    s = tutti.Status()
    comm.recv(np.zeros(3, np.int32), 1, tag=A, status=s)
    out.append((s.source, s.tag, s.count))
    s = tutti.Status()
    comm.recv_upto(np.zeros(8, np.int32), None, tag=A, status=s)
    out.append((s.source, s.tag, s.count))
    s = tutti.Status()
    obj, _ = comm.recv_object(1, tag=A, status=s)
    out.append((s.source, s.tag, obj))
    got = np.zeros(1, np.int32)
    comm.sendrecv(np.array([7], np.int32), 1, got, 1, sendtag=65, recvtag=64)
    comm.barrier()
    return out, got.tolist()


def test_status():
    got = run(with_status, 2)
    out, got0 = got[0]
    assert out == [(1, 61, 3), (1, 62, 2), (1, 63, "obj")], out
    assert got0 == [5] and got[1] == (0, 65, 1, [7]), (got0, got[1])
