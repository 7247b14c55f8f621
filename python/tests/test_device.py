"""Device memory through the Python package: CUDA arrays (torch tensors, the CUDA array
interface of CuPy and Numba, DLPack) are taken where the communicator takes them
(Communicator.device) and refused, clearly, where it does not. The GPU cases need a GPU
(the device machine, tools/dev/device-check.sh); the rest run anywhere."""
import os

import numpy as np
import pytest

import tutti
from tutti._buffer import Buffer
from ranks import launch


class FakeCudaArray:
    """Only the CUDA array interface of an array (what CuPy exposes), at an address no
    one may touch: the library must refuse it before reading it."""

    def __init__(self, shape, typestr="<f4", strides=None, readonly=False, ptr=0x7f0000000000):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (ptr, readonly), "strides": strides,
                                         "version": 3, "stream": None}


def test_cuda_array_interface_is_read():
    b = Buffer(FakeCudaArray((4, 3)), "x", True)
    assert (b.dev, b.count, b.nbytes, tutti._buffer._DTYPE_NAMES[b.dtype]) == \
        ("cuda", 12, 48, "f32")
    b = Buffer(FakeCudaArray((5,), "<i8"), "x", False)
    assert (b.count, tutti._buffer._DTYPE_NAMES[b.dtype]) == (5, "i64")
    with pytest.raises(tutti.InvalidArgError, match="not contiguous"):
        Buffer(FakeCudaArray((4, 3), strides=(4, 16)), "x", True)
    with pytest.raises(tutti.InvalidArgError, match="read-only"):
        Buffer(FakeCudaArray((4,), readonly=True), "x", True)
    # C-order strides given explicitly are contiguous; an empty array is, whatever its
    # strides say
    assert Buffer(FakeCudaArray((4, 3), strides=(12, 4)), "x", True).count == 12
    assert Buffer(FakeCudaArray((0, 3), strides=(4, 16)), "x", True).count == 0
    for bad in (">f4", "<M8[ns]", "<f"):
        with pytest.raises(tutti.InvalidArgError, match="element type"):
            Buffer(FakeCudaArray((4,), bad), "x", True)
    # host memory that also has the interface (a Numba mapped array) is host memory
    class Mapped(np.ndarray):
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (1, False),
                                    "version": 3}
    b = Buffer(np.zeros(4, np.float32).view(Mapped), "x", True)
    assert (b.dev, b.count) == (None, 4)


def _refused(comm):
    out = []
    assert comm.device is None
    for call in (lambda: comm.allreduce(FakeCudaArray((8,))),
                 lambda: comm.allgather(np.zeros(8, np.float32), FakeCudaArray((8 * comm.size,))),
                 lambda: comm.send(FakeCudaArray((8,)), (comm.rank + 1) % comm.size)):
        try:
            call()
            out.append("taken")
        except tutti.InvalidArgError as e:
            out.append(str(e))
    # nothing was sent: the communicator goes on
    x = np.full(4, comm.rank + 1, np.float32)
    comm.allreduce(x)
    return out, x.tolist()


def test_device_memory_refused_without_cuda():
    got = launch(_refused, 2, cuda="off")
    for rank in range(2):
        kind, (msgs, x) = got[rank]
        assert kind == "ok", got[rank]
        assert x == [3.0] * 4
        for m, name in zip(msgs, ("allreduce", "allgather", "send")):
            assert name in m and "CUDA device memory" in m and "cuda='on'" in m, m


def test_set_stream_without_cuda(tmp_path):
    store = tutti.Store("file://" + str(tmp_path))
    c = tutti.Communicator(store, 0, 1, job_id="py-device-stream", cuda="off")
    try:
        with pytest.raises(tutti.Error) as e:
            c.set_stream(1)
        assert e.value.status_name == "TUTTI_ERR_NO_DEVICE", e.value.status_name
        assert "set_stream" in str(e.value) and "no device layer" in str(e.value), str(e.value)
        c.set_stream(None)  # unsetting needs no device
        assert c.stream_error() is None
    finally:
        c.destroy()


