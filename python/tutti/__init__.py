"""tutti: collective communication for CPU processes, from Python.

A thin binding over libtutti (ctypes): every collective and send/recv works on any
buffer-protocol object (NumPy arrays, bytearray, memoryview) and on DLPack tensors (CPU
torch tensors) without copying, blocking or async. The GIL is released while a call
blocks. Failures raise tutti.Error subclasses carrying the status and the library's
explanation (rank, peer, op). See docs/python.md.
"""
import atexit
import ctypes
import json
import os
import weakref

from . import _lib
from ._buffer import _DTYPE_NAMES, _SIZES, Buffer, dtype_of
from ._errors import *  # noqa: F401,F403 (the Error classes)
from ._errors import Error, InvalidArgError, error_for

__all__ = ["Store", "Communicator", "Work", "Op", "Error", "version", "ANY_SOURCE",
           "algorithms"]

#: recv's peer for "whichever rank sends this tag" (so is peer=None)
ANY_SOURCE = _lib.ANY_SOURCE

#: the version of the package and of the libtutti it loaded (they must agree: _lib)
version = __version__ = _lib.lib.tutti_version_string().decode()
_lib_ = _lib.lib
#: reduce ops (include/tutti/tutti.h's tutti_redop_t); BAND, BOR, BXOR: integer dtypes
SUM, PROD, MIN, MAX, AVG, BAND, BOR, BXOR = range(8)

# Communicators, then stores, still open when the interpreter exits are closed before
# Python tears its modules down (a communicator's progress thread must not outlive them).
_live_comms, _live_stores = weakref.WeakSet(), weakref.WeakSet()


def algorithms(coll):
    """The algorithms this library has for a collective ("allreduce", ...), in the order
    they were added: the names TUTTI_ALGO=coll:name and Communicator.algo_for use."""
    names, i = [], 0
    while True:
        n = _lib_.tutti_algo_name(coll.encode(), i)
        if n is None:
            if i == 0:
                raise ValueError("tutti: no collective named %r" % (coll,))
            return names
        names.append(n.decode())
        i += 1


@atexit.register
def _close_all():
    for c in list(_live_comms):
        c.destroy()
    for s in sorted(_live_stores, key=lambda s: s._base is None):  # views before bases
        s.close()


_OPS = {}
# The C functions by collective name, blocking and async (one lookup per call).
_FN = {n: getattr(_lib_, "tutti_" + n) for n in _lib._COLLECTIVES}
_FN_ASYNC = {n: getattr(_lib_, f"tutti_{n}_async") for n in _lib._COLLECTIVES}


def _op(op):
    """A reduce op by name ("sum", "avg" ... as the library parses them), number or Op."""
    if isinstance(op, Op):
        if op.value is None:
            raise InvalidArgError(f"tutti: op {op.name!r} was freed")
        return op.value
    v = _OPS.get(op)
    if v is not None:
        return v
    if isinstance(op, int):
        return op
    out = ctypes.c_int()
    if _lib_.tutti_redop_parse(str(op).encode(), ctypes.byref(out)) < 0:
        raise InvalidArgError(f"tutti: unknown reduce op {op!r} (sum, prod, min, max, avg, "
                              "band, bor, bxor)")
    _OPS[op] = out.value
    return out.value


try:
    import numpy as _np
except ImportError:  # Op's functions then get memoryviews
    _np = None
# NumPy dtypes and struct formats by tutti dtype name (bf16: its bits, as uint16)
_NP_NAMES = {"i8": "int8", "u8": "uint8", "i32": "int32", "i64": "int64", "f16": "float16",
             "bf16": "uint16", "f32": "float32", "f64": "float64", "i16": "int16",
             "u16": "uint16", "u32": "uint32", "u64": "uint64"}
_FMT = {"i8": "b", "u8": "B", "i32": "i", "i64": "q", "f16": "H", "bf16": "H", "f32": "f",
        "f64": "d", "i16": "h", "u16": "H", "u32": "I", "u64": "Q"}
_NOMEM = -2  # TUTTI_ERR_NOMEM


class _OpState:
    """What the library calls back into for an Op: not the Op itself, so that an Op
    dropped is freed at once (no cycle through its callback). fn's exceptions are
    numbered; a call notes the count when it is issued and, once complete, raises the
    first one numbered after that (one that came while it was in flight)."""

    __slots__ = ("fn", "errors", "count")

    def __init__(self, fn):
        self.fn, self.errors, self.count = fn, [], 0

    def call(self, dst, a, b, count, dtype, ctx):
        try:
            out = _op_view(dst, count, dtype, True)
            fa = out if a == dst else _op_view(a, count, dtype, False)
            fb = out if b == dst else _op_view(b, count, dtype, False)
            self.fn(fa, fb, out)
        except BaseException as e:  # noqa: B902 (raised by the call, once complete)
            self.count += 1
            self.errors.append((self.count, e))
            del self.errors[:-16]

    def since(self, mark, end=None):
        """The first exception numbered after mark (and up to end)."""
        for n, e in self.errors:
            if n > mark and (end is None or n <= end):
                return e
        return None


