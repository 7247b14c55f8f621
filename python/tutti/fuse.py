"""The fuser of <tutti/fuse.h> from Python: many tensors packed into buckets, each
bucket's allreduce issued as soon as its last tensor is marked ready; and the coalesced
broadcast and allreduce of a list of tensors."""
import ctypes

from . import _lib
from ._buffer import Buffer, dtype_of
from ._errors import InvalidArgError, error_for

_lib_ = _lib.lib
_S, _I, _P = ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p
COMPRESS = {None: 0, "none": 0, "fp16": 1, "bf16": 2}


class FuseOpts(ctypes.Structure):
    """tutti_fuse_opts_t, field for field (include/tutti/fuse.h)."""
    _fields_ = [("size", _S), ("bucket_cap_bytes", _S), ("first_bucket_cap_bytes", _S),
                ("op", _I), ("compress", _I), ("static_layout", _I), ("bucket_views", _I),
                ("find_unused", _I), ("hook", _P), ("last_bucket_cap_bytes", _S),
                ("min_buckets", _I)]


for _name, _res, _args in (
        ("tutti_fuse_opts_init", _I, [ctypes.POINTER(FuseOpts)]),
        ("tutti_fuse_create", _I, [_lib.c_void_pp, _P, ctypes.POINTER(FuseOpts)]),
        ("tutti_fuse_destroy", _I, [_P]),
        ("tutti_fuse_register", _I, [_P, _P, _S, _I, ctypes.POINTER(_I)]),
        ("tutti_fuse_tensor_data", _I, [_P, _I, _lib.c_void_pp]),
        ("tutti_fuse_mark_ready", _I, [_P, _I]),
        ("tutti_fuse_mark_unused", _I, [_P, _I]),
        ("tutti_fuse_wait", _I, [_P]),
        ("tutti_fuse_num_buckets", _I, [_P, ctypes.POINTER(_I)]),
        ("tutti_fuse_last_error", ctypes.c_char_p, [_P]),
        ("tutti_broadcast_coalesced", _I, [_P, _lib.c_void_pp, _lib.c_size_p,
                                           ctypes.POINTER(_I), _I, _I, _S]),
        ("tutti_allreduce_coalesced", _I, [_P, _lib.c_void_pp, _lib.c_size_p,
                                           ctypes.POINTER(_I), _I, _I, _S])):
    _f = getattr(_lib_, _name)
    _f.restype, _f.argtypes = _res, _args


