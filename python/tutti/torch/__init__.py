"""tutti as a torch.distributed backend: importing this module registers "tutti".

    import torch.distributed as dist
    import tutti.torch  # noqa: F401
    dist.init_process_group("tutti", init_method=..., rank=r, world_size=n)

CPU and CUDA tensors (CUDA ones staged through pinned host memory, as gloo does); the
collectives, reduce ops (SUM, PRODUCT, MIN, MAX, AVG; BAND, BOR, BXOR
on integers) and dtypes (int8, uint8, int16, int32, int64, float16, bfloat16, float32,
float64; complex64 and complex128 with SUM, PRODUCT and AVG; float8_e4m3fn and float8_e5m2
from torch 2.1; uint16, uint32 and uint64 from torch 2.3; bool reduced as NCCL's backend
does; any dtype where data only moves) of tutti
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


def _bytes(v):
    """A value as torch hands it over: bytes, a str, or (from C++) a list of byte values."""
    return v.encode() if isinstance(v, str) else bytes(v)


def _store_errors(fn):
    """tutti's store errors as torch's stores raise theirs: RuntimeError (torch 2.x's
    DistStoreError where it has one; its barrier retries a wait on RuntimeError)."""
    import functools
    import tutti
    cls = getattr(_dist, "DistStoreError", RuntimeError)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except tutti.Error as e:
            raise cls(str(e)) from e
    return call


def _ms(timeout):
    """A torch timeout (a timedelta) in ms for a store call: 0, which torch takes for no
    limit, and anything longer than an int holds, are INT_MAX ms (24.8 days; -1 would be
    the tutti store's own default, and a bigger value wrapped: review, session 100)."""
    ms = int(timeout.total_seconds() * 1000)
    return ms if 0 < ms < 2**31 - 1 else 2**31 - 1


class Store(_dist.Store):
    """A tutti store as torch's: what torch's rendezvous and its backends ask of a store
    (set, get, add, compare_set, delete_key, check, wait, num_keys), through a tutti.Store, with
    torch's semantics and RuntimeError for its errors. The tutti:// init method makes one;
    any tutti.Store can be wrapped (timeout: a timedelta, the bound of get and wait,
    default torch's 30 minutes; set_timeout changes it, as on torch's stores)."""

    def __init__(self, store, timeout=None):
        super().__init__()
        self._s = store
        self.set_timeout(timeout if timeout is not None else _dist.default_pg_timeout)

    @property
    def _ms(self):
        return _ms(self.timeout)  # torch's Store keeps what set_timeout was given

    @_store_errors
    def set(self, key, value):
        self._s.set(key, _bytes(value))

    @_store_errors
    def get(self, key):
        return self._s.get(key, self._ms)

    @_store_errors
    def add(self, key, amount):
        return self._s.add(key, amount)

    @_store_errors
    def compare_set(self, key, expected, desired):
        expected = _bytes(expected)
        if expected and not self._s.check([key]):
            return expected  # torch's stores: a missing key with an expected value
        return self._s.compare_set(key, expected, _bytes(desired))

    @_store_errors
    def delete_key(self, key):
        return self._s.delete(key)

    @_store_errors
    def check(self, keys):
        return self._s.check(list(keys))

    @_store_errors
    def wait(self, keys, timeout=None):
        self._s.wait(list(keys), self._ms if timeout is None else _ms(timeout))

    @_store_errors
    def num_keys(self):
        return self._s.count()

    # the names torch's C++ side asks a Python store for (a PrefixStore over this one)
    deleteKey = delete_key
    getNumKeys = num_keys


# torch holds its stores in C++: the Python side of each one made here must outlive it
_stores = []
_inits = 0  # tutti:// rendezvous made in this process


def _tutti_rendezvous(url, timeout=None, **kwargs):
    """init_method="tutti://": the rank, the size and the store from the launcher's
    environment, as tutti_comm_init_env finds them (TUTTI_*, torchrun's, mpirun's,
    srun's: a job on one host, or a Slurm step across nodes, needs nothing set); a rank
    or world_size given to init_process_group must agree with them."""
    from urllib.parse import parse_qs, urlparse
    import tutti
    global _inits
    if not _dist.is_initialized():  # the groups of an earlier init are gone: their stores too
        for old in _stores:
            old._s.close()
        _stores.clear()
    q = parse_qs(urlparse(url).query)
    opts = {} if timeout is None else {"timeout_ms": int(timeout.total_seconds() * 1000)}
    if _inits:  # a new init in this process (every rank's n-th): a job, and a port, of its own
        import os
        opts["job_id"] = f"{os.environ.get('TUTTI_JOB_ID') or 'tutti'}-init{_inits}"
    _inits += 1
    store, rank, size = tutti.Store.from_env(**opts)
    for name, have in (("rank", rank), ("world_size", size)):
        given = int(q.get(name, ["-1"])[0])
        if given >= 0 and given != have:
            store.close()
            raise ValueError(f"tutti:// rendezvous: {name}={given} given, but the environment "
                             f"makes this process {name} {have}")
    s = Store(store, timeout)
    _stores.append(s)
    yield (s, rank, size)
    raise RuntimeError("tutti:// rendezvous: no second store (a restart needs a new init)")


def _register_rendezvous():
    try:
        from torch.distributed.rendezvous import register_rendezvous_handler
        register_rendezvous_handler("tutti", _tutti_rendezvous)
    except (ImportError, ValueError):  # no such API, or registered already
        pass


_register_rendezvous()


def trace(group=None):
    """The flight recorder of a tutti group (default: the default group): its last calls
    (TUTTI_TRACE_ENTRIES of them) with their state, as a dict (tutti_comm_trace_dump's
    JSON; tools/tutti-trace compares several ranks'). torch 2.x's NCCL counterpart is
    torch.distributed's flight recorder dump."""
    import json
    return json.loads(_tutti_pg(group).trace())


def _tutti_pg(group):
    from torch.distributed import distributed_c10d as c10d
    pg = group if group is not None else c10d._get_default_group()
    if not isinstance(pg, _C.ProcessGroupTutti):  # torch 2.x: the group's CPU backend
        pg = pg._get_backend(_torch.device("cpu"))
    return pg


def set_timeout(timeout, group=None):
    """torch.distributed's _set_pg_timeout for tutti groups (torch's sets gloo's and
    nccl's only): the group's calls issued from now on are bounded by timeout (a
    timedelta), their wait()s too; those issued before keep theirs. Each rank sets its
    own, as with torch's."""
    _tutti_pg(group).set_timeout(timeout)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """torch.distributed.monitored_barrier for tutti groups (torch 1.x's refuses every
    backend but gloo): rank 0 raises naming the ranks that did not arrive in timeout
    (a timedelta; default: the group's timeout). A failed one leaves the group unusable."""
    from torch.distributed import distributed_c10d as c10d
    pg = group if group is not None else c10d._get_default_group()
    if timeout is None:
        return pg.monitored_barrier(wait_all_ranks=wait_all_ranks)
    return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
