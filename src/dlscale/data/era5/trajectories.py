"""An ERA5 split as trajectories along time, for ``dlscale forecast``'s rollouts.

Each year file is one trajectory (a rollout never crosses from one file into the next: the files of a split
need not be consecutive years). The state at time index t of a file is the top-left (H, W) crop of
``fields[t, :n]``; a model step is ``data.dt`` time indices of ``hours_per_step`` hours each (the ``fields``
attribute where a file has it, else 6: the tutorial's 6-hourly files). States are read through
:class:`~dlscale.data.era5.dataset.ERA5Dataset`'s raw view, so in the units of the files, and normalized for the
model with the statistics the model was trained with.

Dates: from a file's ``time`` dataset (seconds since 1970, as ``dlscale data import-era5`` writes it), else a
file named after its year (``2018.h5``, the tutorial's) starts on 1 January at 00 UTC, so time index t is
``year-01-01 + t * hours_per_step``; other files give no dates (initial times are then chosen by position).
Two climatologies: ``climatology_store`` is ``data.climatology_path`` (``stats/climatology.zarr``, WeatherBench2's
climatology by day of year and hour of day, which ``dlscale data climatology`` and ``import-era5`` write) when it
exists, else None (then ``climatology_command`` is the command that builds it, for the forecast's log);
``dlscale forecast`` scores against it by default. ``climatology()`` is
``data.time_means_path`` (the tutorial's ``stats/time_means.npy``, (1, C, H_file, W_file)): one mean over the
training years, the fallback, against which the anomaly correlation still holds the seasonal and daily cycles.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from dlscale.data.era5.climatology.store_layout import climatology_path
from dlscale.data.era5.config import ERA5DataConfig
from dlscale.data.era5.dataset import ERA5Dataset
from dlscale.data.era5.file_dates import file_dates
from dlscale.data.era5.file_dates import hours_per_step as file_hours_per_step
from dlscale.data.era5.importing.names import weatherbench2_name
from dlscale.data.trajectories import ForecastStart
from dlscale.data.values.npy_files import read_npy_array
from dlscale.errors import DataError
from dlscale.runtime.file_status import NOT_FOUND, why_not_a_file

log = logging.getLogger(__name__)


class ERA5Trajectories:
    """The states of one ERA5 split along time (see the module docstring); a
    :class:`dlscale.data.trajectories.Trajectories`."""

    def __init__(
        self,
        cfg: ERA5DataConfig,
        split: str,
        quantities: Mapping[str, tuple[str, str]] | None = None,
    ):
        """``quantities``: each channel name's (long name, unit), where known."""
        if cfg.n_in_channels != cfg.n_out_channels:
            raise DataError(
                f"cannot roll out: the model reads {cfg.n_in_channels} channels (data.n_in_channels) and predicts "
                f"{cfg.n_out_channels} (data.n_out_channels); a forecast feeds each prediction back as the next "
                "input, so they must be equal"
            )
        # Every sample of the split, whatever the run's limit on validation samples; multi-step training
        # (dlscale.data.rollout_samples) keeps the limit of its split as the first that many samples.
        self.sample_limit = {"train": cfg.limit_nsamples, "valid": cfg.limit_nsamples_val}.get(split)
        self.cfg = dataclasses.replace(cfg, limit_nsamples=None, limit_nsamples_val=None)
        self.split = split
        normalized = ERA5Dataset(self.cfg, split)
        self._raw, normalizer = normalized.device_normalization()
        assert normalizer is not None
        self._means = normalizer.input_means  # (C, 1, 1) float32
        self._stds = normalizer.input_stds
        self.files = normalized.files
        self.steps_per_file = [count + self.cfg.dt for count in normalized.samples_per_file]
        n = self.cfg.n_in_channels
        self.channel_names = tuple(normalized.channel_names[:n])
        known = quantities or {}
        self.long_names = tuple(known.get(name, (name, ""))[0] for name in self.channel_names)
        self.units = tuple(known.get(name, (name, ""))[1] for name in self.channel_names)
        self.weatherbench2_names = tuple(weatherbench2_name(name) for name in self.channel_names)
        store = self.cfg.path("climatology_path")
        self.climatology_store: Path | None = store if store.exists() else None
        # What builds the store where it is missing (the forecast's log names it): data climatology writes
        # ROOT/stats/climatology.zarr, which is data.climatology_path unless the config moved it.
        root = self.cfg.path("root")
        self.climatology_command: str | None = None
        if self.climatology_store is None:
            built = climatology_path(root)
            self.climatology_command = f"`dlscale data climatology --root {root}`"
            if store != built:  # data.climatology_path names another place: the forecast must be told
                self.climatology_command += f" (it writes {built}: add --climatology {built})"
        hours_per_step = file_hours_per_step(self.files[0])
        self.step_hours = hours_per_step * self.cfg.dt
        self.hours_per_state = hours_per_step
        self.latitudes = normalized.latitudes
        self.longitudes = normalized.longitudes
        self._dates = [
            file_dates(path, steps, self.hours_per_state)
            for path, steps in zip(self.files, self.steps_per_file, strict=True)
        ]

    def starts(self) -> list[ForecastStart]:
        return [
            ForecastStart(trajectory, step, self._date(trajectory, step))
            for trajectory, count in enumerate(self.steps_per_file)
            for step in range(count)
        ]

    def reach(self, start: ForecastStart) -> int:
        return (self.steps_per_file[start.trajectory] - 1 - start.step) // self.cfg.dt

    def states(self, starts: Sequence[ForecastStart], lead: int) -> torch.Tensor:
        dt = self.cfg.dt
        places = []
        for start in starts:
            t = start.step + lead * dt
            if not 0 <= t < self.steps_per_file[start.trajectory]:
                raise DataError(
                    f"{self.files[start.trajectory]}: time index {t} is beyond the file's "
                    f"{self.steps_per_file[start.trajectory]} states"
                )
            places.append((start.trajectory, t))
        # One state per start (a rollout's truth, a multi-step sample's leads), not an input-and-target pair.
        return self._raw.read_states(places)

    def normalize(self, states: torch.Tensor) -> torch.Tensor:
        return (states - self._means.to(states.device)) / self._stds.to(states.device)

    def to_physical(self, normalized: torch.Tensor) -> torch.Tensor:
        return normalized * self._stds.to(normalized.device) + self._means.to(normalized.device)

    def climatology(self) -> torch.Tensor | None:
        path = self.cfg.path("time_means_path")
        if why_not_a_file(path) == NOT_FOUND:
            log.warning(
                "%s: no climatology (data.time_means_path): the forecast is scored without ACC and without the "
                "climatology baseline",
                path,
            )
            return None
        n, (height, width) = len(self.channel_names), self.cfg.img_size
        expected = f"time_means_path, a .npy array of shape (1, C >= {n}, H >= {height}, W >= {width})"
        array = read_npy_array(path, expected)
        shape = array.shape
        if len(shape) != 4 or shape[0] != 1 or shape[1] < n or shape[2] < height or shape[3] < width:
            raise DataError(f"{path}: has shape {array.shape}; expected {expected}")
        values = np.asarray(array[0, :n, :height, :width], dtype=np.float32)
        if not np.isfinite(values).all():
            raise DataError(f"{path}: holds NaN or infinite values; expected a climatology of finite fields")
        return torch.from_numpy(values.copy())

    def describe(self) -> str:
        height, width = self.cfg.img_size
        return (
            f"ERA5 {self.split} split: {len(self.files)} file(s), {sum(self.steps_per_file)} states, "
            f"{height}x{width} grid, {len(self.channel_names)} channels, {self.step_hours:g} h per model step"
        )

    def _date(self, trajectory: int, step: int) -> np.datetime64 | None:
        dates = self._dates[trajectory]
        return None if dates is None else dates[step]
