"""WeightManager: every running instance is a weight source for new ones (HyperFlexis §6 "Fast
Scaling"; HFX paper §3.4).

A new instance from the warm pool gets its weights by one of three paths, as the Provisioner
models them (hfx/cluster/provisioner.py):

- ``d2d`` (peer): copied from a running instance. On CPU the source publishes its tensors once,
  packed into one named shared-memory segment, and any process on the machine copies them out by
  the segment's name (a picklable ``WeightHandle``). Between GPU processes the same handle would
  carry CUDA IPC handles; that path needs a GPU and is not built here.
- ``cpu``: restored from a copy offloaded to host memory (``OffloadedWeights``; pinned when a GPU
  is present, so the copy back is a DMA).
- ``disk``: read from the checkpoint's safetensors files.

``load_weights`` tries the peer first and falls back to disk on any failure (HyperFlexis §6: "in
case of failure, fall back to loading from disk"), reporting which path it took.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing import shared_memory
from pathlib import Path

import torch

from hfx.model.shapes import ModelShape
from hfx.model.transformer import CausalLM
from hfx.model.weights import empty_model, init_buffers, load_state, read_config, read_state_dict

ALIGN = 64  # bytes: every tensor starts on a cache line
CHUNK = 64 << 20  # bytes per parallel copy job


class PeerUnavailable(RuntimeError):
    """The peer's weights cannot be read (segment gone, or not this model's)."""


@dataclass(frozen=True, slots=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class WeightHandle:
    """What a peer needs to copy the weights: picklable, a few kilobytes."""

    segment: str
    entries: tuple[TensorEntry, ...]
    total_bytes: int


class WeightManager:
    """One instance's weights as a source: name → tensor, shareable with peers."""

    def __init__(self, model: CausalLM) -> None:
        self.model = model
        self._shm: shared_memory.SharedMemory | None = None
        self._handle: WeightHandle | None = None

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def share(self) -> WeightHandle:
        """Publish the weights in a shared-memory segment (once; off the scaling path)."""
        if self._handle is not None:
            return self._handle
        tensors = self.tensors()
        entries, offset = [], 0
        for name, t in tensors.items():
            offset = math.ceil(offset / ALIGN) * ALIGN
            nbytes = t.numel() * t.element_size()
            entries.append(TensorEntry(name, str(t.dtype).removeprefix("torch."),
                                       tuple(t.shape), offset, nbytes))
            offset += nbytes
        self._shm = shared_memory.SharedMemory(create=True, size=max(offset, 1))
        for e in entries:
            _view(self._shm, e).copy_(tensors[e.name].cpu())
        self._handle = WeightHandle(self._shm.name, tuple(entries), offset)
        return self._handle

    def close(self) -> None:
        """Stop being a source: the segment goes away (peers that copied keep their copy)."""
        if self._shm is not None:
            self._shm.close()
            self._shm.unlink()
            self._shm, self._handle = None, None


def _view(shm: shared_memory.SharedMemory, e: TensorEntry) -> torch.Tensor:
    dtype = getattr(torch, e.dtype)
    count = e.nbytes // torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer(shm.buf, dtype=dtype, count=count, offset=e.offset).view(e.shape)


