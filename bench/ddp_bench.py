#!/usr/bin/env python3
"""DDP training step time on CPU: a ResNet-50-sized stack (about 25M parameters in 160
tensors: 80 linear layers of 560x560 with biases), N forked ranks, one thread each.
Prints one line of JSON: the median step time (ms) over the timed steps, as the slowest
rank saw each step.

  ddp_bench.py --backend gloo|tutti [--fused] [-np N] [--steps S] [--warmup W]
               [--transport shm|tcp] [--batch B (default 8)]

--fused: tutti.torch.FusedDataParallel (tutti's own fuser) instead of torch's DDP on the
tutti backend. Run with PYTHONPATH=build/python and /usr/bin/python3."""
import argparse
import os
import time

from forkranks import run_ranks


def rank_main(a, rank, q):
    port = a.port
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ["TUTTI_TRANSPORT"] = a.transport
    os.environ.setdefault("TUTTI_SOCKET_IFNAME", "lo")
    if a.backend == "tutti":
        import tutti.torch  # noqa: F401 (registers the backend)
    dist.init_process_group(a.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=a.np)
    torch.manual_seed(0)
    layers = []
    for _ in range(80):
        layers += [torch.nn.Linear(560, 560), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    if a.fused:
        import tutti
        from tutti.torch import FusedDataParallel
        comm = tutti.Communicator(tutti.Store(f"file://{a.dir}"), rank, a.np,
                                  transport=a.transport, job_id=f"ddp-bench-{port}")
        ddp = FusedDataParallel(model, comm)
    else:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x, y = torch.randn(a.batch, 560), torch.randn(a.batch, 560)
    times = torch.zeros(a.steps, dtype=torch.float64)
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        if i >= a.warmup:
            times[i - a.warmup] = time.perf_counter() - t0
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    if rank == 0:
        q.put({"backend": a.backend + ("+fused" if a.fused else ""), "np": a.np,
               "transport": a.transport, "steps": a.steps,
               "params": sum(p.numel() for p in model.parameters()),
               "tensors": len(list(model.parameters())),
               "step_ms": float(times.median()) * 1e3})
    if a.fused:
        ddp.destroy()
        comm.destroy()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="tutti", choices=["tutti", "gloo"])
    p.add_argument("--fused", action="store_true")
    p.add_argument("-np", dest="np", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--transport", default="shm")
    p.add_argument("--batch", type=int, default=8)
    a = p.parse_args()
    run_ranks(rank_main, a, a.np, 900)

if __name__ == "__main__":
    main()
