"""Buffers without copies: the buffer protocol (NumPy arrays, bytearray, memoryview),
DLPack (torch tensors, on the CPU or a CUDA device) and the CUDA array interface (CuPy,
Numba). Device memory is staged by the library (docs/architecture.md, "Device buffers"),
on a communicator that takes it (Communicator.device). A Buffer holds the exporter's
buffer (or the DLPack capsule) until released, so the memory cannot move or go away while
an operation uses it."""
import ctypes
import re
import struct
import sys

from . import _lib
from ._errors import InvalidArgError

def dtype_of(name):
    """A dtype given as a tutti name or one of the library's spellings ("f32", "bf16",
    "float32", "half" ...), a NumPy/torch dtype, or a tutti_dtype_t value."""
    if isinstance(name, int):
        if not 0 <= name < len(_DTYPE_NAMES):
            raise InvalidArgError(f"tutti: {name} is not a tutti dtype value")
        return name
    text = str(name)
    for prefix in ("torch.", "numpy."):
        if text.startswith(prefix):
            text = text[len(prefix):]
    out = ctypes.c_int()
    if _lib.lib.tutti_dtype_parse(text.encode(), ctypes.byref(out)) < 0:
        raise InvalidArgError(f"tutti: unknown dtype {name!r}")
    return out.value


# The library's dtypes: names and sizes by tutti_dtype_t value (it names an invalid one "?").
_DTYPE_NAMES = []
while _lib.lib.tutti_dtype_name(len(_DTYPE_NAMES)) != b"?":
    _DTYPE_NAMES.append(_lib.lib.tutti_dtype_name(len(_DTYPE_NAMES)).decode())
_SIZES = [_lib.lib.tutti_dtype_size(d) for d in range(len(_DTYPE_NAMES))]

# struct format characters (PEP 3118) by item size -> dtype.
_FORMATS = {k: dtype_of(v) for k, v in {
    ("b", 1): "int8", ("B", 1): "uint8", ("c", 1): "uint8", ("i", 4): "int32",
    ("l", 4): "int32", ("q", 4): "int32", ("i", 8): "int64", ("l", 8): "int64",
    ("q", 8): "int64", ("n", 8): "int64", ("e", 2): "float16", ("f", 4): "float32",
    ("d", 8): "float64", ("h", 2): "int16", ("H", 2): "uint16", ("I", 4): "uint32",
    ("L", 4): "uint32", ("L", 8): "uint64", ("Q", 8): "uint64", ("N", 8): "uint64",
    ("Zf", 8): "complex64", ("Zd", 16): "complex128"}.items()}
# bool (0 or 1 a byte): uint8 on the wire, and its reductions logical (Buffer.logical)
_BOOL = -1
_FORMATS[("?", 1)] = _BOOL


# A struct format's byte-order prefixes that mean this host's order: '@' and '=' (native),
# and '<' or '>' (with '!') where that is the host's. Items in the other order have no
# tutti dtype: the calls that only move data carry them as bytes, reductions refuse them.
_NATIVE_ORDER = "@=" + ("<" if sys.byteorder == "little" else ">!")


# MPI's value-index pairs as NumPy's aligned structured dtypes export them
# (np.dtype([("v", np.float64), ("i", np.int32)], align=True): "T{d:v:i:i:}", 16 bytes):
# (value's format character, itemsize) -> dtype; the int32 right after the value, at
# C's offset (short's padding shown as "xx").
_PAIR = re.compile(r"T\{([@=<>!]?)([fdlqih]):[^:]*:(x*)([@=<>!]?)i:[^:]*:\}$")
def _c_size(vtype):
    """sizeof(struct { vtype v; int32_t i; }) on this host (16 for a double's on LP64)."""
    class S(ctypes.Structure):
        _fields_ = [("v", vtype), ("i", ctypes.c_int32)]
    return ctypes.sizeof(S)


_PAIRS = {("f", _c_size(ctypes.c_float), ""): "float_int",
          ("d", _c_size(ctypes.c_double), ""): "double_int",
          ("l", _c_size(ctypes.c_int64), ""): "long_int",
          ("q", _c_size(ctypes.c_int64), ""): "long_int",
          ("i", _c_size(ctypes.c_int32), ""): "2int",
          ("h", _c_size(ctypes.c_int16), "xx"): "short_int"}
# (the calls that only move data carry such arrays as their bytes, as any record)
_PAIR_DTYPES = {dtype_of(n) for n in set(_PAIRS.values())}