def receive(handle: WeightHandle, model: CausalLM) -> None:
    """Copy a peer's weights into ``model`` (the d2d path).

    On Linux the segment is a tmpfs file: ``preadv`` copies each tensor straight into the
    parameter's memory in the kernel, without mapping (and page-faulting) the source. Elsewhere,
    or for a GPU model, the segment is mapped and copied from.
    """
    own = dict(model.named_parameters())
    if model.lm_head is None:
        own.pop("lm_head.weight", None)
    names = {e.name for e in handle.entries} - ({"lm_head.weight"} if model.lm_head is None
                                                 else set())
    if names != set(own):
        raise PeerUnavailable(f"peer holds another model: missing {sorted(set(own) - names)[:5]}"
                              f", unexpected {sorted(names - set(own))[:5]}")
    path = Path("/dev/shm") / handle.segment.lstrip("/")
    direct = path.exists() and all(p.device.type == "cpu" for p in own.values())
    if not direct:
        try:
            shm = shared_memory.SharedMemory(name=handle.segment)
        except FileNotFoundError:
            raise PeerUnavailable(f"peer segment {handle.segment} is gone") from None
        try:
            load_state(model, {e.name: _view(shm, e) for e in handle.entries})
        except ValueError as err:  # not ``e``: the loop below reuses that name
            raise PeerUnavailable(str(err)) from None
        finally:
            shm.close()
        return
    jobs: list[tuple[memoryview, int]] = []  # (destination bytes, offset in the segment)
    for e in handle.entries:
        p = own.get(e.name)
        if p is None:
            continue
        if (str(p.dtype).removeprefix("torch.") != e.dtype or tuple(p.shape) != e.shape
                or not p.is_contiguous()):
            raise PeerUnavailable(f"{e.name}: peer {e.dtype}{list(e.shape)}, "
                                  f"model {p.dtype}{list(p.shape)}")
        # .data is memoryview(array); numpy types arrays as buffers only from Python 3.12
        buf = p.data.view(-1).view(torch.uint8).numpy().data
        jobs += [(buf[i:i + CHUNK], e.offset + i) for i in range(0, e.nbytes, CHUNK)]
    fd = os.open(path, os.O_RDONLY)
    try:
        # preadv releases the GIL: chunks copy in parallel, one kernel copy per core.
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            list(pool.map(lambda job: _pread_all(fd, *job), jobs))
    finally:
        os.close(fd)


def _pread_all(fd: int, buf: memoryview, offset: int) -> None:
    done = 0
    while done < len(buf):  # preadv may return short
        n = os.preadv(fd, [buf[done:]], offset + done)
        if n <= 0:
            raise PeerUnavailable("peer segment ended early")
        done += n


class OffloadedWeights:
    """A host-memory copy of a model's weights, kept by the warm pool (the cpu path)."""

    def __init__(self, model: CausalLM) -> None:
        pin = torch.cuda.is_available()
        self.state = {k: (v.detach().to("cpu", copy=True).pin_memory() if pin
                          else v.detach().to("cpu", copy=True))
                      for k, v in model.state_dict().items()}

    def restore(self, model: CausalLM) -> None:
        load_state(model, self.state)


def warm_model(shape: ModelShape, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu") -> CausalLM:
    """A warm-pool instance's model: parameter memory allocated and touched, no weights yet.

    Touching matters on a virtual machine, where the first write to a page is a host-side fault
    (bench/engine/host_overheads.py: 1 GB took 1.17 s to fill fresh, 0.05 s once touched).
    """
    model = empty_model(shape, dtype, device)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model


@dataclass(frozen=True, slots=True)
class WeightSources:
    """Where a new instance may get its weights, by path: a running peer's published segment
    (``d2d``), a host-memory copy (``cpu``), a checkpoint directory (``disk``). A missing source
    makes its path fall back to disk (HyperFlexis §6)."""

    peer: WeightHandle | None = None
    host: OffloadedWeights | None = None
    checkpoint: str | Path | None = None


def fill_weights(model: CausalLM, path: str, sources: WeightSources) -> str:
    """Load weights into ``model`` (a warm-pool model: memory allocated, no weights) by ``path``;
    returns the path taken: the one asked for, or ``disk`` when its source failed or is
    missing. Raises PeerUnavailable when not even the disk has them."""
    taken = "disk"
    try:
        if path == "d2d" and sources.peer is not None:
            receive(sources.peer, model)
            taken = "d2d"
        elif path == "cpu" and sources.host is not None:
            sources.host.restore(model)
            taken = "cpu"
    except PeerUnavailable:
        pass  # HyperFlexis §6: fall back to loading from disk
    if taken == "disk":
        if sources.checkpoint is None:
            raise PeerUnavailable(f"no {path} source and no checkpoint on disk to fall back to")
        load_state(model, read_state_dict(sources.checkpoint))
    init_buffers(model, next(model.parameters()).device)
    model.eval()
    return taken


def load_weights(checkpoint: str | Path, peer: WeightHandle | None = None,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 into: CausalLM | None = None) -> tuple[CausalLM, str]:
    """A model for ``checkpoint``'s config (``into``, a warm-pool model, when given), from the
    peer when one is given and readable, else from disk. Returns the model and the path taken
    ("d2d" or "disk")."""
    model = into if into is not None else empty_model(read_config(checkpoint), dtype, device)
    path = fill_weights(model, "d2d", WeightSources(peer=peer, checkpoint=checkpoint))
    return model, path
