"""GPU utilisation sampled in a background thread (benchmarks and the device check share it)."""

from __future__ import annotations

import statistics
import subprocess
import threading


class GpuSampler:
    """Samples device-wide GPU utilisation (%) every ``interval`` seconds in a thread."""

    def __init__(self, interval: float = 0.5):
        self.interval, self.samples = interval, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def read() -> float | None:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=5, check=True).stdout
            return statistics.mean(float(x) for x in out.split())
        except (OSError, subprocess.SubprocessError, ValueError, statistics.StatisticsError):
            pass
        try:
            import torch

            return float(torch.cuda.utilization())
        except Exception:  # no pynvml / no CUDA: utilisation is unknown, not zero
            return None

    def _run(self):
        while not self._stop.wait(self.interval):
            value = self.read()
            if value is not None:
                self.samples.append(value)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float | None:
        return statistics.mean(self.samples) if self.samples else None
