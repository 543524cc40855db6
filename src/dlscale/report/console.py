"""The tutorials' log lines, so their users find what they know (and scripts that grep them keep working):

Starting Training Loop...
Time taken for epoch 2 is 54.986979 sec, avg 9.311295 samples/sec
  Avg train loss=0.391900
  Avg val loss=0.3769605755805969
  Total validation time: 4.2772088050842285 sec

and after them dlscale's own: the workload's metrics, then TFLOP/s, MFU and peak memory.
"""

from __future__ import annotations

import logging

from dlscale.training.observer import EpochReport, Observer

log = logging.getLogger("dlscale.train")


class ConsoleReporter(Observer):
    """Writes the epoch lines of the tutorials, plus the workload's metric lines."""

    def on_train_start(self, trainer) -> None:
        log.info("Starting Training Loop...")

    def on_epoch_end(self, trainer, report: EpochReport) -> None:
        log.info(
            "Time taken for epoch %i is %f sec, avg %f samples/sec",
            report.epoch,
            report.train_seconds,
            report.samples_per_second,
        )
        log.info("  Avg train loss=%f", report.train_loss)
        log.info("  Avg val loss=%s", report.validation.loss)
        log.info("  Total validation time: %s sec", report.validation.seconds)
        for line in report.validation.lines:
            log.info("%s", line)
        performance = performance_line(report, on_gpu=trainer.setup.device.is_gpu)
        if performance:
            log.info("%s", performance)


def per_device(on_gpu: bool | None) -> str:
    """What one share of the throughput runs on: 'GPU', 'CPU process' (each rank of a CPU run is a process),
    or 'device' when the caller does not say."""
    return "device" if on_gpu is None else "GPU" if on_gpu else "CPU process"


def performance_line(report: EpochReport, on_gpu: bool | None = None) -> str:
    """'  Performance: 312.4 TFLOP/s per GPU, MFU 31.6%; peak memory 41.2 GB allocated, 44.0 GB reserved'.

    ``on_gpu`` picks 'per GPU' or 'per CPU process' (None: 'per device'); ``tflops_per_gpu`` keeps its name
    on every device, so records stay comparable.
    """
    parts = []
    if report.tflops_per_gpu is not None:
        text = f"{report.tflops_per_gpu:.4g} TFLOP/s per {per_device(on_gpu)}"
        if report.mfu is not None:
            text += f", MFU {100 * report.mfu:.1f}%"
        parts.append(text)
    memory = report.peak_memory_gb
    if "allocated" in memory:
        parts.append(
            f"peak memory {memory['allocated']:.2f} GB allocated, {memory['reserved']:.2f} GB reserved"
        )
    elif "host_rss" in memory:
        parts.append(f"peak host memory {memory['host_rss']:.2f} GB (process RSS)")
    return "  Performance: " + "; ".join(parts) if parts else ""
