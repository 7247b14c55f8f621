"""FusedDataParallel: data parallelism driven by tutti's own fuser (<tutti/fuse.h>).

Per-parameter gradient hooks mark each gradient ready as autograd accumulates it; the
fuser packs gradients into buckets in the order they became ready on the first step
(Apex style), issues each bucket's allreduce (an average) as soon as its last gradient
is in, and keeps that order afterwards. With bucket views (the default) the gradients
live inside the bucket buffers, so nothing is copied in or out; a gradient autograd put
elsewhere (after zero_grad(set_to_none=True), or one set from outside) is copied in at
its hook. Without views each parameter has a private buffer registered with the fuser:
the gradient is copied in at its hook and the average back out at the end. fp16/bf16
compression casts buckets down for the wire. backward() returns with the averaged
gradients, as with DistributedDataParallel.
"""
import contextlib
import ctypes
import hashlib
import warnings

import torch

from tutti._errors import MismatchError
from tutti.fuse import Fuser, allreduce_coalesced, broadcast_coalesced


def _view(address, like, owner):
    """A tensor of like's shape and dtype over the memory at address (no copy), which
    keeps owner (what frees that memory: the Fuser) alive as long as it lives: a
    gradient outlives a FusedDataParallel dropped without destroy() (it pointed into
    freed buckets, found by review)."""
    nbytes = like.numel() * like.element_size()
    if nbytes == 0:
        return torch.zeros_like(like)
    raw = (ctypes.c_char * nbytes).from_address(address)
    raw._owner = owner  # torch.frombuffer holds raw for the tensor's storage
    return torch.frombuffer(raw, dtype=like.dtype).view(like.shape)


def _check_same_shapes(comm, module):
    """As DDP verifies parameter shapes across processes: the modules' state (shapes,
    dtypes, which parameters take gradients) must be the same on every rank, or the
    broadcast and the buckets would mix different tensors of equal byte sizes (a
    transposed weight, say) without an error. One small allreduce (MAX of h and -h)."""
    desc = [(name, tuple(t.shape), str(t.dtype)) for name, t in module.state_dict().items()]
    desc += [(name, p.requires_grad) for name, p in module.named_parameters()]
    h = int.from_bytes(hashlib.sha256(repr(desc).encode()).digest()[:7], "little")
    t = torch.tensor([h, -h], dtype=torch.int64)
    allreduce_coalesced(comm, [t], op="max")
    if t[0].item() != h or t[1].item() != -h:
        raise MismatchError(f"tutti: FusedDataParallel: the ranks' modules differ in their "
                            f"parameters' or buffers' shapes, dtypes or requires_grad (rank "
                            f"{comm.rank} has {len(module.state_dict())} entries; the shapes "
                            f"of all state_dict entries must agree, as with DDP)")


