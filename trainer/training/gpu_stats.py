"""GPU utilisation and memory from NVML, read when Prometheus scrapes: absent, not zero, on CPU.

NVML (``nvidia-ml-py``'s ``pynvml``) is imported only where this node's processes drive CUDA
devices, and read only at scrape time, so the step loop never waits on it. Each of the node's
GPUs is found by the UUID torch reports for it (NVML's own indices ignore
``CUDA_VISIBLE_DEVICES``), and labelled with the global rank that drives it:
``rank = node_rank x processes per node + local device index``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)


def _device_uuid(index: int) -> str | None:
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith("GPU-") else f"GPU-{text}"


class GpuCollector(Collector):
    """``gpu_utilization`` (percent), ``gpu_memory_used_bytes`` and ``gpu_memory_total_bytes``
    of this node's GPUs, one sample per rank."""

    def __init__(self, nvml: Any, handles: dict[int, Any]) -> None:
        """Args:
        nvml: the ``pynvml`` module, initialised.
        handles: NVML device handle per global rank.
        """
        self._nvml = nvml
        self._handles = handles

    @classmethod
    def for_node(cls, *, node_rank: int, local_world_size: int) -> GpuCollector | None:
        """The collector for this node's CUDA devices; ``None`` without CUDA or NVML."""
        if not torch.cuda.is_available():
            return None
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as e:  # ImportError, or NVMLError (no driver library): no GPU metrics
            log.warning("NVML is not available (%s): no GPU utilisation metrics", e)
            return None
        handles: dict[int, Any] = {}
        for local in range(min(local_world_size, torch.cuda.device_count())):
            rank = node_rank * local_world_size + local
            uuid = _device_uuid(local)
            try:
                if uuid is not None:
                    handles[rank] = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                else:
                    handles[rank] = pynvml.nvmlDeviceGetHandleByIndex(local)
            except pynvml.NVMLError as e:
                log.warning("NVML has no device for rank %d (%s): left out", rank, e)
        return cls(pynvml, handles) if handles else None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        util = GaugeMetricFamily(
            "gpu_utilization",
            "Percent of the last sample period the GPU was busy (NVML), per rank",
            labels=["rank"],
        )
        used = GaugeMetricFamily(
            "gpu_memory_used_bytes", "GPU memory in use (NVML, all processes)", labels=["rank"]
        )
        total = GaugeMetricFamily("gpu_memory_total_bytes", "GPU memory", labels=["rank"])
        for rank, handle in sorted(self._handles.items()):
            try:
                rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            except self._nvml.NVMLError as e:  # a GPU that fell off the bus: its samples go
                log.warning("NVML could not read rank %d's GPU: %s", rank, e)
                continue
            util.add_metric([str(rank)], float(rates.gpu))
            used.add_metric([str(rank)], float(memory.used))
            total.add_metric([str(rank)], float(memory.total))
        yield from (util, used, total)

    def close(self) -> None:
        """Shut NVML down (the process is ending)."""
        with contextlib.suppress(self._nvml.NVMLError):  # already shut down
            self._nvml.nvmlShutdown()