def test_fuser_refuses_device_memory(tmp_path):
    from tutti import fuse
    store = tutti.Store("file://" + str(tmp_path))
    c = tutti.Communicator(store, 0, 1, job_id="py-device-fuse")
    with pytest.raises(tutti.InvalidArgError, match="fuser and the coalesced calls take host"):
        fuse.allreduce_coalesced(c, [np.zeros(4, np.float32), FakeCudaArray((4,))])
    c.destroy()
    store.close()


def test_cuda_option_is_checked(tmp_path):
    store = tutti.Store("file://" + str(tmp_path))
    with pytest.raises(tutti.ConfigError, match="TUTTI_CUDA=bogus"):
        tutti.Communicator(store, 0, 1, cuda="bogus", job_id="py-device-option")
    c = tutti.Communicator(store, 0, 1, cuda="off", job_id="py-device-option2")
    assert c.device is None
    c.destroy()
    store.close()


# ---- on a GPU (forked ranks: CUDA is asked about through NVML only, here) ----

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
try:
    import torch
    HAVE_GPU = torch.cuda.is_available()
except ImportError:
    torch, HAVE_GPU = None, False
NEEDS_GPU = pytest.mark.skipif(not HAVE_GPU, reason="needs torch with a GPU")


def _torch_cuda(comm):
    dev = torch.device("cuda", comm.rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    n, size, rank = 1 << 20, comm.size, comm.rank
    base = torch.arange(n, dtype=torch.float32, device=dev)
    x = base + rank
    comm.allreduce(x)  # in place, right after the kernel that wrote it
    want = base * size + sum(range(size))
    assert torch.equal(x, want), "allreduce"
    g = torch.empty(n * size, dtype=torch.float32, device=dev)
    w = comm.allgather(base + rank, g, async_op=True)
    w.wait()
    for r in range(size):
        assert torch.equal(g[r * n:(r + 1) * n], base + r), f"allgather block {r}"
    b = torch.full((1000,), float(rank), device=dev, dtype=torch.float64)
    comm.broadcast(b, root=1)
    assert torch.equal(b, torch.full_like(b, 1.0)), "broadcast"
    right, left = (rank + 1) % size, (rank - 1) % size
    s = torch.full((777,), rank, device=dev, dtype=torch.int64)
    r = torch.empty_like(s)
    ws = comm.send(s, right, async_op=True)
    comm.recv(r, left)
    ws.wait()
    assert torch.equal(r, torch.full_like(r, left)), "recv"
    return comm.device


def _torch_stream(comm):
    dev = torch.device("cuda", comm.rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    s = torch.cuda.Stream(dev)
    comm.set_stream(s)
    n, size, rank = 1 << 18, comm.size, comm.rank
    with torch.cuda.stream(s):
        x = torch.arange(n, dtype=torch.float32, device=dev) + rank
        y = torch.empty_like(x)
        for _ in range(3):  # in place, each on the last's result
            comm.allreduce(x)
        comm.allreduce(x, y)
        y.mul_(2)  # a kernel after the call, on its stream
    s.synchronize()
    want = (torch.arange(n, dtype=torch.float32, device=dev) * size + sum(range(size))) \
        * size ** 3 * 2
    assert torch.equal(y, want), "stream-ordered allreduces"
    assert comm.stream_error() is None
    comm.set_stream(None)
    return True


@NEEDS_GPU
def test_torch_stream_ordered():
    got = launch(_torch_stream, 2, timeout=120, cuda="on")
    for rank in range(2):
        assert got[rank] == ("ok", True), got[rank]


@NEEDS_GPU
def test_torch_cuda_tensors():
    got = launch(_torch_cuda, 2, timeout=120, cuda="on")
    for rank in range(2):
        assert got[rank] == ("ok", "CUDA"), got[rank]


def _cupy(comm):
    import cupy
    cupy.cuda.Device(comm.rank % cupy.cuda.runtime.getDeviceCount()).use()
    x = cupy.arange(4096, dtype=cupy.float32) + comm.rank
    y = cupy.empty_like(x)
    comm.allreduce(x, y)
    want = cupy.arange(4096, dtype=cupy.float32) * comm.size + sum(range(comm.size))
    return bool(cupy.array_equal(y, want))


@NEEDS_GPU
def test_cupy_arrays():
    pytest.importorskip("cupy")
    got = launch(_cupy, 2, timeout=120, cuda="on")
    for rank in range(2):
        assert got[rank] == ("ok", True), got[rank]
