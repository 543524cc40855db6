"""An ensemble rolled out: member 0 is the deterministic forecast to the bit, the ensemble's scores are those of
its members computed directly, batches and ranks add up to one pass, and the members' forecasts are kept in
their own dimension."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch

from dlscale.data.trajectories import ForecastStart
from dlscale.scoring.ensemble_scores import EnsembleScores
from dlscale.scoring.forecast_scores import ForecastScores
from dlscale.scoring.rollout import ENSEMBLE, MODEL, PERSISTENCE, EnsembleMembers, Rollout, roll_out
from dlscale.scoring.rollout_ranks import sum_rollout_across_ranks

STEPS, MEMBERS = 3, 4
LATITUDES = np.array([60.0, 20.0, -20.0, -60.0])
CPU = torch.device("cpu")


class WaveTrajectories:
    """Two channels on a 4 x 8 grid, one trajectory of 12 states an hour apart: waves drifting east."""

    channel_names = ("a", "b")
    units = ("K", "m")
    long_names = channel_names
    step_hours = 1.0
    hours_per_state = 1.0
    latitudes = LATITUDES
    longitudes = np.arange(0.0, 360.0, 45.0)

    def starts(self) -> list[ForecastStart]:
        return [ForecastStart(0, step) for step in range(8)]

    def reach(self, start: ForecastStart) -> int:
        return 11 - start.step

    def states(self, starts: Sequence[ForecastStart], lead: int) -> torch.Tensor:
        time = torch.tensor([s.step + lead for s in starts], dtype=torch.float32).view(-1, 1, 1, 1)
        rows = torch.arange(4, dtype=torch.float32).view(1, 1, 4, 1)
        columns = torch.arange(8, dtype=torch.float32).view(1, 1, 1, 8)
        channel = torch.tensor([1.0, 2.0]).view(1, 2, 1, 1)
        return channel * torch.sin(columns / 2 - time / 3 + rows) + 0.1 * time

    def normalize(self, states: torch.Tensor) -> torch.Tensor:
        return states / 2

    def to_physical(self, normalized: torch.Tensor) -> torch.Tensor:
        return normalized * 2

    def climatology(self) -> torch.Tensor | None:
        return torch.zeros(2, 4, 8)

    def describe(self) -> str:
        return "waves"


def damp(state: torch.Tensor) -> torch.Tensor:
    return 0.9 * state + 0.05


def offsets(starts: Sequence[ForecastStart], state: torch.Tensor) -> torch.Tensor:
    """Member m (1 .. M-1) starts from the state plus a field of its own that depends on the start."""
    shifts = torch.stack(
        [
            torch.full(state.shape[1:], 0.1 * m * (s.step + 1) * (-1) ** m)
            for s in starts
            for m in range(1, MEMBERS)
        ]
    )
    return state.unsqueeze(1) + shifts.view(len(starts), MEMBERS - 1, *state.shape[1:])


def roll(
    members: EnsembleMembers | None, batch_size: int = 3, starts: Sequence[ForecastStart] | None = None
) -> Rollout:
    trajectories = WaveTrajectories()
    chosen = trajectories.starts() if starts is None else starts
    climatology = ConstantClimatology()
    return roll_out(damp, trajectories, chosen, STEPS, batch_size, CPU, keep_forecasts=True, climatology=climatology, members=members)  # fmt: skip


class ConstantClimatology:
    description = {"kind": "time_mean"}

    def fields(self, batch: Sequence[ForecastStart], lead: int) -> torch.Tensor:
        return torch.zeros(len(batch), 2, 4, 8)


def ensemble(perturb=offsets, predict=damp) -> EnsembleMembers:
    return EnsembleMembers(MEMBERS, perturb, predict, seed=0, description="offsets")


def same_sums(a: ForecastScores, b: ForecastScores, exact: bool = True) -> None:
    check = (
        np.testing.assert_array_equal if exact else lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-12)
    )
    for name in ("mse_sum", "error_sum", "acc_sum", "acc_count", "count"):
        check(getattr(a, name), getattr(b, name))


def test_member_0_is_the_deterministic_forecast_to_the_bit():
    alone, together = roll(None), roll(ensemble())
    assert list(together.scores) == [MODEL, ENSEMBLE, PERSISTENCE, "climatology"]
    same_sums(together.scores[MODEL], alone.scores[MODEL])
    same_sums(together.scores[PERSISTENCE], alone.scores[PERSISTENCE])
    assert together.forecasts.shape == (8, MEMBERS, STEPS, 2, 4, 8)
    np.testing.assert_array_equal(together.forecasts[:, 0], alone.forecasts)
    assert together.forecast_steps == MEMBERS * alone.forecast_steps


def test_the_ensembles_scores_are_its_members_scored_directly():
    rollout = roll(ensemble())
    trajectories = WaveTrajectories()
    starts = trajectories.starts()
    expected = EnsembleScores(STEPS + 1, 2, MEMBERS, LATITUDES)
    expected_mean = ForecastScores(STEPS + 1, 2, LATITUDES)
    state = trajectories.normalize(trajectories.states(starts, 0))
    members = torch.cat([state.unsqueeze(1), offsets(starts, state)], dim=1)  # (N, M, C, H, W), normalized
    for lead in range(STEPS + 1):
        if lead:
            members = damp(members)
        physical, truth = trajectories.to_physical(members), trajectories.states(starts, lead)
        expected.add(lead, physical, truth)
        expected_mean.add(lead, physical.mean(dim=1), truth, torch.zeros(2, 4, 8))
        if lead:
            np.testing.assert_allclose(rollout.forecasts[:, :, lead - 1], physical.numpy(), rtol=1e-6)
    got = rollout.ensemble.members
    np.testing.assert_allclose(got.crps(), expected.crps(), rtol=1e-5)
    np.testing.assert_allclose(got.spread(), expected.spread(), rtol=1e-5)
    np.testing.assert_allclose(got.ensemble_mean_rmse(), expected.ensemble_mean_rmse(), rtol=1e-5)
    np.testing.assert_array_equal(got.rank_histogram(), expected.rank_histogram())
    np.testing.assert_allclose(rollout.scores[ENSEMBLE].rmse(), expected_mean.rmse(), rtol=1e-5)
    np.testing.assert_allclose(rollout.scores[ENSEMBLE].acc(), expected_mean.acc(), rtol=1e-5)
    # the control as a one-member ensemble: its CRPS is its mean absolute error, weighted as the CRPS is
    control = rollout.forecasts[:, 0, -1]
    weights = np.cos(np.deg2rad(LATITUDES)) / np.cos(np.deg2rad(LATITUDES)).mean()
    error = np.abs(control - trajectories.states(starts, STEPS).numpy()).mean(axis=-1)  # (N, C, H)
    mae = (error * weights).mean(axis=-1).mean(axis=0)
    np.testing.assert_allclose(rollout.ensemble.control.crps()[STEPS], mae, rtol=1e-5)


def test_members_that_do_not_differ_have_no_spread_and_score_as_the_control():
    rollout = roll(
        ensemble(perturb=lambda starts, state: state.unsqueeze(1).expand(-1, MEMBERS - 1, -1, -1, -1))
    )
    scores = rollout.ensemble.members
    np.testing.assert_array_equal(scores.spread(), np.zeros((STEPS + 1, 2)))
    np.testing.assert_allclose(scores.crps(), rollout.ensemble.control.crps(), rtol=1e-6)
    np.testing.assert_allclose(rollout.scores[ENSEMBLE].rmse(), rollout.scores[MODEL].rmse(), rtol=1e-6)


def test_the_members_step_through_their_own_predict():
    calls = []

    def member_step(state: torch.Tensor) -> torch.Tensor:
        calls.append(state.shape[0])
        return damp(state)

    roll(ensemble(predict=member_step), batch_size=3)
    # (M - 1) members of each batch's starts in one call per lead: batches of 3, 3 and 2 starts
    assert calls == [3 * (MEMBERS - 1)] * STEPS + [3 * (MEMBERS - 1)] * STEPS + [2 * (MEMBERS - 1)] * STEPS


@pytest.mark.parametrize("batch_size", [1, 8])
def test_batches_give_the_scores_of_one_pass(batch_size):
    reference, rollout = roll(ensemble(), batch_size=3), roll(ensemble(), batch_size=batch_size)
    for name in reference.scores:
        same_sums(rollout.scores[name], reference.scores[name], exact=False)
    for kind in ("members", "control"):
        a, b = getattr(rollout.ensemble, kind), getattr(reference.ensemble, kind)
        np.testing.assert_allclose(a.crps_sum, b.crps_sum, rtol=1e-12)
        np.testing.assert_array_equal(a.rank_counts, b.rank_counts)


def test_two_ranks_sums_add_up_to_one_pass():
    starts = WaveTrajectories().starts()
    whole = roll(ensemble())
    first, second = roll(ensemble(), starts=starts[:5]), roll(ensemble(), starts=starts[5:])
    shared = {}

    def keep(flat: torch.Tensor) -> None:
        shared["flat"] = flat.clone()

    sum_rollout_across_ranks(second, keep, CPU)  # what the second rank contributes (a sum over itself alone)
    sum_rollout_across_ranks(first, lambda flat: flat.add_(shared["flat"]), CPU)
    for name in whole.scores:
        same_sums(first.scores[name], whole.scores[name], exact=False)
        assert first.scores[name].has_acc == whole.scores[name].has_acc
    np.testing.assert_allclose(first.ensemble.members.crps(), whole.ensemble.members.crps(), rtol=1e-12)
    # From lead 1 on: at lead 0 the control is the truth, a tie broken at random in each rank's own order
    ranks, whole_ranks = first.ensemble.members.rank_counts, whole.ensemble.members.rank_counts
    np.testing.assert_array_equal(ranks[1:], whole_ranks[1:])
    np.testing.assert_array_equal(ranks[0].sum(axis=-1), whole_ranks[0].sum(axis=-1))
    np.testing.assert_array_equal(first.ensemble.control.count, whole.ensemble.control.count)
    assert first.first_nonfinite_lead is None


def test_the_first_non_finite_lead_of_any_rank_is_the_sums():
    starts = WaveTrajectories().starts()
    calm = roll(None, starts=starts[:4])
    blowing_up = roll_out(
        lambda s: s * 1e30, WaveTrajectories(), starts[4:], STEPS, 4, CPU, climatology=ConstantClimatology()
    )
    assert blowing_up.first_nonfinite_lead == 2
    shared = {}
    sum_rollout_across_ranks(blowing_up, lambda flat: shared.setdefault("flat", flat.clone()), CPU)
    sum_rollout_across_ranks(calm, lambda flat: flat.add_(shared["flat"]), CPU)
    assert calm.first_nonfinite_lead == 2


def test_a_ratio_without_error_is_undefined_not_infinite(recwarn):
    """Members that all start from the truth (dropout's at lead 0) have no ensemble-mean error there: both
    spread/skill ratios are NaN (null in scores.json), without a division warning."""
    from dlscale.report.ensemble_report import ensemble_entry

    alike = ensemble(perturb=lambda starts, state: state.unsqueeze(1).expand(-1, MEMBERS - 1, -1, -1, -1))
    rollout = roll(alike)
    entry = ensemble_entry(rollout.ensemble, WaveTrajectories.channel_names, 1.0, STEPS)
    for key in ("spread_skill", "spread_skill_uncorrected"):
        assert np.isnan(entry[key]["a"][0])
        assert entry[key]["a"][1] == 0.0  # no spread, some error: 0
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
