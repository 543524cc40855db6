"""The optional wandb and MLflow loggers with the real packages, offline and without a server: what a run logs
through them is read back with the packages' own readers (wandb: its offline run file; MLflow: MlflowClient).

Each test skips, saying why, where its package is not installed: ``pip install -e '.[wandb,mlflow]'``.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from run_configs import tiny_run_config

from dlscale.report.loggers import missing_logger_package, open_loggers
from dlscale.report.trackers import MlflowLogger, WandbLogger, mlflow_name

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "vit_era5.yaml"
WANDB_MISSING = "wandb is not installed (pip install -e '.[wandb]'): the wandb logger is not tested"
MLFLOW_MISSING = "mlflow is not installed (pip install -e '.[mlflow]'): the MLflow logger is not tested"
T0 = 1_790_000_000.25  # wall times of the rows: seconds since the epoch, as time.time() gives them


def record_of(tmp_path: Path) -> SimpleNamespace:
    """What the loggers read of a run's RunRecord, from the shipped tiny config (its whole resolved config)."""
    cfg = tiny_run_config(CONFIG_FILE, tmp_path / "data", tmp_path / "runs", "log.loggers=[wandb,mlflow]")
    return SimpleNamespace(name=cfg.name, source=cfg.source, workload=cfg.workload, resolved=cfg.to_dict())


def points(logged: list) -> list:
    """(step, name, value, time) points in a canonical order, values as floats and NaN as "nan" (so that
    NaN equals NaN, and 1 equals 1.0: wandb's JSON writes a whole float as an integer)."""
    canonical = [(step, name, "nan" if math.isnan(v) else float(v), wall) for step, name, v, wall in logged]
    return sorted(canonical, key=lambda point: (point[0], point[3], point[1]))


def log_a_short_run(opened, first: int = 1, last: int = 4, epoch_every: int = 2, scale: float = 1.0) -> list:
    """Per-step rows for steps first..last and an epoch row every ``epoch_every`` steps, as MetricsReporter
    sends them (the steps of an epoch, then the epoch's row at its last step); returns (step, name, value, time)
    of each value logged, names as the backends get them."""
    logged = []
    for step in range(first, last + 1):
        loss = math.inf if step == 3 else scale / step  # a skipped step: inf
        values = {"epoch": (step - 1) // epoch_every + 1, "train_loss": loss, "lr": 1e-3 * step}
        for logger in opened.steps:
            logger.log_scalars(step, values, T0 + step)
        logged += [(step, "step/" + name, value, T0 + step) for name, value in values.items()]
        if step % epoch_every == 0:
            epoch_values = {
                "epoch": step // epoch_every,
                "Loss/valid": scale / step**2,
                "RMSE(u10m)/valid": 0.5,
            }
            for logger in opened.epochs:
                logger.log_scalars(step, epoch_values, T0 + step + 0.5)
            logged += [(step, name, value, T0 + step + 0.5) for name, value in epoch_values.items()]
    return logged


def the_backend(opened, kind):
    return next(logger for logger in opened.owned if isinstance(logger, kind))


@pytest.mark.slow
def test_the_packages_are_imported_only_when_a_run_names_them(tmp_path):
    # Meaningful where they are installed: there an import at the top of loggers.py would load them.
    pytest.importorskip("wandb", reason=WANDB_MISSING)
    pytest.importorskip("mlflow", reason=MLFLOW_MISSING)
    assert missing_logger_package(["tensorboard", "wandb", "mlflow"]) is None
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from types import SimpleNamespace\n"
        "import dlscale\n"
        "from dlscale.report.loggers import open_loggers\n"
        f"opened = open_loggers(['csv'], Path({str(tmp_path)!r}), SimpleNamespace(name='tiny'), 0)\n"
        "opened.close()\n"
        "print(sorted(m for m in ('wandb', 'mlflow') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------------- wandb


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """No WANDB_MODE (the logger's default: offline), wandb's own files in tmp_path, and a server address on
    the loopback that refuses connections, so that nothing can reach the network."""
    pytest.importorskip("wandb", reason=WANDB_MISSING)
    for name in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "wandb_home"
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(home / name.lower()))
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")  # wandb's crash reports go to a server of their own
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # older wandb writes debug logs to ./wandb


