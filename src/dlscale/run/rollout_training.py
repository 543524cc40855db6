"""Multi-step training assembled: what ``train.rollout_steps`` > 1 or a ``rollout_schedule`` changes in a run.

Four pieces replace their one-step forms (each explained where it lives):

* the train and valid samples: K_max + 1 consecutive states from the workload's ``forecast_data``
  (:class:`~dlscale.data.rollout_samples.RolloutSamples`), K_max the schedule's largest K, read for the whole
  run (one sample set, so epochs, the sampler and exact resume stay as they are);
* the training loss: the mean over K autoregressive steps, K from the curriculum at each global step
  (:class:`~dlscale.training.rollout_loss.RolloutLoss`, with ``train.rollout_checkpointing``);
* validation: the workload's metrics on the first step plus the K_max-step loss
  (:mod:`dlscale.scoring.rollout_validation`);
* the FLOP count: K model steps per sample, averaged over each epoch's curriculum (recomputation under
  checkpointing is not counted: MFU counts the model's FLOPs, not the ones spent to save memory).

The workload itself needs no code beyond ``forecast_data`` (as ``dlscale forecast`` asks), and must not have a
``training_loss`` of its own (the two would each decide what a batch's loss is).
"""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.data.rollout_samples import RolloutSamples
from dlscale.errors import ConfigError, DlscaleError
from dlscale.perf.flops import Utilization
from dlscale.training.rollout_curriculum import RolloutCurriculum
from dlscale.training.schedule import EpochPlan
from dlscale.training.train_config import TrainConfig, parse_rollout_schedule
from dlscale.workloads.protocol import Workload
from dlscale.workloads.user_code import raised_by_workload


@dataclass(frozen=True)
class RolloutSplits:
    train: RolloutSamples
    valid: RolloutSamples


def check_rollout_workload(workload: Workload, where: str) -> None:
    """Refuse multi-step training for a workload with a training-loss hook of its own, in one line."""
    if workload.training_loss is not None:
        raise ConfigError(
            f"{where}: train.rollout_steps/rollout_schedule ask dlscale for the multi-step loss, and workload "
            f"{workload.name!r} has its own training_loss; use one of them"
        )


def rollout_splits(workload: Workload, data_cfg: object, steps: int, where: str) -> RolloutSplits:
    """The train and valid splits as samples of ``steps`` + 1 consecutive states."""
    splits = {}
    for split in ("train", "valid"):
        try:
            with raised_by_workload(workload, "forecast_data"):
                trajectories = workload.forecast_data(data_cfg, split)
        except DlscaleError as exc:
            raise ConfigError(
                f"{where}: train.rollout_steps {steps} trains on the model's own rollouts, which reads the "
                f"{split} split as trajectories (the workload's forecast_data): {exc}"
            ) from None
        try:
            splits[split] = RolloutSamples(trajectories, steps, split)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return RolloutSplits(splits["train"], splits["valid"])


def unreached_schedule_entries(cfg: TrainConfig, plan: EpochPlan) -> str | None:
    """What to warn about when ``train.rollout_schedule`` has entries that start after this run's last step or
    epoch (so they never take effect, while the samples and validation are still made for their K); None when
    the run reaches every entry."""
    if cfg.rollout_schedule is None:
        return None
    schedule = parse_rollout_schedule(cfg.rollout_schedule)
    starts = schedule.starts_in_steps(plan.steps_per_epoch)
    reached = sum(1 for start in starts if start < plan.total_steps)
    if reached == len(starts):
        return None
    pairs = zip(schedule.starts[reached:], schedule.steps[reached:], strict=True)
    entries = ", ".join(f"{at}={k}" for at, k in pairs)
    several = len(starts) - reached > 1
    if schedule.unit == "epoch":
        end = f"its last epoch is {plan.num_epochs - 1}"
    else:
        end = f"its last step is {plan.total_steps - 1}"
    k_max = schedule.max_steps
    return (
        f"train.rollout_schedule {cfg.rollout_schedule!r}: {'entries' if several else 'entry'} {entries} "
        f"will not be reached: this run trains {plan.total_steps} steps ({plan.explanation}), so {end} (counted from 0, as the schedule "
        f"counts) and K stays {schedule.steps[reached - 1]} to the end, while the samples are still read for "
        f"K = {k_max} ({k_max + 1} consecutive states each) and validation rolls out {k_max} steps; raise "
        f"train.num_epochs or train.num_iters to reach {'them' if several else 'it'}, or drop "
        f"{'them' if several else 'it'} from the schedule"
    )


def rollout_curriculum(cfg: TrainConfig, steps_per_epoch: int) -> RolloutCurriculum:
    """K at each global step: the schedule in global steps, else ``rollout_steps`` throughout."""
    if cfg.rollout_schedule is None:
        return RolloutCurriculum.constant(cfg.rollout_steps)
    return RolloutCurriculum.from_schedule(parse_rollout_schedule(cfg.rollout_schedule), steps_per_epoch)


class RolloutUtilization(Utilization):
    """TFLOP/s and MFU of a multi-step run: one model step's training FLOPs times the K of the steps measured."""

    def __init__(self, one_step: Utilization, curriculum: RolloutCurriculum):
        self.one_step = one_step
        self.curriculum = curriculum
        self.device_name, self.precision, self.peak = one_step.device_name, one_step.precision, one_step.peak
        self.flops_per_sample = one_step.flops_per_sample * curriculum.max_steps

    def over_steps(self, first: int, stop: int) -> Utilization:
        """The rating of global steps ``first`` .. ``stop - 1``: their mean K times one step's FLOPs."""
        flops = self.one_step.flops_per_sample * self.curriculum.mean_steps(first, stop)
        return Utilization(flops, self.device_name, self.precision, warn_if_unknown=False)

    def describe(self) -> str:
        return (
            f"{self.one_step.flops_per_sample / 1e9:.4g} GFLOP per model step x K rollout steps per sample "
            f"({self.curriculum.describe()}); {self.one_step.describe()}"
        )
