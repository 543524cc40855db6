"""``dlscale plan`` counts the K steps of multi-step training: saved activations, the batch's K targets and the
collectives of every model call, and checkpointing's trade of memory for recomputation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dlscale.errors import InvalidValue
from dlscale.models.vit import VisionTransformer
from dlscale.models.vit_config import ViTConfig
from dlscale.perf.plan.layout_cost import (
    Layout,
    ModelShape,
    TrainingSettings,
    estimate_activation_bytes,
    estimate_communication,
    estimate_memory,
    rollout_activation_bytes,
)
from dlscale.perf.plan.saved_tensors import measure_saved_activation_bytes
from dlscale.scoring.metrics import relative_l2_loss

CHANNELS, IMAGE, BATCH = 3, (16, 32), 2


class Rollout(nn.Module):
    """The model fed its own output ``steps`` times, the predictions stacked (what the rollout loss sees)."""

    def __init__(self, model: nn.Module, steps: int):
        super().__init__()
        self.model, self.steps = model, steps

    def forward(self, x):
        outputs = []
        for _ in range(self.steps):
            x = self.model(x)
            outputs.append(x)
        return torch.stack(outputs, dim=1)


@pytest.mark.parametrize("steps", [2, 3])
def test_without_checkpointing_a_k_step_rollout_saves_k_times_one_steps_activations(steps):
    torch.manual_seed(0)
    cfg = ViTConfig(embed_dim=32, depth=2, num_heads=2, patch_size=4)
    model = VisionTransformer(cfg, IMAGE, CHANNELS, CHANNELS)
    shape = ModelShape.from_config(cfg, IMAGE, CHANNELS, CHANNELS)
    inputs = torch.randn(BATCH, CHANNELS, *IMAGE)
    targets = torch.randn(BATCH, steps, CHANNELS, *IMAGE)

    def loss(predictions):
        return sum(relative_l2_loss(predictions[:, k], targets[:, k]) for k in range(steps))

    measured = measure_saved_activation_bytes(Rollout(model, steps), inputs, loss_fn=loss)
    one = estimate_activation_bytes(shape, "none", BATCH)
    state = BATCH * CHANNELS * IMAGE[0] * IMAGE[1] * 4
    estimate = rollout_activation_bytes(one.total, one.loss, state, TrainingSettings(4, rollout_steps=steps))
    assert estimate == steps * one.total
    assert estimate == pytest.approx(measured, rel=0.01)


def test_checkpointing_keeps_each_steps_input_and_loss_and_one_step_live():
    settings = TrainingSettings(4, rollout_steps=4, rollout_checkpointing=True)
    # one step saves 1000 bytes, 100 of them the loss's, from a 50-byte state: 3 x (50 + 100) + 1000
    assert rollout_activation_bytes(1000, 100, 50, settings) == 1450
    assert rollout_activation_bytes(1000, 100, 50, TrainingSettings(4, rollout_steps=4)) == 4000
    assert rollout_activation_bytes(1000, 100, 50, TrainingSettings(4, rollout_checkpointing=True)) == 1000


def test_the_plan_of_a_rollout_holds_k_targets_and_k_steps_of_collectives():
    cfg = ViTConfig(embed_dim=64, depth=2, num_heads=4, patch_size=4)
    shape = ModelShape.from_config(cfg, (32, 64), 20, 20)
    one, four = TrainingSettings(8), TrainingSettings(8, rollout_steps=4)
    layout = Layout(1, 2, 2)
    memory_one, memory_four = estimate_memory(shape, one, layout), estimate_memory(shape, four, layout)
    targets = 8 * 20 * 32 * 64 * 4
    # three more targets in the step's batch and in the batch loaded ahead
    assert memory_four.batch - memory_one.batch == 2 * 3 * targets
    assert memory_four.activations == 4 * memory_one.activations
    comm_one, comm_four = (
        estimate_communication(shape, one, layout),
        estimate_communication(shape, four, layout),
    )
    assert comm_four.tensor_parallel == pytest.approx(4 * comm_one.tensor_parallel, abs=4)
    assert comm_four.context_parallel == pytest.approx(4 * comm_one.context_parallel, abs=4)
    recomputed = estimate_communication(
        shape, TrainingSettings(8, rollout_steps=4, rollout_checkpointing=True), layout
    )
    assert recomputed.tensor_parallel > comm_four.tensor_parallel  # the recomputed forwards communicate again
    with pytest.raises(InvalidValue, match="rollout_steps"):
        TrainingSettings(8, rollout_steps=0)
