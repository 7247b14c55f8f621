"""FusedDataParallel: data parallelism driven by tutti's own fuser (<tutti/fuse.h>).

Per-parameter gradient hooks mark each gradient ready as autograd accumulates it; the
fuser packs gradients into buckets in the order they became ready on the first step
(Apex style), issues each bucket's allreduce (an average) as soon as its last gradient
is in, and keeps that order afterwards. With bucket views (the default) the gradients
live inside the bucket buffers, so nothing is copied in or out. fp16/bf16 compression
casts buckets down for the wire. backward() returns with the averaged gradients, as
with DistributedDataParallel.
"""
import ctypes

import torch

from tutti.fuse import Fuser, broadcast_coalesced


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


class FusedDataParallel(torch.nn.Module):
    """module replicated on every rank of comm (a tutti.Communicator); its parameters
    and buffers start from rank 0's (one coalesced broadcast).

    bucket_cap_mb: bucket size; compression: None, "fp16" or "bf16";
    bucket_views: gradients live in the buckets (no copies); find_unused_parameters:
    parameters that get no gradient in a step count as zeros (ranks must agree)."""

    def __init__(self, module, comm, bucket_cap_mb=25, compression=None, bucket_views=True,
                 find_unused_parameters=False, broadcast_buffers=True):
        super().__init__()
        self.module, self.comm = module, comm
        self.broadcast_buffers = broadcast_buffers
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
        self._index, self._bound = {}, {}
        for p in self._params:
            if bucket_views:
                i = self._fuser.register(None, p.numel(), p.dtype)
            else:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                i = self._fuser.register(p.grad)
            self._index[p] = i
        self._bind_views(zero=True)
        self._marked = set()
        self._queued = False
        self._accs = []  # the AccumulateGrad nodes must live as long as their hooks
        for p in self._params:
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._hook(p))
            self._accs.append(acc)

    def _bind_views(self, zero=False):
        """Point every parameter's .grad at its place in its bucket (they move once,
        after the first step's wait; an optimizer's zero_grad(set_to_none=True) drops
        them: rebind before each forward)."""
        if not self._views:
            return
        for p in self._params:
            addr = self._fuser.address(self._index[p])
            g = p.grad
            if g is not None and g.data_ptr() == addr:
                continue
            view = _view(addr, p, self._fuser)
            if g is None or zero:
                view.zero_()
            elif g.data_ptr() != self._bound.get(p):
                view.copy_(g)  # a gradient set from outside (the old view's moved itself)
            p.grad = view
            self._bound[p] = addr

    def _hook(self, p):
        index = self._index[p]

        def hook(*_):
            if not self._queued:
                self._queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            self._marked.add(index)
            self._fuser.mark_ready(index)
        return hook

    def _finish(self):
        if self._find_unused:
            for p in self._params:
                if self._index[p] not in self._marked:
                    self._fuser.mark_unused(self._index[p])
        self._fuser.wait()
        self._marked.clear()
        self._queued = False
        self._bind_views()

    def forward(self, *args, **kwargs):
        self._bind_views()
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
