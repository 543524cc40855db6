"""The end of a run: ``summary.json``, PNG figures, and where everything went."""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from dlscale.report.figures import loss_curve_figure, save_png, validation_figures
from dlscale.report.loggers import EPOCHS_CSV, STEPS_CSV, read_csv_columns
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.strict_json import to_json
from dlscale.scoring.evaluator import ChannelSkill, EvalSummary
from dlscale.training.divergence.final_weights import FinalWeights, end_of_training
from dlscale.training.divergence.policy import Divergence
from dlscale.training.observer import EpochReport, Observer
from dlscale.version import __version__

log = logging.getLogger("dlscale.train")


def mean_throughput(history: list[dict[str, Any]]) -> float | None:
    """Mean samples/s over the epochs, leaving out the first when there are several (it includes warm-up)."""
    rates = [row["samples_per_second"] for row in history if row["samples_per_second"] > 0]
    if len(rates) > 1:
        rates = rates[1:]
    return statistics.fmean(rates) if rates else None


class FinalValidation(NamedTuple):
    """The last epoch's validation, when it is run again on a finished run's final weights (what RunSummary reads
    of an epoch's report)."""

    epoch: int
    validation: EvalSummary


def missing_report(run_dir: Path, global_step: int) -> str | None:
    """Why the end-of-run report of a run that finished at ``global_step`` is missing or incomplete (a kill after
    its last checkpoint, before the report was written), or None when ``summary.json`` and its figures are there."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return "no summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return "summary.json cannot be read"
    if not isinstance(summary, dict):
        return "summary.json is not a summary"
    if summary.get("outcome") != "finished" or summary.get("global_step") != global_step:
        return f"summary.json is an earlier attempt's ({summary.get('outcome')} at step {summary.get('global_step')})"
    figures = summary.get("figures")
    # By name under figures/: the paths written may be relative to the directory the run was started in.
    absent = [Path(f).name for f in figures or () if not (run_dir / "figures" / Path(f).name).is_file()]
    if absent:
        return f"figures/{absent[0]} is missing" + (
            f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""
        )
    return None


class RunSummary(Observer):
    """Writes figures and ``summary.json`` when training ends, and says where logs, checkpoints and plots are."""

    def __init__(
        self,
        run_dir: Path,
        tensorboard_dir: Path | None,
        checkpoint_dir: Path | None,
        explain_divergence: Callable[[Divergence], str] = Divergence.describe,
        loss_name: str | None = None,
    ):
        """``explain_divergence``: the paragraph logged when the run diverged (the run layer's names the last
        good checkpoint and what to try); ``loss_name``: what the training loss is, for the figure's axis."""
        self.run_dir = run_dir
        self.loss_name = loss_name
        self.explain_divergence = explain_divergence
        self.tensorboard_dir = tensorboard_dir
        self.checkpoint_dir = checkpoint_dir
        self.last: EpochReport | FinalValidation | None = None
        self.written: dict[str, Any] | None = None  # the summary.json document, once training has ended

    def on_epoch_end(self, trainer, report: EpochReport) -> None:
        self.last = report

    def on_rollback(self, trainer, divergence) -> None:
        if self.last is not None and self.last.epoch > trainer.progress.epoch:
            self.last = None  # an epoch that the rollback undid

    def on_train_end(self, trainer, outcome: str) -> None:
        setup, p = trainer.setup, trainer.progress
        if trainer.guard.divergence is not None:
            outcome = "diverged"  # also when the save of a stopped run found its weights diverged
        weights = final_weights_of(trainer)
        if weights.validation is not None:  # the last good checkpoint's, validated again
            self.last = FinalValidation(weights.epoch, weights.validation)
        summary, figures = self._write(trainer, outcome)
        path = self.run_dir / "summary.json"
        final = summary["final"]
        if outcome == "diverged":
            log.error("%s", self.explain_divergence(trainer.guard.divergence))
        if outcome == "stopped":
            next_step = (
                "Run the same command again to resume."
                if self.checkpoint_dir is not None
                else "Checkpoints are disabled (checkpoint.enabled: false), so nothing was saved to resume from."
            )
            log.info(
                "Stopped by %s at epoch %d, step %d of the epoch (global step %d of %d). %s",
                trainer.stop.reason,
                p.epoch + 1,
                p.step_in_epoch,
                p.global_step,
                setup.plan.total_steps,
                next_step,
            )
        if final and not final["weights_trusted"]:
            log.warning(
                "Final validation, of %s (the thrown-out weights' numbers, kept for the record): %s",
                summary["final_weights"],
                final_line(final),
            )
        elif final and weights.description != end_of_training(p.global_step).description:
            log.info("Final validation, of %s: %s", summary["final_weights"], final_line(final))
        elif final:
            log.info("Final validation: %s", final_line(final))
        skill = self.last.validation.channel_skill if self.last is not None else None
        if skill is not None:
            report_skill(skill)
        if summary["throughput_samples_per_second"]:
            log.info("Training throughput: %.4g samples/s", summary["throughput_samples_per_second"])
        log.info("Outputs of this run:")
        log.info("  log:         %s", self.run_dir / "out.log")
        log.info("  config:      %s", self.run_dir / "config.yaml")
        if (self.run_dir / STEPS_CSV).is_file():
            log.info("  metrics:     %s, %s", self.run_dir / STEPS_CSV, (self.run_dir / EPOCHS_CSV).name)
        if self.checkpoint_dir is not None:
            log.info("  checkpoints: %s", self.checkpoint_dir)
        if self.tensorboard_dir is not None:
            log.info(
                "  tensorboard: %s  (view: tensorboard --logdir %s)",
                self.tensorboard_dir,
                self.tensorboard_dir,
            )
        for figure in figures:
            log.info("  figure:      %s", figure)
        log.info("  summary:     %s", path)

    def write_finished(self, trainer, validation: EvalSummary) -> dict[str, Any]:
        """Write the report of a finished run from its final checkpoint (loaded into ``trainer``'s setup), as the
        run would have at its end; ``validation``: its last epoch's validation, run again on the final weights.
        The summary.json document."""
        row = trainer.progress.history[-1]
        recorded, again = row.get("val_loss"), validation.loss
        if isinstance(recorded, float) and not _same_loss(recorded, again):
            log.warning(
                "The final validation, run again on the final checkpoint, gives loss %.6g, and the run's last "
                "epoch had %.6g: the validation data (or the code) changed since; the summary's metrics are "
                "those of the validation run now",
                again,
                recorded,
            )
        self.last = FinalValidation(row["epoch"], validation)
        summary, _ = self._write(trainer, "finished")
        if summary["final"]:
            log.info("Final validation: %s", final_line(summary["final"]))
        return summary

    def _write(self, trainer, outcome: str) -> tuple[dict[str, Any], list[Path]]:
        """The figures and summary.json (written last: its presence says the report is complete)."""
        figures = self._write_figures(trainer)
        summary = self.summary(trainer, outcome, figures)
        write_text_atomically(self.run_dir / "summary.json", to_json(summary))
        self.written = summary
        return summary, figures

    def _write_figures(self, trainer) -> list[Path]:
        history = trainer.progress.history
        paths = []
        if history:
            # Every step of the run, earlier attempts included (the CSV holds them all, a resume's rows after
            # its checkpoint dropped); written out by the metrics observer before this one is told.
            columns = read_csv_columns(self.run_dir / STEPS_CSV)
            step_losses = (columns["step"], columns["train_loss"]) if "train_loss" in columns else None
            title = (
                f"{trainer.setup.record.name}: {len(history)} epoch{'s' if len(history) != 1 else ''}, "
                f"{trainer.progress.global_step} steps"
            )
            figure = loss_curve_figure(history, title, step_losses, self.loss_name)
            paths.append(save_png(figure, self.run_dir / "figures" / "loss_curves.png"))
        if self.last is not None:
            title = f"epoch {self.last.epoch}"
            for stem, figure in validation_figures(self.last.validation, title).items():
                paths.append(save_png(figure, self.run_dir / "figures" / f"{stem}.png"))
        return paths

    def summary(self, trainer, outcome: str, figures: list[Path]) -> dict[str, Any]:
        setup, p = trainer.setup, trainer.progress
        weights = final_weights_of(trainer)
        last = p.history[-1] if p.history else None
        final = {}
        if weights.validation is not None:
            final = {
                "epoch": weights.epoch,
                "global_step": weights.global_step,
                **_row_of(weights.validation),
            }
        elif last:
            final = {
                "epoch": last["epoch"],
                "global_step": last["global_step"],
                "val_loss": last["val_loss"],
                "headline": last["headline"],
                "headline_value": last["headline_value"],
                "headline_unit": last.get("headline_unit"),
                "baseline": last.get("baseline"),
                "baseline_loss": last["baseline_loss"],
                "baseline_headline": last["baseline_headline"],
            }
        if final:
            final["weights_trusted"] = weights.trusted
            if self.last is not None:
                final["metrics"] = self.last.validation.scalars
                final["baseline_metrics"] = self.last.validation.baseline_scalars
                if self.last.validation.channel_skill is not None:
                    final["channel_skill"] = self.last.validation.channel_skill.to_dict()
        return {
            "config": setup.record.name,
            "config_file": setup.record.source,
            "workload": setup.record.workload,
            "outcome": outcome,
            "dlscale_version": __version__,
            "torch_version": str(torch.__version__),
            "device": setup.device.name,
            "world_size": setup.process.world_size,
            "global_batch_size": setup.global_batch_size,
            "epochs_completed": p.epoch,
            "global_step": p.global_step,
            "total_steps": setup.plan.total_steps,
            "train_seconds": sum(row["train_seconds"] for row in p.history),
            "throughput_samples_per_second": mean_throughput(p.history),
            "best": {"epoch": p.best_epoch, "val_loss": p.best_val_loss},
            "divergence": trainer.guard.divergence.to_dict() if trainer.guard.divergence else None,
            "skipped_steps": p.skipped_steps,
            "rollbacks": p.rollbacks,
            "final_weights": weights.description,
            "final": final,
            "history": p.history,
            "figures": [str(f) for f in figures],
        }