def _op_view(ptr, count, dtype, writable):
    """count elements of dtype at ptr: a NumPy array (bf16 as its uint16 bits), or a
    memoryview without NumPy (fp16 as its bits too: memoryview cannot cast to 'e')."""
    name = _DTYPE_NAMES[dtype]  # the library's tables, read once (_buffer.py)
    nbytes = count * _SIZES[dtype]
    mem = (ctypes.c_char * nbytes).from_address(ptr) if nbytes else bytearray()
    if _np is None:
        v = memoryview(mem).cast("B").cast(_FMT[name])
        return v if writable else v.toreadonly()
    arr = _np.frombuffer(mem, dtype=_NP_NAMES[name], count=count)
    arr.flags.writeable = writable
    return arr


class Op:
    """A reduce op defined in Python (tutti_redop_create), for allreduce, reduce,
    reduce_scatter(v), scan, exscan and tutti.fuse.allreduce_coalesced: fn(a, b, out) writes a op b
    into out, element by element, for a slice of the vector; out may be a or b itself.
    a, b and out are NumPy arrays of the call's dtype (bf16 as its uint16 bits;
    memoryviews without NumPy, fp16 there as its bits too). fn must be associative and
    must not call tutti.

    commutative=False (the default, as mpi4py's): the result is x0 op x1 op ... op
    x(n-1) in rank order, a holding the lower ranks' part; such a call runs a linear
    algorithm (every vector through one rank; scan and exscan keep rank order in every
    algorithm). commutative=True: any algorithm, operands in any order.

    Every rank must define its ops in the same order (the values must match; ranks that
    pass different ops fail the call). An exception in fn is raised, once the call
    completed, by the call that was in flight when fn raised (its wait() for an async
    one; several calls in flight with one op all raise it); only the rank whose fn
    raised gets it, and the elements fn did not write are undefined on every rank. Free
    it with free() (or `with`, or by dropping it); a call already issued with it still
    runs it."""

    def __init__(self, fn, commutative=False, name=None):
        self.value = None
        self.name = name or getattr(fn, "__name__", "op")
        self._state = _OpState(fn)
        self._cb = _lib.REDOP_FN(self._state.call)  # an issued call keeps its Op alive
        cname = self.name.encode()[:31].decode("utf-8", "ignore").encode()
        v = ctypes.c_int()
        for attempt in range(2):
            st = _lib_.tutti_redop_create(ctypes.byref(v), self._cb, None,
                                          1 if commutative else 0, cname)
            if st != _NOMEM or attempt:
                break
            import gc  # Ops in reference cycles: let them free their values
            gc.collect()
        if st < 0:
            raise error_for(st, "tutti: Op: all 128 op values are taken (free some)"
                            if st == _NOMEM else "tutti: Op: cannot define the op")
        self.value = v.value

    def _mark(self):
        return self._state.count

    def _raise_since(self, mark, end=None):
        e = self._state.since(mark, end)
        if e is not None:
            raise e

    def free(self):
        if self.value is not None:
            _lib_.tutti_redop_free(self.value)
            self.value = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def __del__(self):
        if getattr(self, "value", None) is not None and _lib_ is not None:
            self.free()


def _same(a, b, what, sa, sb):
    """a and b hold one element type (checked where it came from the buffers)."""
    if (a.dtype, a.k) != (b.dtype, b.k):
        na = _name(a.dtype) if a.k == 1 else f"{a.k}-byte items"
        nb = _name(b.dtype) if b.k == 1 else f"{b.k}-byte items"
        raise InvalidArgError(f"tutti: {what}'s {sa} is {na} and its {sb} {nb}")


def _sizes(values, n, what, k=1):
    """A count or displacement array of n entries, in elements; k: the carrier's elements
    per element (Buffer.k)."""
    if values is None:
        return None
    values = list(values)
    if len(values) != n:
        raise InvalidArgError(f"tutti: {what} has {len(values)} entries for {n} ranks")
    if any(v < 0 for v in values):
        raise InvalidArgError(f"tutti: {what} has a negative entry")
    values = [v * k for v in values]
    if any(v >= 1 << 64 for v in values):  # ctypes would keep the low bits
        raise InvalidArgError(f"tutti: {what} has an entry too large for size_t")
    return (ctypes.c_size_t * n)(*values)


class _Handle:
    """A library handle released on `with` exit and when dropped (subclasses name
    their release `_release`)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._release()

    def __del__(self):
        self._release()


def _url_redacted(url):
    """url for a message, as tt_store_url_redact shows it: what precedes the last '@' after
    the first "://" (or in a URL without one, the whole of it) becomes "***", a user before
    ':' staying; file:// URLs as they are."""
    sep = url.find("://")
    head, info = (url[:sep + 3], url[sep + 3:]) if sep >= 0 else ("", url)
    at = info.rfind("@")
    if at < 0 or url.startswith("file://"):
        return url
    user, colon, _ = info[:at].partition(":")
    keep = user + ":" if colon and "/" not in user else ""
    return f"{head}{keep}***{info[at:]}"


