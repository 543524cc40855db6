"""TensorBoard scalars under the tutorials' tags, plus a prediction-vs-target image each epoch.

Tags: ``Loss/train``, ``Loss/valid``, ``RMSE(u10m)/valid`` (the workload's headline metric), ``Learning Rate``,
``Avg iters per sec``, ``Avg samples per sec``; and dlscale's own: every channel's metric
(``RMSE/<channel>/valid``) and the baseline's (``.../persistence``), drawn as a reference line. The x-axis is
the optimizer step, as in the tutorials. Performance: ``Performance/TFLOPs per GPU``, ``Performance/MFU``
and ``Memory/peak <allocated|reserved|host_rss> GB`` per epoch.
"""

from __future__ import annotations

from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from dlscale.report.figures import figure_to_rgb, prediction_figure
from dlscale.training.observer import EpochReport, Observer


class TensorBoardReporter(Observer):
    """Writes event files into ``directory``; a resumed run drops events after its checkpoint's step."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.writer: SummaryWriter | None = None

    def on_train_start(self, trainer) -> None:
        # purge_step hides the events that an earlier, interrupted attempt wrote after the step this run
        # continues from (all of them when it starts from scratch), so a curve never shows two points for one
        # step. Events *at* that step were written before its checkpoint (epoch-end scalars come before the
        # checkpoint is saved) and belong to the history this run continues.
        self.writer = SummaryWriter(str(self.directory), purge_step=trainer.progress.global_step + 1)

    def on_rollback(self, trainer, divergence) -> None:
        # The steps after the checkpoint are trained again: hide what the diverged attempt wrote for them.
        self.on_train_end(trainer, "rolled back")
        self.on_train_start(trainer)

    def on_epoch_end(self, trainer, report: EpochReport) -> None:
        writer, step = self.writer, trainer.progress.global_step
        validation = report.validation
        writer.add_scalar("Loss/train", report.train_loss, step)
        writer.add_scalar("Loss/valid", validation.loss, step)
        writer.add_scalar("Learning Rate", report.learning_rate, step)
        writer.add_scalar("Avg iters per sec", report.iterations_per_second, step)
        writer.add_scalar("Avg samples per sec", report.samples_per_second, step)
        for name, value in validation.scalars.items():
            writer.add_scalar(f"{name}/valid", value, step)
        if report.tflops_per_gpu is not None:
            writer.add_scalar("Performance/TFLOPs per GPU", report.tflops_per_gpu, step)
        if report.mfu is not None:
            writer.add_scalar("Performance/MFU", report.mfu, step)
        for kind, gigabytes in report.peak_memory_gb.items():
            writer.add_scalar(f"Memory/peak {kind} GB", gigabytes, step)
        if validation.baseline_name:
            for name, value in validation.baseline_scalars.items():
                tag = "Loss" if name == "loss" else name
                writer.add_scalar(f"{tag}/{validation.baseline_name}", value, step)
        if validation.example is not None:
            figure = prediction_figure(validation.example, f"epoch {report.epoch}, step {step}")
            writer.add_image(
                f"Visualization, {validation.example.channel}", figure_to_rgb(figure), step, dataformats="HWC"
            )
        writer.flush()

    def on_train_end(self, trainer, outcome: str) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