def final_weights_of(trainer) -> FinalWeights:
    """Which weights the report describes: the trainer's decision at the end of training, else (a report
    written again from a finished run's final checkpoint) the weights at its end."""
    weights = getattr(trainer, "final_weights", None)
    return weights if weights is not None else end_of_training(trainer.progress.global_step)


def _row_of(validation: EvalSummary) -> dict[str, Any]:
    """The final block's numbers from a validation, as an epoch's history row holds them."""
    return {
        "val_loss": validation.loss,
        **validation.headline_numbers(),
    }


def _same_loss(recorded: float, again: float) -> bool:
    """Equal up to the last digits a reduction in another order may change (NaN equals NaN here)."""
    return math.isclose(recorded, again, rel_tol=1e-5) or (math.isnan(recorded) and math.isnan(again))


SKILLS_PER_LINE = 7


def report_skill(skill: ChannelSkill) -> None:
    """Log the skill of every channel against the baseline, and warn about the channels that do not beat it
    (with both errors, in the channel's unit where known): a forecast worse than persistence is no forecast."""
    scores = skill.skill()
    log.info(
        "Skill per channel against %s (1 - %s / %s's; above 0 beats it):",
        skill.baseline_name,
        skill.metric,
        skill.baseline_name,
    )
    cells = [f"{name} {score:+.2f}" for name, score in zip(skill.channels, scores, strict=True)]
    for start in range(0, len(cells), SKILLS_PER_LINE):
        log.info("  %s", ",  ".join(cells[start : start + SKILLS_PER_LINE]))
    losing = skill.not_beating()
    if not losing:
        log.info("The model beats %s on every channel (%d).", skill.baseline_name, len(skill.channels))
        return
    details = []
    for name in losing:
        index = skill.channels.index(name)
        model, baseline = skill.physical(skill.model, index), skill.physical(skill.baseline, index)
        physical = f" ({model} vs {baseline})" if model else ""
        details.append(f"{name} {skill.model[index]:.4f} vs {skill.baseline[index]:.4f}{physical}")
    log.warning(
        "The model does not beat %s on %d of %d channels (%s of the model vs %s): %s. Train longer, or check "
        "these channels' data and normalization.",
        skill.baseline_name,
        len(losing),
        len(skill.channels),
        skill.metric,
        skill.baseline_name,
        "; ".join(details),
    )


