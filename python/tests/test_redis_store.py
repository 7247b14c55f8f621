"""The redis:// store from Python, on a redis-server each test module starts on a free
loopback port: the store's calls, a password that never shows, and ranks meeting there."""
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import tempfile
import time

import numpy as np
import pytest

import tutti
from ranks import answer, collect

REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as c:
            c.sendall(b"PING\r\n")
            return c.recv(16).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


def _start(d, *extra):
    assert os.access(REDIS, os.X_OK), "redis-server is not installed (apt-get install redis-server)"
    for _ in range(5):
        port = _free_port()
        p = subprocess.Popen([REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", d, "--logfile",
                              os.path.join(d, f"redis-{port}.log"), *extra])
        for _ in range(250):
            if p.poll() is not None:
                break
            if _answers(port):
                return p, port
            time.sleep(0.02)
        p.kill()
        p.wait()
    raise RuntimeError(f"redis-server did not start (logs in {d})")


@pytest.fixture(scope="module")
def redis():
    with tempfile.TemporaryDirectory(prefix="tutti-redis-") as d:
        p, port = _start(d)
        try:
            yield port
        finally:
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def redis_auth():
    with tempfile.TemporaryDirectory(prefix="tutti-redis-") as d:
        p, port = _start(d, "--requirepass", "s3cret-pw")
        try:
            yield port
        finally:
            p.kill()
            p.wait()


def test_store_calls(redis):
    s = tutti.Store(f"redis://127.0.0.1:{redis}/7", timeout_ms=2000)
    assert s.url == f"redis://127.0.0.1:{redis}/7"
    s.set("k", b"\x00bin\xff")
    assert s.get("k") == b"\x00bin\xff"
    assert s.add("n", 40) == 40 and s.add("n", 2) == 42
    assert s.get("n") == b"42"
    assert s.check(["k", "n"]) and not s.check(["k", "missing"])
    assert s.compare_set("c", b"", b"first") == b"first"        # missing equals empty
    assert s.compare_set("c", b"wrong", b"second") == b"first"  # no change
    assert s.compare_set("c", b"first", b"third") == b"third"
    t0 = time.monotonic()
    with pytest.raises(tutti.Error, match="missing"):
        s.get("missing", timeout_ms=300)
    assert 0.3 <= time.monotonic() - t0 < 1.3
    assert s.delete("k") and not s.delete("k")
    s.close()


def test_password_never_shows(redis_auth):
    url = f"redis://:s3cret-pw@127.0.0.1:{redis_auth}/1"
    s = tutti.Store(url, timeout_ms=2000)
    assert "s3cret" not in s.url
    s.set("k", b"v")
    s.close()
    s = tutti.Store(f"redis://127.0.0.1:{redis_auth}/1", password="s3cret-pw", timeout_ms=2000)
    assert s.get("k") == b"v"
    s.close()
    for bad in (f"redis://:wrong-pw@127.0.0.1:{redis_auth}/1",
                f"redis://:s3cret-pw@127.0.0.1:{redis_auth}/x",
                f"redis://:p@ss@pw@127.0.0.1:{redis_auth}/x",   # '@' in it, unescaped
                f"redis://al:p@ss-pw@127.0.0.1:{redis_auth}/x"):
        with pytest.raises(tutti.Error) as e:
            tutti.Store(bad, timeout_ms=2000)
        shown = [w for w in ("wrong-pw", "s3cret", "p@ss", "ss@pw", "ss-pw") if w in str(e.value)]
        assert not shown, str(e.value)
        assert f"***@127.0.0.1:{redis_auth}/" in str(e.value), str(e.value)
    for bad in ("http://bob:hunter22@x:1", " tcp://bob:hunter22@x", "bob:hunter22@x:1"):
        with pytest.raises(tutti.Error) as e:  # malformed: refused without the password
            tutti.Store(bad, timeout_ms=200)
        assert "hunter22" not in str(e.value) and "***@x" in str(e.value), str(e.value)
    with pytest.raises(tutti.Error, match="NOAUTH"):
        tutti.Store(f"redis://127.0.0.1:{redis_auth}/1", timeout_ms=2000)


def _rank(rank, size, url, q):
    try:
        store = tutti.Store(url, timeout_ms=20000)
        comm = tutti.Communicator(store, rank, size, job_id=f"redis-{os.getppid()}",
                                  timeout_ms=20000)
        a = np.arange(1000, dtype=np.float32) + rank
        comm.allreduce(a)
        b = np.full(10, rank, dtype=np.int64)
        comm.broadcast(b, root=size - 1)
        comm.destroy()
        store.close()
        answer(q, rank, "ok", (a.tolist(), b.tolist()))
    except BaseException as e:  # noqa: B902 (reported to the parent)
        answer(q, rank, "error", repr(e))


def test_ranks_meet_over_redis(redis):
    size, url = 3, f"redis://127.0.0.1:{redis}/9"
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    got = {}
    collect([ctx.Process(target=_rank, args=(r, size, url, q)) for r in range(size)], q, got, 60)
    want_a = (np.arange(1000, dtype=np.float32) * size + sum(range(size))).tolist()
    for r in range(size):
        assert got.get(r, ("missing",))[0] == "ok", got.get(r)
        a, b = got[r][1]
        assert a == want_a and b == [size - 1] * 10
    with socket.create_connection(("127.0.0.1", redis), timeout=3) as c:
        c.sendall(b"SELECT 9\r\nDBSIZE\r\n")
        reply = b""
        while b"\r\n:" not in reply:
            reply += c.recv(64)
    assert reply.endswith(b":0\r\n"), reply  # the last rank out removed the job's keys
