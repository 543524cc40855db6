"""A resumed run logs into the same wandb and MLflow runs as the attempt it continues: their ids travel in the
checkpoint (``meta.logger_runs``). Offline: wandb writes offline runs, MLflow a file store under the run."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from test_training_run import StopAtStep

from dlscale.checkpoint.files import load_checkpoint, save_checkpoint
from dlscale.run.training import train

STEPS = 2 * (46 // 4)  # two epochs of the tiny config
BOTH = "log.loggers=[wandb,mlflow]"


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """wandb offline with its files in tmp_path and no server it could reach; MLflow's default file store."""
    pytest.importorskip("wandb", reason="wandb is not installed (pip install -e '.[wandb]')")
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install -e '.[mlflow]')")
    for name in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home" / name.lower()))
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")


def unit_test_module(name: str) -> ModuleType:
    """A test module of tests/report, loaded from its file (on the path only when its own tests run)."""
    path = Path(__file__).resolve().parents[1] / "report" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_continuity_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_dir(cfg) -> Path:
    return Path(cfg.log.expdir) / cfg.name / cfg.log.run_num


def saved_runs(cfg) -> dict:
    return load_checkpoint(run_dir(cfg) / "checkpoints" / "ckpt_latest.pt")["meta"]["logger_runs"]


def mlflow_runs(cfg, monkeypatch) -> dict:
    """run id -> the steps of its ``step/train_loss`` history, for every run of the run directory's store."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(run_dir(cfg) / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name(cfg.name)
    runs = client.search_runs([experiment.experiment_id])
    assert all(run.info.status == "FINISHED" for run in runs)
    return {
        run.info.run_id: [m.step for m in client.get_metric_history(run.info.run_id, "step/train_loss")]
        for run in runs
    }


def wandb_attempts(cfg) -> list[tuple[str, list[int]]]:
    """(run id, the global steps of its step rows) of each offline wandb attempt, oldest first."""
    import wandb

    wandb_run = unit_test_module("test_optional_loggers").wandb_run  # the reader of wandb's run files
    wandb.teardown()  # waits until wandb has written the runs' files whole
    found = [wandb_run(path) for path in (run_dir(cfg) / "wandb").glob("offline-run-*")]
    found.sort(key=lambda run: (run["run"].start_time.seconds, run["run"].start_time.nanos))
    return [
        (run["run"].run_id, [row["global_step"] for row in run["history"] if "step/train_loss" in row])
        for run in found
    ]


@pytest.mark.slow
def test_a_stopped_and_resumed_run_logs_into_the_same_wandb_and_mlflow_runs(
    tiny_config, offline, monkeypatch
):
    cfg = tiny_config(BOTH)
    assert train(cfg, extra_observers=[StopAtStep(5)]) == 0
    ids = saved_runs(cfg)
    assert sorted(ids) == ["mlflow", "wandb"]
    stopped_at = load_checkpoint(run_dir(cfg) / "checkpoints" / "ckpt_latest.pt")["progress"]["global_step"]
    assert 0 < stopped_at < STEPS
    assert train(cfg) == 0  # the same command again: the requeue
    assert saved_runs(cfg) == ids
    assert mlflow_runs(cfg, monkeypatch) == {ids["mlflow"]: list(range(1, STEPS + 1))}
    attempts = wandb_attempts(cfg)
    assert [run_id for run_id, _ in attempts] == [ids["wandb"]] * 2
    assert [step for _, steps in attempts for step in steps] == list(range(1, STEPS + 1))  # each step once
    with (run_dir(cfg) / "metrics" / "steps.csv").open(newline="") as file:
        assert [int(row["step"]) for row in csv.DictReader(file)] == list(range(1, STEPS + 1))


def test_a_checkpoint_without_logger_ids_starts_new_runs_with_one_line(tiny_config, offline, monkeypatch):
    cfg = tiny_config("log.loggers=[mlflow]")
    train(cfg, extra_observers=[StopAtStep(5)])
    latest = run_dir(cfg) / "checkpoints" / "ckpt_latest.pt"
    payload = load_checkpoint(latest)
    first = payload["meta"].pop("logger_runs")["mlflow"]  # as dlscale wrote checkpoints before it kept them
    save_checkpoint(payload, latest)
    train(cfg)
    new = saved_runs(cfg)["mlflow"]
    assert new != first
    runs = mlflow_runs(cfg, monkeypatch)
    assert sorted(runs) == sorted([first, new])
    assert runs[new][0] == payload["progress"]["global_step"] + 1 and runs[new][-1] == STEPS
    lines = (run_dir(cfg) / "out.log").read_text().splitlines()
    assert sum("the checkpoint names no mlflow run" in line for line in lines) == 1
    assert not any("WARNING" in line and "mlflow" in line.lower() for line in lines)


def test_another_runs_checkpoint_gives_new_logger_runs(tiny_config, offline, monkeypatch, tmp_path):
    first = tiny_config("log.loggers=[mlflow]", expdir=tmp_path / "first")
    train(first, extra_observers=[StopAtStep(5)])
    source = run_dir(first) / "checkpoints" / "ckpt_latest.pt"
    second = tiny_config(
        "log.loggers=[mlflow]", expdir=tmp_path / "second", **{"checkpoint.resume": str(source)}
    )
    train(second)
    assert saved_runs(second)["mlflow"] != saved_runs(first)["mlflow"]
    # a new run from the start, not a failed attempt to continue one that lives in the other directory
    text = (run_dir(second) / "out.log").read_text()
    assert "the checkpoint names no mlflow run" in text and "cannot continue" not in text
    assert json.loads((run_dir(second) / "summary.json").read_text())


def test_a_restore_takes_the_saved_ids_the_run_has_not_opened_yet():
    from dlscale.checkpoint.training_state import continue_logger_runs

    runs = {"mlflow": "open-now"}  # a rollback's restore: the loggers have their runs open
    continue_logger_runs(runs, {"mlflow": "saved", "wandb": "w1", "bad": 3, "": "x", "empty": ""})
    assert runs == {"mlflow": "open-now", "wandb": "w1"}
    for missing in (None, [], "mlflow"):  # an old checkpoint, or an entry that is no mapping
        kept = {"wandb": "w1"}
        continue_logger_runs(kept, missing)
        assert kept == {"wandb": "w1"}
