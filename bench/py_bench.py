#!/usr/bin/env python3
"""Per-call time of a collective from Python, measured as tutti-bench measures it: W
untimed iterations, then N timed ones, each rank timing every iteration; an iteration's
time is the slowest rank's; prints p50 and mean (us) of those, one line of JSON.

  py_bench.py [--api tutti|torch-tutti|torch-gloo] [-np N] [-b BYTES] [-n N] [-w W]
              [--transport shm|tcp] [--device cpu|cuda] [--sparse]

tutti: the Python package (tutti.Communicator.allreduce, in place, float32).
torch-*: torch.distributed.all_reduce of a float32 tensor on the named backend; with
--device cuda, of a tensor on GPU rank % GPUs, each call followed by
torch.cuda.synchronize() (gloo's CUDA work returns before its copy back is done).
--sparse (torch-*): a sparse COO float32 tensor of 2^20 rows of 16 instead, BYTES of
values on each rank (BYTES / 64 rows, drawn per rank, so ranks overlap in a few), a
copy of it allreduced in each call (the sum replaces the tensor it is given).
Run with PYTHONPATH=build/python and /usr/bin/python3."""
import argparse
import os
import time

import numpy as np

from forkranks import run_ranks


def rank_main(a, rank, q):
    url, port = "file://" + a.dir, a.port
    os.environ.setdefault("TUTTI_SOCKET_IFNAME", "lo")
    n, w, count = a.n, a.w, max(1, a.bytes // 4)
    times = np.zeros(n, np.float64)
    if a.api == "tutti":
        import tutti
        store = tutti.Store(url)
        comm = tutti.Communicator(store, rank, a.np, transport=a.transport,
                                  job_id=f"py-bench-{os.getppid()}")
        buf = np.ones(count, np.float32)
        call = lambda: comm.allreduce(buf)  # noqa: E731
        gather_max = lambda t: comm.allreduce(t, op="max")  # noqa: E731
    else:
        import torch
        import torch.distributed as dist
        backend = a.api.split("-", 1)[1]
        if backend == "tutti":
            import tutti.torch  # noqa: F401 (registers the backend)
            os.environ["TUTTI_TRANSPORT"] = a.transport
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=a.np)
        if a.device == "cuda":
            dev = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(dev)
            buf = torch.ones(count, dtype=torch.float32, device=dev)

            def call():
                dist.all_reduce(buf)
                torch.cuda.synchronize()
        elif a.sparse:
            gen = torch.Generator().manual_seed(rank)
            nnz = max(1, a.bytes // 64)
            rows = torch.randint(0, 1 << 20, (1, nnz), generator=gen)
            base = torch.sparse_coo_tensor(rows, torch.ones(nnz, 16), (1 << 20, 16))
            call = lambda: dist.all_reduce(base.clone())  # noqa: E731
        else:
            buf = torch.ones(count, dtype=torch.float32)
            call = lambda: dist.all_reduce(buf)  # noqa: E731

        def gather_max(t):
            tt = torch.from_numpy(t)
            dist.all_reduce(tt, op=dist.ReduceOp.MAX)
    for _ in range(w):
        call()
    clock = time.perf_counter
    for i in range(n):
        t0 = clock()
        call()
        times[i] = clock() - t0
    gather_max(times)
    if rank == 0:
        us = times * 1e6
        q.put({"api": a.api, "np": a.np, "bytes": count * 4, "transport": a.transport,
               "device": a.device, "sparse": a.sparse,
               "iters": n, "p50_us": float(np.percentile(us, 50)), "mean_us": float(us.mean())})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--api", default="tutti", choices=["tutti", "torch-tutti", "torch-gloo"])
    p.add_argument("-np", dest="np", type=int, default=2)
    p.add_argument("-b", dest="bytes", type=int, default=4)
    p.add_argument("-n", type=int, default=5000)
    p.add_argument("-w", type=int, default=200)
    p.add_argument("--transport", default="shm")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--sparse", action="store_true")
    a = p.parse_args()
    if a.sparse and a.api == "tutti":
        p.error("--sparse takes a torch API")
    run_ranks(rank_main, a, a.np, 600)

if __name__ == "__main__":
    main()
