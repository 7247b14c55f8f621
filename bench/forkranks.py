"""Fork N local ranks of a Python benchmark: a free loopback port (a.port, for torch's
tcp:// rendezvous) and a fresh directory (a.dir, for a file store); rank_main(a, rank, q)
runs in each, and what rank 0 puts on q is printed as one line of JSON."""
import json
import multiprocessing as mp
import socket
import tempfile


def run_ranks(rank_main, a, nranks, timeout):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        a.port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="tutti-pybench-") as d:
        a.dir = d
        procs = [ctx.Process(target=rank_main, args=(a, r, q)) for r in range(nranks)]
        for pr in procs:
            pr.start()
        try:
            print(json.dumps(q.get(timeout=timeout)))
        finally:
            for pr in procs:
                pr.join(60)
                if pr.is_alive():
                    pr.kill()
