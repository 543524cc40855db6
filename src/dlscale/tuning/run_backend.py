"""The tune's real measurements: dlscale's bench trials and short training runs of the tuned settings.

Every trial config is the user's config (file, ``--set`` and flags) plus the settings' keys, so a trial measures
exactly what the tuned YAML will say. Trials and checks write only inside the tune's output folder (their
bench JSON, logs and short runs), never into the config's own run directory.

An out-of-memory error, a config the change makes invalid, or any other failure of a trial is that trial's
result ("out of memory" / "failed", with the error's first line), not the end of the tune. Under torchrun every
rank runs every trial and all take rank 0's result; an error on a single rank inside a collective cannot be
turned into a result (the other ranks wait in the collective until ``parallel.timeout_s``), which the memory
planner's bound on the batch size makes unlikely.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.config import RunConfig, load_run_config
from dlscale.errors import DlscaleError, TrainingDiverged, exception_line, first_line
from dlscale.run.assembly import batch_sizes
from dlscale.run.bench import bench_one_config
from dlscale.run.config_plan import traced_plan_of
from dlscale.run.training import train_and_summarize
from dlscale.runtime.device import Device
from dlscale.runtime.distributed import share_text_from_main
from dlscale.runtime.launch import ProcessInfo
from dlscale.runtime.strict_json import to_json
from dlscale.tuning.cache import settings_key
from dlscale.tuning.knobs import BATCH_KEY
from dlscale.tuning.records import Measurement, NumericsCheck
from dlscale.tuning.settings import config_keys, run_length_keys

log = logging.getLogger("dlscale.tune")

# Off in every trial and check: they would measure themselves (profilers) or slow the trials down.
QUIET_KEYS = {
    "profile.enable_manual_profiling": False,
    "profile.torch_profiler": False,
    "profile.line_profile": False,
    "bench.enable_benchy": False,
}


@dataclass(frozen=True)
class TrialLengths:
    """How long each throughput measurement and each numerics check is."""

    nwarmup: int = 1
    ntrials: int = 3
    nbatches: int = 20
    check_steps: int = 40  # optimizer steps of the numerics check at the starting batch size


@dataclass(frozen=True)
class ConfigSource:
    """The user's config as given: the file, the section, ``--set`` texts and flag values."""

    yaml_config: str
    config: str
    overrides: tuple[str, ...] = ()
    flag_values: Mapping[str, Any] | None = None
    workload: str | None = None  # a workload reference in place of the config's workload: key

    def load(self, extra: Mapping[str, Any] | None = None) -> RunConfig:
        """The config with ``extra`` keys applied last."""
        return load_run_config(
            self.yaml_config,
            self.config,
            list(self.overrides),
            {**(self.flag_values or {}), **(extra or {})},
            workload=self.workload,
        )


def settings_slug(settings: Mapping[str, Any]) -> str:
    """A short, stable name of a set of settings, for its trial's files."""
    return hashlib.sha256(settings_key("trial", dict(settings)).encode()).hexdigest()[:12]


