"""The pieces of ``dlscale evaluate``: which checkpoint a run directory and --checkpoint name (and the one line when
there is none), whether a config fits a checkpoint, which splits a workload offers, the config a checkpoint
recorded, the metrics document and its CSV, the evaluation directory written as one, and the progress lines."""

from __future__ import annotations

import csv
import io
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from dlscale.checkpoint.files import save_checkpoint
from dlscale.checkpoint.selection import check_fits, choose_checkpoint
from dlscale.config import load_run_config
from dlscale.config.run_config import recorded_run_config
from dlscale.errors import CheckpointError, DataError
from dlscale.report.evaluation_report import evaluation_document, metrics_csv
from dlscale.report.progress_display import PassProgress
from dlscale.runtime.atomic_files import write_directory_atomically
from dlscale.runtime.strict_json import to_json
from dlscale.scoring.evaluator import ClassCounts, EvalSummary
from dlscale.workloads import get_workload
from dlscale.workloads.protocol import Workload
from dlscale.workloads.references import as_workload

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def run_directory(root: Path, *names: str) -> Path:
    """A run directory with config.yaml and small checkpoint files ``names`` in checkpoints/."""
    (root / "checkpoints").mkdir(parents=True)
    (root / "config.yaml").write_text("tiny: {}\n")
    for name in names:
        save_checkpoint({"model": {}}, root / "checkpoints" / name)
    return root


# ------------------------------------------------------------------------------------- which checkpoint


def test_a_run_directory_names_its_latest_or_best_checkpoint_and_its_config(tmp_path):
    run = run_directory(tmp_path / "run", "ckpt_latest.pt", "ckpt_best.pt")
    latest = choose_checkpoint(run)
    assert latest.checkpoint == run / "checkpoints" / "ckpt_latest.pt" and latest.name == "ckpt_latest"
    assert latest.config_file == run / "config.yaml" and latest.output_dir == run
    assert choose_checkpoint(run, "best").checkpoint == run / "checkpoints" / "ckpt_best.pt"
    assert choose_checkpoint(run / "checkpoints").run_dir == run  # its checkpoints/ names it too
    other = save_checkpoint({"model": {}}, tmp_path / "elsewhere" / "ckpt_step00000004.pt")
    chosen = choose_checkpoint(run, str(other))
    assert (chosen.checkpoint, chosen.run_dir, chosen.name) == (other, run, "ckpt_step00000004")
    # a file alone: the run directory it is in, or (outside of one) its own directory and recorded config
    inside = choose_checkpoint(run / "checkpoints" / "ckpt_best.pt")
    assert (inside.run_dir, inside.output_dir) == (run, run)
    alone = choose_checkpoint(other)
    assert (alone.run_dir, alone.config_file, alone.output_dir) == (None, None, other.parent)


@pytest.mark.parametrize(
    ("present", "choice", "expected"),
    [
        ((), None, "no checkpoint to evaluate (no checkpoints/ckpt_latest.pt): it holds checkpoints/, config.yaml"),
        (("ckpt_latest.pt",), "best", "no checkpoints/ckpt_best.pt for --checkpoint best; it holds ckpt_latest.pt: "
         "evaluate one with --checkpoint latest"),
        (("ckpt_best.pt",), "latest", "it holds ckpt_best.pt: evaluate one with --checkpoint best"),
        (("ckpt_step00000008.pt",), "best", "it holds ckpt_step00000008.pt: evaluate one with --checkpoint /"),
        (("ckpt_latest.pt",), "nowhere.pt", "--checkpoint nowhere.pt: does not exist; --checkpoint takes latest or best"),
    ],
)  # fmt: skip
def test_a_missing_checkpoint_is_one_line_naming_what_is_there(tmp_path, present, choice, expected):
    run = run_directory(tmp_path / "run", *present)
    with pytest.raises(CheckpointError) as raised:
        choose_checkpoint(run, choice)
    message = str(raised.value)
    assert "\n" not in message and expected in message, message


def test_a_file_with_a_checkpoint_choice_nothing_and_a_data_file_are_refused(tmp_path):
    run = run_directory(tmp_path / "run", "ckpt_latest.pt")
    with pytest.raises(CheckpointError, match="is a checkpoint file, and --checkpoint best chooses"):
        choose_checkpoint(run / "checkpoints" / "ckpt_latest.pt", "best")
    with pytest.raises(CheckpointError, match="does not exist; dlscale evaluate takes a run directory"):
        choose_checkpoint(tmp_path / "no_such_run")
    data = tmp_path / "1981.h5"
    data.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(100))
    with pytest.raises(CheckpointError, match=r"is not a dlscale checkpoint \(an HDF5 file"):
        choose_checkpoint(data)


