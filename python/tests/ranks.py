"""Run a function on N forked ranks over a file store in a fresh directory, every wait
bounded: a rank that hangs or dies fails the test, and every child is killed."""
import multiprocessing as mp
import os
import pickle
import queue
import tempfile
import time
import traceback

import tutti


def answer(q, rank, kind, value):
    """A rank's answer for collect, pickled here, by value: through the queue alone, a
    tensor (once torch is imported) would go as a file descriptor of its storage, which
    the parent cannot open once the rank has exited."""
    q.put((rank, kind, pickle.dumps(value)))


def _child(fn, rank, size, url, opts, q):
    try:
        store = tutti.Store(url)
        comm = tutti.Communicator(store, rank, size, **opts)
        try:
            answer(q, rank, "ok", fn(comm))
        finally:
            comm.destroy()
            store.close()
    except BaseException as e:  # report everything, including the traceback
        answer(q, rank, "error", (type(e).__name__, str(e), traceback.format_exc()))


def launch(fn, size, timeout=60, **opts):
    """fn(comm) on `size` ranks; {rank: ("ok", result) | ("error", (type, text, tb))};
    a rank that did not answer within timeout seconds is missing."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    opts.setdefault("job_id", f"pytest-{os.getpid()}-{id(fn)}")
    opts.setdefault("timeout_ms", min(timeout * 1000 // 2, 20000))
    got = {}
    with tempfile.TemporaryDirectory(prefix="tutti-py-") as d:
        procs = [ctx.Process(target=_child, args=(fn, r, size, "file://" + d, opts, q))
                 for r in range(size)]
        collect(procs, q, got, timeout)
    return got


def collect(procs, q, got, timeout):
    """Start procs, put their (rank, kind, value) answers from q (sent by answer) into got
    until all have answered, all are gone, or timeout seconds pass; then kill what is left."""
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    try:
        while len(got) < len(procs) and time.monotonic() < deadline:
            try:
                rank, kind, value = q.get(timeout=0.1)
                got[rank] = (kind, pickle.loads(value))
            except queue.Empty:
                if all(p.exitcode is not None for p in procs) and q.empty():
                    break  # every rank is gone: the missing ones died
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()


def run(fn, size, timeout=60, **opts):
    """fn(comm) on every rank; [result by rank], or AssertionError with every failing
    rank's traceback."""
    got = launch(fn, size, timeout, **opts)
    missing = [r for r in range(size) if r not in got]
    assert not missing, f"ranks {missing} did not answer within {timeout} s"
    errors = {r: v for r, (k, v) in got.items() if k == "error"}
    assert not errors, "\n".join(f"rank {r}: {v[2]}" for r, v in sorted(errors.items()))
    return [got[r][1] for r in range(size)]
