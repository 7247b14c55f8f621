"""tutti: collective communication for CPU processes, from Python.

A thin binding over libtutti (ctypes): every collective and send/recv works on any
buffer-protocol object (NumPy arrays, bytearray, memoryview) and on DLPack tensors (CPU
torch tensors) without copying, blocking or async. The GIL is released while a call
blocks. Failures raise tutti.Error subclasses carrying the status and the library's
explanation (rank, peer, op). See docs/python.md.
"""
import array
import atexit
import collections
import ctypes
import functools
import json
import math
import operator
import os
import pickle
import threading
import weakref

from . import _lib
from ._buffer import _DTYPE_NAMES, _SIZES, Buffer, dtype_of
from ._errors import *  # noqa: F401,F403 (the Error classes)
from ._errors import Error, InvalidArgError, error_for

__all__ = ["Store", "Communicator", "Work", "Op", "Error", "version", "ANY_SOURCE", "PROC_NULL",
           "ANY_TAG", "Status",
           "Probe", "Message", "algorithms", "wait_any", "wait_all", "wait_some",
           "get_unique_id", "release_unique_id", "Persistent", "start_all",
           "dims_create"]

#: recv's peer for "whichever rank sends this tag" (so is peer=None)
ANY_SOURCE = _lib.ANY_SOURCE
#: MPI_PROC_NULL, as any peer (send, recv, sendrecv, probe): done at once, moving
#: nothing (a halo exchange's edge); a receive from it leaves its buffer as it was
PROC_NULL = _lib.PROC_NULL
#: MPI_ANY_TAG, as a recv's, recv_upto's, sendrecv's recvtag or a probe's tag: the first
#: message from its peer (any rank, with peer=None) that no receive issued before takes,
#: whatever its tag; Work.tag, Probe.tag and Message.tag say which it had. Not for sends.
ANY_TAG = _lib.ANY_TAG

#: What Communicator.probe found: the sending rank, the message's count and dtype as
#: sent (the library's name, which dtype= takes), its size in bytes, and its tag (the
#: probe's own, or for ANY_TAG the message's; ANY_TAG for PROC_NULL's, as MPI's).
Probe = collections.namedtuple("Probe", "source count dtype nbytes tag")

#: the version of the package and of the libtutti it loaded (they must agree: _lib)
version = __version__ = _lib.lib.tutti_version_string().decode()
_lib_ = _lib.lib
#: reduce ops (include/tutti/tutti.h's tutti_redop_t); BAND, BOR, BXOR and MPI's logical
#: LAND, LOR, LXOR (1 or 0 by the operands' truth): integer dtypes (and bool); MINLOC,
#: MAXLOC: the value-index pair dtypes ("float_int", "double_int", ...)
SUM, PROD, MIN, MAX, AVG, BAND, BOR, BXOR, MINLOC, MAXLOC, LAND, LOR, LXOR = range(13)

# Communicators, then stores, still open when the interpreter exits are closed before
# Python tears its modules down (a communicator's progress thread must not outlive them).
_live_comms, _live_stores = weakref.WeakSet(), weakref.WeakSet()

#: With True, blocking calls on host memory made on the main thread are issued async and
#: waited for on a lock their completion releases, so that Ctrl-C (and any Python signal
#: handler) gets in at once rather than after the communicator's timeout. Off by default:
#: it costs a hand-off to the library's progress thread and back through the GIL (0.1-0.2
#: ms a small call, where the library's blocking call runs the op on the caller's
#: thread; docs/python.md, "Ctrl-C").
interruptible = False
_SLICE_MS = 100
_main_ident = threading.main_thread().ident

# Operations still running whose Work was dropped (Work.__del__ must not block: it may run
# on the library's progress thread, from a garbage collection in an Op's function) or
# whose blocking call was interrupted: (handle, what to keep alive, the communicator's
# handle for an interrupted call, else None), oldest first. Freed, with their buffers, by
# _reap once done: at each call, at a communicator's destroy and at exit. Communicators
# dropped inside a library callback wait in _orphan_comms ((handle, store)), destroyed by
# the next _reap.
_orphans = collections.deque()
_orphan_comms = collections.deque()
_PID = os.getpid()  # this process's (a fork's child refreshes it)
_tls = threading.local()  # .cb: inside a library callback (on whatever thread runs it)


def _on_library_thread():
    """Whether Python runs here inside a library callback (an Op's function, a done
    callback): on a thread the library made, which threading knows as a dummy."""
    return getattr(_tls, "cb", False) or isinstance(threading.current_thread(),
                                                     threading._DummyThread)


def _reap(every=False):
    """Destroy the communicators dropped in callbacks; free the orphans done, oldest
    first, up to the first still running (a call's cost stays bounded: one test more than
    it frees), or with every (destroy, exit) each done one."""
    for _ in range(len(_orphan_comms)):
        try:
            h, store = _orphan_comms.popleft()
        except IndexError:
            break
        _lib_.tutti_comm_destroy(h)
        del store
    done = ctypes.c_int()
    for _ in range(len(_orphans)):
        try:
            item = _orphans.popleft()  # (atomic: another thread may reap at once)
        except IndexError:
            break
        _lib_.tutti_test(item[0], ctypes.byref(done))
        if done.value:
            _lib_.tutti_work_free(item[0])
        elif every:
            _orphans.append(item)
        else:
            _orphans.appendleft(item)
            break


def _after_fork_in_child():
    """A forked child shares none of the parent's communicators: their progress threads
    and connections stay the parent's. Forget them (and the stores) without touching the
    library, so that the child's exit does not destroy what the parent still uses."""
    global _main_ident, _PID
    _main_ident, _PID = threading.get_ident(), os.getpid()
    for c in list(_live_comms):
        c._h = None
    _live_comms.clear()
    _live_stores.clear()
    _orphans.clear()
    _orphan_comms.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)

_INT_MAX = _lib.INT_MAX
_TIMEOUT = -3  # TUTTI_ERR_TIMEOUT
_monotonic = __import__("time").monotonic
# an integer argument within a C type's range (a C int by default), as the options' are
_int = _lib.checked_int


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
    for c in list(_live_comms):  # (a forked child's inherited ones are forgotten)
        c.destroy()
    _reap(every=True)  # every op has ended with its communicator
    def depth(s):
        d = 0
        while s._base is not None:
            s, d = s._base, d + 1
        return d
    for s in sorted(_live_stores, key=depth, reverse=True):  # views before their bases
        try:
            s.close()
        except Error:  # a call still in a daemon thread: the process ends with it
            pass


_OPS = {}
# The C functions by collective name, blocking and async (one lookup per call).
_FN = {n: getattr(_lib_, "tutti_" + n) for n in _lib._COLLECTIVES}
_FN_ASYNC = {n: getattr(_lib_, f"tutti_{n}_async") for n in _lib._COLLECTIVES}
_FN_ASYNC["recv_upto"] = _lib_.tutti_recv_upto_async  # (no blocking form of that shape)
_NO_COUNT = (1 << (8 * ctypes.sizeof(ctypes.c_size_t))) - 1  # tutti_work_count's (size_t)-1


_USER_FIRST, _USER_LAST = 128, 255  # TUTTI_REDOP_USER_FIRST, _LAST
_USER_OPS = weakref.WeakValueDictionary()  # a defined op's value -> its live tutti.Op


def _resolve_op(op):
    """(value, Op or None) for a reduce op by name ("sum", "avg" ... as the library parses
    them), number or Op. A defined op's number is taken only while its Op lives (the call
    then keeps the Op, and so its function, alive); any other number is refused."""
    if isinstance(op, Op):
        if op.value is None:
            raise InvalidArgError(f"tutti: op {op.name!r} was freed")
        return op.value, op
    if isinstance(op, str):
        v = _OPS.get(op)
        if v is not None:
            return v, None
        out = ctypes.c_int()
        if _lib_.tutti_redop_parse(op.encode(), ctypes.byref(out)) < 0:
            raise InvalidArgError(f"tutti: unknown reduce op {op!r} (sum, prod, min, max, "
                                  "avg, band, bor, bxor, land, lor, lxor, minloc, maxloc)")
        _OPS[op] = out.value
        return out.value, None
    try:
        v = operator.index(op)
    except TypeError:
        raise InvalidArgError(f"tutti: unknown reduce op {op!r} (sum, prod, min, max, avg, "
                              "band, bor, bxor, land, lor, lxor, minloc, maxloc, or a "
                              "tutti.Op)") from None
    if 0 <= v < _USER_FIRST:
        return v, None  # the library's own ops (it refuses the values it has none for)
    defined = _USER_OPS.get(v) if v <= _USER_LAST else None
    if defined is None:  # (free() takes a freed op's value out)
        raise InvalidArgError(f"tutti: reduce op {v} is not an op defined here (a freed or "
                              "unknown value): pass the tutti.Op itself")
    return v, defined


def _op(op):
    """A reduce op's value (see _resolve_op)."""
    return _resolve_op(op)[0]


def reduce_local(buf, out, op="sum", dtype=None):
    """MPI_Reduce_local: out = buf op out, element by element, on this rank alone (no
    communicator), with the collectives' kernels and defined ops (tutti.Op: called with
    buf's elements first). Both of one count and dtype, host memory; not "avg"."""
    i = Buffer(buf, "reduce_local's input", False, dtype)
    o = Buffer(out, "reduce_local's output", True, dtype)
    if i.dev is not None or o.dev is not None:
        raise InvalidArgError("tutti: reduce_local takes host memory only")
    if i.count != o.count or i.dtype != o.dtype:
        raise InvalidArgError(f"tutti: reduce_local: the input is {i.count} x "
                              f"{_name(i.dtype)}, the output {o.count} x {_name(o.dtype)}")
    v, keep = _resolve_op(op)
    v = _logical_op([i, o], v, "reduce_local")
    st = _lib_.tutti_reduce_local(i.ptr, o.ptr, o.count, o.dtype, v)
    del keep  # (the defined op lived through the call)
    if st < 0:
        raise error_for(st, _lib_.tutti_comm_last_error(None).decode())


def _logical_op(bufs, v, name):
    """The op a reduction of bool buffers (Buffer.logical: uint8 0 or 1) runs with, as
    NCCL's torch backend maps them: sum and max as max (logical or), prod and min as min
    (logical and), the bitwise ops as they are; avg refused. Ops defined here (tutti.Op)
    see the bytes."""
    if not any(b.logical for b in bufs):
        return v
    if not _LOGICAL:
        _LOGICAL.update({_op(a): _op(b) for a, b in (("sum", "max"), ("max", "max"),
                                                     ("prod", "min"), ("min", "min"),
                                                     ("band", "band"), ("bor", "bor"),
                                                     ("bxor", "bxor"), ("land", "land"),
                                                     ("lor", "lor"), ("lxor", "lxor"))})
    if v >= _USER_FIRST:
        return v
    m = _LOGICAL.get(v)
    if m is None:
        raise InvalidArgError(f"tutti: {name}: reduce op {_lib_.tutti_redop_name(v).decode()} "
                              "does not apply to bool elements (sum/max: or, prod/min: and, "
                              "band, bor, bxor, land, lor, lxor)")
    return m


_LOGICAL = {}


try:
    import numpy as _np
except ImportError:  # Op's functions then get memoryviews
    _np = None
# NumPy dtypes and struct formats by tutti dtype name (bf16: its bits, as uint16; fp8
# its bits, as uint8)
# (complex without NumPy: the parts, real and imaginary in turn, as floats or doubles)
_NP_NAMES = {"i8": "int8", "u8": "uint8", "i32": "int32", "i64": "int64", "f16": "float16",
             "bf16": "uint16", "f32": "float32", "f64": "float64", "i16": "int16",
             "u16": "uint16", "u32": "uint32", "u64": "uint64", "c64": "complex64",
             "c128": "complex128", "f8e4m3": "uint8", "f8e5m2": "uint8"}
_FMT = {"i8": "b", "u8": "B", "i32": "i", "i64": "q", "f16": "H", "bf16": "H", "f32": "f",
        "f64": "d", "i16": "h", "u16": "H", "u32": "I", "u64": "Q", "c64": "f", "c128": "d",
        "f8e4m3": "B", "f8e5m2": "B"}