# ------------------------------------------------------------------------------ does the config fit it


def test_a_checkpoint_of_another_workload_or_with_other_weight_keys_is_refused():
    cfg = load_run_config(CONFIGS / "vit_era5.yaml", "tiny")
    keys = frozenset({"model.embed_dim", "data.img_size"})
    payload = {"model": {}, "meta": {"workload": "era5_vit", "config_name": "tiny"}, "config": cfg.to_dict()}
    check_fits(payload, Path("c.pt"), "era5_vit", cfg.to_dict(), "the config", keys)
    changed = load_run_config(
        CONFIGS / "vit_era5.yaml", "tiny", ["data.root=/elsewhere", "model.dropout=0.5"]
    )
    check_fits(payload, Path("c.pt"), "era5_vit", changed.to_dict(), "the config", keys)  # no weight key
    with pytest.raises(
        CheckpointError, match="is a checkpoint of workload 'era5_vit' .* of workload 'cnn_mnist'"
    ):
        check_fits(payload, Path("c.pt"), "cnn_mnist", cfg.to_dict(), "the config", keys)
    wider = load_run_config(CONFIGS / "vit_era5.yaml", "tiny", ["model.embed_dim=64"])
    with pytest.raises(
        CheckpointError, match="changes keys that define its weights .*model.embed_dim: 32 -> 64"
    ):
        check_fits(payload, Path("c.pt"), "era5_vit", wider.to_dict(), "the config", keys)


def test_a_recorded_config_loads_again_with_overrides():
    cfg = load_run_config(CONFIGS / "vit_era5.yaml", "tiny", ["data.root=/data/era5"])
    again = recorded_run_config(cfg.to_dict(), "tiny", "/runs/c.pt (its recorded config)")
    assert again.to_dict() == cfg.to_dict() and again.name == "tiny"
    moved = recorded_run_config(cfg.to_dict(), "tiny", "c.pt", ["data.root=/scratch/era5"])
    assert moved.data.root == "/scratch/era5" and moved.model == cfg.model


# ------------------------------------------------------------------------------------------- splits


@dataclass
class Section:
    """A config section without keys."""


class ThreeSplits(Workload):
    """A user's workload whose build_datasets also returns a test split (and nothing else of evaluate's)."""

    name = "three_splits"
    data_config = model_config = Section

    def build_datasets(self, data_cfg):
        return {"train": ["t"], "valid": ["v"], "test": ["x"]}


class PlainThreeSplits:
    """The same, as a plain object (a user's workload need not subclass Workload)."""

    data_config = model_config = Section
    build_datasets = ThreeSplits.build_datasets

    def build_model(self, model_cfg, data_cfg):
        return None

    def loss(self, prediction, target):
        return None


def test_a_workload_offers_the_held_out_splits_of_its_build_datasets_by_default():
    workload = ThreeSplits()
    assert workload.build_split(None, "test") == ["x"] and workload.build_split(None, "valid") == ["v"]
    with pytest.raises(DataError, match="no 'extrapolation' split to evaluate; workload 'three_splits' offers "
                                        "valid, test$"):  # fmt: skip
        workload.build_split(None, "extrapolation")
    with pytest.raises(
        DataError, match="never the training samples; workload 'three_splits' offers valid, test"
    ):
        workload.build_split(None, "train")
    # an object that does not subclass Workload gets the same default
    assert as_workload(PlainThreeSplits(), "plain").build_split(None, "test") == ["x"]
    own = type("OwnSplit", (PlainThreeSplits,), {"build_split": lambda self, data_cfg, split: [split]})
    assert as_workload(own(), "own").build_split(None, "holdout") == ["holdout"]  # its own, when it has one


def test_the_built_in_workloads_name_the_splits_they_offer(tmp_path):
    unet = get_workload("unet_cosmo")
    cfg = load_run_config(CONFIGS / "unet_cosmo.yaml", "tiny")
    with pytest.raises(DataError, match="one held-out volume, the validation volume .*offers valid$"):
        unet.build_split(cfg.data, "test")
    era5 = load_run_config(CONFIGS / "vit_era5.yaml", "tiny", [f"data.root={tmp_path}"])
    with pytest.raises(DataError) as raised:
        get_workload("era5_vit").build_split(era5.data, "test")
    message = str(raised.value)
    assert f"{tmp_path / 'test'} is no directory of *.h5 files (data.inf_data_path='test'" in message
    assert message.endswith("workload 'era5_vit' offers valid, test")
    mnist = load_run_config(CONFIGS / "cnn_mnist.yaml", "tiny")
    with pytest.raises(DataError, match="offers test \\(MNIST's test images, the run's validation set\\)"):
        get_workload("cnn_mnist").build_split(mnist.data, "holdout")


