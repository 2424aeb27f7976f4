"""Measuring: percentiles, rates, time, resident size and CPU seconds."""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (0 to 1), nearest rank."""
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f}"


def load() -> str:
    """This machine's load averages (1, 5, 15 min), for a report's heading."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def best_rate(fn: Callable[[], int], repeats: int = 3) -> float:
    """Best items/s of ``repeats`` runs of fn (which returns how many items it did)."""
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        n = fn()
        rates.append(n / (time.perf_counter() - start))
    return max(rates)


def rss_mb() -> float:
    """This process's resident size now (Linux), else its peak."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class PeakRss:
    """The highest resident size while the block runs, above its size at the start (MiB),
    sampled every 2 ms (``rss_mb``), and minor page faults."""

    def __enter__(self) -> PeakRss:
        self.start = self.peak = rss_mb()
        self.faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss_mb())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb())
        self.above = self.peak - self.start
        self.faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self.faults


def timed(fn: Callable[[], object]) -> dict:
    """One call's seconds, the peak resident size above the start and the page faults."""
    with PeakRss() as mem:
        start = time.perf_counter()
        fn()
        seconds = time.perf_counter() - start
    return {"s": seconds, "peak_mib": mem.above, "faults": mem.faults}


def cpu_seconds(proc: psutil.Process, threads: set[int] | None = None) -> float:
    """User + system CPU seconds of a process, or of some of its threads."""
    if threads is None:
        t = proc.cpu_times()
        return t.user + t.system
    return sum(th.user_time + th.system_time for th in proc.threads() if th.id in threads)


def glibc_heap() -> tuple[float, float] | None:
    """glibc's main heap (MiB): in use, free but kept (``mallinfo2``); None elsewhere."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in [
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            ]
        ]

    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = MallInfo2
    info = mallinfo2()
    return info.uordblks / 2**20, info.fordblks / 2**20
