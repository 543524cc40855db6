"""The multi-step curriculum: K at every global step, and the schedules and settings it refuses."""

from __future__ import annotations

import pytest

from dlscale.errors import InvalidValue
from dlscale.training.rollout_curriculum import RolloutCurriculum
from dlscale.training.train_config import TrainConfig, parse_rollout_schedule


def test_an_epoch_schedule_turns_into_global_steps_and_k_holds_until_the_next_start():
    schedule = parse_rollout_schedule("epoch 0=1, 2=2, 4=4")
    assert (schedule.unit, schedule.starts, schedule.steps, schedule.max_steps) == (
        "epoch",
        (0, 2, 4),
        (1, 2, 4),
        4,
    )
    curriculum = RolloutCurriculum.from_schedule(schedule, steps_per_epoch=10)
    assert curriculum.starts == (0, 20, 40)
    assert [curriculum.steps_at(step) for step in (0, 19, 20, 39, 40, 1000)] == [1, 1, 2, 2, 4, 4]


def test_a_step_schedule_keeps_its_starts_and_spaces_or_commas_both_separate_pairs():
    schedule = parse_rollout_schedule("step 0=1 500=3,700=3")
    curriculum = RolloutCurriculum.from_schedule(schedule, steps_per_epoch=10)
    assert curriculum.starts == (0, 500, 700)
    assert [curriculum.steps_at(step) for step in (499, 500, 699, 700)] == [1, 3, 3, 3]


def test_the_mean_k_over_a_range_of_steps_weights_each_step_once():
    curriculum = RolloutCurriculum((0, 4, 6), (1, 2, 4))
    # steps 2..7: K = 1, 1, 2, 2, 4, 4
    assert curriculum.mean_steps(2, 8) == pytest.approx(14 / 6)
    assert curriculum.mean_steps(6, 9) == 4.0
    assert curriculum.mean_steps(0, 4) == 1.0
    assert curriculum.mean_steps(5, 5) == 2.0  # an empty range: the K of its step


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("epoch 0=2, 2=1", "goes backwards at '2=1'"),
        ("epoch 1=1, 2=2", "must start at epoch 0"),
        ("step 0=1, 300=2, 300=4", "starts at step 300, not after step 300"),
        ("steps 0=1", "must start with its unit"),
        ("epoch 0=1, two=2", "'two=2' in 'epoch 0=1, two=2' is no AT=K pair"),
        ("epoch", "has no AT=K pair"),
        ("epoch 0=0", "every K must be >= 1"),
    ],
)
def test_a_schedule_that_cannot_be_a_curriculum_is_refused_by_name(text, words):
    with pytest.raises(InvalidValue, match="rollout_schedule") as raised:
        parse_rollout_schedule(text)
    assert words in str(raised.value)


def test_the_train_section_checks_k_and_agrees_with_its_schedule():
    assert TrainConfig().max_rollout_steps == 1
    assert TrainConfig(rollout_steps=3).max_rollout_steps == 3
    assert TrainConfig(rollout_schedule="epoch 0=1, 1=4").max_rollout_steps == 4
    assert TrainConfig(rollout_steps=1, rollout_schedule="epoch 0=1, 1=4").max_rollout_steps == 4
    with pytest.raises(InvalidValue, match="rollout_steps: must be >= 1"):
        TrainConfig(rollout_steps=0)
    for steps in (2, 4):  # another K than the schedule's, or its largest: both given, one must go
        with pytest.raises(InvalidValue, match="and train.rollout_schedule 'epoch 0=1, 1=4' are both given"):
            TrainConfig(rollout_steps=steps, rollout_schedule="epoch 0=1, 1=4")
    with pytest.raises(InvalidValue, match="goes backwards"):
        TrainConfig(rollout_schedule="epoch 0=4, 1=2")


def test_cuda_graphs_refuse_multi_step_training_in_one_line():
    with pytest.raises(InvalidValue, match="cuda_graphs: cannot capture multi-step training"):
        TrainConfig(cuda_graphs=True, rollout_steps=2)
    TrainConfig(cuda_graphs=True, rollout_steps=1)  # one step is what graphs capture today
