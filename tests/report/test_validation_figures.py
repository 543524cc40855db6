"""The validation's figures: prediction vs target in the channel's unit on longitude/latitude axes, a classifier's
per-class accuracy and confusion matrix, and how often they are drawn (``log.image_every``)."""

from __future__ import annotations

import numpy as np
import pytest

from dlscale.errors import InvalidValue
from dlscale.report.figures import (
    class_accuracy_figure,
    confusion_figure,
    figure_to_rgb,
    prediction_figure,
    validation_figures,
)
from dlscale.report.log_config import LogConfig
from dlscale.scoring.evaluator import ClassCounts, EvalSummary, ExampleImage

FIELD = np.linspace(-1.0, 1.0, 8 * 16).reshape(8, 16)


def t2m_example(**changes) -> ExampleImage:
    """A normalized t2m field (std 20 K, mean 280 K) on the whole 8 x 16 grid; the prediction overshoots."""
    fields = dict(
        channel="t2m",
        target=FIELD,
        prediction=1.5 * FIELD,
        baseline=FIELD + 0.1,
        baseline_name="persistence",
        quantity="2 m temperature",
        unit="K",
        scale=20.0,
        offset=280.0,
        extent=(-11.25, 348.75, -102.9, 102.9),
    )
    return ExampleImage(**{**fields, **changes})


def image_axes(figure):
    """The axes that show an image (the panels), in order; the others are colour bars."""
    return [axis for axis in figure.axes if axis.images]


def colour_bar_labels(figure) -> list[str]:
    return [axis.get_ylabel() for axis in figure.axes if not axis.images and axis.get_ylabel()]


def tick_texts(figure, axis) -> list[str]:
    figure_to_rgb(figure)  # the tick labels are made when the figure is drawn
    return [label.get_text() for label in axis.get_ticklabels() if label.get_text()]


def test_prediction_and_target_share_one_colour_scale_and_the_errors_a_diverging_one_centred_on_zero():
    figure = prediction_figure(t2m_example())
    panels = image_axes(figure)
    assert [axis.get_title() for axis in panels] == [
        "t2m: prediction",
        "t2m: target",
        "t2m: prediction - target",
        "t2m: persistence - target",
    ]
    norms = [axis.images[0].norm for axis in panels]
    assert (norms[0].vmin, norms[0].vmax) == (norms[1].vmin, norms[1].vmax)
    # the shared scale covers both fields, in kelvin: the prediction reaches 280 +- 1.5 * 20
    assert norms[0].vmin == pytest.approx(250.0) and norms[0].vmax == pytest.approx(310.0)
    for norm in norms[2:]:
        assert norm.vmin == pytest.approx(-norm.vmax) and norm.vmax == pytest.approx(10.0)  # 0.5 * 20 K
    assert panels[2].images[0].get_cmap().name == "RdBu_r"


def test_the_images_are_de_normalized_and_the_colour_bars_name_quantity_and_unit():
    figure = prediction_figure(t2m_example())
    panels = image_axes(figure)
    np.testing.assert_allclose(panels[1].images[0].get_array(), FIELD * 20.0 + 280.0)
    np.testing.assert_allclose(panels[2].images[0].get_array(), 0.5 * FIELD * 20.0)
    labels = colour_bar_labels(figure)
    assert labels == ["2 m temperature [K]"] * 2 + ["difference [K]"] * 2


def test_a_grid_with_an_extent_has_longitude_and_latitude_ticks_in_degrees():
    figure = prediction_figure(t2m_example())
    axis = image_axes(figure)[0]
    longitudes = tick_texts(figure, axis.xaxis)
    latitudes = tick_texts(figure, axis.yaxis)
    assert longitudes == ["0°E", "60°E", "120°E", "180°E", "240°E", "300°E"]
    assert latitudes == ["90°S", "60°S", "30°S", "0°", "30°N", "60°N", "90°N"]
    assert axis.get_xlabel() == "longitude" and axis.get_ylabel() == "latitude"
    # the image spans the extent, the first row at the top (north)
    assert axis.images[0].get_extent() == pytest.approx([-11.25, 348.75, -102.9, 102.9])


