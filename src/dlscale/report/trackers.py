"""The experiment trackers a run's scalars can also go to: wandb and MLflow (optional packages, imported only
when ``log.loggers`` names them; see :mod:`dlscale.report.loggers` for the interface and how a resumed run
continues the same tracker runs)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from dlscale.errors import first_line

log = logging.getLogger("dlscale.report.loggers")


class WandbLogger:
    """A wandb run in ``<run>/wandb/``: offline unless ``WANDB_MODE`` says otherwise; its project is
    ``WANDB_PROJECT`` or "dlscale", its group the config's name. One wandb run per dlscale run: given
    ``run_id`` (the run a checkpoint saved), a resumed attempt continues that run (``wandb.init(id=...,
    resume="allow")`` online; offline, each attempt writes its own ``offline-run-*-<id>`` directory under the
    same run id, which ``wandb sync`` uploads them under). A run id wandb refuses (a run deleted on the
    server, say) gives a new run and one warning.

    Each row is one history row with the optimizer step in ``global_step``, the x-axis of every chart (wandb's
    own ``_step`` counts rows and may only grow: given our step as wandb's step, it would drop with a warning
    each row of the steps that a rollback trains again), and the measured time in ``_timestamp``. A resumed
    run's ``_step`` goes on growing; the steps a killed attempt logged after its last checkpoint are logged
    again by the resumed one, so they appear twice on the ``global_step`` axis (bitwise resume gives them the
    same losses; only the times and rates differ). Closing finishes the run; the wandb-core process writes the
    end of its file moments later (at the latest when this process exits; ``wandb.teardown()`` waits for
    it)."""

    def __init__(self, run_dir: Path, record: Any, start_step: int, run_id: str | None = None):
        import wandb

        run_dir.mkdir(parents=True, exist_ok=True)  # wandb 0.16 logs to /tmp/wandb when `dir` does not exist
        mode = os.environ.get("WANDB_MODE") or "offline"
        where: dict[str, Any] = {
            "project": os.environ.get("WANDB_PROJECT") or "dlscale",
            "group": record.name,
            "name": f"{record.name}/{run_dir.name}",
            "job_type": "train",
            "dir": str(run_dir),
            "mode": mode,
        }
        config = {**record.resolved, "dlscale": {"source": record.source, "resumed_at_step": start_step}}
        self.run: Any = None
        if run_id is not None:
            # Offline, wandb ignores `resume` (0.16 with a warning) and writes the attempt under the given id.
            resume = {} if mode in ("offline", "disabled") else {"resume": "allow"}
            try:
                self.run = wandb.init(id=run_id, **resume, **where)
            except Exception as exc:  # wandb's errors have no common base across versions
                log.warning(
                    "wandb: cannot continue run %s (%s); logging into a new wandb run",
                    run_id,
                    first_line(exc),
                )
        if self.run is None:
            self.run = wandb.init(config=config, **where)
        try:
            if run_id is not None and self.run.id == run_id:
                # A continued run's config changes (the step it resumed at, a longer schedule) are allowed.
                self.run.config.update(config, allow_val_change=True)
            self.run.define_metric(WANDB_STEP, hidden=True)
            self.run.define_metric("*", step_metric=WANDB_STEP)
        except BaseException:
            self.close()
            raise
        self.run_id: str = self.run.id

    def log_scalars(self, step: int, values: Mapping[str, float], wall_time: float) -> None:
        self.run.log({**values, WANDB_STEP: step, "_timestamp": wall_time})

    def close(self) -> None:
        run, self.run = self.run, None
        if run is not None:
            run.finish()


WANDB_STEP = "global_step"  # the history key of the optimizer step in a wandb run


class MlflowLogger:
    """An MLflow run in the experiment named after the config: in ``<run>/mlruns`` (a file store) unless
    ``MLFLOW_TRACKING_URI`` is set. Names MLflow refuses (parentheses, say: ``RMSE(u10m)/valid``) are changed by
    :func:`mlflow_name`.

    Given ``run_id`` (the run a checkpoint saved), a resumed attempt continues that run: it is marked running
    again and its ``dlscale.resumed_at_step`` tag says where the attempt began. One that the store does not
    hold (deleted, or another ``MLFLOW_TRACKING_URI``) gives a new run and one warning. MLflow keeps every
    value logged: a step logged again (the steps a killed attempt logged after its last checkpoint, or those a
    rollback trains again) holds two values in the metric's history, the later timestamp the resumed attempt's
    (the one MLflow shows as the metric's latest value at that step).

    MLflow 3.13 and later refuse a file store unless ``MLFLOW_ALLOW_FILE_STORE=true`` (it gets no new features,
    but keeps runs, metrics and tags, all this logger writes, and needs no database package): this logger sets
    it around its own calls only. To look at the runs, ``MLFLOW_ALLOW_FILE_STORE=true mlflow ui
    --backend-store-uri <run>/mlruns`` (or ``MlflowClient(tracking_uri=...)`` with the variable set)."""

    def __init__(self, run_dir: Path, record: Any, start_step: int, run_id: str | None = None):
        from mlflow.tracking import MlflowClient

        user_uri = os.environ.get("MLFLOW_TRACKING_URI")
        self.tracking_uri = user_uri or (run_dir / "mlruns").resolve().as_uri()
        self._own_file_store = not user_uri  # a store the user names is theirs to allow or not
        self._closed = False
        with self._store():
            self.client = MlflowClient(tracking_uri=self.tracking_uri)
            experiment = self.client.get_experiment_by_name(record.name)
            experiment_id = (
                experiment.experiment_id
                if experiment is not None
                else self.client.create_experiment(record.name)
            )
            tags = {"dlscale.source": record.source, "dlscale.workload": record.workload}
            tags["dlscale.resumed_at_step"] = str(start_step)
            continued = run_id is not None and self._reopen(run_id, start_step)
            self.run_id: str = (
                run_id
                if continued
                else self.client.create_run(
                    experiment_id, run_name=f"{record.name}/{run_dir.name}", tags=tags
                ).info.run_id
            )

    def _reopen(self, run_id: str, start_step: int) -> bool:
        """Mark the stored run ``run_id`` running again; False (and one warning) when the store cannot give
        it."""
        try:
            found = self.client.get_run(run_id)
            stage = found.info.lifecycle_stage
        except Exception as exc:  # MlflowException when the store has no such run; a server's own errors
            log.warning(
                "MLflow: cannot continue run %s (%s); logging into a new MLflow run", run_id, first_line(exc)
            )
            return False
        if stage != "active":
            log.warning("MLflow: run %s is %s; logging into a new MLflow run", run_id, stage)
            return False
        self.client.update_run(run_id, status="RUNNING")
        self.client.set_tag(run_id, "dlscale.resumed_at_step", str(start_step))
        return True

    def log_scalars(self, step: int, values: Mapping[str, float], wall_time: float) -> None:
        from mlflow.entities import Metric

        millis = int(wall_time * 1000)
        metrics = [Metric(mlflow_name(k), float(v), millis, step) for k, v in values.items()]
        with self._store():
            for start in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics per batch
                self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def close(self) -> None:
        """Mark the run finished (once: closing again leaves its end time as it was)."""
        if self._closed:
            return
        self._closed = True
        with self._store():
            self.client.set_terminated(self.run_id)

    @contextlib.contextmanager
    def _store(self) -> Iterator[None]:
        """``MLFLOW_ALLOW_FILE_STORE=true`` while MLflow opens our default file store (it checks the variable
        when it builds a store, which it may do again on any call), unless the user set the variable."""
        if not self._own_file_store or FILE_STORE_SWITCH in os.environ:
            yield
            return
        os.environ[FILE_STORE_SWITCH] = "true"
        try:
            yield
        finally:
            os.environ.pop(FILE_STORE_SWITCH, None)


FILE_STORE_SWITCH = "MLFLOW_ALLOW_FILE_STORE"


def mlflow_name(name: str) -> str:
    """``name`` as every MLflow takes it: the characters it refuses in metric names replaced by ``_`` (``:``
    too, which MLflow 2 and MLflow on Windows refuse), and so is each empty, ``.`` or ``..`` part between
    slashes (MLflow refuses names that a file path would read otherwise)."""
    parts = re.sub(r"[^\w./\- ]", "_", name).split("/")
    return "/".join("_" if part in ("", ".", "..") else part for part in parts)