class Store(_Handle):
    """A rendezvous store: Store("file:///tmp/job"), Store("tcp://host:port",
    is_server=True, auth_token=...) or Store("redis://[[user]:password@]host[:port][/db]",
    password=...). Options are tutti_store_opts_t's fields."""

    def __init__(self, url, **opts):
        self._h = self._base = None
        o, keep = _lib.store_opts(opts)
        h = ctypes.c_void_p()
        st = _lib_.tutti_store_open(ctypes.byref(h), str(url).encode(), ctypes.byref(o))
        del keep
        if st < 0:
            shown = _url_redacted(str(url))
            why = (_lib_.tutti_store_last_error(None) or b"").decode(errors="replace")
            raise error_for(st, f"tutti: cannot open store {shown}: "
                                f"{_lib_.tutti_strerror(st).decode()}: {why} (stores are "
                                "file:///dir, tcp://host:port or redis://host:port/db)")
        self._h = h
        _live_stores.add(self)

    @classmethod
    def from_env(cls, **opts):
        """The job's store as the environment names it, with this process's rank and the
        rank count: (store, rank, size), as tutti_store_open_env finds them (TUTTI_*,
        torchrun's, mpirun's, srun's; a job on one host, a Slurm step or Open MPI's
        mpirun across hosts meets without a store named, rank 0 serving it). opts: tutti_comm_opts_t's (timeout_ms,
        job_id, auth_token ...)."""
        self = cls.__new__(cls)
        self._h = self._base = None
        o, keep = _lib.comm_opts(opts)
        h, rank, size = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int()
        st = _lib_.tutti_store_open_env(ctypes.byref(h), ctypes.byref(rank), ctypes.byref(size),
                                        ctypes.byref(o))
        del keep
        if st < 0:
            why = _lib_.tutti_comm_last_error(None).decode() or _lib_.tutti_strerror(st).decode()
            raise error_for(st, f"tutti: no store from the environment: {why}")
        self._h = h
        _live_stores.add(self)
        return self, rank.value, size.value

    @classmethod
    def _view(cls, base, prefix):
        self = cls.__new__(cls)
        self._h = self._base = None
        h = ctypes.c_void_p()
        st = _lib_.tutti_store_open_prefixed(ctypes.byref(h), base._handle(), prefix.encode())
        if st < 0:
            raise error_for(st, "tutti: cannot open a prefixed store view")
        self._h, self._base = h, base
        _live_stores.add(self)
        return self

    def prefixed(self, prefix):
        """A view that puts prefix before every key (keeps this store alive)."""
        return Store._view(self, Store._key(prefix, "prefix").decode())

    def _handle(self):
        if not self._h:
            raise Error("tutti: the store is closed", -15)
        return self._h

    def _check(self, st):
        if st < 0:
            raise error_for(st, _lib_.tutti_store_last_error(self._h).decode())
        return st

    @property
    def url(self):
        return _lib_.tutti_store_url(self._handle()).decode()

    @property
    def port(self):
        return _lib_.tutti_store_port(self._handle())

    @staticmethod
    def _key(key, what="key"):
        """A key (or prefix) as the C library takes it: a str, UTF-8, without NUL (the C
        side would end it there: 'a\\0x' would be the key 'a')."""
        if not isinstance(key, str):
            raise TypeError(f"tutti: a store {what} is a str, not {type(key).__name__}")
        if "\0" in key:
            raise ValueError(f"tutti: a store {what} cannot hold a NUL character: {key!r}")
        return key.encode()

    @staticmethod
    def _value(value, what="value"):
        """A value as bytes: a bytes-like object as it is, a str encoded UTF-8; anything
        else (an int would be bytes(n), n zero bytes) is refused."""
        if isinstance(value, str):
            return value.encode()
        try:
            return memoryview(value).tobytes()
        except TypeError:
            raise TypeError(f"tutti: a store {what} is bytes-like or a str, not "
                            f"{type(value).__name__}") from None

    def set(self, key, value):
        key, value = self._key(key), self._value(value)
        self._check(_lib_.tutti_store_set(self._handle(), key, value, len(value)))

    def get(self, key, timeout_ms=-1):
        p, n = ctypes.c_void_p(), ctypes.c_size_t()
        self._check(_lib_.tutti_store_get(self._handle(), self._key(key), ctypes.byref(p),
                                          ctypes.byref(n), timeout_ms))
        try:
            return ctypes.string_at(p, n.value)
        finally:
            _lib.libc.free(p)

    def add(self, key, delta=1):
        out = ctypes.c_int64()
        self._check(_lib_.tutti_store_add(self._handle(), self._key(key), delta, ctypes.byref(out)))
        return out.value

    def compare_set(self, key, expected, desired):
        """Set key to desired if its value is expected (b"" for a missing key); returns
        the value after the call."""
        p, n = ctypes.c_void_p(), ctypes.c_size_t()
        expected, desired = self._value(expected, "expected value"), self._value(desired)
        self._check(_lib_.tutti_store_compare_set(self._handle(), self._key(key), expected,
                                                  len(expected), desired, len(desired),
                                                  ctypes.byref(p), ctypes.byref(n)))
        try:
            return ctypes.string_at(p, n.value)
        finally:
            _lib.libc.free(p)

    @staticmethod
    def _keys(keys):
        # a str is a sequence of one-character keys: 'ab' would wait on 'a' and 'b'
        if isinstance(keys, (str, bytes, bytearray, memoryview)):
            raise TypeError("tutti: expected a list of keys, not a single "
                            f"{type(keys).__name__} (wrap one key in a list: [key])")
        enc = [Store._key(k) for k in keys]
        arr = (ctypes.c_char_p * len(enc))(*enc)
        return arr, len(enc)

    def check(self, keys):
        arr, n = self._keys(keys)
        out = ctypes.c_int()
        self._check(_lib_.tutti_store_check(self._handle(), arr, n, ctypes.byref(out)))
        return bool(out.value)

    def wait(self, keys, timeout_ms=-1):
        arr, n = self._keys(keys)
        self._check(_lib_.tutti_store_wait(self._handle(), arr, n, timeout_ms))

    def delete(self, key):
        out = ctypes.c_int()
        self._check(_lib_.tutti_store_delete(self._handle(), self._key(key), ctypes.byref(out)))
        return bool(out.value)

    def count(self, prefix=""):
        """How many keys start with prefix ("": all of this store's, a view's own)."""
        out = ctypes.c_size_t()
        self._check(_lib_.tutti_store_count(self._handle(), self._key(prefix, "prefix"),
                                            ctypes.byref(out)))
        return out.value

    def close(self):
        """Close the handle. Communicators made on it must be destroyed first."""
        users = [c for c in _live_comms if c._store is self and c._h]
        if users:
            raise Error(f"tutti: the store {self.url} is still used by {len(users)} "
                        "communicator(s); destroy them first", -1)
        if self._h:
            _lib_.tutti_store_close(self._h)
            self._h = None
        self._base = None

    _release = close