class RunBackend:
    """Measures and checks settings by running dlscale itself (see the module docstring)."""

    def __init__(
        self,
        source: ConfigSource,
        start: RunConfig,
        out_dir: Path,
        lengths: TrialLengths,
        process: ProcessInfo,
        device: Device,
        data_parallel_ranks: int,
        restore_logging: Any = None,
    ):
        self.source = source
        self.start = start
        self.out_dir = out_dir
        self.lengths = lengths
        self.process = process
        self.device = device
        self.dp = data_parallel_ranks
        # The trials point dlscale's log at their own files; this points it back at the tune's.
        self.restore_logging = restore_logging or (lambda: None)

    def trial_config(self, settings: Mapping[str, Any], extra: Mapping[str, Any]) -> RunConfig:
        """The user's config with ``settings`` and ``extra`` keys."""
        return self.source.load({**config_keys(self.start, dict(settings), self.dp), **QUIET_KEYS, **extra})

    # ------------------------------------------------------------------ throughput
    def measure(self, settings: dict[str, Any]) -> Measurement:
        slug = settings_slug(settings)
        extra = {
            "bench.nwarmup": self.lengths.nwarmup,
            "bench.ntrials": self.lengths.ntrials,
            "bench.nbatches": self.lengths.nbatches,
            "bench.report_freq": 0,
            "bench.run_io": True,
            "bench.run_synthetic": True,
            "bench.run_full": True,
            "log.expdir": str(self.out_dir / "trials"),
            "log.run_num": slug,
        }
        began = time.monotonic()
        try:
            cfg = self.trial_config(settings, extra)
            results = bench_one_config(cfg, self.out_dir / "trials" / f"{slug}.json", "dlscale tune")
            measurement = Measurement(
                "ok",
                {name: list(series.trial_throughput) for name, series in results.tests.items()},
                results.verdict.kind,
                results.verdict.reason,
                time.monotonic() - began,
                results.tests["FULL"].peak_memory_gb if "FULL" in results.tests else None,
            )
        except Exception as error:  # noqa: BLE001 - a knob that breaks the run is a result, not the end of the tune
            measurement = Measurement(
                _failure_status(error), seconds=time.monotonic() - began, message=_first_line(error)
            )
            log.warning("TUNE::rank %d: the trial failed: %s", self.process.rank, measurement.message)
        finally:
            self._between_runs()
        return Measurement.from_json(json.loads(self._shared(to_json(measurement.to_json()))))

    # ------------------------------------------------------------------ numerics
    def check_numerics(self, settings: dict[str, Any]) -> NumericsCheck:
        slug = settings_slug(settings)
        start_global = batch_sizes(self.start, self.dp)[0]
        new_global = settings[BATCH_KEY] * self.dp
        steps = max(1, round(self.lengths.check_steps * start_global / new_global))
        scaled, _ = run_length_keys(self.start, new_global, self.dp)
        extra = {
            "train.num_iters": steps,
            "train.num_epochs": None,
            "checkpoint.enabled": False,
            "checkpoint.resume": "never",
            "log.expdir": str(self.out_dir / "checks"),
            "log.run_num": slug,
            "log.tensorboard": False,
            "log.progress": "none",
            "monitor.enable_monitor": False,
        }
        if "optim.warmup" in scaled:
            extra["optim.warmup"] = scaled["optim.warmup"]
        began = time.monotonic()
        try:
            cfg = self.trial_config(settings, extra)
            run_dir = self.out_dir / "checks" / cfg.name / slug
            if self.process.is_main and run_dir.exists():
                shutil.rmtree(run_dir)  # an unfinished check (a finished one is in the cache)
            summary = train_and_summarize(cfg).summary or {}
            loss = (summary.get("final") or {}).get("val_loss")
            check = NumericsCheck("ok", loss, summary.get("global_step", steps), time.monotonic() - began)
        except TrainingDiverged as error:
            check = NumericsCheck(
                "failed", None, steps, time.monotonic() - began, f"diverged: {_first_line(error)}"
            )
        except Exception as error:  # noqa: BLE001 - as for measure
            check = NumericsCheck("failed", None, steps, time.monotonic() - began, _first_line(error))
        finally:
            self._between_runs()
        return NumericsCheck.from_json(json.loads(self._shared(to_json(check.to_json()))))

    # ------------------------------------------------------------------ memory
    def memory_problem(self, settings: dict[str, Any]) -> str | None:
        if self.start.parallel.tensor_parallel * self.start.parallel.context_parallel > 1:
            return None  # the traced plan covers data parallelism only; the real try decides
        try:
            cfg = self.trial_config(settings, {})
            row = traced_plan_of(cfg, self.dp, self.device.memory_capacity_gb()).plan.requested_row
        except Exception as error:  # noqa: BLE001 - no estimate is not a reason to skip the real try
            log.info(
                "TUNE::no memory estimate for local batch %s (%s)", settings[BATCH_KEY], _first_line(error)
            )
            return None
        return None if row.fits else row.reason

    # ------------------------------------------------------------------ helpers
    def _shared(self, text: str) -> str:
        """Rank 0's result on every rank, so that all ranks decide alike."""
        shared = share_text_from_main(text, self.device)
        return shared if shared is not None else text

    def _between_runs(self) -> None:
        # The trial's model, optimizer and loader are unreachable now; free them before the next one.
        gc.collect()
        self.device.release_cached_memory()
        self.restore_logging()


def _failure_status(error: BaseException) -> str:
    return "out of memory" if Device.is_out_of_memory(error) else "failed"


def _first_line(error: BaseException) -> str:
    """A failure in one line: a DlscaleError's own words, any other exception with its class's name."""
    return first_line(error) if isinstance(error, DlscaleError) else exception_line(error)