class FusedDataParallel(torch.nn.Module):
    """module replicated on every rank of comm (a tutti.Communicator); its parameters
    and buffers start from rank 0's (one coalesced broadcast).

    bucket_cap_mb: bucket size; compression: None, "fp16" or "bf16";
    bucket_views: gradients live in the buckets (no copies); find_unused_parameters:
    parameters that get no gradient in a step count as zeros in the average and are
    left with grad None (every rank must leave out the same ones)."""

    def __init__(self, module, comm, bucket_cap_mb=25, compression=None, bucket_views=True,
                 find_unused_parameters=False, broadcast_buffers=True):
        super().__init__()
        if bucket_cap_mb < 0:
            raise ValueError(f"bucket_cap_mb must not be negative, not {bucket_cap_mb}")
        self.module, self.comm = module, comm
        self.broadcast_buffers = broadcast_buffers
        _check_same_shapes(comm, module)
        state = [t for t in module.state_dict().values() if t.numel()]
        with torch.no_grad():
            broadcast_coalesced(comm, [t.data for t in state], root=0)
        self._params = [p for p in module.parameters() if p.requires_grad]
        cap = max(1, int(bucket_cap_mb * (1 << 20)))
        small = min(cap, 1 << 20)  # the first and last buckets: 1 MiB, as DDP's first
        self._fuser = Fuser(comm, bucket_cap_bytes=cap, op="avg", compress=compression,
                            bucket_views=bucket_views, find_unused=find_unused_parameters,
                            first_bucket_cap_bytes=small, last_bucket_cap_bytes=small)
        self._find_unused = find_unused_parameters
        self._views = bucket_views
        # _grad[p]: the fuser's storage of p's gradient, a view into its bucket (views;
        # _addr[p] is the address it was made at) or p's private registered buffer
        self._index, self._grad, self._addr = {}, {}, {}
        for p in self._params:
            if bucket_views:
                i = self._fuser.register(None, p.numel(), p.dtype)
            else:
                # not p.grad itself: zero_grad(set_to_none=True) drops it, and the
                # gradients autograd makes afterwards would never be reduced
                buf = torch.zeros(p.shape, dtype=p.dtype)
                i = self._fuser.register(buf)
                self._grad[p] = buf
                if p.grad is None:
                    p.grad = buf  # the usual case then needs no copies
            self._index[p] = i
        if bucket_views:
            self._bind(initial=True)
        self._marked = set()  # indices marked this step
        self._pending = set()  # indices that got a gradient under no_sync()
        self._queued = False  # _finish is queued for the running backward
        self._error = None  # the first exception a hook caught this step
        self._sync = True
        self._accs = []  # the AccumulateGrad nodes must live as long as their hooks
        for p in self._params:
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._hook(p))
            self._accs.append(acc)

    def _bind(self, initial=False, unused=()):
        """Views: point every parameter's .grad at its place in its bucket (the places
        move once, at the first step's wait, contents and all; a wait that failed may
        have moved them too). Parameters in `unused` get None."""
        for p in self._params:
            if p in unused:
                p.grad = None
                continue
            if p.numel() == 0:
                continue
            addr = self._fuser.address(self._index[p])
            if self._addr.get(p) != addr:
                self._grad[p] = _view(addr, p, self._fuser)
                self._addr[p] = addr
                if initial and p.grad is not None:
                    self._grad[p].copy_(p.grad)
            if p.grad is None or p.grad.data_ptr() != addr:
                p.grad = self._grad[p]

    def _stage_in(self, p):
        """p's gradient into the fuser's storage, unless it is there already."""
        if p.numel() == 0:
            return
        mine, g = self._grad[p], p.grad
        if g is None:
            mine.zero_()
        elif g.data_ptr() != mine.data_ptr():
            mine.copy_(g)
        if self._views:
            p.grad = mine

    def _hook(self, p):
        index = self._index[p]

        def hook(*_):
            if not self._sync:
                self._pending.add(index)  # reduced with the next synchronized step
                return
            if not self._queued:
                torch.autograd.Variable._execution_engine.queue_callback(self._finish)
                self._queued = True
            try:
                self._stage_in(p)
                self._marked.add(index)
                self._fuser.mark_ready(index)
            except Exception as e:  # raised by _finish once the step has ended
                if self._error is None:
                    self._error = e
        return hook

    def _finish(self):
        """The end of backward: declare what got no gradient, wait for the averages, and
        put the gradients in place. The state is reset and the gradients are rebound
        whatever fails (a failed first wait still moves the views)."""
        errors, unused = [], set()
        try:
            for p in self._params:
                i = self._index[p]
                if i in self._marked:
                    continue
                if i in self._pending:  # accumulated under no_sync() only
                    self._stage_in(p)
                    self._marked.add(i)
                    self._fuser.mark_ready(i)
                elif self._find_unused:
                    unused.add(p)
                    self._fuser.mark_unused(i)
        except Exception as e:
            errors.append(e)
        ok = False
        try:
            self._fuser.wait()
            ok = True
        except Exception as e:
            errors.append(e)
        finally:
            hook_error, self._error = self._error, None
            self._marked.clear()
            self._pending.clear()
            self._queued = False
            if self._views:
                self._bind(unused=unused)
            else:
                for p in self._params:
                    if p in unused:
                        p.grad = None
                    elif ok and p.grad is not None and p.grad.data_ptr() != \
                            self._grad[p].data_ptr():
                        p.grad.copy_(self._grad[p])
        if hook_error is not None:
            errors.insert(0, hook_error)
        if errors:
            raise errors[0]

    @contextlib.contextmanager
    def no_sync(self):
        """As DDP's: backward passes inside accumulate gradients locally, with no
        communication; the first synchronized backward after it reduces the sum."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def forward(self, *args, **kwargs):
        if self._queued:
            # the last backward raised before its end (autograd then drops the queued
            # _finish): close its step, which the other ranks wait for, so that this
            # one can go on; its error (the gradients that never came) is a warning
            # here, the backward's own exception having been the real one
            try:
                self._finish()
            except Exception as e:
                warnings.warn(f"FusedDataParallel: the step of a backward that raised "
                              f"was closed: {e}", RuntimeWarning, stacklevel=2)
        if self.broadcast_buffers:
            bufs = [b for b in self.module.buffers() if b.numel()]
            if bufs:
                with torch.no_grad():
                    broadcast_coalesced(self.comm, bufs, root=0)
        return self.module(*args, **kwargs)

    def destroy(self):
        """Free the fuser (before the communicator is destroyed)."""
        for p in self._params:
            if self._views and p.grad is not None:
                p.grad = p.grad.clone()  # the bucket memory goes with the fuser
        self._fuser.destroy()


__all__ = ["FusedDataParallel"]
