"""Prefetching batches on a background thread, copied to the GPU ahead of the step that needs them.

The data stream runs on the host (index gathers, Parquet reads). Without prefetching the GPU idles
while the next batch is cut and copied; with it, a thread keeps ``depth`` batches ready and, on
CUDA, already on the device:

- each batch is copied into pinned (page-locked) host memory, which lets the host-to-device copy
  run asynchronously by DMA instead of through a staging buffer;
- the copy is issued with ``non_blocking=True`` on a side CUDA stream, so it overlaps the
  compute queued on the training stream, and an event marks its end;
- the consumer makes its current stream wait on that event (a device-side wait, no host sync)
  and calls ``record_stream`` so the caching allocator does not hand the batch's memory to the
  side stream again while the training stream may still read it.

On the CPU it only prefetches. The order of batches, and the positions that come with them, are
exactly those of the wrapped iterator: one thread consumes it, through a FIFO queue.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Generic, TypeVar

import torch

P = TypeVar("P")

# How often a blocked producer looks at the stop flag: bounds how long close() waits for it.
_POLL_S = 0.05


class _End:
    """Queue marker: the wrapped iterator is exhausted."""


class _Failed:
    """Queue marker: the wrapped iterator (or the copy) raised ``error``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher(Generic[P]):
    """Iterates ``(position, x, y)`` like the wrapped iterator, ``depth`` batches ahead.

    Use it as a context manager (or call :meth:`close`) so the thread stops with the loop::

        with Prefetcher(iter(stream), device=ctx.device) as batches:
            for position, x, y in batches:
                ...

    Args:
        batches: The source, e.g. ``iter(BatchStream(...))``; consumed only by the background
            thread from now on.
        device: Where the batches are wanted. On a CUDA device they arrive there (pinned,
            non-blocking copies on a side stream); elsewhere they are passed through unchanged.
        depth: Batches kept ready ahead of the consumer (at least 1).

    Raises:
        ValueError: If ``depth`` is below 1, or ``device`` is CUDA and CUDA is not available.
    """

    def __init__(
        self,
        batches: Iterator[tuple[P, torch.Tensor, torch.Tensor]],
        *,
        device: torch.device,
        depth: int = 2,
    ) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self.device = device
        self.depth = depth
        self._cuda = device.type == "cuda"
        if self._cuda and not torch.cuda.is_available():
            raise ValueError(f"cannot prefetch to {device}: CUDA is not available")
        self._copy_stream = torch.cuda.Stream(device=device) if self._cuda else None
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(
            target=_produce,
            args=(batches, self._queue, self._stop, device, self._copy_stream),
            name="gpupipe-prefetch",
            daemon=True,
        )
        self._thread.start()
        # A prefetcher dropped without close() (an exception unwinding the loop) still stops.
        self._finalizer = weakref.finalize(self, self._stop.set)

    def __iter__(self) -> Prefetcher[P]:
        return self

    def __next__(self) -> tuple[P, torch.Tensor, torch.Tensor]:
        """The next batch, on ``device``; re-raises whatever the source raised.

        Raises:
            StopIteration: The source is exhausted, or the prefetcher is closed.
        """
        if self._done:
            raise StopIteration
        item = self._queue.get()
        if isinstance(item, _End):
            self._done = True
            raise StopIteration
        if isinstance(item, _Failed):
            self.close()
            raise item.error
        position, x, y, ready = item
        if ready is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(ready)  # on the device: the host does not wait
            x.record_stream(current)
            y.record_stream(current)
        return position, x, y

    def close(self) -> None:
        """Stops the thread and drops the batches it prepared. Safe to call more than once."""
        self._done = True
        self._stop.set()
        while self._thread.is_alive():
            self._drain()
            self._thread.join(timeout=_POLL_S)
        self._drain()
        self._finalizer.detach()

    def _drain(self) -> None:
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass

    def __enter__(self) -> Prefetcher[P]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _produce(
    batches: Iterator[tuple[Any, torch.Tensor, torch.Tensor]],
    out: queue.Queue[Any],
    stop: threading.Event,
    device: torch.device,
    copy_stream: torch.cuda.Stream | None,
) -> None:
    """The thread's body: pull, (pin and copy,) enqueue, until stopped or the source ends.

    A module-level function, not a method, so the thread holds no reference to the
    ``Prefetcher`` and cannot keep it alive past its last user.
    """

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    try:
        for position, x, y in batches:
            if stop.is_set():
                return
            ready: torch.cuda.Event | None = None
            if copy_stream is not None:
                x, y, ready = _to_device(x, y, device, copy_stream)
            if not put((position, x, y, ready)):
                return
        put(_End())
    except BaseException as e:  # handed to the consumer, which re-raises it
        put(_Failed(e))


def _to_device(
    x: torch.Tensor, y: torch.Tensor, device: torch.device, stream: torch.cuda.Stream
) -> tuple[torch.Tensor, torch.Tensor, torch.cuda.Event]:
    """Pinned, non-blocking copies of ``x`` and ``y`` on ``stream``; the event marks their end.

    The caching host allocator records the copy on the pinned blocks, so they are not reused
    before the copy has read them even though the host tensors go out of scope here.
    """
    x_host = x if x.is_pinned() else x.pin_memory()
    y_host = y if y.is_pinned() else y.pin_memory()
    with torch.cuda.device(device), torch.cuda.stream(stream):
        x_dev = x_host.to(device, non_blocking=True)
        y_dev = y_host.to(device, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(stream)
    return x_dev, y_dev, ready
