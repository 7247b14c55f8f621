"""tutti as a torch.distributed backend: importing this module registers "tutti".

    import torch.distributed as dist
    import tutti.torch  # noqa: F401
    dist.init_process_group("tutti", init_method=..., rank=r, world_size=n)

CPU tensors; the collectives, reduce ops (SUM, PRODUCT, MIN, MAX, AVG) and dtypes (int8,
uint8, int32, int64, float16, bfloat16, float32, float64) of tutti. The group's timeout is
tutti's timeout_ms; the TUTTI_* environment applies as for any communicator.
"""
import torch.distributed as _dist  # before _C: its pybind types are _C's bases

from . import _C

ProcessGroupTutti = _C.ProcessGroupTutti
BACKEND = "tutti"


def _create(store, rank, world_size, timeout):
    return _C.create_process_group(store, rank, world_size, timeout)


if not hasattr(_dist.Backend, BACKEND.upper()):
    _dist.Backend.register_backend(BACKEND, _create)