def _format_dtype(fmt, itemsize, what, buf):
    """The dtype of a buffer-protocol format (None: none; buf.foreign set for items in
    the other byte order)."""
    m = _PAIR.match(fmt) if fmt.startswith("T{") else None
    if m:  # (this host's byte order: none given, or named; the size checks the padding)
        native = all(not o or o in _NATIVE_ORDER for o in (m.group(1), m.group(4)))
        name = _PAIRS.get((m.group(2), itemsize, m.group(3)))
        return dtype_of(name) if name and native and struct.calcsize("=i") == 4 else None
    if len(fmt) > 1 and fmt[0] in "@=<>!":
        if fmt[0] not in _NATIVE_ORDER:
            buf.foreign = True
            return None
        fmt = fmt[1:]
    return _FORMATS.get((fmt, itemsize))


class Py_buffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p),
                ("len", ctypes.c_ssize_t), ("itemsize", ctypes.c_ssize_t),
                ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
                ("strides", ctypes.POINTER(ctypes.c_ssize_t)),
                ("suboffsets", ctypes.POINTER(ctypes.c_ssize_t)),
                ("internal", ctypes.c_void_p)]


_api = ctypes.pythonapi
_api.PyObject_GetBuffer.argtypes = [ctypes.py_object, ctypes.POINTER(Py_buffer), ctypes.c_int]
_api.PyObject_GetBuffer.restype = ctypes.c_int
_api.PyBuffer_Release.argtypes = [ctypes.POINTER(Py_buffer)]
_api.PyBuffer_Release.restype = None
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_PYBUF_RECORDS_RO = 0x0004 | 0x0018  # PyBUF_FORMAT | PyBUF_STRIDES
# PyBUF_FORMAT | PyBUF_ANY_CONTIGUOUS (| PyBUF_WRITABLE): C or Fortran order
_PYBUF_ANY_CONTIG = 0x0004 | 0x0080 | 0x0018
_PYBUF_WRITABLE = 0x0001


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


