"""The tutorials' log lines, so their users find what they know (and scripts that grep them keep working):

Starting Training Loop...
Time taken for epoch 2 is 54.986979 sec, avg 9.311295 samples/sec
  Avg train loss=0.391900
  Avg val loss=0.3769605755805969
  Total validation time: 4.2772088050842285 sec
"""

from __future__ import annotations

import logging

from dlscale.train.observer import EpochReport, Observer

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
