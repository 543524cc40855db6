"""CRPS training (``train.loss: crps``): a stochastic model trained as an ensemble on the fair CRPS of its members.

The model reads Gaussian noise beside its state (``model.noise_channels``, input channels after the state's:
FourCastNet 3's noise inputs, Bonev et al. 2025, arXiv 2507.12144; ECMWF's AIFS-CRPS, Lang et al. 2024, arXiv
2412.15832, injects its noise inside the processor instead). Each training sample is run ``M =
train.ensemble_members`` times, each member on its own noise, all members in one batch (the sample's members
side by side), and the loss is the fair CRPS over the members (:func:`dlscale.scoring.ensemble_scores.fair_crps`,
the estimator the ensemble forecast is scored by: one formula in one place), latitude-weighted over the grid
and averaged over channels (normalized units, so each channel counts by its own standard deviation), rollout
steps and samples. With multi-step training each member is rolled out on its own noise, drawn anew at every
step, and the loss is the mean over the K steps as in :mod:`dlscale.training.rollout_loss`.

The fair CRPS rewards the members for being exchangeable draws of the truth's distribution: its skill term
pulls each member toward the truth, its spread term (the mean distance between members) pushes them apart, and
its expectation is minimal when the members are drawn from the truth's distribution, whatever M. So the noise
channels are what the model learns to turn into the spread of its forecast.

Noise: drawn from a generator seeded by the run's seed, the global step, the rollout step and the sample's
position in the global batch (:class:`MemberNoise`), on the device: a run on 2 data-parallel ranks draws for each
sample what one rank does, resume draws what the uninterrupted run did, and no generator state is checkpointed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from dlscale.runtime.rng import stream_seed
from dlscale.scoring.ensemble_scores import fair_crps
from dlscale.scoring.forecast_scores import weighted_grid_mean
from dlscale.scoring.metrics import latitude_weights
from dlscale.training.rollout_curriculum import RolloutCurriculum
from dlscale.training.rollout_loss import rollout_loss

# Mixed into every seed, so that the noise is not the stream that initialized the weights or shuffles the data.
TRAINING_NOISE_STREAM = 0x5EED_C2B5


def ensemble_crps(members: torch.Tensor, truth: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The scalar loss of (B, M, C, H, W) ``members`` against their (B, C, H, W) ``truth``: the fair CRPS at
    every point, its latitude-weighted grid mean (``weights``: (H,), averaging 1), averaged over channels and
    samples."""
    return weighted_grid_mean(fair_crps(members, truth), weights.to(members.device, members.dtype)).mean()


class MemberNoise:
    """Unit Gaussian noise of ``channels`` channels on an (H, W) grid for every member of every sample of a
    training batch, each sample's from its own generator."""

    def __init__(self, seed: int, channels: int, grid: tuple[int, int]):
        self.seed = seed
        self.channels = channels
        self.grid = (int(grid[0]), int(grid[1]))

    def sample_seed(self, global_step: int, rollout_step: int, position: int) -> int:
        # halved: below 2**63 (the seeds drawn so far; every generator takes up to 2**64 - 1)
        return stream_seed([self.seed, TRAINING_NOISE_STREAM, global_step, rollout_step, position]) >> 1

    def draw(
        self,
        global_step: int,
        rollout_step: int,
        first_position: int,
        samples: int,
        members: int,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """(samples * members, channels, H, W): the noise of the batch's samples at global-batch positions
        ``first_position`` .. ``first_position + samples - 1``, each sample's ``members`` together."""
        fields = []
        for position in range(first_position, first_position + samples):
            generator = torch.Generator(device=device)
            generator.manual_seed(self.sample_seed(global_step, rollout_step, position))
            shape = (members, self.channels, *self.grid)
            fields.append(torch.randn(shape, generator=generator, device=device, dtype=dtype))
        return torch.cat(fields)


class EnsembleCrpsLoss:
    """``Workload.training_loss`` for CRPS training: ``members`` members per sample, K from the curriculum (1:
    one-step training on the workload's own samples, targets (B, C, H, W); K > 1: rollout samples, targets
    (B, K_max, C, H, W)). ``first_position``: where this rank's samples start in the global batch (the
    data-parallel rank times the local batch, as :class:`dlscale.data.loading.sampler.TrainingSampler` deals
    them)."""

    def __init__(
        self,
        members: int,
        noise: MemberNoise,
        latitudes: np.ndarray,
        curriculum: RolloutCurriculum,
        first_position: int,
        checkpointing: bool = False,
    ):
        if members < 2:
            raise ValueError(f"a CRPS loss needs at least 2 members, got {members}")
        self.members = members
        self.noise = noise
        self.weights = latitude_weights(latitudes)
        self.curriculum = curriculum
        self.first_position = first_position
        self.checkpointing = checkpointing

    def __call__(
        self,
        model: Callable[[torch.Tensor], torch.Tensor],
        batch: tuple[torch.Tensor, torch.Tensor],
        global_step: int,
    ) -> torch.Tensor:
        inputs, targets = batch
        steps = self.curriculum.steps_at(global_step)
        if targets.dim() == inputs.dim():  # one-step samples: (B, C, H, W)
            targets = targets.unsqueeze(1)
        samples, members = inputs.shape[0], self.members

        def with_noise(rollout_step: int, state: torch.Tensor) -> torch.Tensor:
            noise = self.noise.draw(
                global_step, rollout_step, self.first_position, samples, members, state.device, state.dtype
            )
            return torch.cat([state, noise], dim=1)

        def loss_fn(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return ensemble_crps(
                prediction.view(samples, members, *prediction.shape[1:]), target, self.weights
            )

        # each sample's members side by side: member m of sample b is row b * M + m
        states = inputs.repeat_interleave(members, dim=0)
        return rollout_loss(model, states, targets, steps, loss_fn, self.checkpointing, with_noise)
