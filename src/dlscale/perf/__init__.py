"""Measurements: throughput trials, profiling, FLOPs and MFU."""
