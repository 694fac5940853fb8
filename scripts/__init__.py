"""Setup, test and device-check scripts (``scripts.gpu_sampler`` is imported by the benchmarks)."""
