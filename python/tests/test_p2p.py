"""Receives from any source: peer=None (or tutti.ANY_SOURCE) takes whichever rank's
message of the tag comes, in each sender's order, and says who sent it."""
import numpy as np

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