# ------------------------------------------------------------------------------- document and files


def classifier_summary() -> EvalSummary:
    confusion = np.array([[3, 1, 0], [0, 2, 0], [0, 0, 0]])  # class "c" has no sample: its accuracy is NaN
    return EvalSummary(
        loss=0.5,
        scalars={"accuracy": 5 / 6},
        headline="accuracy",
        lines=["  Val accuracy=83.33% (5/6)"],
        baseline_name="majority class",
        baseline_scalars={"accuracy": 4 / 6},
        class_counts=ClassCounts(confusion, ("a", "b", "c")),
        samples=6,
    )


def test_the_document_is_strict_json_and_the_csv_has_a_row_per_metric_and_class():
    document = evaluation_document(classifier_summary(), {"split": "test"})
    assert document["split"] == "test" and document["loss"] == 0.5 and document["baseline_loss"] is None
    assert document["headline_value"] == 5 / 6 and document["baseline_headline"] == 4 / 6
    assert document["classes"]["confusion"] == [[3, 1, 0], [0, 2, 0], [0, 0, 0]]
    text = to_json(document)
    assert json.loads(text)["classes"]["accuracy"] == [0.75, 1.0, None]  # NaN is null
    rows = list(csv.reader(io.StringIO(metrics_csv(document))))
    assert rows[0] == ["metric", "value", "baseline", "unit"]
    assert rows[1:3] == [["loss", "0.5", "", ""], ["accuracy", repr(5 / 6), repr(4 / 6), ""]]
    assert [row[0] for row in rows[3:]] == ["accuracy/a", "accuracy/b", "accuracy/c"]
    assert float(rows[3][1]) == 0.75


def test_the_evaluation_directory_is_replaced_whole_or_not_at_all(tmp_path):
    target = tmp_path / "eval" / "valid-ckpt_latest"

    def first(directory: Path) -> None:
        (directory / "metrics.json").write_text("old")
        (directory / "old_figure.png").write_text("old")

    write_directory_atomically(target, first)
    assert sorted(p.name for p in target.iterdir()) == ["metrics.json", "old_figure.png"]

    def failing(directory: Path) -> None:
        (directory / "metrics.json").write_text("new")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_directory_atomically(target, failing)
    assert (target / "metrics.json").read_text() == "old"
    assert [p.name for p in target.parent.iterdir()] == ["valid-ckpt_latest"]  # no temporary left

    write_directory_atomically(target, lambda directory: (directory / "metrics.json").write_text("new"))
    assert [p.name for p in target.iterdir()] == ["metrics.json"] and (
        target / "metrics.json"
    ).read_text() == "new"
    assert [p.name for p in target.parent.iterdir()] == ["valid-ckpt_latest"]


# -------------------------------------------------------------------------------------------- progress


def test_progress_is_plain_lines_in_a_log_a_bar_on_a_terminal_and_nothing_when_off(caplog):
    with caplog.at_level(logging.INFO, logger="dlscale.train"):
        assert list(PassProgress([1, 2, 3], "test split", "lines", interval_s=0.0)) == [1, 2, 3]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and lines[1].startswith("test split: batch 2/3 (67%), ") and "ETA" in lines[1]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dlscale.train"):
        assert list(PassProgress([1, 2, 3], "test split", "none", interval_s=0.0)) == [1, 2, 3]
        assert list(PassProgress([1, 2], "test split", "lines", interval_s=3600.0)) == [1, 2]
    assert caplog.records == []
    stream = io.StringIO()
    assert list(PassProgress([1, 2, 3], "valid split", "bar", stream=stream, delay_s=0.0)) == [1, 2, 3]
    assert "valid split:   0%|" in stream.getvalue() and "/3 [" in stream.getvalue()  # a bar, then cleared
    quiet = io.StringIO()  # a pass shorter than the delay draws no bar
    assert list(PassProgress([1, 2, 3], "valid split", "bar", stream=quiet, delay_s=60.0)) == [1, 2, 3]
    assert quiet.getvalue() == ""
