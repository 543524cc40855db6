"""Profiling a run: NVTX ranges and the nsys capture window, the torch profiler's trace of a window of
steps, and per-line timings of the training step (``profile:`` config section)."""