class Work:
    """An operation in flight. It holds the buffers it uses until it completes."""

    __slots__ = ("_w", "_bufs", "_comm", "_status", "_source", "_op", "_mark", "_end",
                 "_done_cb")

    def __init__(self, handle, bufs, comm):
        self._w, self._bufs, self._comm, self._status = handle, bufs, comm, None
        self._source, self._op, self._mark, self._end, self._done_cb = -1, None, 0, None, None

    def is_completed(self):
        """Whether the operation finished (successfully or not); never blocks."""
        if self._w is None:
            return True
        done = ctypes.c_int()
        st = _lib_.tutti_test(self._w, ctypes.byref(done))
        if done.value:
            self._finish_and_keep(st)
            return True
        return False

    def _finish_and_keep(self, st):
        msg = _lib_.tutti_work_error(self._w).decode() if st < 0 else ""
        self._source = _lib_.tutti_work_source(self._w)
        self._finish_plain(st, msg)

    @property
    def source(self):
        """The rank a completed receive got its message from (for peer=None, whichever
        rank sent it); None while it runs, when it failed before a sender was known, or
        when the operation is not a receive."""
        if self._w is not None and not self.is_completed():
            return None
        return self._source if self._source >= 0 else None

    def _finish_plain(self, st, msg):
        _lib_.tutti_work_free(self._w)
        self._w = None
        for b in self._bufs:
            b.release()
        self._bufs = ()
        self._status = (st, msg)

    def wait(self, timeout=None):
        """Wait until done (timeout in seconds; None: the communicator's timeout). Raises
        the operation's error, or tutti.TimeoutError if it still runs at the timeout."""
        if self._w is not None:
            ms = -1 if timeout is None else max(0, int(timeout * 1000))
            st = _lib_.tutti_wait(self._w, ms)
            done = ctypes.c_int()
            if st == -3 and _lib_.tutti_test(self._w, ctypes.byref(done)) == 0 and not done.value:
                raise error_for(-3, f"tutti: the operation still runs after {timeout} s")
            self._finish_and_keep(st)
        st, msg = self._status
        if st < 0:
            raise error_for(st, msg)
        if self._op is not None:
            self._op._raise_since(self._mark, self._end[0])
        return True

    def exception(self):
        """The operation's error once it completed with one, else None."""
        if not self.is_completed():
            return None
        st, msg = self._status
        if st < 0:
            return error_for(st, msg)
        return self._op._state.since(self._mark, self._end[0]) if self._op is not None else None

    def __del__(self):
        # The library may still write the buffers: keep them until it is done.
        if getattr(self, "_w", None) is not None:
            _lib_.tutti_wait(self._w, -1)
            self._finish_plain(0, "")


