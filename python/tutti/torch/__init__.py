"""tutti as a torch.distributed backend: importing this module registers "tutti".

    import torch.distributed as dist
    import tutti.torch  # noqa: F401
    dist.init_process_group("tutti", init_method=..., rank=r, world_size=n)

CPU and CUDA tensors (CUDA ones staged through pinned host memory, as gloo does); the
collectives, reduce ops (SUM, PRODUCT, MIN, MAX, AVG; BAND, BOR, BXOR
on integers) and dtypes (int8, uint8, int16, int32, int64, float16, bfloat16, float32,
float64; bool reduced as NCCL's backend does; any dtype where data only moves) of tutti
(docs/pytorch.md). The ranks meet through
torch's store for the group. The group's timeout is tutti's timeout_ms (unless
TUTTI_TIMEOUT_MS is set) and bounds Work.wait(); the rest of the TUTTI_* environment
applies as for any communicator. A job id is derived per group instance unless
TUTTI_JOB_ID is set.
"""
import inspect

import torch as _torch
import torch.distributed as _dist  # before _C: its pybind types are _C's bases

from . import _C

from .fused import FusedDataParallel  # noqa: E402,F401 (tutti's own fuser for DDP-style training)

ProcessGroupTutti = _C.ProcessGroupTutti
BACKEND = "tutti"


def _create(store, rank, world_size, timeout):
    return _C.create_process_group(store, rank, world_size, timeout)


def _register():
    # torch 2.x maps devices to backends and warns when a backend names none (2.2, 2.4 and
    # later); 1.x takes no devices argument. Asking the signature avoids a version table.
    params = inspect.signature(_dist.Backend.register_backend).parameters
    if "devices" in params:
        _dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])
    else:
        _dist.Backend.register_backend(BACKEND, _create)


if not hasattr(_dist.Backend, BACKEND.upper()):
    _register()


def trace(group=None):
    """The flight recorder of a tutti group (default: the default group): its last calls
    (TUTTI_TRACE_ENTRIES of them) with their state, as a dict (tutti_comm_trace_dump's
    JSON; tools/tutti-trace compares several ranks'). torch 2.x's NCCL counterpart is
    torch.distributed's flight recorder dump."""
    import json
    from torch.distributed import distributed_c10d as c10d
    pg = group if group is not None else c10d._get_default_group()
    if not isinstance(pg, _C.ProcessGroupTutti):  # torch 2.x: the group's CPU backend
        pg = pg._get_backend(_torch.device("cpu"))
    return json.loads(pg.trace())


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """torch.distributed.monitored_barrier for tutti groups (torch 1.x's refuses every
    backend but gloo): rank 0 raises naming the ranks that did not arrive in timeout
    (a timedelta; default: the group's timeout). A failed one leaves the group unusable."""
    from torch.distributed import distributed_c10d as c10d
    pg = group if group is not None else c10d._get_default_group()
    if timeout is None:
        return pg.monitored_barrier(wait_all_ranks=wait_all_ranks)
    return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
