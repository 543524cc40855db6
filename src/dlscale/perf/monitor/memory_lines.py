"""The model-parallel tutorial's memory lines, from the device layer.

``Scaffolding memory high watermark: X GB.`` once the model, its parallel form and the optimizer exist (what a
run holds before it trains), and `` Memory usage after forward pass: X GB.`` after the first step of every epoch:
the step's peak, which a training step reaches at the end of its forward pass, when every activation that
backward needs is held. On a GPU the number is what the caching allocator reserved (the closest to the
tutorial's NVML reading, minus the CUDA context), with the bytes held by tensors next to it; on a CPU it is the
process's peak resident memory.
"""

from __future__ import annotations

import logging

from dlscale.training.observer import Observer

log = logging.getLogger("dlscale.train")


def _describe(peaks: dict[str, float]) -> str:
    if "reserved" in peaks:
        return f"{peaks['reserved']:.4g} GB (tensors {peaks['allocated']:.4g} GB)"
    return f"{peaks.get('host_rss', 0.0):.4g} GB (host RSS)"


class MemoryReport(Observer):
    """Logs the scaffolding and after-forward memory lines (the NERSC tutorial's names)."""

    def on_train_start(self, trainer) -> None:
        log.info("Scaffolding memory high watermark: %s.", _describe(trainer.setup.device.memory_peaks()))

    def on_step_end(self, trainer, loss) -> None:
        if trainer.progress.step_in_epoch == 1:
            log.info(" Memory usage after forward pass: %s.", _describe(trainer.setup.device.memory_peaks()))