class Communicator(_Handle):
    """A group of ranks that run collectives together.

    Communicator(store, rank, size, **opts) joins through a Store; from_env() reads
    TUTTI_RANK/TUTTI_WORLD_SIZE/TUTTI_STORE, torchrun's variables, mpirun's (Open MPI's,
    MPICH's) or srun's, as tutti_comm_init_env does. opts are
    tutti_comm_opts_t's fields (timeout_ms, transport, algo, job_id ...)."""

    def __init__(self, store, rank, size, **opts):
        self._init(store, lambda h, o: _lib_.tutti_comm_init(h, store._handle(), rank, size, o),
                   opts)

    @classmethod
    def from_env(cls, **opts):
        self = cls.__new__(cls)
        self._init(None, lambda h, o: _lib_.tutti_comm_init_env(h, o), opts)
        return self

    @classmethod
    def join(cls, store, **opts):
        """A new process's side of grow(): wait for the job's grow (same job_id, store and
        options as its ranks), take the next free rank; a spare waits for the next grow."""
        self = cls.__new__(cls)
        self._init(store, lambda h, o: _lib_.tutti_comm_join(h, store._handle(), o), opts)
        return self

    def _init(self, store, call, opts):
        self._h = None
        o, keep = _lib.comm_opts(opts)
        h = ctypes.c_void_p()
        st = call(ctypes.byref(h), ctypes.byref(o))
        del keep
        if st < 0:
            # A failed init leaves no communicator: the library keeps this thread's cause.
            where = store.url if store is not None else "the environment"
            why = _lib_.tutti_comm_last_error(None).decode() or _lib_.tutti_strerror(st).decode()
            raise error_for(st, f"tutti: communicator set-up through {where} failed: {why}")
        self._h, self._store = h, store
        _live_comms.add(self)
        self.rank = _lib_.tutti_comm_rank(h)
        self.size = _lib_.tutti_comm_size(h)

    def _handle(self):
        if not self._h:
            raise error_for(-15, "tutti: the communicator was destroyed")
        return self._h

    @property
    def transport(self):
        return _lib_.tutti_comm_transport(self._handle()).decode()

    @property
    def device(self):
        """The device memory this communicator's calls take besides host memory: "CUDA"
        (cuda="auto" where the program had made its first CUDA call before, or "on"), or
        None (host memory only)."""
        d = _lib_.tutti_comm_device(self._handle())
        return d.decode() if d else None

    def set_stream(self, stream):
        """Stream-ordered calls (NCCL's model; tutti_comm_set_stream): with a CUDA stream
        set (a torch.cuda.Stream, a CuPy Stream, anything with .cuda_stream, .ptr or
        .handle, or the handle as an int), a blocking call on CUDA arrays waits for the
        arrays' own streams as every call does, then returns once it is enqueued on this
        stream, whose later work sees its result: synchronise the stream before reading
        it on the host, and keep the arrays alive until the stream has run the call. The
        _async calls, send/recv and host arrays are unaffected. None unsets. A failure
        while the call runs is stream_error()'s."""
        ptr = 0
        if stream is not None:
            for attr in ("cuda_stream", "ptr", "handle"):
                if hasattr(stream, attr):
                    stream = getattr(stream, attr)
                    break
            if hasattr(stream, "value"):  # a ctypes handle (Numba's .handle)
                stream = stream.value
            ptr = int(stream)
        h = self._handle()
        st = _lib_.tutti_comm_set_stream(h, ctypes.c_void_p(ptr or None))
        if st < 0:
            raise error_for(st, _lib_.tutti_comm_last_error(h).decode())

    def stream_error(self):
        """The first failure of a stream-ordered call since the stream was set, as the
        Error it would have raised, or None. Does not wait for the stream."""
        h = self._handle()
        st = _lib_.tutti_comm_stream_error(h)
        return error_for(st, _lib_.tutti_comm_last_error(h).decode()) if st < 0 else None

    def _check_device(self, name, bufs):
        if self.device is None:
            b = next(b for b in bufs if b.dev is not None)
            raise InvalidArgError(
                f"tutti: {name}: {b.what} is CUDA device memory ({b.dev}), and this "
                "communicator takes host memory only: make it with cuda='on' (TUTTI_CUDA=on), "
                "or after the program's first CUDA call (cuda='auto' looks for the CUDA "
                "driver when the communicator is made)")

    def algo_for(self, coll, nbytes):
        return _lib_.tutti_comm_algo_for(self._handle(), coll.encode(), nbytes).decode()

    @property
    def last_error(self):
        return _lib_.tutti_comm_last_error(self._handle()).decode()

    def trace(self):
        """The flight recorder: this communicator's last operations (TUTTI_TRACE_ENTRIES
        of them) with their state, and its failure if any, as a dict (the JSON document
        tutti_comm_trace_dump writes; tutti-trace compares several ranks')."""
        fd = os.memfd_create("tutti-trace", os.MFD_CLOEXEC)
        try:
            st = _lib_.tutti_comm_trace_dump(self._handle(), fd)
            if st < 0:
                raise error_for(st, f"rank {self.rank}: writing the flight record failed "
                                    f"({_lib_.tutti_status_name(st).decode()})")
            os.lseek(fd, 0, os.SEEK_SET)
            with os.fdopen(os.dup(fd), "rb") as f:
                return json.loads(f.read().decode())
        finally:
            os.close(fd)

    def split(self, color, key=0):
        """MPI_Comm_split: every rank calls it; ranks with the same color (>= 0) form a new
        communicator ordered by (key, rank). A negative color takes part and gets None."""
        h = ctypes.c_void_p()
        st = _lib_.tutti_comm_split(self._handle(), color, key, ctypes.byref(h))
        if st < 0:
            raise error_for(st, _lib_.tutti_comm_last_error(self._h).decode())
        if not h:
            return None
        return self._child(h)

    def shrink(self, exclude=None, wait_ms=-1):
        """ncclCommShrink: a new communicator of the ranks not in exclude (their order
        kept), made through the store alone, so it works after a rank died: the ranks left
        call it with the same set. exclude=None (MPIX_Comm_shrink): the ranks that call it
        agree on who is here, waiting wait_ms (-1: a quarter of the timeout) for the rest."""
        h = ctypes.c_void_p()
        if exclude is None:
            st = _lib_.tutti_comm_shrink_live(self._handle(), int(wait_ms), ctypes.byref(h))
            if st < 0:
                raise error_for(st, _lib_.tutti_comm_last_error(self._h).decode())
            return self._child(h)
        ranks = [int(r) for r in exclude]
        arr = (ctypes.c_int * max(len(ranks), 1))(*ranks)
        st = _lib_.tutti_comm_shrink(self._handle(), arr, len(ranks), ctypes.byref(h))
        if st < 0:
            raise error_for(st, _lib_.tutti_comm_last_error(self._h).decode())
        return self._child(h)

    def grow(self, size):
        """ncclCommGrow: every rank calls it with the new size; new processes call
        Communicator.join(store) to fill the places. Ranks keep their numbers."""
        h = ctypes.c_void_p()
        st = _lib_.tutti_comm_grow(self._handle(), int(size), ctypes.byref(h))
        if st < 0:
            raise error_for(st, _lib_.tutti_comm_last_error(self._h).decode())
        return self._child(h)

    def _child(self, h):
        child = Communicator.__new__(Communicator)
        child._h, child._store = h, self._store
        child.rank, child.size = _lib_.tutti_comm_rank(h), _lib_.tutti_comm_size(h)
        _live_comms.add(child)
        return child

    def abort(self):
        _lib_.tutti_comm_abort(self._handle())

    def revoke(self):
        """MPIX_Comm_revoke: fail this communicator on every rank (RevokedError), so that
        the ranks waiting on a dead or hung one stop; then shrink() it."""
        _lib_.tutti_comm_revoke(self._handle())

    def destroy(self):
        if self._h:
            _lib_.tutti_comm_destroy(self._h)
            self._h = None
        self._store = None

    _release = destroy

    # ---- the calls: buffers in, the C function, errors out ----

    def _run(self, name, bufs, args, async_op, op=None):
        h = self._h or self._handle()
        for b in bufs:
            if b.dev is not None:
                self._check_device(name, bufs)
                break
        op = op if isinstance(op, Op) else None  # its function's exception, once done
        mark = op._mark() if op is not None else 0
        if not async_op:
            st = _FN[name](h, *args)  # the buffers are held until they go out of scope
            if st < 0:
                raise error_for(st, _lib_.tutti_comm_last_error(h).decode())
            if op is not None:
                op._raise_since(mark)
            return None
        w = ctypes.c_void_p()
        st = _FN_ASYNC[name](h, *args, ctypes.byref(w))
        if st < 0:
            raise error_for(st, _lib_.tutti_comm_last_error(h).decode())
        work = Work(w, bufs, self)
        if op is not None:
            # the op's error count when the call completes (from the thread that completes
            # it): fn's exceptions after that are later calls'
            state, end = op._state, [None]

            def done(arg, status):
                end[0] = state.count
            work._op, work._mark, work._end = op, mark, end
            work._done_cb = _lib.DONE_FN(done)  # kept with the Work, which outlives the call
            _lib_.tutti_work_on_done(w, work._done_cb, None)
        return work

    @staticmethod
    def _pair(send, recv, dtype, what, carry=False):
        """recv (written) and send (read; None or recv itself: in place), same dtype
        (carry: any element type, as bytes, for the calls that only move data)."""
        out = Buffer(recv, f"{what}'s output", True, dtype, carry)
        if send is None or send is recv:
            return out, None, _lib.IN_PLACE
        inp = Buffer(send, f"{what}'s input", False, dtype, carry)
        _same(inp, out, what, "input", "output")
        return out, inp, inp.ptr

    @staticmethod
    def _expect(buf, nbytes, what):
        if buf is not None and buf.nbytes != nbytes:
            raise InvalidArgError(f"tutti: {what} holds {buf.nbytes} bytes, the call "
                                  f"needs {nbytes}")

    def _reduce_all(self, name, buf, out, op, dtype, async_op):
        """allreduce, scan, exscan: buf in, out (None: in place into buf) out."""
        if out is None:
            o, i, sp = self._pair(None, buf, dtype, name)
        else:
            o, i, sp = self._pair(buf, out, dtype, name)
            self._expect(i, o.nbytes, f"{name}'s input")
        bufs = [b for b in (o, i) if b is not None]
        return self._run(name, bufs, (sp, o.ptr, o.count, o.dtype, _op(op)), async_op, op)

    def allreduce(self, buf, out=None, op="sum", dtype=None, async_op=False):
        """Reduce buf over the ranks into out (None: in place into buf)."""
        return self._reduce_all("allreduce", buf, out, op, dtype, async_op)

    def scan(self, buf, out=None, op="sum", dtype=None, async_op=False):
        """MPI_Scan: rank r's out (None: in place into buf) gets the reduction of ranks
        0..r's buf, in rank order ("avg": divided by r + 1)."""
        return self._reduce_all("scan", buf, out, op, dtype, async_op)

    def exscan(self, buf, out=None, op="sum", dtype=None, async_op=False):
        """MPI_Exscan: rank r's out (None: in place into buf) gets the reduction of ranks
        0..r-1's buf, in rank order ("avg": divided by r); rank 0's is not written."""
        return self._reduce_all("exscan", buf, out, op, dtype, async_op)

    def broadcast(self, buf, root=0, dtype=None, async_op=False):
        """root's buf to every rank's buf."""
        b = Buffer(buf, "broadcast's buffer", True, dtype, carry=True)
        return self._run("broadcast", [b], (b.ptr, b.ptr, b.count, b.dtype, root), async_op)

    def barrier(self, async_op=False):
        return self._run("barrier", [], (), async_op)

    def reduce(self, buf, out=None, op="sum", root=0, dtype=None, async_op=False):
        """Reduce every rank's buf into root's out (None: in place into buf at root)."""
        if self.rank != root or out is None:
            i = Buffer(buf, "reduce's input", self.rank == root and out is None, dtype)
            sp = _lib.IN_PLACE if self.rank == root else i.ptr
            rp = i.ptr if self.rank == root else None
            return self._run("reduce", [i], (sp, rp, i.count, i.dtype, _op(op), root), async_op,
                             op)
        o, i, sp = self._pair(buf, out, dtype, "reduce")
        self._expect(i, o.nbytes, "reduce's input")
        bufs = [b for b in (o, i) if b is not None]
        return self._run("reduce", bufs, (sp, o.ptr, o.count, o.dtype, _op(op), root), async_op,
                         op)

    def allgather(self, buf, out, dtype=None, async_op=False):
        """Every rank's buf, in rank order, into every rank's out (size x buf)."""
        o, i, sp = self._pair(buf, out, dtype, "allgather", carry=True)
        self._expect(o, i.nbytes * self.size, "allgather's output")
        return self._run("allgather", [o, i], (sp, o.ptr, i.count, o.dtype), async_op)

    def allgatherv(self, buf, out, counts, displs=None, dtype=None, async_op=False):
        o, i, sp = self._pair(None if buf is None else buf, out, dtype, "allgatherv", carry=True)
        c, d = _sizes(counts, self.size, "counts", o.k), _sizes(displs, self.size, "displs", o.k)
        bufs = [b for b in (o, i) if b is not None]
        return self._run("allgatherv", bufs, (sp, o.ptr, c, d, o.dtype), async_op)

    def reduce_scatter(self, buf, out, op="sum", dtype=None, async_op=False):
        """Rank r gets the reduction of every rank's block r of buf (size x out)."""
        o, i, sp = self._pair(buf, out, dtype, "reduce_scatter")
        self._expect(i, o.nbytes * self.size, "reduce_scatter's input")
        bufs = [b for b in (o, i) if b is not None]
        return self._run("reduce_scatter", bufs, (sp, o.ptr, o.count, o.dtype, _op(op)),
                         async_op, op)

    def reduce_scatterv(self, buf, out, counts, op="sum", dtype=None, async_op=False):
        o, i, sp = self._pair(buf, out, dtype, "reduce_scatterv")
        c = _sizes(counts, self.size, "counts")
        bufs = [b for b in (o, i) if b is not None]
        return self._run("reduce_scatterv", bufs, (sp, o.ptr, c, o.dtype, _op(op)), async_op,
                         op)

    def _rooted(self, what, mine, mine_writes, roots, root, dtype, times=None):
        """Every rank's buffer (gather's input, scatter's output) and the root's other one
        (None elsewhere), which must hold `times` x mine when times is given."""
        sides = ("output", "input") if mine_writes else ("input", "output")
        m = Buffer(mine, f"{what}'s {sides[0]}", mine_writes, dtype, carry=True)
        if self.rank != root:
            return m, None, [m]
        r = Buffer(roots, f"{what}'s {sides[1]}", not mine_writes,
                   m.dtype if dtype is not None or m.k == 1 else None, carry=True)
        _same(m, r, what, sides[0], sides[1])
        if times is not None:
            self._expect(r, m.nbytes * times, f"{what}'s {sides[1]}")
        return m, r, [m, r]

    def _layout(self, r, counts, displs):
        if r is None:
            return None, None, None
        return (r.ptr, _sizes(counts, self.size, "counts", r.k),
                _sizes(displs, self.size, "displs", r.k))

    def gather(self, buf, out=None, root=0, dtype=None, async_op=False):
        """Every rank's buf into root's out (size x buf), in rank order."""
        i, o, bufs = self._rooted("gather", buf, False, out, root, dtype, self.size)
        rp = o.ptr if o else None
        return self._run("gather", bufs, (i.ptr, rp, i.count, i.dtype, root), async_op)

    def gatherv(self, buf, out, counts, displs=None, root=0, dtype=None, async_op=False):
        i, o, bufs = self._rooted("gatherv", buf, False, out, root, dtype)
        rp, c, d = self._layout(o, counts, displs)
        return self._run("gatherv", bufs, (i.ptr, i.count, rp, c, d, i.dtype, root), async_op)

    def scatter(self, buf, out, root=0, dtype=None, async_op=False):
        """Block r of root's buf (size x out) to rank r's out."""
        o, i, bufs = self._rooted("scatter", out, True, buf, root, dtype, self.size)
        sp = i.ptr if i else None
        return self._run("scatter", bufs, (sp, o.ptr, o.count, o.dtype, root), async_op)

    def scatterv(self, buf, counts, out, displs=None, root=0, dtype=None, async_op=False):
        o, i, bufs = self._rooted("scatterv", out, True, buf, root, dtype)
        sp, c, d = self._layout(i, counts, displs)
        return self._run("scatterv", bufs, (sp, c, d, o.ptr, o.count, o.dtype, root), async_op)

    def alltoall(self, buf, out=None, dtype=None, async_op=False):
        """Block j of buf to rank j; block i of out from rank i (out None: in place)."""
        if out is None:
            o, i, sp = self._pair(None, buf, dtype, "alltoall", carry=True)
        else:
            o, i, sp = self._pair(buf, out, dtype, "alltoall", carry=True)
            self._expect(i, o.nbytes, "alltoall's input")
        if o.count // o.k % self.size:
            raise InvalidArgError(f"tutti: alltoall's buffer of {o.count // o.k} elements does "
                                  f"not split into {self.size} blocks")
        bufs = [b for b in (o, i) if b is not None]
        return self._run("alltoall", bufs, (sp, o.ptr, o.count // self.size, o.dtype), async_op)

    def alltoallv(self, buf, send_counts, out, recv_counts, send_displs=None,
                  recv_displs=None, dtype=None, async_op=False):
        o, i, sp = self._pair(buf, out, dtype, "alltoallv", carry=True)
        n, k = self.size, o.k
        args = (sp, _sizes(send_counts, n, "send_counts", k),
                _sizes(send_displs, n, "send_displs", k), o.ptr,
                _sizes(recv_counts, n, "recv_counts", k), _sizes(recv_displs, n, "recv_displs", k),
                o.dtype)
        bufs = [b for b in (o, i) if b is not None]
        return self._run("alltoallv", bufs, args, async_op)

    def send(self, buf, peer, tag=0, dtype=None, async_op=False):
        b = Buffer(buf, "send's buffer", False, dtype, carry=True)
        return self._run("send", [b], (b.ptr, b.count, b.dtype, peer, tag), async_op)

    def recv(self, buf, peer=None, tag=0, dtype=None, async_op=False):
        """Receive into buf from rank peer, or from whichever rank sends this tag first
        (peer None or tutti.ANY_SOURCE). Returns the sending rank, or with async_op a
        Work whose source says it once done."""
        b = Buffer(buf, "recv's buffer", True, dtype, carry=True)
        peer = _lib.ANY_SOURCE if peer is None else peer
        if not async_op and peer != _lib.ANY_SOURCE:
            self._run("recv", [b], (b.ptr, b.count, b.dtype, peer, tag), False)
            return peer
        # the blocking C call cannot say who sent: an async one and its work can
        w = self._run("recv", [b], (b.ptr, b.count, b.dtype, peer, tag), True)
        if async_op:
            return w
        w.wait()
        return w.source


def _name(dtype):
    return _lib_.tutti_dtype_name(dtype).decode()