def wandb_records(path: Path):
    """The records of a wandb run file (``run-<id>.wandb``): the W&B header (":W&B", magic 0xBEE1, version),
    then LevelDB's log format: 32 KiB blocks of chunks (checksum u32, length u16, type u8: 1 a whole record,
    2/3/4 its first/middle/last part); each record a protobuf ``Record`` of wandb's internal protocol."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<HB", data[4:7]) == (0xBEE1, 0), data[:7]
    block, position, pending = 32 * 1024, 7, b""
    while position + 7 <= len(data):
        room = block - position % block
        if room < 7:  # a block's tail too short for a chunk header is padding
            position += room
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0:  # zero padding to the end of the block
            position += room
            continue
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def wandb_run(directory: Path) -> dict:
    """An offline wandb run read back from its files: its run record and history rows (key -> value)."""
    (run_file,) = directory.glob("run-*.wandb")
    found: dict = {"history": [], "metrics": [], "config": {}}
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            found["run"] = record.run
            found["config"].update(
                {item.key: json.loads(item.value_json) for item in record.run.config.update}
            )
        elif kind == "config":  # run.config.update() after the start
            found["config"].update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            row = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            found["history"].append(row)
        elif kind == "metric":
            found["metrics"].append(record.metric)
        elif kind == "exit":
            found["exit_code"] = record.exit.exit_code
    return found


def wandb_points(history: list[dict]) -> list:
    """(step, name, value, time) of each value of the history rows, in the order logged."""
    points = []
    for row in history:
        for name, value in row.items():
            if not name.startswith("_") and name != "global_step":
                points.append((row["global_step"], name, value, row["_timestamp"]))
    return points


def offline_runs(run_dir: Path) -> list[dict]:
    """The offline wandb runs under ``run_dir`` (see :func:`wandb_run`), in the order they started, once wandb
    has written them whole: ``finish()`` returns before the wandb-core process has written all of a run's file
    (it does so moments later, or when the process exits); ``wandb.teardown()`` waits for that."""
    import wandb

    wandb.teardown()
    runs = [wandb_run(path) for path in (run_dir / "wandb").glob("offline-run-*")]
    return sorted(runs, key=lambda run: (run["run"].start_time.seconds, run["run"].start_time.nanos))


def test_wandb_offline_records_every_value_at_its_step_and_time(tmp_path, wandb_env):
    run_dir, record = tmp_path / "runs" / "tiny" / "00", record_of(tmp_path)
    opened = open_loggers(["wandb"], run_dir, record, 0)
    logged = log_a_short_run(opened)
    opened.close()
    (run,) = offline_runs(run_dir)  # offline by default: no WANDB_MODE, no server, no account
    assert points(wandb_points(run["history"])) == points(logged)
    assert run["exit_code"] == 0
    assert (run["run"].project, run["run"].run_group, run["run"].display_name) == (
        "dlscale",
        "tiny",
        "tiny/00",
    )
    config = {item.key: json.loads(item.value_json) for item in run["run"].config.update}
    assert config["model"] == record.resolved["model"]
    assert config["dlscale"] == {"source": record.source, "resumed_at_step": 0}
    # the charts' x-axis is the optimizer step
    assert any(m.glob_name == "*" and m.step_metric == "global_step" for m in run["metrics"])


def test_wandb_keeps_the_steps_a_rollback_trains_again(tmp_path, wandb_env):
    run_dir = tmp_path / "run"
    logger = WandbLogger(run_dir, record_of(tmp_path), 0)
    for step in (1, 2, 3, 4):
        logger.log_scalars(step, {"train_loss": 1.0 / step}, T0 + step)
    for step in (3, 4, 5):  # rolled back to step 2: steps 3 and 4 trained again
        logger.log_scalars(step, {"train_loss": 10.0 / step}, T0 + 10 + step)
    logger.close()
    logger.close()  # closing again does nothing
    (run,) = offline_runs(run_dir)
    seen = [(step, value) for step, _, value, _ in wandb_points(run["history"])]
    assert seen == [(1, 1.0), (2, 0.5), (3, 1 / 3), (4, 0.25), (3, 10 / 3), (4, 2.5), (5, 2.0)]


def test_a_resumed_attempt_without_a_saved_wandb_id_is_a_second_run_next_to_the_first(tmp_path, wandb_env):
    run_dir, record = tmp_path / "runs" / "tiny" / "00", record_of(tmp_path)
    first = open_loggers(["wandb"], run_dir, record, 0)
    first_logged = log_a_short_run(first, 1, 4)
    first.close()
    resumed = open_loggers(["wandb"], run_dir, record, 2)  # the checkpoint was at step 2
    resumed_logged = log_a_short_run(resumed, 3, 6, scale=7.0)
    resumed.close()
    first_run, resumed_run = offline_runs(run_dir)
    assert points(wandb_points(first_run["history"])) == points(first_logged)  # untouched by the second
    assert points(wandb_points(resumed_run["history"])) == points(resumed_logged)
    assert first_run["run"].run_id != resumed_run["run"].run_id
    config = {item.key: json.loads(item.value_json) for item in resumed_run["run"].config.update}
    assert config["dlscale"]["resumed_at_step"] == 2


def test_a_resumed_run_continues_its_wandb_run_with_each_step_once(tmp_path, wandb_env):
    run_dir, record, runs = tmp_path / "runs" / "tiny" / "00", record_of(tmp_path), {}
    first = open_loggers(["wandb"], run_dir, record, 0, runs=runs)
    first_logged = log_a_short_run(first, 1, 4)
    assert runs == {"wandb": the_backend(first, WandbLogger).run.id}
    first.close()
    saved = dict(runs)  # what the checkpoint at step 4 holds
    resumed = open_loggers(["wandb"], run_dir, record, 4, runs=saved)
    resumed_logged = log_a_short_run(resumed, 5, 8, scale=7.0)
    resumed.close()
    assert saved == runs  # the same run, which the next checkpoints save again
    attempts = offline_runs(run_dir)
    assert [attempt["run"].run_id for attempt in attempts] == [runs["wandb"]] * 2
    history = [row for attempt in attempts for row in attempt["history"]]
    assert points(wandb_points(history)) == points(first_logged + resumed_logged)
    step_rows = [row["global_step"] for row in history if "step/train_loss" in row]
    assert step_rows == list(range(1, 9))  # each step once, in order
    assert attempts[1]["config"]["dlscale"]["resumed_at_step"] == 4
    assert attempts[1]["config"]["model"] == record.resolved["model"]


def test_a_wandb_run_that_cannot_be_continued_is_replaced_with_one_warning(
    tmp_path, wandb_env, monkeypatch, caplog
):
    import wandb

    real_init = wandb.init

    def init_refusing_ids(*args, **kwargs):  # as a server answers for a deleted run
        if "id" in kwargs:
            raise wandb.errors.CommError("run dlscale/gone1234 was previously created and deleted\ndetails")
        return real_init(*args, **kwargs)

    monkeypatch.setattr(wandb, "init", init_refusing_ids)
    run_dir, runs = tmp_path / "run", {"wandb": "gone1234"}
    with caplog.at_level("INFO", logger="dlscale"):
        opened = open_loggers(["wandb"], run_dir, record_of(tmp_path), 6, runs=runs)
    log_a_short_run(opened, 7, 8)
    opened.close()
    warnings = [
        r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name.startswith("dlscale")
    ]
    assert warnings == [
        "wandb: cannot continue run gone1234 (run dlscale/gone1234 was previously created and deleted); "
        "logging into a new wandb run"
    ]
    (attempt,) = offline_runs(run_dir)
    assert runs["wandb"] == attempt["run"].run_id != "gone1234"  # the new run is the one saved from here on


def test_online_a_saved_wandb_id_is_resumed_with_resume_allow(tmp_path, wandb_env, monkeypatch):
    import wandb

    real_init, calls = wandb.init, []

    def init_offline_instead(*args, **kwargs):  # what an online run asks of wandb, run offline here
        calls.append({k: kwargs.get(k) for k in ("id", "resume", "mode")})
        return real_init(*args, **{**kwargs, "mode": "offline"})

    monkeypatch.setattr(wandb, "init", init_offline_instead)
    monkeypatch.setenv("WANDB_MODE", "online")
    runs = {"wandb": "kept1234"}
    open_loggers(["wandb"], tmp_path / "run", record_of(tmp_path), 4, runs=runs).close()
    assert calls == [{"id": "kept1234", "resume": "allow", "mode": "online"}]
    assert runs == {"wandb": "kept1234"}
    calls.clear()
    monkeypatch.setenv("WANDB_MODE", "offline")  # offline wandb ignores `resume` (0.16 warns): not passed
    open_loggers(["wandb"], tmp_path / "run", record_of(tmp_path), 4, runs=runs).close()
    assert calls == [{"id": "kept1234", "resume": None, "mode": "offline"}]


# --------------------------------------------------------------------------------------------------- MLflow


@pytest.fixture
def mlflow_env(tmp_path, monkeypatch):
    """No MLFLOW_TRACKING_URI (the logger's default: a file store under the run), no telemetry, and a working
    directory of its own, to see that nothing is written outside the run."""
    pytest.importorskip("mlflow", reason=MLFLOW_MISSING)
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def mlflow_client(store: Path, monkeypatch):
    """A reader of the file store ``store`` (MLflow 3.13 and later open one only with this variable set)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return MlflowClient(tracking_uri=store.resolve().as_uri())


def mlflow_points(client, run_id: str) -> list:
    """(step, name, value, time) of every value of a run."""
    found = []
    for name in client.get_run(run_id).data.metrics:
        found += [
            (m.step, m.key, m.value, m.timestamp / 1000) for m in client.get_metric_history(run_id, name)
        ]
    return points(found)


def as_mlflow(logged: list) -> list:
    """What MLflow should hold of values logged: names mapped, times in whole milliseconds."""
    return points(
        [(step, mlflow_name(name), v, math.floor(wall * 1000) / 1000) for step, name, v, wall in logged]
    )


def test_mlflow_records_every_value_at_its_step_in_a_file_store_under_the_run(
    tmp_path, mlflow_env, monkeypatch
):
    run_dir, record = tmp_path / "runs" / "tiny" / "00", record_of(tmp_path)
    opened = open_loggers(["mlflow"], run_dir, record, 0)
    logged = log_a_short_run(opened)
    run_id = the_backend(opened, MlflowLogger).run_id
    opened.close()
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ  # set around the logger's own calls only
    assert list(mlflow_env.iterdir()) == []  # no mlflow.db, no ./mlruns: all under the run
    client = mlflow_client(run_dir / "mlruns", monkeypatch)
    assert mlflow_points(client, run_id) == as_mlflow(logged)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "tiny/00"
    assert client.get_experiment(run.info.experiment_id).name == "tiny"
    assert run.data.tags["dlscale.workload"] == "era5_vit" and run.data.tags["dlscale.resumed_at_step"] == "0"
    assert run.data.tags["dlscale.source"] == record.source


def test_names_mlflow_refuses_are_mapped_to_names_it_takes(tmp_path, mlflow_env, monkeypatch):
    from mlflow.exceptions import MlflowException

    names = ["RMSE(u10m)/valid", "ACC[t2m]/persistence", "Loss/", "a//b", "./x", "../y", "µ-loss %"]
    mapped = ["RMSE_u10m_/valid", "ACC_t2m_/persistence", "Loss/_", "a/_/b", "_/x", "_/y", "µ-loss _"]
    assert [mlflow_name(name) for name in names] == mapped
    assert mlflow_name("") == "_"
    assert mlflow_name("time: s") == "time_ s"  # MLflow 2 (and on Windows) refuses ":"
    taken = "Performance/TFLOP/s per device fp32.bf16_mix-1"
    assert mlflow_name(taken) == taken  # what every MLflow takes stays as it is
    logger = MlflowLogger(tmp_path / "run", record_of(tmp_path), 0)
    logger.log_scalars(3, {name: float(i) for i, name in enumerate([*names, taken])}, T0)
    logger.close()
    client = mlflow_client(tmp_path / "run" / "mlruns", monkeypatch)
    assert mlflow_points(client, logger.run_id) == points(
        [(3, name, float(i), T0) for i, name in enumerate([*mapped, taken])]
    )
    for name in [*names, ""]:  # MLflow itself refuses each of them as it is
        with pytest.raises(MlflowException):
            client.log_metric(logger.run_id, name, 0.5, step=1)


def test_a_resumed_attempt_without_a_saved_mlflow_id_is_a_second_run_and_keeps_the_first(
    tmp_path, mlflow_env, monkeypatch
):
    run_dir, record = tmp_path / "runs" / "tiny" / "00", record_of(tmp_path)
    first = open_loggers(["mlflow"], run_dir, record, 0)
    first_logged = log_a_short_run(first, 1, 4)
    first_id = the_backend(first, MlflowLogger).run_id
    first.close()
    resumed = open_loggers(["mlflow"], run_dir, record, 2)  # the checkpoint was at step 2
    resumed_logged = log_a_short_run(resumed, 3, 6, scale=7.0)
    resumed_id = the_backend(resumed, MlflowLogger).run_id
    resumed.close()
    client = mlflow_client(run_dir / "mlruns", monkeypatch)
    assert mlflow_points(client, first_id) == as_mlflow(first_logged)  # untouched by the second attempt
    assert mlflow_points(client, resumed_id) == as_mlflow(resumed_logged)
    assert first_id != resumed_id
    assert client.get_run(first_id).info.experiment_id == client.get_run(resumed_id).info.experiment_id
    assert client.get_run(resumed_id).data.tags["dlscale.resumed_at_step"] == "2"


def test_closing_an_mlflow_run_twice_leaves_its_end(tmp_path, mlflow_env, monkeypatch):
    logger = MlflowLogger(tmp_path / "run", record_of(tmp_path), 0)
    logger.log_scalars(1, {"train_loss": 0.5}, T0)
    logger.close()
    client = mlflow_client(tmp_path / "run" / "mlruns", monkeypatch)
    ended = client.get_run(logger.run_id).info.end_time
    time.sleep(0.01)
    logger.close()
    assert client.get_run(logger.run_id).info.end_time == ended


def test_mlflow_logs_where_mlflow_tracking_uri_says(tmp_path, mlflow_env, monkeypatch):
    elsewhere = tmp_path / "team_store"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", elsewhere.as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a file store the user names is theirs to allow
    logger = MlflowLogger(tmp_path / "run", record_of(tmp_path), 0)
    logger.log_scalars(7, {"train_loss": 0.25}, T0)
    logger.close()
    assert not (tmp_path / "run" / "mlruns").exists()
    client = mlflow_client(elsewhere, monkeypatch)
    assert [(m.step, m.value) for m in client.get_metric_history(logger.run_id, "train_loss")] == [(7, 0.25)]


def test_a_resumed_run_continues_its_mlflow_run_with_each_step_once(tmp_path, mlflow_env, monkeypatch):
    run_dir, record, runs = tmp_path / "runs" / "tiny" / "00", record_of(tmp_path), {}
    first = open_loggers(["mlflow"], run_dir, record, 0, runs=runs)
    first_logged = log_a_short_run(first, 1, 4)
    first.close()
    run_id = runs["mlflow"]
    resumed = open_loggers(["mlflow"], run_dir, record, 4, runs=dict(runs))  # the checkpoint at step 4
    assert the_backend(resumed, MlflowLogger).run_id == run_id
    resumed_logged = log_a_short_run(resumed, 5, 8, scale=7.0)
    resumed.close()
    client = mlflow_client(run_dir / "mlruns", monkeypatch)
    run = client.get_run(run_id)
    assert [r.info.run_id for r in client.search_runs([run.info.experiment_id])] == [run_id]  # one run
    assert mlflow_points(client, run_id) == as_mlflow(first_logged + resumed_logged)
    assert [m.step for m in client.get_metric_history(run_id, "step/train_loss")] == list(range(1, 9))
    assert run.info.status == "FINISHED" and run.data.tags["dlscale.resumed_at_step"] == "4"


@pytest.mark.parametrize("how", ["deleted", "unknown"])
def test_an_mlflow_run_that_cannot_be_continued_is_replaced_with_one_warning(
    tmp_path, mlflow_env, monkeypatch, caplog, how
):
    run_dir, record = tmp_path / "run", record_of(tmp_path)
    first = MlflowLogger(run_dir, record, 0)
    first.close()
    client = mlflow_client(run_dir / "mlruns", monkeypatch)
    if how == "deleted":
        client.delete_run(first.run_id)
        gone = first.run_id
    else:
        gone = "0123456789abcdef0123456789abcdef"  # another store's run, say
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    runs = {"mlflow": gone}
    with caplog.at_level("INFO", logger="dlscale"):
        opened = open_loggers(["mlflow"], run_dir, record, 2, runs=runs)
    log_a_short_run(opened, 3, 4)
    opened.close()
    warnings = [
        r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name.startswith("dlscale")
    ]
    assert len(warnings) == 1 and warnings[0].startswith("MLflow: ") and gone in warnings[0], warnings
    assert warnings[0].endswith("logging into a new MLflow run")
    assert runs["mlflow"] not in (gone, first.run_id)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    new = client.get_run(runs["mlflow"])
    assert new.info.status == "FINISHED" and new.data.tags["dlscale.resumed_at_step"] == "2"
    assert [m.step for m in client.get_metric_history(runs["mlflow"], "step/train_loss")] == [3, 4]


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_a_checkpoint_without_a_run_id_starts_a_new_run_with_one_line(tmp_path, request, caplog, name):
    request.getfixturevalue(f"{name}_env")
    run_dir, runs = tmp_path / "runs" / "tiny" / "00", {}
    with caplog.at_level("INFO", logger="dlscale"):
        opened = open_loggers([name], run_dir, record_of(tmp_path), 2, runs=runs)
    opened.close()
    (line,) = [r.getMessage() for r in caplog.records if r.name.startswith("dlscale")]
    assert line.startswith(f"{name}: the checkpoint names no {name} run") and "starts at step 2" in line
    assert list(runs) == [name] and runs[name]  # saved from here on
    caplog.clear()
    with caplog.at_level("INFO", logger="dlscale"):
        open_loggers([name], run_dir, record_of(tmp_path), 0, runs={}).close()
    assert [r for r in caplog.records if r.name.startswith("dlscale")] == []  # a fresh run says nothing
