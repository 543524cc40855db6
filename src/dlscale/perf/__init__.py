"""Measurements, one sub-package per idea: ``bench`` (throughput trials, verdicts, sweeps, scaling), ``plan`` (memory
planning before a run), ``monitor`` (GPU/host sampling and the efficiency report), ``profile`` (nsys, torch profiler,
line timings); ``flops`` (FLOPs per sample, peak TFLOP/s, MFU) serves bench, plan and the training run;
``inference_memory`` (a model's inference step's bytes per sample, measured on it) serves forecast's memory check."""
