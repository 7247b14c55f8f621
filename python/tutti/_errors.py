"""tutti.Error and one subclass per status code of <tutti/status.h>, named after it
(TUTTI_ERR_TIMEOUT: tutti.TimeoutError), generated from the library's own list."""
import builtins

from . import _lib


class Error(Exception):
    """A tutti failure: `status` is the TUTTI_ERR_* code, the message the library's
    explanation (rank, peer, op and cause where it has them)."""

    status = -16  # TUTTI_ERR_INTERNAL, for subclasses raised without a code

    def __init__(self, message, status=None):
        super().__init__(message)
        if status is not None:
            self.status = status

    @property
    def status_name(self):
        return _lib.lib.tutti_status_name(self.status).decode()


# Python exceptions a status also is, so that `except ValueError` catches bad arguments.
_ALSO = {"INVALID_ARG": ValueError, "TIMEOUT": builtins.TimeoutError, "NOMEM": MemoryError}

_BY_STATUS = {}


def _make_classes():
    out = {}
    status = -1
    while True:
        name = _lib.lib.tutti_status_name(status).decode()
        if not name.startswith("TUTTI_ERR_"):
            break
        short = name[len("TUTTI_ERR_"):]
        cls_name = "".join(w.capitalize() for w in short.split("_")) + "Error"
        bases = (Error, _ALSO[short]) if short in _ALSO else (Error,)
        cls = type(cls_name, bases, {"status": status, "__module__": "tutti",
                                     "__doc__": _lib.lib.tutti_strerror(status).decode()})
        out[cls_name] = cls
        _BY_STATUS[status] = cls
        status -= 1
    return out


globals().update(_make_classes())
__all__ = ["Error", "raise_for"] + [c.__name__ for c in _BY_STATUS.values()]


def error_for(status, message):
    """The exception for a failed call: its class from the status, its text from the
    library (or the status's description when the library said nothing)."""
    if not message:
        message = _lib.lib.tutti_strerror(status).decode()
    return _BY_STATUS.get(status, Error)(message, status)


def raise_for(status, message):
    raise error_for(status, message)