# the value-index pairs (MINLOC/MAXLOC): NumPy's aligned structured dtypes ("v", "i"),
# their bytes without NumPy
_PAIR_NP = {"float_int": "f4", "double_int": "f8", "long_int": "i8", "2int": "i4",
            "short_int": "i2"}
_FMT.update({n: "B" for n in _PAIR_NP})
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
        outer = getattr(_tls, "cb", False)
        _tls.cb = True  # a Communicator dropped in here is destroyed later (_reap)
        try:
            out = _op_view(dst, count, dtype, True)
            fa = out if a == dst else _op_view(a, count, dtype, False)
            fb = out if b == dst else _op_view(b, count, dtype, False)
            self.fn(fa, fb, out)
        except BaseException as e:  # noqa: B902 (raised by the call, once complete)
            self.count += 1
            self.errors.append((self.count, e))
            del self.errors[:-16]
        finally:
            _tls.cb = outer

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
    if name in _PAIR_NP:
        dt = _np.dtype([("v", _PAIR_NP[name]), ("i", "i4")], align=True)
    else:
        dt = _NP_NAMES[name]
    arr = _np.frombuffer(mem, dtype=dt, count=count)
    arr.flags.writeable = writable
    return arr


class Op:
    """A reduce op defined in Python (tutti_redop_create), for allreduce, reduce,
    reduce_scatter(v), scan, exscan and tutti.fuse.allreduce_coalesced: fn(a, b, out) writes a op b
    into out, element by element, for a slice of the vector; out may be a or b itself.
    a, b and out are NumPy arrays of the call's dtype (bf16 as its uint16 bits; a
    value-index pair as an aligned structured array, fields "v" and "i"; memoryviews
    without NumPy, fp16 there as its bits too, a pair as its bytes). fn must be associative and
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
        _USER_OPS[self.value] = self

    @property
    def is_commutative(self):
        """MPI_Op_commutative (mpi4py's Op.is_commutative), from the library."""
        c = ctypes.c_int(0)
        st = _lib_.tutti_redop_commutative(-1 if self.value is None else self.value,
                                           ctypes.byref(c))
        if st < 0:
            raise InvalidArgError(f"tutti: Op {self.name!r} was freed")
        return bool(c.value)

    def _mark(self):
        return self._state.count

    def _raise_since(self, mark, end=None):
        e = self._state.since(mark, end)
        if e is not None:
            raise e

    def free(self):
        if self.value is not None:
            if _USER_OPS.get(self.value) is self:
                _USER_OPS.pop(self.value, None)
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


def _entries(values, n, what, of="ranks"):
    """A count or displacement list of n non-negative integers (in elements; one for
    each of n `of`: ranks, or a topology's sources or destinations)."""
    if values is None:
        return None
    try:
        values = [operator.index(v) for v in values]
    except TypeError:
        raise InvalidArgError(f"tutti: {what} must hold integers") from None
    if len(values) != n:
        raise InvalidArgError(f"tutti: {what} has {len(values)} entries for {n} {of}")
    if any(v < 0 for v in values):
        raise InvalidArgError(f"tutti: {what} has a negative entry")
    return values


def _c_sizes(values, what, k=1):
    """A list from _entries as the C size_t array, in the carrier's elements (k: Buffer.k)."""
    if values is None:
        return None
    values = [v * k for v in values]
    if any(v >= 1 << 64 for v in values):  # ctypes would keep the low bits
        raise InvalidArgError(f"tutti: {what} has an entry too large for size_t")
    return (ctypes.c_size_t * len(values))(*values)


def _c_ints(values=(), n=None):
    """values as a C int array of n entries (None: as many as values; at least one, so
    that an empty list is still an address), the rest zero."""
    return (ctypes.c_int * max(len(values) if n is None else n, 1))(*values)


def _elems(buf):
    """A Buffer's length in the caller's elements (a carried item counts once)."""
    return buf.count // buf.k


def _fits(op, rank, counts, displs, cname, dname, buf, bwhat, who="rank"):
    """Every block of a layout (counts, displs in elements; displs None: back to back)
    inside buf: InvalidArgError naming the call, the argument and the rank otherwise."""
    n = _elems(buf) if buf is not None else 0
    end = 0
    for i, c in enumerate(counts):
        start = displs[i] if displs is not None else end
        end = start + c
        if c and end > n:
            where = (f"{dname}[{i}] + {cname}[{i}] = {start} + {c}" if displs is not None
                     else f"sum({cname}[:{i + 1}]) = {end}")
            raise InvalidArgError(f"tutti: rank {rank}: {op}: {who} {i}'s block ends at "
                                  f"element {end} ({where}), beyond {bwhat}'s {n} elements")


def _holds(op, rank, buf, want, bwhat, why):
    """buf holds exactly `want` elements, as `why` (the layout, the other buffer) says;
    buf None (an in-place call's missing input): nothing to check."""
    if buf is not None and _elems(buf) != want:
        have, size = _elems(buf), buf.k * _SIZES[buf.dtype]
        raise InvalidArgError(f"tutti: rank {rank}: {op}: {bwhat} holds {have} elements "
                              f"({have * size} bytes), and {why} is {want} "
                              f"({want * size} bytes)")


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


_store_calls = threading.Lock()  # guards Store._inflight, and close() against calls


def _store_call(fn):
    """A Store method that enters the library: counted while it runs, so that close() from
    another thread refuses rather than free the handle under it (a get blocked in one
    thread and a close in another crashed the process: review, session 100)."""
    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        with _store_calls:
            self._inflight += 1
        try:
            return fn(self, *args, **kwargs)
        finally:
            with _store_calls:
                self._inflight -= 1
    return call


class Store(_Handle):
    """A rendezvous store: Store("file:///tmp/job"), Store("tcp://host:port",
    is_server=True, auth_token=...) or Store("redis://[[user]:password@]host[:port][/db]",
    password=...). Options are tutti_store_opts_t's fields."""

    _inflight = 0  # calls in the library now (_store_call)

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
        if isinstance(value, bytes):
            return value  # as it is (a copy of up to 64 MiB saved)
        if isinstance(value, str):
            return value.encode()
        try:
            return memoryview(value).tobytes()
        except TypeError:
            raise TypeError(f"tutti: a store {what} is bytes-like or a str, not "
                            f"{type(value).__name__}") from None

    @_store_call
    def set(self, key, value):
        key, value = self._key(key), self._value(value)
        self._check(_lib_.tutti_store_set(self._handle(), key, value, len(value)))

    @_store_call
    def get(self, key, timeout_ms=-1):
        p, n = ctypes.c_void_p(), ctypes.c_size_t()
        timeout_ms = _int(timeout_ms, "get's timeout_ms")  # (ctypes would cut it)
        self._check(_lib_.tutti_store_get(self._handle(), self._key(key), ctypes.byref(p),
                                          ctypes.byref(n), timeout_ms))
        try:
            return ctypes.string_at(p, n.value)
        finally:
            _lib.libc.free(p)

    @_store_call
    def add(self, key, delta=1):
        out = ctypes.c_int64()
        delta = _int(delta, "add's delta", -2**63, 2**63 - 1)
        self._check(_lib_.tutti_store_add(self._handle(), self._key(key), delta, ctypes.byref(out)))
        return out.value

    @_store_call
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

    @_store_call
    def check(self, keys):
        arr, n = self._keys(keys)
        out = ctypes.c_int()
        self._check(_lib_.tutti_store_check(self._handle(), arr, n, ctypes.byref(out)))
        return bool(out.value)

    @_store_call
    def wait(self, keys, timeout_ms=-1):
        timeout_ms = _int(timeout_ms, "wait's timeout_ms")
        arr, n = self._keys(keys)
        self._check(_lib_.tutti_store_wait(self._handle(), arr, n, timeout_ms))

    @_store_call
    def delete(self, key):
        out = ctypes.c_int()
        self._check(_lib_.tutti_store_delete(self._handle(), self._key(key), ctypes.byref(out)))
        return bool(out.value)

    @_store_call
    def count(self, prefix=""):
        """How many keys start with prefix ("": all of this store's, a view's own)."""
        out = ctypes.c_size_t()
        self._check(_lib_.tutti_store_count(self._handle(), self._key(prefix, "prefix"),
                                            ctypes.byref(out)))
        return out.value

    def _under(self, store):
        """Whether store is this handle or a view made from it (at any depth)."""
        while store is not None:
            if store is self:
                return True
            store = store._base
        return False

    def close(self):
        """Close the handle. Communicators made on it or on its views, and its views,
        must be closed first (the library frees what they use: closing a base under a
        view, or under a communicator made on a view, crashed the process at its next
        use; review, session 100)."""
        users = [c for c in _live_comms if c._h and self._under(c._store)]
        if users:
            raise Error(f"tutti: the store {self.url} is still used by {len(users)} "
                        "communicator(s) (on it or on its views); destroy them first", -1)
        views = [v for v in _live_stores if v is not self and v._h and self._under(v._base)]
        if views and self._h:
            raise Error(f"tutti: the store {self.url} has {len(views)} open view(s) "
                        "(Store.prefixed); close them first", -1)
        with _store_calls:
            if self._inflight:
                raise Error(f"tutti: the store {self.url} is in use by {self._inflight} "
                            "call(s) in other threads; close it once they returned", -1)
            h, self._h = self._h, None
        if h:
            _lib_.tutti_store_close(h)
        self._base = None

    _release = close


def _wake(arg, status):
    """A sliced wait's done callback (on the thread that completed the op): wake it."""
    lock = _wakers.get(arg)
    if lock is not None:
        lock.release()


_WAKE = _lib.DONE_FN(_wake)
_wakers = {}  # a sliced wait's key -> the lock its done callback releases
_waker_keys = iter(range(1, 1 << 62))


def _wait_sliced(w):
    """Wait for work handle w on the main thread so that Ctrl-C gets in at once: its done
    callback releases a lock this thread waits for in _SLICE_MS slices (a lock's wait is
    cut short by a signal, whose handler then runs; a wait in the library is not).
    Returns the status; a KeyboardInterrupt comes out of here with the op still running
    (the caller keeps its buffers until it ends: _orphans)."""
    key = next(_waker_keys)
    lock = threading.Lock()
    lock.acquire()
    _wakers[key] = lock
    _lib_.tutti_work_on_done(w, _WAKE, key)  # at once if it finished already
    done = ctypes.c_int()
    _lib_.tutti_test(w, ctypes.byref(done))  # wakes the progress thread for a deferred op
    try:
        while not done.value and not lock.acquire(timeout=_SLICE_MS / 1000):
            pass
    finally:
        del _wakers[key]  # a callback still due finds no lock: nothing to wake
    return _lib_.tutti_wait(w, -1)  # done: its status (once the callback has returned)


def _wait_handle(w, deadline):
    """Wait for work handle w until done or the deadline (time.monotonic(); None: until
    the op ends, which its own deadline bounds): (status, done)."""
    if deadline is None:
        return _lib_.tutti_wait(w, -1), True
    ms = min(max(math.ceil((deadline - _monotonic()) * 1000), 0), _INT_MAX)
    st = _lib_.tutti_wait(w, ms)
    if st != _TIMEOUT:
        return st, True
    done = ctypes.c_int()  # the bound passed, or the op's own deadline: a test tells
    st = _lib_.tutti_test(w, ctypes.byref(done))
    return st, bool(done.value)


class Work:
    """An operation in flight. It holds the buffers it uses until it completes. Its
    methods may be called from several threads at once: the handle is freed once the
    operation is seen done and no thread is inside a call on it."""

    __slots__ = ("_w", "_bufs", "_comm", "_status", "_source", "_count", "_tag", "_op", "_mark",
                 "_end", "_done_cb", "_lock", "_calls", "_what", "_pid")

    def __init__(self, handle, bufs, comm, what=None):
        self._w, self._bufs, self._comm, self._status = handle, bufs, comm, None
        self._source, self._op, self._mark, self._end, self._done_cb = -1, None, 0, None, None
        self._count, self._tag = _NO_COUNT, None
        self._lock, self._calls, self._what, self._pid = threading.Lock(), 0, what, comm._pid

    def _enter(self):
        """The handle, counted as in use by this thread's call (None once finished)."""
        with self._lock:
            w = self._w
            if w is not None:
                if self._pid != _PID:
                    raise Error("tutti: this operation was issued by process "
                                f"{self._pid}, before a fork", -15)
                self._calls += 1
            return w

    def _leave(self, done, st):
        """End a call begun with _enter; done: the library said the operation finished
        (st its status). The last call out frees the handle of a finished operation."""
        with self._lock:
            self._calls -= 1
            w = self._w
            if done and self._status is None:
                msg = _lib_.tutti_work_error(w).decode() if st < 0 else ""
                self._source = _lib_.tutti_work_source(w)
                self._count = _lib_.tutti_work_count(w)
                if st == 0 and (self._source >= 0 or self._source == PROC_NULL):  # a receive
                    info = _lib.MsgInfo()
                    if _lib_.tutti_work_info(w, ctypes.byref(info)) == 0:
                        self._tag = info.tag
                self._status = (st, msg)
            if self._status is not None and not self._calls:
                self._w = None
                _lib_.tutti_work_free(w)
                for b in self._bufs:
                    b.release()
                self._bufs = ()

    def is_completed(self):
        """Whether the operation finished (successfully or not); never blocks."""
        w = self._enter()
        if w is None:
            return True
        done, st = ctypes.c_int(), 0
        try:
            st = _lib_.tutti_test(w, ctypes.byref(done))
        finally:
            self._leave(bool(done.value), st)
        return bool(done.value)

    @property
    def source(self):
        """The rank a completed receive got its message from (for peer=None, whichever
        rank sent it); None while it runs, when it failed before a sender was known, or
        when the operation is not a receive."""
        if not self.is_completed():
            return None
        return self._source if self._source >= 0 or self._source == PROC_NULL else None

    @property
    def count(self):
        """The count a completed receive took (MPI_Get_count): recv_upto's message's, in
        its dtype's elements (bytes for "uint8"), another receive's own; None while it
        runs, when it failed, or when the operation is not a receive."""
        if not self.is_completed():
            return None
        return None if self._count == _NO_COUNT else self._count

    @property
    def tag(self):
        """The tag of the message a completed receive took (its own, or for ANY_TAG the
        message's; ANY_TAG from PROC_NULL); None while it runs, when it failed, or when
        the operation is not a receive."""
        if not self.is_completed():
            return None
        return self._tag

    def _describe(self):
        name, detail = self._what if self._what else ("operation", "")
        return f"rank {self._comm.rank}: {name}{detail}"

    def _wait_until(self, deadline):
        """Wait for the operation until the deadline (time.monotonic(); None: until it
        ends): whether it ended."""
        w = self._enter()
        if w is None:
            return True
        st, done = 0, False
        try:
            st, done = _wait_handle(w, deadline)
        finally:
            self._leave(done, st)
        return done

    def wait(self, timeout=None):
        """Wait until done (timeout in seconds; None: the communicator's timeout). Raises
        the operation's error, or tutti.TimeoutError if it still runs at the timeout (the
        Work stays usable: wait again). It waits in the library, so Ctrl-C is seen when it
        returns (tutti.interruptible covers blocking calls only): bound it with timeout
        to let a signal in."""
        if not self._wait_until(_deadline(timeout, "Work.wait")):
            raise error_for(_TIMEOUT, f"tutti: {self._describe()}: still running after "
                                      f"Work.wait's timeout of {timeout} s")
        st, msg = self._status
        if st < 0:
            raise error_for(st, msg)
        if self._op is not None:
            self._op._raise_since(self._mark, self._end[0])
        return True

    def cancel(self):
        """MPI_Cancel for a receive: True when it was taken back (it is done, its buffer
        untouched, and wait() raises tutti.CancelledError; the message it would have
        taken goes to the next receive), False when it had finished or cannot be (its
        message has come, or a later receive from its rank of its tag holds the next
        number: it completes as it would). A receive from any source or of any tag still
        looking can always be cancelled. InvalidArgError for a send or a collective."""
        w = self._enter()
        if w is None:
            return False
        c, st = ctypes.c_int(), 0
        try:
            st = _lib_.tutti_cancel(w, ctypes.byref(c))
            if st < 0:
                with self._comm._lock:
                    raise self._comm._error(st, "cancel")
        finally:
            self._leave(False, 0)
        return bool(c.value)

    def exception(self):
        """The operation's error once it completed with one, else None."""
        if not self.is_completed():
            return None
        st, msg = self._status
        if st < 0:
            return error_for(st, msg)
        return self._op._state.since(self._mark, self._end[0]) if self._op is not None else None

    def __del__(self):
        # Never blocks (it may run on the library's progress thread, from a garbage
        # collection in an Op's function): an operation still running goes to _orphans,
        # with its buffers (the library may still write them) and callbacks, freed by a
        # later call's _reap once done.
        # A forked child forgets its parent's (the handle is the parent's to free).
        w = getattr(self, "_w", None)
        if w is not None:
            self._w = None
            try:
                if self._pid == _PID:
                    _orphans.append((w, (self._bufs, self._op, self._done_cb), None))
            except Exception:  # noqa: B902 (interpreter teardown: nothing left to run it)
                pass


def _uid_bytes(uid, what):
    if not isinstance(uid, (bytes, bytearray)) or len(uid) != _lib.UNIQUE_ID_BYTES:
        raise InvalidArgError(f"tutti: {what}: uid must be the {_lib.UNIQUE_ID_BYTES} bytes "
                              f"tutti.get_unique_id made, not {type(uid).__name__}"
                              f"{' of ' + str(len(uid)) if isinstance(uid, (bytes, bytearray)) else ''}")
    return bytes(uid)


def get_unique_id():
    """ncclGetUniqueId: the id of a new job, as 128 bytes to hand to every rank, which
    each joins with Communicator.from_unique_id. This process serves the job's store (on
    an address of TUTTI_SOCKET_IFNAME's) until release_unique_id and its own
    communicators of the job are gone, or it exits: keep it up while the job runs."""
    buf = ctypes.create_string_buffer(_lib.UNIQUE_ID_BYTES)
    st = _lib_.tutti_get_unique_id(buf)
    if st < 0:
        raise error_for(st, _lib_.tutti_comm_last_error(None).decode())
    return buf.raw


def release_unique_id(uid):
    """Stop serving uid's store once this process's communicators made from it are
    destroyed (InvalidArgError for an id this process did not make, or released)."""
    st = _lib_.tutti_unique_id_release(_uid_bytes(uid, "release_unique_id"))
    if st < 0:
        raise error_for(st, _lib_.tutti_comm_last_error(None).decode())


def _works(works, what):
    works = list(works)
    for i, w in enumerate(works):
        if w is not None and not isinstance(w, Work):
            raise TypeError(f"tutti: {what}: works[{i}] is {type(w).__name__}, not a tutti.Work "
                            "or None")
    return works


def _timeout_ms(timeout, what):
    """A timeout in seconds (None: -1, until an op ends) as the library's milliseconds."""
    if timeout is None:
        return -1
    try:
        t = float(timeout)
    except (TypeError, ValueError):
        raise TypeError(f"tutti: {what}'s timeout must be a number of seconds or None, not "
                        f"{timeout!r}") from None
    if math.isnan(t):
        raise InvalidArgError(f"tutti: {what}'s timeout is NaN")
    if math.isinf(t):
        return -1 if t > 0 else 0
    return min(max(math.ceil(t * 1000), 0), _INT_MAX)


def _deadline(timeout, what):
    """A timeout in seconds as a time.monotonic() deadline (None: no bound of the call's)."""
    ms = _timeout_ms(timeout, what)
    return None if ms < 0 else _monotonic() + ms / 1e3


def _finished(works):
    """The indices of the works already seen finished (their handles freed)."""
    return [i for i, w in enumerate(works) if w is not None and w._status is not None]


def wait_any(works, timeout=None):
    """MPI_Waitany: wait until one of works (tutti.Work or None, skipped) finished, or
    timeout seconds passed (None: until one does, which each op's own deadline bounds;
    0: one look, MPI_Testany). Returns the lowest index of a finished one (its wait()
    then returns at once, or raises its error), or None when the timeout passed first
    or every entry is None. Works of several communicators may mix."""
    works = _works(works, "wait_any")
    ms = _timeout_ms(timeout, "wait_any")
    done = _finished(works)
    if done:
        return done[0]
    entered, handles = [], (ctypes.c_void_p * max(len(works), 1))()
    at, st = ctypes.c_int(-1), 0
    try:
        for i, w in enumerate(works):  # (inside: one issued before a fork raises here)
            if w is not None:
                entered.append((i, w, w._enter()))
                handles[i] = entered[-1][2]
        st = _lib_.tutti_wait_any(len(works), handles, ms, ctypes.byref(at))
    finally:
        for i, w, h in entered:
            if h is None:
                continue
            d = ctypes.c_int()
            s = st if i == at.value else _lib_.tutti_test(h, ctypes.byref(d))
            w._leave(i == at.value or bool(d.value), s)
    if at.value < 0 and st < 0 and st != _TIMEOUT:
        raise error_for(st, f"tutti: wait_any: {_lib_.tutti_strerror(st).decode()}")
    done = _finished(works)
    return done[0] if done else None


def wait_some(works, timeout=None):
    """MPI_Waitsome: wait as wait_any, then return the indices of every finished work,
    ascending ([] when the timeout passed first or every entry is None; timeout 0:
    MPI_Testsome)."""
    works = _works(works, "wait_some")
    if wait_any(works, timeout) is None:
        return []
    return [i for i, w in enumerate(works) if w is not None and w.is_completed()]


def wait_all(works, timeout=None):
    """MPI_Waitall: wait until every work (None entries skipped) finished, or timeout
    seconds passed (one bound for them all; None: until they end). Raises the first
    failure by index once all finished, tutti.TimeoutError if one still runs at the
    bound; else True."""
    works = _works(works, "wait_all")
    deadline = _deadline(timeout, "wait_all")
    for i, w in enumerate(works):
        if w is not None and not w._wait_until(deadline):
            raise error_for(_TIMEOUT, f"tutti: wait_all: {w._describe()} (works[{i}]) still "
                                      f"running after the timeout of {timeout} s")
    for w in works:
        if w is not None and w._status[0] < 0:
            w.wait()  # raises its error
    return True


class Status:
    """What a receive took (MPI_Status, mpi4py's MPI.Status): pass one as status= to recv,
    recv_upto, sendrecv or recv_object and it is filled: source, tag (the message's, for
    ANY_TAG) and count (the receive's count, as Work.count; recv_object's: the pickle's
    bytes)."""

    __slots__ = ("source", "tag", "count")

    def __init__(self):
        self.source = self.tag = self.count = None

    def __repr__(self):
        return f"tutti.Status(source={self.source}, tag={self.tag}, count={self.count})"

    def _take(self, source, tag, count):
        self.source, self.tag, self.count = source, tag, count


class Persistent:
    """A call kept to be started again, round after round (MPI's persistent requests:
    MPI_Send_init, MPI_Recv_init, MPI-4's MPI_Allreduce_init...): made by
    Communicator.persistent(comm.allreduce, buf, ...), its arguments (buffers included)
    checked by its first start. start() issues it as its async_op=True form and returns
    that round's Work (also .work); starting again while the round runs raises
    InvalidArgError (MPI's active request)."""

    __slots__ = ("_fn", "_args", "_kwargs", "work")

    def __init__(self, fn, args, kwargs):
        if "async_op" in kwargs:
            raise InvalidArgError("tutti: persistent: async_op is the request's own (each "
                                  "start is async)")
        self._fn, self._args, self._kwargs, self.work = fn, args, kwargs, None

    def start(self):
        if self.work is not None and not self.work.is_completed():
            raise InvalidArgError(f"tutti: start: the persistent {self._fn.__name__} is "
                                  "still active: its last round has not finished")
        self.work = self._fn(*self._args, async_op=True, **self._kwargs)
        return self.work

    def wait(self, timeout=None):
        """The last round's Work.wait (InvalidArgError before any start)."""
        if self.work is None:
            raise InvalidArgError("tutti: wait: the persistent request was never started")
        return self.work.wait(timeout)


def start_all(requests):
    """MPI_Startall: start each Persistent in order (None entries skipped); their Works."""
    return [r.start() if r is not None else None for r in requests]


def dims_create(nnodes, dims):
    """MPI_Dims_create (mpi4py's Compute_dims): dims (a length, or a list whose zeros
    are to fill) as a grid of nnodes ranks, the filled entries as close to each other as
    they can be, non-increasing. Returns the list."""
    try:
        nd = operator.index(dims)  # a length (int, NumPy's integers)
    except TypeError:
        d = [_int(x, "dims_create's dims") for x in dims]
    else:
        if nd < 0:
            raise InvalidArgError(f"tutti: dims_create: ndims {nd} is negative")
        d = [0] * nd
    a = _c_ints(d)
    st = _lib_.tutti_dims_create(_int(nnodes, "dims_create's nnodes"), len(d), a)
    if st < 0:
        raise error_for(st, "tutti: " + (_lib_.tutti_comm_last_error(None) or b"").decode())
    return list(a[:len(d)])


class Communicator(_Handle):
    """A group of ranks that run collectives together.

    Communicator(store, rank, size, **opts) joins through a Store; from_env() reads
    TUTTI_RANK/TUTTI_WORLD_SIZE/TUTTI_STORE, torchrun's variables, mpirun's (Open MPI's,
    MPICH's) or srun's, as tutti_comm_init_env does. opts are
    tutti_comm_opts_t's fields (timeout_ms, transport, algo, job_id ...)."""

    def __init__(self, store, rank, size, **opts):
        rank, size = _int(rank, "rank"), _int(size, "size")
        self._init(store, lambda h, o: _lib_.tutti_comm_init(h, store._handle(), rank, size, o),
                   opts)

    @classmethod
    def from_env(cls, **opts):
        self = cls.__new__(cls)
        self._init(None, lambda h, o: _lib_.tutti_comm_init_env(h, o), opts)
        return self

    @classmethod
    def from_unique_id(cls, uid, rank, size, **opts):
        """ncclCommInitRank: rank `rank` of `size` joins the job of uid, the bytes
        tutti.get_unique_id made in one process and the program handed to every rank
        (comm.broadcast_object, mpi4py's bcast, a file)."""
        rank, size = _int(rank, "rank"), _int(size, "size")
        uid = _uid_bytes(uid, "from_unique_id")
        self = cls.__new__(cls)
        self._init(None, lambda h, o: _lib_.tutti_comm_init_rank(h, size, uid, rank, o), opts,
                   where="the unique id")
        return self

    @classmethod
    def init_all(cls, n, **opts):
        """ncclCommInitAll: every rank of a job of n in this process, as a list (rank r's
        at r). Drive them from a thread each, or with async_op=True calls and
        tutti.wait_all: a blocking call on one waits for the others' matching calls."""
        n = _int(n, "n")
        o, keep = _lib.comm_opts(opts)
        hs = (ctypes.c_void_p * max(n, 1))()
        st = _lib_.tutti_comm_init_all(hs, n, ctypes.byref(o))
        del keep
        if st < 0:
            raise error_for(st, _lib_.tutti_comm_last_error(None).decode())
        out = []
        for h in hs[:n]:
            c = cls.__new__(cls)
            c._setup()
            c._h = ctypes.c_void_p(h)
            c.rank, c.size = _lib_.tutti_comm_rank(c._h), _lib_.tutti_comm_size(c._h)
            _live_comms.add(c)
            out.append(c)
        return out

    @classmethod
    def from_mpi(cls, mpi_comm, **opts):
        """gloo::mpi::Context's counterpart: a communicator of an MPI communicator's ranks
        in its order (mpi4py's, or any object with Get_rank(), Get_size() and
        bcast(obj, root)). Collective over mpi_comm: its rank 0 makes a unique id, which
        goes round by mpi_comm's bcast; rank 0's process serves the job's store while its
        communicator lives, so destroy rank 0's last (every rank's communicator reads the
        store until destroyed). A failure to make the id raises on every rank."""
        rank, size = int(mpi_comm.Get_rank()), int(mpi_comm.Get_size())
        made = None
        if rank == 0:
            try:
                made = ("id", get_unique_id())
            except Exception as e:  # noqa: B902 (every rank must hear of it, or hang)
                made = ("error", f"{type(e).__name__}: {e}")
        kind, value = mpi_comm.bcast(made, root=0)
        if kind != "id":
            raise Error(f"tutti: rank {rank}: from_mpi: rank 0 could not make the job's id: "
                        f"{value}", -1)
        try:
            return cls.from_unique_id(value, rank, size, **opts)
        finally:
            if rank == 0:  # (its communicator, if made, keeps the store up)
                try:
                    release_unique_id(value)
                except Error:
                    pass  # (the set-up's own error is the one to raise)

    @classmethod
    def join(cls, store, **opts):
        """A new process's side of grow(): wait for the job's grow (same job_id, store and
        options as its ranks), take the next free rank; a spare waits for the next grow."""
        self = cls.__new__(cls)
        self._init(store, lambda h, o: _lib_.tutti_comm_join(h, store._handle(), o), opts)
        return self

    def _init(self, store, call, opts, where=None):
        self._h = None
        self._setup()
        o, keep = _lib.comm_opts(opts)  # an integer a field cannot hold is refused there
        h = ctypes.c_void_p()
        st = call(ctypes.byref(h), ctypes.byref(o))
        del keep
        if st < 0:
            # A failed init leaves no communicator: the library keeps this thread's cause.
            where = where or (store.url if store is not None else "the environment")
            why = _lib_.tutti_comm_last_error(None).decode() or _lib_.tutti_strerror(st).decode()
            raise error_for(st, f"tutti: communicator set-up through {where} failed: {why}")
        self._h, self._store = h, store
        _live_comms.add(self)
        self.rank = _lib_.tutti_comm_rank(h)
        self.size = _lib_.tutti_comm_size(h)

    def _setup(self):
        # _lock: held to read the last_error that explains a call's failure, taken only
        # once it failed (never around an issue or a wait: a failure on another thread in
        # between may still replace the message, docs/python.md), and around
        # set_stream's and stream_error's calls with that read
        self._pid, self._lock, self._store = _PID, threading.Lock(), None

    def _handle(self):
        if not self._h:
            if getattr(self, "_pid", _PID) != _PID:
                raise error_for(-15, f"tutti: this communicator belongs to process "
                                     f"{self._pid}: a forked child cannot use it (make one "
                                     "in the child)")
            raise error_for(-15, "tutti: the communicator was destroyed")
        return self._h

    def _error(self, st, name=None):
        """The exception for status st of a call on this communicator, with last_error's
        explanation, read under _lock by the caller."""
        msg = _lib_.tutti_comm_last_error(self._h).decode() if self._h else ""
        if not msg and name:
            msg = f"rank {self.rank}: {name}: {_lib_.tutti_strerror(st).decode()}"
        return error_for(st, msg)

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

    @property
    def timeout_ms(self):
        """The bound on each call's waits, in ms (timeout_ms, TUTTI_TIMEOUT_MS). Setting it
        (tutti_comm_set_timeout; > 0) bounds the calls issued from then on, as gloo's
        setTimeout and torch's _set_pg_timeout; calls issued before keep theirs."""
        return _lib_.tutti_comm_timeout(self._handle())

    @timeout_ms.setter
    def timeout_ms(self, ms):
        ms = _int(ms, "timeout_ms")
        h = self._handle()
        with self._lock:
            st = _lib_.tutti_comm_set_timeout(h, ms)
            if st < 0:
                raise self._error(st, "set_timeout")

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
        with self._lock:
            st = _lib_.tutti_comm_set_stream(h, ctypes.c_void_p(ptr or None))
            if st < 0:
                raise self._error(st, "set_stream")

    def stream_error(self):
        """The first failure of a stream-ordered call since the stream was set, as the
        Error it would have raised, or None. Does not wait for the stream."""
        h = self._handle()
        with self._lock:
            st = _lib_.tutti_comm_stream_error(h)
            return self._error(st) if st < 0 else None

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

    def async_error(self):
        """ncclCommGetAsyncError (torch's getError): None while the communicator is
        usable, else the error of its first failure (a tutti.Error subclass, not raised),
        which every later call raises. Sticky; found by this rank's calls."""
        buf = ctypes.create_string_buffer(1024)
        st = _lib_.tutti_comm_get_async_error(self._handle(), buf, len(buf))
        return None if st == 0 else error_for(st, buf.value.decode(errors="replace"))

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

    def split(self, color, key=0, **opts):
        """MPI_Comm_split: every rank calls it; ranks with the same color (>= 0) form a new
        communicator ordered by (key, rank). A negative color takes part and gets None.
        opts (as the constructor's; ncclCommSplit's config) give the new one options of
        its own; without them it has this one's (the job id and secret stay this one's)."""
        color, key = _int(color, "split's color"), _int(key, "split's key")
        h = ctypes.c_void_p()
        if opts:
            o, keep = _lib.comm_opts(opts)
            st = _lib_.tutti_comm_split_opts(self._handle(), color, key, ctypes.byref(o),
                                             ctypes.byref(h))
            del keep
        else:
            st = _lib_.tutti_comm_split(self._handle(), color, key, ctypes.byref(h))
        if st < 0:
            raise self._error(st, "split")
        if not h:
            return None
        return self._child(h)

    def split_type(self, kind="host", key=0):
        """MPI_Comm_split_type: every rank calls it; kind "host" (MPI_COMM_TYPE_SHARED):
        a communicator of this rank's host's ranks (TUTTI_HOST_ID names a host), ordered
        by (key, rank); None takes part and gets None."""
        key = _int(key, "split_type's key")
        # another kind still takes part (as type 0, which no rank may pass), so that every
        # rank fails naming this one, and the communicator goes on (a refusal here alone
        # left the others in the exchange, to fail it: found by review)
        bad = kind is not None and not (isinstance(kind, str) and kind == "host")
        h = ctypes.c_void_p()
        st = _lib_.tutti_comm_split_type(self._handle(), -1 if kind is None else 0 if bad else 1,
                                         key, ctypes.byref(h))
        if st < 0:
            with self._lock:
                e = self._error(st, "split_type")
            if bad:
                raise InvalidArgError(f"tutti: split_type's kind is \"host\" or None, not "
                                      f"{kind!r} ({e})")
            raise e
        if not h:
            return None
        return self._child(h)

    def persistent(self, call, *args, **kwargs):
        """A persistent request of call, one of this communicator's methods that takes
        async_op (send, recv, allreduce, broadcast, alltoall...), with its arguments:
        tutti.Persistent, whose start() issues it again each round (MPI_Send_init,
        MPI_Allreduce_init; tutti.start_all for MPI_Startall)."""
        if getattr(call, "__self__", None) is not self:
            raise InvalidArgError("tutti: persistent: call must be a method of this "
                                  "communicator (comm.allreduce, comm.send...)")
        return Persistent(call, args, kwargs)

    def dup(self):
        """MPI_Comm_dup: every rank calls it; a new communicator of the same ranks in the
        same order, whose calls never meet this one's."""
        h = ctypes.c_void_p()
        st = _lib_.tutti_comm_dup(self._handle(), ctypes.byref(h))
        if st < 0:
            raise self._error(st, "dup")
        return self._child(h)

    def shrink(self, exclude=None, wait_ms=-1):
        """ncclCommShrink: a new communicator of the ranks not in exclude (their order
        kept), made through the store alone, so it works after a rank died: the ranks left
        call it with the same set. exclude=None (MPIX_Comm_shrink): the ranks that call it
        agree on who is here, waiting wait_ms (-1: a quarter of the timeout) for the rest."""
        h = ctypes.c_void_p()
        if exclude is None:
            wait_ms = _int(wait_ms, "shrink's wait_ms")
            st = _lib_.tutti_comm_shrink_live(self._handle(), wait_ms, ctypes.byref(h))
            if st < 0:
                raise self._error(st, "shrink")
            return self._child(h)
        ranks = [_int(r, "shrink's excluded rank") for r in exclude]
        arr = (ctypes.c_int * max(len(ranks), 1))(*ranks)
        st = _lib_.tutti_comm_shrink(self._handle(), arr, len(ranks), ctypes.byref(h))
        if st < 0:
            raise self._error(st, "shrink")
        return self._child(h)

    def agree(self, flag=1, wait_ms=-1):
        """MPIX_Comm_agree: the ranks that call it agree, through the store alone (so it
        works after a failure or a revoke), on the bitwise AND of their flags (unsigned
        32-bit) and on which ranks were absent (dead, hung, or later than wait_ms; -1: a
        quarter of the timeout). Returns (flag, absent ranks), the same on every caller;
        absent non-empty is what the C call reports as TUTTI_ERR_PEER (then e.g.
        comm.shrink(absent)). A rank that came after the others agreed without it raises
        TimeoutError."""
        flag, wait_ms = _int(flag, "agree's flag"), _int(wait_ms, "agree's wait_ms")
        if not 0 <= flag <= 0xFFFFFFFF:
            raise InvalidArgError(f"agree's flag {flag} is not an unsigned 32-bit value")
        f = ctypes.c_uint32(flag)
        size = self.size
        absent = (ctypes.c_int * max(size, 1))()
        n = ctypes.c_int(0)
        st = _lib_.tutti_comm_agree(self._handle(), wait_ms, ctypes.byref(f), absent,
                                    ctypes.byref(n))
        if st < 0 and st != PeerError.status:
            raise self._error(st, "agree")
        return f.value, [absent[i] for i in range(n.value)]

    def grow(self, size):
        """ncclCommGrow: every rank calls it with the new size; new processes call
        Communicator.join(store) to fill the places. Ranks keep their numbers."""
        size = _int(size, "grow's size")
        h = ctypes.c_void_p()
        st = _lib_.tutti_comm_grow(self._handle(), size, ctypes.byref(h))
        if st < 0:
            raise self._error(st, "grow")
        return self._child(h)

    def _child(self, h):
        child = Communicator.__new__(Communicator)
        child._setup()
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
        """Wait for this communicator's operations (each bounded by its deadline), then
        free it. One left running by an interrupted blocking call (Ctrl-C) is aborted
        instead of waited for (once it ended, not). A communicator inherited through fork
        is only forgotten (the fork hook took its handle)."""
        h = self._h
        if h:
            self._h = None
            _reap(every=True)  # an interrupted op that has ended is no reason to abort
            if any(e[2] == h for e in list(_orphans)):
                _lib_.tutti_comm_abort(h)
            _lib_.tutti_comm_destroy(h)
            _reap(every=True)  # its ops have ended
        self._store = None

    def _release(self):
        if getattr(self, "_h", None) and _on_library_thread():
            # dropped inside a library callback (a garbage collection in an Op's function,
            # on the progress thread): destroying would wait for that very thread
            _orphan_comms.append((self._h, self._store))
            self._h = None
            return
        self.destroy()

    # ---- the calls: buffers in, the C function, errors out ----

    def _run(self, name, bufs, args, async_op, op=None, detail="", need_work=False):
        """Issue collective `name` (op: the tutti.Op it runs, if any; detail: what a
        timeout's message adds to the name). A blocking call on host memory made on the
        main thread (with `interruptible`) is issued async and waited for so that Ctrl-C
        gets in (_wait_sliced), its failure explained by its own work
        (tutti_work_error); other blocking calls are the library's, but for need_work (a
        receive that must say who sent). Returns the Work (async_op), the sending rank
        (need_work), else None."""
        h = self._h or self._handle()
        if _orphans or _orphan_comms:
            _reap()
        dev = False
        for b in bufs:
            if b.dev is not None:
                self._check_device(name, bufs)
                dev = True  # a blocking call the library's: stream-ordered ones return
                break       # once enqueued
        main = (not async_op and not dev and interruptible and
                threading.get_ident() == _main_ident)
        if not (async_op or main or need_work):
            return self._run_blocking(h, name, args, op)
        mark = op._mark() if op is not None else 0
        w = ctypes.c_void_p()
        owned = False  # once the handle is freed or a Work holds it
        try:
            st = _FN_ASYNC[name](h, *args, ctypes.byref(w))
            if st < 0:
                with self._lock:  # as _run_blocking's
                    raise self._error(st, name)
            if async_op:
                work = Work(w, bufs, self, (name, detail))
                owned = True
                if op is not None:
                    # the op's error count when the call completes (from the thread that
                    # completes it): fn's exceptions after that are later calls'
                    state, end = op._state, [None]

                    def done(arg, status):
                        end[0] = state.count  # (on the library's thread: see _release)
                    work._op, work._mark, work._end = op, mark, end
                    work._done_cb = _lib.DONE_FN(done)  # kept with the Work, which outlives the call
                    _lib_.tutti_work_on_done(w, work._done_cb, None)
                return work
            st = _wait_sliced(w) if main else _wait_handle(w, None)[0]
            msg = _lib_.tutti_work_error(w).decode() if st < 0 else ""
            src = _lib_.tutti_work_source(w)
            cnt = _lib_.tutti_work_count(w)
            owned = True
            _lib_.tutti_work_free(w)
        except BaseException:
            if w.value and not owned:
                # interrupted (Ctrl-C) while it runs: the library may still write the
                # buffers, which stay alive until it ends (_reap; destroy aborts it)
                _orphans.append((w.value, (bufs, op), h))
            raise
        if st < 0:
            raise error_for(st, msg)
        if op is not None:
            op._raise_since(mark)
        return (src, cnt) if need_work == "count" else src if need_work else None

    def _run_blocking(self, h, name, args, op):
        """The library's blocking call (its fast path runs the op on this thread). Its
        failure's explanation is last_error, read after the call under _lock: a failure on
        another thread in between (of a blocking call, or on the progress thread) can
        replace it (docs/python.md)."""
        mark = op._mark() if op is not None else 0
        st = _FN[name](h, *args)  # the buffers are held until they go out of scope
        if st < 0:
            with self._lock:
                raise self._error(st, name)
        if op is not None:
            op._raise_since(mark)

    @staticmethod
    def _pair(send, recv, dtype, what, carry=False, strided=False):
        """recv (written) and send (read; None or recv itself: in place), same dtype
        (carry: any element type, as bytes, for the calls that only move data; strided:
        a 1-D strided recv taken in place, where it is the call's one buffer)."""
        out = Buffer(recv, f"{what}'s output", True, dtype, carry,
                     strided and (send is None or send is recv))
        if send is None or send is recv:
            return out, None, _lib.IN_PLACE
        inp = Buffer(send, f"{what}'s input", False, dtype, carry)
        _same(inp, out, what, "input", "output")
        return out, inp, inp.ptr

    def _blocks(self, buf, what):
        """A buffer's elements per rank, for a call whose one buffer holds size blocks."""
        n = _elems(buf)
        if n % self.size:
            raise InvalidArgError(f"tutti: rank {self.rank}: {what} of {n} elements does not "
                                  f"split into {self.size} blocks")
        return buf.count // self.size

    def _root(self, root, name):
        """root as a C int, and what a message adds to the call's name."""
        root = _int(root, f"{name}'s root")
        return root, f" (root {root})"

    def _reduce_all(self, name, buf, out, op, dtype, async_op):
        """allreduce, scan, exscan: buf in, out (None: in place into buf) out."""
        if out is None:
            o, i, sp = self._pair(None, buf, dtype, name, strided=True)
        else:
            o, i, sp = self._pair(buf, out, dtype, name)
            _holds(name, self.rank, i, _elems(o), "the input", "the output's length")
        bufs = [b for b in (o, i) if b is not None]
        v, op = _resolve_op(op)
        v = _logical_op(bufs, v, name)
        return self._run(name, bufs, (sp, o.ptr, o.count, o.cdt, v), async_op, op)

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
        root, detail = self._root(root, "broadcast")
        b = Buffer(buf, "broadcast's buffer", True, dtype, carry=True, strided=True)
        return self._run("broadcast", [b], (b.ptr, b.ptr, b.count, b.cdt, root), async_op,
                         detail=detail)

    def barrier(self, async_op=False):
        return self._run("barrier", [], (), async_op)

    def reduce(self, buf, out=None, op="sum", root=0, dtype=None, async_op=False):
        """Reduce every rank's buf into root's out (None: in place into buf at root)."""
        root, detail = self._root(root, "reduce")
        if self.rank != root or out is None:
            i = Buffer(buf, "reduce's input", self.rank == root and out is None, dtype,
                       strided=True)
            sp = _lib.IN_PLACE if self.rank == root else i.ptr
            rp = i.ptr if self.rank == root else None
            v, op = _resolve_op(op)
            v = _logical_op([i], v, "reduce")
            return self._run("reduce", [i], (sp, rp, i.count, i.cdt, v, root), async_op,
                             op, detail)
        o, i, sp = self._pair(buf, out, dtype, "reduce")
        _holds("reduce", self.rank, i, _elems(o), "the input", "the output's length")
        bufs = [b for b in (o, i) if b is not None]
        v, op = _resolve_op(op)
        v = _logical_op(bufs, v, "reduce")
        return self._run("reduce", bufs, (sp, o.ptr, o.count, o.dtype, v, root), async_op,
                         op, detail)

    def allgather(self, buf, out, dtype=None, async_op=False):
        """Every rank's buf, in rank order, into every rank's out (size x buf). In place:
        buf None (or out itself), this rank's block already at its place in out."""
        o, i, sp = self._pair(buf, out, dtype, "allgather", carry=True)
        if i is None:
            return self._run("allgather", [o], (sp, o.ptr, self._blocks(o, "allgather's "
                             "output (in place)"), o.dtype), async_op)
        _holds("allgather", self.rank, o, _elems(i) * self.size, "the output",
               f"{self.size} x the input's length")
        return self._run("allgather", [o, i], (sp, o.ptr, i.count, o.dtype), async_op)

    def allgatherv(self, buf, out, counts, displs=None, dtype=None, async_op=False):
        """Rank i's buf (counts[i] elements) into every rank's out at displs[i] (None:
        back to back). In place: buf None (or out itself), this rank's block already at
        its place in out."""
        o, i, sp = self._pair(buf, out, dtype, "allgatherv", carry=True)
        n, me = self.size, self.rank
        cl, dl = _entries(counts, n, "counts"), _entries(displs, n, "displs")
        if cl is None:
            raise InvalidArgError("tutti: allgatherv needs counts")
        c, d = _c_sizes(cl, "counts", o.k), _c_sizes(dl, "displs", o.k)
        _fits("allgatherv", me, cl, dl, "counts", "displs", o, "the output")
        if i is not None:
            _holds("allgatherv", me, i, cl[me], "the input", f"counts[{me}]")
        bufs = [b for b in (o, i) if b is not None]
        return self._run("allgatherv", bufs, (sp, o.ptr, c, d, o.dtype), async_op)

    def reduce_scatter(self, buf, out, op="sum", dtype=None, async_op=False):
        """Rank r gets the reduction of every rank's block r of buf (size x out). In
        place: buf None (or out itself), out holding every block; the result goes to
        out's first block."""
        o, i, sp = self._pair(buf, out, dtype, "reduce_scatter")
        if i is None:
            count = self._blocks(o, "reduce_scatter's buffer (in place)")
        else:
            _holds("reduce_scatter", self.rank, i, _elems(o) * self.size, "the input",
                   f"{self.size} x the output's length")
            count = o.count
        bufs = [b for b in (o, i) if b is not None]
        v, op = _resolve_op(op)
        v = _logical_op(bufs, v, "reduce_scatter")
        return self._run("reduce_scatter", bufs, (sp, o.ptr, count, o.dtype, v), async_op, op)

    def reduce_scatterv(self, buf, out, counts, op="sum", dtype=None, async_op=False):
        """Rank r gets the reduction of every rank's block r of buf (blocks of counts[i]
        elements, back to back) in out (counts[r] elements). In place: buf None (or out
        itself), out holding every block; the result goes to its start."""
        o, i, sp = self._pair(buf, out, dtype, "reduce_scatterv")
        n, me = self.size, self.rank
        cl = _entries(counts, n, "counts")
        if cl is None:
            raise InvalidArgError("tutti: reduce_scatterv needs counts")
        c = _c_sizes(cl, "counts")
        if i is None:
            _holds("reduce_scatterv", me, o, sum(cl), "the buffer (in place)", "sum(counts)")
        else:
            _holds("reduce_scatterv", me, i, sum(cl), "the input", "sum(counts)")
            _holds("reduce_scatterv", me, o, cl[me], "the output", f"counts[{me}]")
        bufs = [b for b in (o, i) if b is not None]
        v, op = _resolve_op(op)
        v = _logical_op(bufs, v, "reduce_scatterv")
        return self._run("reduce_scatterv", bufs, (sp, o.ptr, c, o.dtype, v), async_op, op)

    def _rooted(self, what, mine, mine_writes, roots, root, dtype, times=None):
        """Every rank's buffer (gather's input, scatter's output) and the root's other one
        (None elsewhere), which must hold `times` x mine when times is given: (mine,
        root's, bufs). In place at the root (mine None or roots itself): mine is None."""
        sides = ("output", "input") if mine_writes else ("input", "output")
        if self.rank == root and (mine is None or mine is roots):
            r = Buffer(roots, f"{what}'s {sides[1]}", not mine_writes, dtype, carry=True)
            return None, r, [r]
        m = Buffer(mine, f"{what}'s {sides[0]}", mine_writes, dtype, carry=True)
        if self.rank != root:
            return m, None, [m]
        r = Buffer(roots, f"{what}'s {sides[1]}", not mine_writes,
                   m.dtype if dtype is not None or m.k == 1 else None, carry=True)
        _same(m, r, what, sides[0], sides[1])
        if times is not None:
            _holds(what, self.rank, r, _elems(m) * times, f"the {sides[1]}",
                   f"{times} x the {sides[0]}'s length")
        return m, r, [m, r]

    def _root_layout(self, what, r, counts, displs, cname, bwhat):
        """The root's layout over its buffer r: (counts list, C counts, C displs)."""
        n = self.size
        cl, dl = _entries(counts, n, cname), _entries(displs, n, "displs")
        if cl is None:
            raise InvalidArgError(f"tutti: {what} needs {cname} at the root")
        c, d = _c_sizes(cl, cname, r.k), _c_sizes(dl, "displs", r.k)
        _fits(what, self.rank, cl, dl, cname, "displs", r, bwhat)
        return cl, c, d

    def gather(self, buf, out=None, root=0, dtype=None, async_op=False):
        """Every rank's buf into root's out (size x buf), in rank order. In place at the
        root: buf None (or out itself), its block already at its place in out."""
        root, detail = self._root(root, "gather")
        i, o, bufs = self._rooted("gather", buf, False, out, root, dtype, self.size)
        if i is None:
            count = self._blocks(o, "gather's output (in place)")
            args = (_lib.IN_PLACE, o.ptr, count, o.dtype, root)
        else:
            args = (i.ptr, o.ptr if o else None, i.count, i.dtype, root)
        return self._run("gather", bufs, args, async_op, detail=detail)

    def gatherv(self, buf, out, counts, displs=None, root=0, dtype=None, async_op=False):
        """Rank i's buf into root's out at displs[i] (None: back to back), counts[i]
        elements (counts and displs matter at the root). In place at the root: buf None
        (or out itself), its block already at its place in out."""
        root, detail = self._root(root, "gatherv")
        me = self.rank
        i, o, bufs = self._rooted("gatherv", buf, False, out, root, dtype)
        rp = c = d = None
        if o is not None:
            cl, c, d = self._root_layout("gatherv", o, counts, displs, "counts", "the output")
            if i is None:
                return self._run("gatherv", bufs, (_lib.IN_PLACE, cl[me] * o.k, o.ptr, c, d,
                                                   o.dtype, root), async_op, detail=detail)
            _holds("gatherv", me, i, cl[me], "the input", f"counts[{me}]")
            rp = o.ptr
        return self._run("gatherv", bufs, (i.ptr, i.count, rp, c, d, i.dtype, root), async_op,
                         detail=detail)

    def scatter(self, buf, out, root=0, dtype=None, async_op=False):
        """Block r of root's buf (size x out) to rank r's out. In place at the root: out
        None (or buf itself), its block left in buf."""
        root, detail = self._root(root, "scatter")
        o, i, bufs = self._rooted("scatter", out, True, buf, root, dtype, self.size)
        if o is None:
            count = self._blocks(i, "scatter's input (in place)")
            args = (i.ptr, _lib.IN_PLACE_OUT, count, i.dtype, root)
        else:
            args = (i.ptr if i else None, o.ptr, o.count, o.dtype, root)
        return self._run("scatter", bufs, args, async_op, detail=detail)

    def scatterv(self, buf, counts, out, displs=None, root=0, dtype=None, async_op=False):
        """Block i of root's buf (counts[i] elements at displs[i]; None: back to back) to
        rank i's out. In place at the root: out None (or buf itself), its block left in
        buf."""
        root, detail = self._root(root, "scatterv")
        me = self.rank
        o, i, bufs = self._rooted("scatterv", out, True, buf, root, dtype)
        sp = c = d = None
        if i is not None:
            cl, c, d = self._root_layout("scatterv", i, counts, displs, "counts", "the input")
            if o is None:
                return self._run("scatterv", bufs, (i.ptr, c, d, _lib.IN_PLACE_OUT,
                                                    cl[me] * i.k, i.dtype, root),
                                 async_op, detail=detail)
            _holds("scatterv", me, o, cl[me], "the output", f"counts[{me}]")
            sp = i.ptr
        return self._run("scatterv", bufs, (sp, c, d, o.ptr, o.count, o.dtype, root), async_op,
                         detail=detail)

    def alltoall(self, buf, out=None, dtype=None, async_op=False):
        """Block j of buf to rank j; block i of out from rank i (out None: in place)."""
        if out is None:
            o, i, sp = self._pair(None, buf, dtype, "alltoall", carry=True)
        else:
            o, i, sp = self._pair(buf, out, dtype, "alltoall", carry=True)
            _holds("alltoall", self.rank, i, _elems(o), "the input", "the output's length")
        count = self._blocks(o, "alltoall's buffer")
        bufs = [b for b in (o, i) if b is not None]
        return self._run("alltoall", bufs, (sp, o.ptr, count, o.dtype), async_op)

    def alltoallv(self, buf, send_counts, out, recv_counts, send_displs=None,
                  recv_displs=None, dtype=None, async_op=False):
        """send_counts[j] elements of buf at send_displs[j] to rank j; recv_counts[i]
        from rank i into out at recv_displs[i] (displacements None: back to back). In
        place: buf None (or out itself), with one layout for both."""
        o, i, sp = self._pair(buf, out, dtype, "alltoallv", carry=True)
        n, k, me = self.size, o.k, self.rank
        rc, rd = _entries(recv_counts, n, "recv_counts"), _entries(recv_displs, n, "recv_displs")
        sc, sd = _entries(send_counts, n, "send_counts"), _entries(send_displs, n, "send_displs")
        if rc is None or (sc is None and i is not None):
            raise InvalidArgError("tutti: alltoallv needs send_counts and recv_counts")
        if i is None and sc is not None and (sc, sd) != (rc, rd):
            raise InvalidArgError("tutti: alltoallv in place (buf None or out itself) takes "
                                  "one layout: send_counts and send_displs as the receive's")
        args = (sp, _c_sizes(sc, "send_counts", k), _c_sizes(sd, "send_displs", k), o.ptr,
                _c_sizes(rc, "recv_counts", k), _c_sizes(rd, "recv_displs", k), o.dtype)
        if i is not None:
            _fits("alltoallv", me, sc, sd, "send_counts", "send_displs", i, "the input")
        _fits("alltoallv", me, rc, rd, "recv_counts", "recv_displs", o, "the output")
        bufs = [b for b in (o, i) if b is not None]
        return self._run("alltoallv", bufs, args, async_op)

    # ---- topologies (MPI_Dist_graph_create_adjacent, MPI_Cart_create) ----

    def create_dist_graph_adjacent(self, sources, destinations):
        """MPI_Dist_graph_create_adjacent (mpi4py's Create_dist_graph_adjacent, without
        weights or reordering): every rank calls it with the ranks it receives from and
        those it sends to (repeats allowed, tutti.PROC_NULL too); a new communicator of
        the same ranks carrying the graph. Edges whose ends disagree fail every rank."""
        src = [_int(r, "sources' rank") for r in sources]
        dst = [_int(r, "destinations' rank") for r in destinations]
        h = ctypes.c_void_p()
        st = _lib_.tutti_dist_graph_create_adjacent(self._handle(), len(src), _c_ints(src),
                                                    len(dst), _c_ints(dst), ctypes.byref(h))
        if st < 0:
            raise self._error(st, "create_dist_graph_adjacent")
        return self._child(h)

    def create_dist_graph(self, sources, degrees, destinations):
        """MPI_Dist_graph_create (mpi4py's Create_dist_graph, without weights or
        reordering): every rank names any edges, degrees[i] of them from sources[i] to the
        next entries of destinations; each rank gets those at it, by the naming rank and
        its order."""
        src = [_int(r, "sources' rank") for r in sources]
        deg = [_int(d, "degrees' entry") for d in degrees]
        dst = [_int(r, "destinations' rank") for r in destinations]
        bad = None
        if len(deg) != len(src):
            bad = f"{len(deg)} degrees for {len(src)} sources"
        elif all(d >= 0 for d in deg) and sum(deg) != len(dst):
            bad = f"the degrees sum to {sum(deg)}, destinations has {len(dst)}"
        arrs = [_c_ints(x) for x in (src, deg, dst)]
        h = ctypes.c_void_p()
        # (a bad call still takes part, as n -1, so that every rank fails with it)
        st = _lib_.tutti_dist_graph_create(self._handle(), -1 if bad else len(src), *arrs,
                                           ctypes.byref(h))
        if bad:
            raise InvalidArgError(f"tutti: rank {self.rank}: create_dist_graph: {bad}")
        if st < 0:
            raise self._error(st, "create_dist_graph")
        return self._child(h)

    def create_cart(self, dims, periods=None):
        """MPI_Cart_create (mpi4py's Create_cart, without reordering): a grid of dims
        (row-major over this communicator's first prod(dims) ranks), periodic along the
        dimensions where periods is true; every rank passes the same. A rank past the
        grid gets None."""
        d = [_int(x, "create_cart's dims") for x in dims]
        p = [1 if x else 0 for x in (periods if periods is not None else [0] * len(d))]
        bad = len(p) != len(d)
        h = ctypes.c_void_p()
        # (a bad call still takes part, as ndims -1, so that every rank fails with it)
        st = _lib_.tutti_cart_create(self._handle(), -1 if bad else len(d), _c_ints(d),
                                     _c_ints(p, max(len(p), len(d))), ctypes.byref(h))
        if bad:
            raise InvalidArgError(f"tutti: rank {self.rank}: create_cart: {len(p)} periods for "
                                  f"{len(d)} dims")
        if st < 0:
            raise self._error(st, "create_cart")
        return self._child(h) if h else None

    def cart_sub(self, remain_dims):
        """MPI_Cart_sub (mpi4py's Sub): the grid of the dimensions kept (remain_dims[i]
        true) through this rank; every rank keeps the same."""
        keep = [1 if x else 0 for x in remain_dims]
        nd = self._grid()
        bad = len(keep) != nd and nd > 0
        if bad:  # (still takes part, with -1s, so that every rank fails with it)
            keep = [-1] * nd
        h = ctypes.c_void_p()
        st = _lib_.tutti_cart_sub(self._handle(), _c_ints(keep, nd), ctypes.byref(h))
        if bad:
            raise InvalidArgError(f"tutti: rank {self.rank}: cart_sub: {len(remain_dims)} "
                                  f"remain_dims for a grid of {nd} dimensions")
        if st < 0:
            raise self._error(st, "cart_sub")
        return self._child(h)

    @property
    def topology(self):
        """None, "graph" or "cart" (MPI_Topo_test)."""
        k = ctypes.c_int(0)
        _lib_.tutti_topo_test(self._handle(), ctypes.byref(k))
        return {1: "graph", 2: "cart"}.get(k.value)

    def _degrees(self):
        i, o = ctypes.c_int(0), ctypes.c_int(0)
        st = _lib_.tutti_topo_neighbors_count(self._handle(), ctypes.byref(i), ctypes.byref(o))
        if st < 0:
            raise self._error(st, "neighbors")
        return i.value, o.value

    @property
    def neighbors(self):
        """(sources, destinations) of this rank's topology, in the order the neighbourhood
        collectives lay out their blocks (a grid: per dimension, the rank back, then the
        one forward; tutti.PROC_NULL past an edge)."""
        n_in, n_out = self._degrees()
        a, b = _c_ints(n=n_in), _c_ints(n=n_out)
        st = _lib_.tutti_topo_neighbors(self._handle(), n_in, a, n_out, b)
        if st < 0:
            raise self._error(st, "neighbors")
        return list(a[:n_in]), list(b[:n_out])

    def _grid(self):
        nd = ctypes.c_int(0)
        st = _lib_.tutti_cartdim_get(self._handle(), ctypes.byref(nd))
        if st < 0:
            raise self._error(st, "cart")
        return nd.value

    def cart_get(self):
        """MPI_Cart_get: (dims, periods, coords) of this rank's grid."""
        nd = self._grid()
        d, p, c = (_c_ints(n=nd) for _ in range(3))
        st = _lib_.tutti_cart_get(self._handle(), nd, d, p, c)
        if st < 0:
            raise self._error(st, "cart_get")
        return list(d[:nd]), [bool(x) for x in p[:nd]], list(c[:nd])

    def cart_rank(self, coords):
        """MPI_Cart_rank: the rank at coords (wrapped where periodic)."""
        nd = self._grid()
        c = [_int(x, "cart_rank's coords") for x in coords]
        if len(c) != nd:
            raise InvalidArgError(f"tutti: cart_rank: {len(c)} coords for {nd} dimensions")
        r = ctypes.c_int(-1)
        st = _lib_.tutti_cart_rank(self._handle(), _c_ints(c), ctypes.byref(r))
        if st < 0:
            raise self._error(st, "cart_rank")
        return r.value

    def cart_coords(self, rank=None):
        """MPI_Cart_coords: rank's coordinates (None: this rank's)."""
        nd = self._grid()
        rank = self.rank if rank is None else _int(rank, "cart_coords' rank")
        c = _c_ints(n=nd)
        st = _lib_.tutti_cart_coords(self._handle(), rank, nd, c)
        if st < 0:
            raise self._error(st, "cart_coords")
        return list(c[:nd])

    def cart_shift(self, direction, disp=1):
        """MPI_Cart_shift: (source, dest), the ranks disp back and forward along
        direction; tutti.PROC_NULL past a non-periodic edge."""
        s, d = ctypes.c_int(0), ctypes.c_int(0)
        st = _lib_.tutti_cart_shift(self._handle(), _int(direction, "cart_shift's direction"),
                                    _int(disp, "cart_shift's disp"), ctypes.byref(s),
                                    ctypes.byref(d))
        if st < 0:
            raise self._error(st, "cart_shift")
        return s.value, d.value

    def _neighbor_pair(self, buf, out, dtype, what):
        if buf is None or buf is out:
            raise InvalidArgError(f"tutti: {what} is not in place (MPI's neither): pass buf "
                                  "and out")
        o, i, sp = self._pair(buf, out, dtype, what, carry=True)
        return o, i, sp, self._degrees()

    def neighbor_allgather(self, buf, out, dtype=None, async_op=False):
        """MPI_Neighbor_allgather: buf to every destination; the block from source j
        into out at j x len(buf) (out: indegree x len(buf))."""
        o, i, sp, (n_in, _) = self._neighbor_pair(buf, out, dtype, "neighbor_allgather")
        _holds("neighbor_allgather", self.rank, o, _elems(i) * n_in, "the output",
               f"indegree {n_in} x the input's length")
        return self._run("neighbor_allgather", [o, i], (sp, o.ptr, i.count, o.dtype), async_op)

    def neighbor_allgatherv(self, buf, out, counts, displs=None, dtype=None, async_op=False):
        """MPI_Neighbor_allgatherv: buf to every destination; counts[j] elements from
        source j into out at displs[j] (None: back to back)."""
        w = "neighbor_allgatherv"
        o, i, sp, (n_in, _) = self._neighbor_pair(buf, out, dtype, w)
        cl, dl = _entries(counts, n_in, "counts", "sources"), _entries(displs, n_in, "displs",
                                                                      "sources")
        if cl is None:
            raise InvalidArgError(f"tutti: {w} needs counts")
        _fits(w, self.rank, cl, dl, "counts", "displs", o, "the output", "source")
        args = (sp, i.count, o.ptr, _c_sizes(cl, "counts", o.k), _c_sizes(dl, "displs", o.k),
                o.dtype)
        return self._run(w, [o, i], args, async_op)

    def neighbor_alltoall(self, buf, out, dtype=None, async_op=False):
        """MPI_Neighbor_alltoall: block i of buf (outdegree blocks) to destination i; the
        block from source j into out's block j (indegree blocks, of the same size)."""
        w = "neighbor_alltoall"
        o, i, sp, (n_in, n_out) = self._neighbor_pair(buf, out, dtype, w)
        ni, no = _elems(i), _elems(o)
        blk = ni // n_out if n_out else no // n_in if n_in else 0
        if (n_out and ni != blk * n_out) or (n_in and no != blk * n_in):
            raise InvalidArgError(f"tutti: rank {self.rank}: {w}: the input's {ni} elements "
                                  f"and the output's {no} are not blocks of one size for "
                                  f"outdegree {n_out} and indegree {n_in}")
        return self._run(w, [o, i], (sp, o.ptr, blk * o.k, o.dtype), async_op)

    def neighbor_alltoallv(self, buf, send_counts, out, recv_counts, send_displs=None,
                           recv_displs=None, dtype=None, async_op=False):
        """MPI_Neighbor_alltoallv: send_counts[i] elements of buf at send_displs[i] to
        destination i; recv_counts[j] from source j into out at recv_displs[j]
        (displacements None: back to back)."""
        w = "neighbor_alltoallv"
        o, i, sp, (n_in, n_out) = self._neighbor_pair(buf, out, dtype, w)
        k, me = o.k, self.rank
        sc = _entries(send_counts, n_out, "send_counts", "destinations")
        sd = _entries(send_displs, n_out, "send_displs", "destinations")
        rc = _entries(recv_counts, n_in, "recv_counts", "sources")
        rd = _entries(recv_displs, n_in, "recv_displs", "sources")
        if sc is None or rc is None:
            raise InvalidArgError(f"tutti: {w} needs send_counts and recv_counts")
        _fits(w, me, sc, sd, "send_counts", "send_displs", i, "the input", "destination")
        _fits(w, me, rc, rd, "recv_counts", "recv_displs", o, "the output", "source")
        args = (sp, _c_sizes(sc, "send_counts", k), _c_sizes(sd, "send_displs", k), o.ptr,
                _c_sizes(rc, "recv_counts", k), _c_sizes(rd, "recv_displs", k), o.dtype)
        return self._run(w, [o, i], args, async_op)

    def send(self, buf, peer, tag=0, dtype=None, async_op=False):
        peer = _int(peer, "send's peer")
        tag = _int(tag, "send's tag", 0, (1 << 32) - 1)
        b = Buffer(buf, "send's buffer", False, dtype, carry=True)
        return self._run("send", [b], (b.ptr, b.count, b.dtype, peer, tag), async_op,
                         detail=f" to rank {peer} (tag {tag})")

    def recv(self, buf, peer=None, tag=0, dtype=None, async_op=False, status=None):
        """Receive into buf from rank peer, or from whichever rank sends this tag first
        (peer None or tutti.ANY_SOURCE); tag tutti.ANY_TAG: whatever the tag (MPI's
        order: the first message no receive issued before takes). Returns the sending
        rank, or with async_op a Work whose source (and tag) say it once done. status: a
        tutti.Status the blocking call fills (source, tag, count)."""
        if status is not None and not async_op:
            w = self.recv(buf, peer, tag, dtype, async_op=True)
            w.wait()
            status._take(w.source, w.tag, w.count)
            return w.source
        peer = _lib.ANY_SOURCE if peer is None else _int(peer, "recv's peer")
        tag = _int(tag, "recv's tag", 0, (1 << 32) - 1)
        b = Buffer(buf, "recv's buffer", True, dtype, carry=True, strided=True)
        src = "any rank" if peer == _lib.ANY_SOURCE else f"rank {peer}"
        args, detail = (b.ptr, b.count, b.cdt, peer, tag), f" from {src} ({_tag_text(tag)})"
        if async_op:
            return self._run("recv", [b], args, True, detail=detail)
        if peer != _lib.ANY_SOURCE:
            self._run("recv", [b], args, False, detail=detail)
            return peer
        # the library's blocking call cannot say who sent: an async one and its work can
        return self._run("recv", [b], args, False, detail=detail, need_work=True)

    def recv_upto(self, buf, peer=None, tag=0, dtype=None, async_op=False, status=None):
        """MPI_Recv's count as a bound: receive the next message of tag from rank peer
        (None or tutti.ANY_SOURCE: any rank) of up to buf's count, into its start (the
        rest untouched). Its dtype must be buf's, but a "uint8" buffer takes any message by
        its bytes. Returns (source, count), or with async_op a Work whose source and count
        say them once done. A message that does not fit raises MismatchError and stays
        for a receive with room (the communicator goes on). Host memory only. status: a
        tutti.Status the blocking call fills."""
        if status is not None and not async_op:
            w = self.recv_upto(buf, peer, tag, dtype, async_op=True)
            w.wait()
            status._take(w.source, w.tag, w.count)
            return w.source, w.count
        peer = _lib.ANY_SOURCE if peer is None else _int(peer, "recv_upto's peer")
        tag = _int(tag, "recv_upto's tag", 0, (1 << 32) - 1)
        b = Buffer(buf, "recv_upto's buffer", True, dtype, carry=True, strided=True)
        if b.dev is not None:
            raise InvalidArgError(f"tutti: recv_upto: its buffer is on {b.dev}: it takes "
                                  "host memory only")
        src = "any rank" if peer == _lib.ANY_SOURCE else f"rank {peer}"
        args, detail = (b.ptr, b.count, b.cdt, peer, tag), f" from {src} ({_tag_text(tag)})"
        return self._run("recv_upto", [b], args, async_op, detail=detail,
                         need_work=False if async_op else "count")

    def probe(self, peer=None, tag=0):
        """MPI_Probe: wait for a message of tag from rank peer (None or tutti.ANY_SOURCE:
        any rank; tag tutti.ANY_TAG: of whatever tag) that a recv issued now would take,
        and take nothing: a Probe(source, count, dtype, nbytes, tag) to receive it with,
        e.g. `buf = bytearray(p.nbytes); comm.recv(buf, p.source, p.tag, dtype=p.dtype)`. TimeoutError past the
        communicator's timeout, which leaves the communicator usable. Not interrupted by
        Ctrl-C (the library's wait; bounded by the timeout)."""
        return self._probe(False, peer, tag)

    def iprobe(self, peer=None, tag=0):
        """MPI_Iprobe: one look, as probe's: a Probe, or None where no such message came."""
        return self._probe(True, peer, tag)

    def mprobe(self, peer=None, tag=0):
        """MPI_Mprobe: as probe, and the message found is taken (no other receive gets it,
        whatever other threads receive meanwhile): a Message, received already, whose
        recv() copies it out. TimeoutError past the communicator's timeout takes
        nothing."""
        return self._probe(False, peer, tag, True)

    def improbe(self, peer=None, tag=0):
        """MPI_Improbe: one look, as mprobe's: a Message, or None where none came."""
        return self._probe(True, peer, tag, True)

    def _probe(self, once, peer, tag, matched=False):
        name = ("i" if once else "") + ("m" if matched else "") + "probe"
        peer = _lib.ANY_SOURCE if peer is None else _int(peer, f"{name}'s peer")
        tag = _int(tag, f"{name}'s tag", 0, (1 << 32) - 1)
        flag, info, msg = ctypes.c_int(), _lib.MsgInfo(), ctypes.c_void_p()
        h = self._h or self._handle()
        if matched:
            out = (None, None, None)
            st = (_lib_.tutti_improbe(h, peer, tag, ctypes.byref(flag), ctypes.byref(msg), *out)
                  if once else _lib_.tutti_mprobe(h, peer, tag, ctypes.byref(msg), *out))
            if st == 0 and not once:
                flag.value = 1
            if st == 0 and flag.value:
                _lib_.tutti_message_info(msg.value, ctypes.byref(info))
        else:  # (tutti_probe_info: the tag too, for ANY_TAG)
            st = _lib_.tutti_probe_info(h, peer, tag, ctypes.byref(flag) if once else None,
                                        ctypes.byref(info))
            if st == 0 and not once:
                flag.value = 1
        if st < 0:
            with self._lock:
                raise self._error(st, name)
        if not flag.value:
            return None
        dt = _name(info.dtype)
        if matched:
            try:
                return Message(msg.value, self.rank, info.source, info.tag, info.count, dt)
            except BaseException:
                _lib_.tutti_message_free(msg.value)
                raise
        return Probe(info.source, info.count, dt, info.count * _SIZES[info.dtype], info.tag)

    # ---- Python objects, pickled: mpi4py's lowercase calls, torch's *_object ----------
    # (unpickling runs code a peer chose: as with mpi4py and torch, only between ranks of
    # one trusted job; a job secret, TUTTI_AUTH_TOKEN, keeps others off the links)

    def send_object(self, obj, peer, tag=0):
        """Send obj, pickled, to rank peer (mpi4py's comm.send; recv_object takes it)."""
        self.send(_pickle(obj), peer, tag, dtype="uint8")

    def recv_object(self, peer=None, tag=0, status=None):
        """An object send_object sent with tag from rank peer (None: any rank):
        (obj, source). Takes it with mprobe (as mpi4py does), so that threads receiving
        objects of one tag at once each get one whole."""
        m = self.mprobe(peer, tag)
        if status is not None:
            status._take(m.source, m.tag, m.count)
        if m.source == PROC_NULL:  # (mpi4py's: None from no rank)
            m.recv()
            return None, PROC_NULL
        return _unpickle(m.recv()), m.source

    def broadcast_object(self, obj=None, root=0):
        """root's obj to every rank (mpi4py's comm.bcast, torch's broadcast_object_list):
        every rank returns it (root: obj itself). Where root cannot pickle it, root raises
        pickle's error and the others PeerError naming root, at once."""
        data, err = _pickled(obj) if self.rank == root else (b"", None)
        n = array.array("q", [-1 if err else len(data)])
        self.broadcast(n, root)
        if n[0] < 0:
            self._objects_failed("broadcast_object", [root], err)
        buf = bytearray(data) if self.rank == root else bytearray(n[0])
        self.broadcast(buf, root, dtype="uint8")
        return obj if self.rank == root else _unpickle(buf)

    def allgather_object(self, obj):
        """Every rank's obj, in rank order, on every rank (mpi4py's comm.allgather,
        torch's all_gather_object). A rank that cannot pickle its obj raises pickle's
        error, and the others PeerError naming it, at once."""
        data, err = _pickled(obj)
        sizes = array.array("q", [0]) * self.size
        self.allgather(array.array("q", [-1 if err else len(data)]), sizes)
        self._objects_failed("allgather_object", [r for r, n in enumerate(sizes) if n < 0], err)
        out = bytearray(sum(sizes))
        self.allgatherv(data, out, list(sizes), dtype="uint8")
        return _split_objects(out, sizes)

    def gather_object(self, obj, root=0):
        """Every rank's obj, in rank order, at root (a list; None elsewhere: mpi4py's
        comm.gather, torch's gather_object). A rank that cannot pickle its obj raises
        pickle's error, and the others PeerError naming it, at once (the sizes go to
        every rank, so that all of them know)."""
        data, err = _pickled(obj)
        me = self.rank == root
        sizes = array.array("q", [0]) * self.size
        self.allgather(array.array("q", [-1 if err else len(data)]), sizes)
        self._objects_failed("gather_object", [r for r, n in enumerate(sizes) if n < 0], err)
        out = bytearray(sum(sizes)) if me else None
        self.gatherv(data, out, list(sizes), root=root, dtype="uint8")
        return _split_objects(out, sizes) if me else None

    def scatter_object(self, objs=None, root=0):
        """objs[r] (a sequence of size objects at root; ignored elsewhere) to rank r:
        each rank returns its own (mpi4py's comm.scatter, torch's scatter_object_list).
        A root whose objs are not size objects raises InvalidArgError (one it cannot
        pickle, pickle's error), and the other ranks PeerError naming root, at once."""
        me = self.rank == root
        datas, err = self._pickled_each("scatter_object", objs, "root's ") if me else ([], None)
        sizes = (array.array("q", [-1] * self.size if err else [len(d) for d in datas])
                 if me else None)
        mine = array.array("q", [0])
        self.scatter(sizes, mine, root)
        if mine[0] < 0:
            self._objects_failed("scatter_object", [root], err)
        buf = bytearray(mine[0])
        self.scatterv(b"".join(datas) if me else None, list(sizes) if me else None, buf,
                      root=root, dtype="uint8")
        return _unpickle(buf)

    def allreduce_object(self, obj, op=operator.add):
        """Every rank's obj reduced by op (a function of two objects) in rank order,
        ((obj0 op obj1) op obj2) ..., on every rank (mpi4py's comm.allreduce of objects,
        op default: +). Pickling failures as allgather_object's."""
        return functools.reduce(op, self.allgather_object(obj))

    def reduce_object(self, obj, root=0, op=operator.add):
        """allreduce_object's result at root, None elsewhere (mpi4py's comm.reduce)."""
        objs = self.gather_object(obj, root)
        return functools.reduce(op, objs) if objs is not None else None

    def scan_object(self, obj, op=operator.add):
        """obj0 op ... op obj(rank), the inclusive prefix in rank order (comm.scan)."""
        return functools.reduce(op, self.allgather_object(obj)[:self.rank + 1])

    def exscan_object(self, obj, op=operator.add):
        """obj0 op ... op obj(rank - 1); None on rank 0 (comm.exscan)."""
        objs = self.allgather_object(obj)[:self.rank]
        return functools.reduce(op, objs) if objs else None

    def alltoall_object(self, objs):
        """objs[j] (a sequence of size objects) to rank j; returns what each rank sent to
        this one, in rank order (mpi4py's comm.alltoall of objects). A rank whose objs
        are not size objects raises InvalidArgError (one it cannot pickle, pickle's
        error), and the others PeerError naming it, at once."""
        n = self.size
        datas, err = self._pickled_each("alltoall_object", objs, "")
        sizes = array.array("q", [-1] * n if err else [len(d) for d in datas])
        got = array.array("q", [0]) * n
        self.alltoall(sizes, got)
        self._objects_failed("alltoall_object", [r for r, k in enumerate(got) if k < 0], err)
        out = bytearray(sum(got))
        self.alltoallv(b"".join(datas), list(sizes), out, list(got), dtype="uint8")
        return _split_objects(out, got)

    def sendrecv(self, buf, dest, out, source=None, sendtag=0, recvtag=0, dtype=None,
                 status=None):
        """MPI_Sendrecv: buf to rank dest and a receive into out from rank source (None:
        any rank) at once, so that ranks exchanging with each other cannot block on their
        sends, whatever the size. Returns the sending rank."""
        w = self.send(buf, dest, tag=sendtag, dtype=dtype, async_op=True)
        return _after_send(w, lambda: self.recv(out, source, tag=recvtag, dtype=dtype,
                                                status=status))

    def sendrecv_object(self, obj, dest, source=None, sendtag=0, recvtag=0, status=None):
        """obj, pickled, to rank dest and an object from rank source (None: any rank) at
        once (mpi4py's comm.sendrecv): (obj received, its source)."""
        w = self.send(_pickle(obj), dest, tag=sendtag, dtype="uint8", async_op=True)
        return _after_send(w, lambda: self.recv_object(source, recvtag, status))

    def _pickled_each(self, call, objs, whose):
        """objs, size objects (one a rank), pickled: (their data, None), or ([], why not:
        InvalidArgError for another count, pickle's error for one it cannot pickle)."""
        if objs is None or len(objs) != self.size:
            return [], InvalidArgError(
                f"tutti: rank {self.rank}: {call}: {whose}objs must be {self.size} objects, "
                f"one a rank (got {'None' if objs is None else len(objs)})")
        datas = []
        for o in objs:
            data, err = _pickled(o)
            if err is not None:
                return [], err
            datas.append(data)
        return datas, None

    def _objects_failed(self, call, failed, err):
        """After an object call's sizes went round: raise where any rank could not pickle
        (its own error on that rank, PeerError naming it elsewhere); both parts of the
        call are skipped on every rank, so the communicator goes on."""
        if err is not None:
            raise err
        if failed:
            raise PeerError(f"tutti: rank {self.rank}: {call}: rank(s) "  # noqa: F405
                            f"{', '.join(map(str, failed))} could not send its object "
                            "(pickling failed there, or a bad argument: that rank raised why)")


def _tag_text(tag):
    return "any tag" if tag == ANY_TAG else f"tag {tag}"


def _after_send(w, receive):
    """receive()'s result once send w is done too (a sendrecv's two halves): its failure
    is the one raised (the send's then only repeats it)."""
    try:
        got = receive()
    except BaseException:
        try:
            w.wait()
        except Error:
            pass
        raise
    w.wait()
    return got


def _pickled(obj):
    """obj pickled, or the exception pickling raised (then b"")."""
    try:
        return _pickle(obj), None
    except Exception as e:  # noqa: BLE001 (raised again by _objects_failed)
        return b"", e


class Message:
    """What Communicator.mprobe took (MPI_Message): source, tag, count, dtype and nbytes,
    as a Probe's, and the message itself, received already; recv() copies it out once
    (free() drops it unread; so does the garbage collector)."""

    __slots__ = ("_m", "_lock", "_rank", "source", "tag", "count", "dtype", "nbytes")

    def __init__(self, handle, rank, source, tag, count, dtype):
        self._m, self._lock, self._rank = handle, threading.Lock(), rank
        self.source, self.tag, self.count, self.dtype = source, tag, count, dtype
        self.nbytes = count * _SIZES[dtype_of(dtype)]

    def __repr__(self):
        return (f"tutti.Message(source={self.source}, tag={self.tag}, count={self.count}, "
                f"dtype={self.dtype!r}{', used' if self._m is None else ''})")

    def recv(self, buf=None, dtype=None):
        """Copy the message into buf, whose count and dtype (dtype= reads buf as another)
        must be the message's (MismatchError naming both, and the message stays); buf
        None: into a new bytearray of nbytes, returned. Host memory only."""
        what = (f"rank {self._rank}: mrecv of the message from rank {self.source} "
                f"(tag {self.tag}, {self.count} x {self.dtype})")
        if buf is None:
            out = bytearray(self.nbytes)
            b = Buffer(out, "mrecv's buffer", True, self.dtype)
        else:
            out, b = None, Buffer(buf, "mrecv's buffer", True, dtype, carry=True, strided=True)
            if b.dev is not None:
                raise InvalidArgError(f"tutti: {what}: its buffer is on {b.dev}: a message "
                                      "is copied out to host memory")
            if self.source != PROC_NULL and (b.count != self.count or
                                             b.dtype != dtype_of(self.dtype)):
                raise MismatchError(f"tutti: {what}: the buffer holds {b.count} x "  # noqa: F405
                                    f"{_name(b.dtype)}")
        with self._lock:
            m, self._m = self._m, None
        if m is None:
            raise InvalidArgError(f"tutti: {what}: received (or freed) already")
        st = _lib_.tutti_mrecv(m, b.ptr, b.count, b.cdt)
        if st < 0:  # (checked above: not reached but by a library that disagrees)
            with self._lock:
                self._m = m
            raise error_for(st, f"tutti: {what}: {_lib_.tutti_strerror(st).decode()}")
        return out if buf is None else None

    def free(self):
        """Drop the message unread."""
        with self._lock:
            m, self._m = self._m, None
        if m is not None:
            _lib_.tutti_message_free(m)

    def __del__(self):
        m = getattr(self, "_m", None)
        if m is not None and _lib_ is not None:  # (None: the interpreter is tearing down)
            _lib_.tutti_message_free(m)


def _pickle(obj):
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _unpickle(buf):
    return pickle.loads(buf)


def _split_objects(buf, sizes):
    """The objects pickled back to back in buf, sizes[i] bytes each."""
    out, at, view = [], 0, memoryview(buf)
    for n in sizes:
        out.append(_unpickle(view[at:at + n]))
        at += n
    return out


def _name(dtype):
    return _lib_.tutti_dtype_name(dtype).decode()