# DLPack (code, bits) -> dtype: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLComplex 5,
# kDLFloat8_e4m3fn 10, kDLFloat8_e5m2 12 (DLPack 1.1).
_DL_DTYPES = {k: dtype_of(v) for k, v in {
    (0, 8): "int8", (1, 8): "uint8", (0, 32): "int32", (0, 64): "int64", (2, 16): "float16",
    (4, 16): "bfloat16", (2, 32): "float32", (2, 64): "float64", (0, 16): "int16",
    (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64", (5, 64): "complex64",
    (5, 128): "complex128", (10, 8): "float8_e4m3fn", (12, 8): "float8_e5m2"}.items()}
_DL_DTYPES[(6, 8)] = _BOOL  # kDLBool
_KDLCPU, _KDLCUDA, _KDLCUDAHOST, _KDLCUDAMANAGED = 1, 2, 3, 13
# where the host may read and write the memory itself
_DL_HOST = (_KDLCPU, _KDLCUDAHOST, _KDLCUDAMANAGED)

# __cuda_array_interface__ typestr (without its byte order) -> dtype
_CAI_DTYPES = {k: dtype_of(v) for k, v in {
    "i1": "int8", "u1": "uint8", "i2": "int16", "u2": "uint16", "i4": "int32", "u4": "uint32",
    "i8": "int64", "u8": "uint64", "f2": "float16", "f4": "float32", "f8": "float64",
    "c8": "complex64", "c16": "complex128"}.items()}
_CAI_DTYPES["b1"] = _BOOL


class _Export:
    """A Py_buffer taken with PyObject_GetBuffer (read-only inputs, and arrays in
    Fortran order), released on drop."""
    __slots__ = ("view",)

    def __init__(self, obj, flags=_PYBUF_RECORDS_RO):
        self.view = Py_buffer()
        _api.PyObject_GetBuffer(obj, ctypes.byref(self.view), flags)

    def __del__(self):
        _api.PyBuffer_Release(ctypes.byref(self.view))


_U8 = dtype_of("uint8")


class _StridedType:
    """A derived type (tutti_type_resized) that reads a 1-D strided array in place: its
    elements `stride` bytes apart. Freed on drop (a call in flight holds its own)."""
    __slots__ = ("value",)

    def __init__(self, dtype, stride, what):
        out = ctypes.c_int()
        if _lib.lib.tutti_type_resized(dtype, 0, stride, ctypes.byref(out)) < 0:
            raise InvalidArgError(f"tutti: {what}: "
                                  f"{_lib.lib.tutti_comm_last_error(None).decode()}")
        self.value = out.value

    def __del__(self):
        _lib.lib.tutti_type_free(self.value)


# what a written strided array's refusal adds, where the call could take a 1-D one
_STRIDED_CALLS = ("(a 1-D one with a positive stride is taken in place by broadcast, recv, "
                  "recv_upto, mrecv, and allreduce, scan, exscan and reduce in place)")


class Buffer:
    """One exported buffer: address, size in bytes, element count and dtype. It holds the
    export (or the DLPack capsule) until released or dropped. With carry, an element type
    tutti has no dtype for (bool, complex, ...) travels as its bytes: dtype uint8, k bytes
    an item (k is 1 otherwise), for the calls that only move data."""
    __slots__ = ("ptr", "nbytes", "count", "dtype", "k", "dev", "what", "_hold", "foreign",
                 "logical", "stride", "strided", "_type")

    def __init__(self, obj, what, writable, dtype=None, carry=False, strided=False):
        """strided: a written 1-D strided array (numpy, torch on the CPU) is taken in
        place, through a derived type (`cdt`), by a call of this one buffer."""
        self.dev, self.what, self.foreign = None, what, False  # dev: "cuda:N" for device memory
        self.stride, self.strided, self._type = 0, strided, None
        self._init(obj, what, writable, dtype, carry)
        if self.stride:  # elements stride bytes apart: their type, its dtype's size each
            if self.k != 1 or self.nbytes != self.count * _SIZES[self.dtype]:
                self._hold = None
                raise InvalidArgError(f"tutti: {what} is not contiguous, and its items are "
                                      "not one dtype's elements: make a contiguous copy")
            self._type = _StridedType(self.dtype, self.stride, what)

    @property
    def cdt(self):
        """The dtype the call passes: a strided array's derived type, else dtype."""
        return self._type.value if self._type is not None else self.dtype

    def _init(self, obj, what, writable, dtype, carry):
        tensor = _torch_tensor()
        if tensor is not None and isinstance(obj, tensor):
            src_dtype, itemsize = self._from_torch(obj, what, writable)
        else:
            src_dtype, itemsize = self._from_other(obj, what, writable)
        self.k = 1
        # bool items: uint8, reduced logically (the reducing calls map the op: _logical_op)
        self.logical = src_dtype == _BOOL and dtype is None
        if src_dtype == _BOOL:
            src_dtype = _U8
        if dtype is None and carry and src_dtype in _PAIR_DTYPES:
            src_dtype = None  # moved as bytes, as before pairs had dtypes (dtype= names one)
        if dtype is None and src_dtype is None and carry:
            src_dtype, self.k, itemsize = _U8, itemsize, 1
        if self.foreign and not carry:
            self._hold = None
            order = "big" if sys.byteorder == "little" else "little"
            raise InvalidArgError(f"tutti: {what} holds {order}-endian items, which tutti "
                                  "does not reduce (this host is "
                                  f"{sys.byteorder}-endian): convert it first (NumPy: "
                                  "a.astype(a.dtype.newbyteorder('='))); calls that only "
                                  "move data take it as it is")
        if dtype is None:
            if src_dtype is None:
                self._hold = None
                raise InvalidArgError(f"tutti: {what} has an element type tutti does not "
                                      "reduce (int8, uint8, int16, uint16, int32, uint32, "
                                      "int64, uint64, float16, bfloat16, float32, float64, "
                                      "complex64, complex128, float8_e4m3fn, float8_e5m2, "
                                      "and (value, int32) pairs as aligned structured "
                                      "arrays for minloc/maxloc); pass dtype= to read it "
                                      "as one (calls that only move data take any element "
                                      "type)")
            self.dtype = src_dtype
            self.count = self.nbytes // itemsize
            return
        self.dtype = dtype_of(dtype)
        size = _SIZES[self.dtype]
        if itemsize not in (1, size) or self.nbytes % size:
            self._hold = None
            raise InvalidArgError(f"tutti: {what} holds {self.nbytes} bytes of "
                                  f"{itemsize}-byte items, not {size}-byte "
                                  f"{_DTYPE_NAMES[self.dtype]} elements")
        self.count = self.nbytes // size

    def _from_other(self, obj, what, writable):
        try:
            m = memoryview(obj)  # first: host memory (a Numba mapped array has both)
        except TypeError as e:
            if hasattr(obj, "__cuda_array_interface__"):
                return self._from_cai(obj, what, writable)
            if not hasattr(obj, "__dlpack__"):
                raise TypeError(f"tutti: {what} ({type(obj).__name__}) is neither a buffer "
                                f"nor a DLPack tensor: {e}") from None
            return self._from_dlpack(obj, what)
        return self._from_memoryview(m, obj, what, writable)

    def _from_torch(self, t, what, writable):
        """torch tensors directly (DLPack would cost a capsule per call). A
        non-contiguous one that is only read: a contiguous copy of it."""
        if t.device.type == "cuda":
            # the data must be ready when the library copies it (on the legacy stream)
            _torch_cuda_sync(t.device)
            self.dev = f"cuda:{t.device.index}"
        elif t.device.type != "cpu":
            raise InvalidArgError(f"tutti: {what} is on {t.device}; tutti takes host memory "
                                  "and CUDA device memory")
        if not t.is_contiguous():
            if writable and self.strided and t.device.type == "cpu" and t.dim() == 1 and \
                    t.stride(0) > 0:
                self._hold = t  # in place, element by element (the caller's cdt)
                self.ptr = t.data_ptr()
                size = t.element_size()
                self.nbytes = t.numel() * size
                self.stride = t.stride(0) * size
                return _TORCH_DTYPES.get(t.dtype), size
            if writable:
                raise InvalidArgError(f"tutti: {what} is not contiguous (call .contiguous()), "
                                      f"and the operation writes it {_STRIDED_CALLS}")
            t = t.contiguous()
        self._hold = t
        self.ptr = t.data_ptr()
        size = t.element_size()
        self.nbytes = t.numel() * size
        return _TORCH_DTYPES.get(t.dtype), size

    def _from_memoryview(self, m, obj, what, writable):
        if not m.c_contiguous and not m.f_contiguous:
            if writable and self.strided and m.ndim == 1 and m.strides[0] > 0 and \
                    not m.readonly:
                # in place, element by element (the caller's cdt)
                self._hold = e = _Export(obj, _PYBUF_RECORDS_RO | _PYBUF_WRITABLE)
                self.ptr = e.view.buf
                self.nbytes = m.nbytes
                self.stride = m.strides[0]
                return _format_dtype(m.format, m.itemsize, what, self), m.itemsize
            if writable:
                raise InvalidArgError(f"tutti: {what} is not contiguous (make a contiguous "
                                      "copy, e.g. numpy.ascontiguousarray), and the operation "
                                      f"writes it {_STRIDED_CALLS}")
            # only read: its elements in C order, copied (as mpi4py sends a strided
            # array: a refusal on the sender alone left its receiver to its timeout)
            copy = bytearray(m.tobytes())
            self._hold = e = _Export(copy)
            self.ptr = e.view.buf if m.nbytes else None
            self.nbytes = m.nbytes
            return _format_dtype(m.format, m.itemsize, what, self), m.itemsize
        self.nbytes = n = m.nbytes
        if not m.c_contiguous:  # Fortran order: its memory as it lies, as mpi4py takes it
            if m.readonly and writable:
                raise InvalidArgError(f"tutti: {what} is read-only, and the operation writes it")
            self._hold = e = _Export(obj, _PYBUF_ANY_CONTIG | (_PYBUF_WRITABLE if writable else 0))
            self.ptr = e.view.buf
            return _format_dtype(m.format, m.itemsize, what, self), m.itemsize
        if m.readonly:
            if writable:
                raise InvalidArgError(f"tutti: {what} is read-only, and the operation writes it")
            self._hold = e = _Export(obj)
            self.ptr = e.view.buf
        elif n:
            self._hold = h = ctypes.c_char.from_buffer(m)  # holds the export
            self.ptr = ctypes.addressof(h)
        else:
            self._hold, self.ptr = None, None
        return _format_dtype(m.format, m.itemsize, what, self), m.itemsize

    def _from_cai(self, obj, what, writable):
        """CuPy, Numba and the like: __cuda_array_interface__ (version 2 or 3)."""
        cai = obj.__cuda_array_interface__
        ptr, readonly = cai["data"]
        if readonly and writable:
            raise InvalidArgError(f"tutti: {what} is read-only, and the operation writes it")
        typestr, shape = cai["typestr"], tuple(cai["shape"])
        try:
            if typestr[0] == ">" or typestr[1] not in "iufcbV?":
                raise ValueError
            itemsize = int(typestr[2:])
        except (ValueError, IndexError):
            raise InvalidArgError(f"tutti: {what} has element type {typestr!r}, which tutti "
                                  "does not take (little-endian numbers only)") from None
        n = 1
        for dim in shape:
            n *= dim
        strides, expect = cai.get("strides"), itemsize
        for i in range(len(shape) - 1, -1, -1):
            if n and strides is not None and shape[i] != 1 and strides[i] != expect:
                raise InvalidArgError(f"tutti: {what} is not contiguous (make a contiguous "
                                      "copy)")
            expect *= shape[i]
        if cai.get("mask") is not None:
            raise InvalidArgError(f"tutti: {what} is a masked array")
        # version 3: the producer's stream, which the data may still be written on (1 and
        # 2, the default streams, are ordered with the library's copy already)
        stream = cai.get("stream")
        if stream not in (None, 1, 2):
            _cuda_stream_sync(stream, what)
        self._hold = obj
        self.ptr = ptr or None
        self.nbytes = n * itemsize
        self.dev = "cuda"
        return _CAI_DTYPES.get(typestr.lstrip("<>|=")), itemsize

    def _from_dlpack(self, obj, what):
        try:
            dev = obj.__dlpack_device__()[0] if hasattr(obj, "__dlpack_device__") else None
            # a CUDA producer makes its data ready on the legacy default stream (1), the
            # one the library's copies go on
            capsule = obj.__dlpack__(stream=1) if dev == _KDLCUDA else obj.__dlpack__()
        except Exception as e:  # torch: tensors that require grad, ...
            raise InvalidArgError(f"tutti: {what} cannot be shared through DLPack: {e}") from None
        self._hold = capsule  # its destructor runs the tensor's deleter
        t = DLTensor.from_address(_api.PyCapsule_GetPointer(capsule, b"dltensor"))
        if t.device.device_type == _KDLCUDA:
            self.dev = f"cuda:{t.device.device_id}"
        elif t.device.device_type not in _DL_HOST:
            raise InvalidArgError(f"tutti: {what} is on DLPack device type "
                                  f"{t.device.device_type}; tutti takes host memory and CUDA "
                                  "device memory")
        n, expect = 1, 1
        for i in range(t.ndim - 1, -1, -1):
            dim = t.shape[i]
            if t.strides and dim != 1 and t.strides[i] != expect:
                raise InvalidArgError(f"tutti: {what} is not contiguous (call .contiguous())")
            expect *= dim
            n *= dim
        bits = t.dtype.bits
        if t.dtype.lanes != 1 or bits % 8:
            raise InvalidArgError(f"tutti: {what} has a vector or sub-byte element type")
        self.ptr = (t.data or 0) + t.byte_offset
        self.nbytes = n * (bits // 8)
        return _DL_DTYPES.get((t.dtype.code, bits)), bits // 8

    def release(self):
        self._hold = None
        self._type = None


_TORCH_DTYPES = {}
_TORCH = []


_CUDA = []


def _cuda_stream_sync(stream, what):
    """cuStreamSynchronize(stream), through the driver's own library."""
    if not _CUDA:
        try:
            _CUDA.append(ctypes.CDLL("libcuda.so.1"))
        except OSError as e:
            raise InvalidArgError(f"tutti: {what} names CUDA stream {stream:#x}, and the CUDA "
                                  f"driver cannot be loaded to wait for it: {e}") from None
    r = _CUDA[0].cuStreamSynchronize(ctypes.c_void_p(stream))
    if r != 0:
        raise InvalidArgError(f"tutti: {what}: waiting for its CUDA stream {stream:#x} failed "
                              f"(CUDA error {r})")


def _torch_cuda_sync(device):
    """Wait for the work queued on device's current stream (the caller's kernels that
    write the tensor)."""
    sys.modules["torch"].cuda.current_stream(device).synchronize()


def _torch_tensor():
    """torch.Tensor once torch is imported (tutti never imports it itself), else None."""
    if _TORCH:
        return _TORCH[0]
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "Tensor"):
        return None
    names = ("int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64",
             "int16", "complex64", "complex128", "uint16", "uint32",
             "uint64",  # these three: torch >= 2.3
             "float8_e4m3fn", "float8_e5m2")  # torch >= 2.1
    _TORCH_DTYPES.update({getattr(torch, n): dtype_of(n) for n in names if hasattr(torch, n)})
    _TORCH_DTYPES[torch.bool] = _BOOL
    _TORCH.append(torch.Tensor)
    return torch.Tensor