class Fuser:
    """Buckets over one communicator. Register every tensor (same order on every rank),
    then each step mark each one ready (any order, any thread) and wait.

    With bucket_views=True tensors live in the buckets: register(None, count, dtype) and
    read their memory's address with address(i) (it moves once, after the first wait)."""

    def __init__(self, comm, bucket_cap_bytes=None, op="sum", compress=None,
                 static_layout=False, bucket_views=False, find_unused=False,
                 first_bucket_cap_bytes=None, last_bucket_cap_bytes=None, min_buckets=None):
        from . import _op
        if min_buckets is not None and min_buckets < 0:  # an int, where C takes it as 0
            raise InvalidArgError(f"tutti: min_buckets must not be negative, not {min_buckets}")
        # a size a field cannot hold (a negative one would wrap to a huge one) is refused
        o, _ = _lib._fill(FuseOpts, _lib_.tutti_fuse_opts_init,
                          {"bucket_cap_bytes": bucket_cap_bytes,
                           "first_bucket_cap_bytes": first_bucket_cap_bytes,
                           "last_bucket_cap_bytes": last_bucket_cap_bytes,
                           "min_buckets": min_buckets}, "fuser")
        if compress not in COMPRESS:
            raise InvalidArgError(f"tutti: compress is one of none, fp16, bf16, not {compress!r}")
        o.op, o.compress = _op(op), COMPRESS[compress]
        o.static_layout, o.bucket_views, o.find_unused = static_layout, bucket_views, find_unused
        self._h = None
        h = ctypes.c_void_p()
        self._check(_lib_.tutti_fuse_create(ctypes.byref(h), comm._handle(), ctypes.byref(o)),
                    comm.last_error)
        self._h, self._comm, self._bufs = h, comm, []
        self.views = bool(bucket_views)

    def _check(self, st, text=None):
        if st < 0:
            if text is None:
                text = _lib_.tutti_fuse_last_error(self._h).decode() if self._h else ""
            raise error_for(st, text)
        return st

    def register(self, tensor, count=None, dtype=None):
        """Register a tensor (any writable buffer or torch tensor), or with bucket views
        None plus count and dtype; returns its index."""
        idx = ctypes.c_int()
        if tensor is None:
            if not self.views or count is None or dtype is None:
                raise InvalidArgError("tutti: register(None, count, dtype) is for bucket views")
            st = _lib_.tutti_fuse_register(self._h, None, count, dtype_of(dtype),
                                           ctypes.byref(idx))
        else:
            b = _host(Buffer(tensor, "a fused tensor", True, dtype))
            self._bufs.append(b)  # the fuser writes it at every wait
            st = _lib_.tutti_fuse_register(self._h, b.ptr, b.count, b.dtype, ctypes.byref(idx))
        self._check(st)
        return idx.value

    def address(self, index):
        p = ctypes.c_void_p()
        self._check(_lib_.tutti_fuse_tensor_data(self._h, index, ctypes.byref(p)))
        return p.value

    def mark_ready(self, index):
        st = _lib_.tutti_fuse_mark_ready(self._h, index)
        if st < 0:
            self._check(st)

    def mark_unused(self, index):
        self._check(_lib_.tutti_fuse_mark_unused(self._h, index))

    def wait(self):
        self._check(_lib_.tutti_fuse_wait(self._h))

    @property
    def num_buckets(self):
        n = ctypes.c_int()
        self._check(_lib_.tutti_fuse_num_buckets(self._h, ctypes.byref(n)))
        return n.value

    def destroy(self):
        if self._h:
            _lib_.tutti_fuse_destroy(self._h)
            self._h = None
        self._bufs = []

    def __del__(self):
        self.destroy()


def _host(b):
    """b, which the fuser copies with memcpy: host memory only."""
    if b.dev is not None:
        raise InvalidArgError(f"tutti: {b.what} is CUDA device memory ({b.dev}); the fuser "
                              "and the coalesced calls take host memory only")
    return b


def _coalesced(comm, tensors, what):
    bufs = [_host(Buffer(t, f"{what}'s tensor {i}", True)) for i, t in enumerate(tensors)]
    n = len(bufs)
    ptrs = (ctypes.c_void_p * n)(*[b.ptr for b in bufs])
    counts = (ctypes.c_size_t * n)(*[b.count for b in bufs])
    dtypes = (ctypes.c_int * n)(*[b.dtype for b in bufs])
    return bufs, ptrs, counts, dtypes, n


def broadcast_coalesced(comm, tensors, root=0, cap_bytes=0):
    """root's tensors into every rank's, packed into buffers of at most cap_bytes."""
    keep, ptrs, counts, dtypes, n = _coalesced(comm, tensors, "broadcast_coalesced")
    st = _lib_.tutti_broadcast_coalesced(comm._handle(), ptrs, counts, dtypes, n, root, cap_bytes)
    del keep
    if st < 0:
        raise error_for(st, comm.last_error)


def allreduce_coalesced(comm, tensors, op="sum", cap_bytes=0):
    """Every tensor allreduced in place, tensors of one dtype packed together."""
    from . import _op, _logical_op
    keep, ptrs, counts, dtypes, n = _coalesced(comm, tensors, "allreduce_coalesced")
    mark = op._mark() if hasattr(op, "_mark") else 0  # a tutti.Op: its function's exception
    v = _op(op)
    m = _logical_op(keep, v, "allreduce_coalesced")  # bool tensors: or, and (one op for all)
    if m != v and not all(b.logical for b in keep):
        raise InvalidArgError("tutti: allreduce_coalesced: bool tensors among others take "
                              "max, min, band, bor, bxor, land, lor or lxor (sum and prod of "
                              "bools are or and and)")
    st = _lib_.tutti_allreduce_coalesced(comm._handle(), ptrs, counts, dtypes, n, m, cap_bytes)
    del keep
    if st < 0:
        raise error_for(st, comm.last_error)
    if hasattr(op, "_mark"):
        op._raise_since(mark)
