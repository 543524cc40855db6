"""``log.image_every``: the validation's figures go to TensorBoard every N epochs and at the last, no more."""

from __future__ import annotations

import pytest

import dlscale.report.metrics_observer as metrics_observer
from dlscale.run.training import train


@pytest.mark.slow
@pytest.mark.parametrize(("every", "drawn"), [(1, [1, 2, 3]), (2, [2, 3]), (5, [3])])
def test_figures_are_drawn_every_image_every_epochs_and_at_the_last(tiny_config, monkeypatch, every, drawn):
    epochs = []  # the epoch of every validation whose figures were drawn for TensorBoard
    draw = metrics_observer.validation_figures

    def counted(validation, title=""):
        epochs.append(int(title.split(",")[0].removeprefix("epoch ")))
        return draw(validation, title)

    monkeypatch.setattr(metrics_observer, "validation_figures", counted)
    assert train(tiny_config("train.num_epochs=3", f"log.image_every={every}")) == 0
    assert epochs == drawn
