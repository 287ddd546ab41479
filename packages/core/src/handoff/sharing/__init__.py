"""Sharing the machine among cases: CPU slots, GPUs through NVML, the VRAM ledger, placement,
scheduling, and the profiler with its plot."""