def final_line(final: dict[str, Any]) -> str:
    """'loss 0.0743, RMSE(u10m) 0.266 m/s (0.0702 normalized); persistence: loss 0.3195, RMSE(u10m) 1.22 m/s
    (0.3210 normalized)' (the baseline's part only with what the workload's baseline has; the headline once when
    it is the loss itself; in its unit, as the epoch lines give it, where ``headline_unit`` (unit, scale) says)."""
    headline = final["headline"]
    unit, scale = final.get("headline_unit") or (None, None)

    def text(key: str) -> str:
        value = final[key]
        if key.endswith("loss") or not unit:
            return _readable(value)
        return f"{value * scale:.3g} {unit} ({_readable(value)} normalized)"

    names = [("loss", "val_loss", "baseline_loss")]
    if headline != "loss":
        names.append((headline, "headline_value", "baseline_headline"))
    line = ", ".join(f"{name} {text(key)}" for name, key, _ in names)
    baseline = [f"{name} {text(key)}" for name, _, key in names if final.get(key) is not None]
    if final.get("baseline") and baseline:
        line += f"; {final['baseline']}: {', '.join(baseline)}"
    return line


def _readable(value: float) -> str:
    """4 decimals, as the tutorials print losses; 3 significant digits below 0.001, which would print as 0."""
    return f"{value:.4f}" if abs(value) >= 1e-3 or value == 0 else f"{value:.3g}"