def test_a_crop_says_which_part_of_the_grid_it_is():
    region = "top-left 4x8 crop of the 8x16 grid"
    figure = prediction_figure(t2m_example(extent=(-11.25, 168.75, 0.0, 102.9), region=region))
    first = image_axes(figure)[0]
    assert region in first.get_xlabel()
    assert tick_texts(figure, first.xaxis) == ["0°E", "30°E", "60°E", "90°E", "120°E", "150°E"]


def test_without_unit_or_extent_the_figure_says_normalized_values_on_pixel_axes():
    example = ExampleImage("channel 0", FIELD, FIELD + 0.5)
    figure = prediction_figure(example)
    assert colour_bar_labels(figure) == ["normalized value"] * 2 + ["difference (normalized)"]
    first = image_axes(figure)[0]
    assert first.get_xlabel() == "x (pixel)" and first.get_ylabel() == "y (pixel)"
    np.testing.assert_allclose(first.images[0].get_array(), FIELD + 0.5)  # not de-normalized


def counts(matrix) -> ClassCounts:
    return ClassCounts(np.asarray(matrix, dtype=np.int64))


def test_per_class_accuracy_is_sorted_with_chance_and_the_overall_accuracy():
    # class 0: 2 of 4 right, class 1: 3 of 3, class 2: 0 of 3, class 3: no sample
    matrix = [[2, 1, 1, 0], [0, 3, 0, 0], [1, 2, 0, 0], [0, 0, 0, 0]]
    per_class = counts(matrix).per_class_accuracy()
    np.testing.assert_allclose(per_class[:3], [0.5, 1.0, 0.0])
    assert np.isnan(per_class[3])
    figure = class_accuracy_figure(counts(matrix))
    axis = figure.axes[0]
    assert [bar.get_height() for bar in axis.patches] == pytest.approx([0.0, 0.0, 50.0, 100.0])
    assert tick_texts(figure, axis.xaxis) == ["3", "2", "0", "1"]  # the class without samples first
    lines = {line.get_label(): line.get_ydata()[0] for line in axis.get_lines()}
    assert lines["chance (1 / classes)"] == pytest.approx(25.0)
    assert lines["overall 50.0%"] == pytest.approx(50.0)


def test_the_confusion_matrix_shows_the_counts_with_true_classes_as_rows():
    matrix = [[5, 1], [2, 7]]
    figure = confusion_figure(counts(matrix))
    axis = figure.axes[0]
    np.testing.assert_array_equal(axis.images[0].get_array(), matrix)
    assert axis.get_ylabel() == "true class" and axis.get_xlabel() == "predicted class"
    assert sorted(text.get_text() for text in axis.texts) == ["1", "2", "5", "7"]
    assert "15 samples" in axis.get_title()


@pytest.mark.parametrize(
    ("classes", "figures"), [(10, ["class_accuracy", "confusion_matrix"]), (100, ["class_accuracy"])]
)
def test_a_classifier_gets_a_confusion_matrix_up_to_20_classes_only(classes, figures):
    summary = EvalSummary(0.0, {}, "accuracy", class_counts=counts(np.eye(classes, dtype=np.int64)))
    assert list(validation_figures(summary, "epoch 1")) == figures


def test_a_field_workload_gets_its_prediction_figure_only():
    summary = EvalSummary(0.0, {}, "loss", example=t2m_example())
    drawn = validation_figures(summary, "epoch 3")
    assert list(drawn) == ["prediction_vs_target"]
    assert drawn["prediction_vs_target"]._suptitle.get_text() == "epoch 3, first validation sample"


@pytest.mark.parametrize(
    ("every", "drawn"), [(1, [1, 2, 3, 4, 5, 6, 7]), (3, [3, 6, 7]), (5, [5, 7]), (10, [7])]
)
def test_images_are_drawn_every_image_every_epochs_and_at_the_last(every, drawn):
    cfg = LogConfig(image_every=every)
    assert [epoch for epoch in range(1, 8) if cfg.draws_images(epoch, is_last=epoch == 7)] == drawn


def test_image_every_must_be_at_least_one():
    with pytest.raises(InvalidValue, match="image_every"):
        LogConfig(image_every=0)
