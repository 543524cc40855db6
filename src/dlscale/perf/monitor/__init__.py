"""Watching a run's hardware: the GPU/host sampler (NVML), its CSV and TensorBoard lines, the end-of-run
efficiency report (``monitor/efficiency.json``), and the tutorial's memory lines."""
