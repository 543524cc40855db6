"""Which climatology ``dlscale forecast`` scores against: the ACC's reference and the climatology forecaster.

* ``--climatology PATH``: a climatology store in WeatherBench2's layout (ours from ``dlscale data climatology``,
  or one WeatherBench2 publishes, found on the forecast's grid by coordinates); the data's initial times must
  have dates.
* ``--climatology time-mean``: the one mean field over the training years (``Trajectories.climatology()``;
  ERA5's ``data.time_means_path``), the reference dlscale used before it had the other.
* neither: the data's ``climatology_store`` (ERA5's ``data.climatology_path``, ``stats/climatology.zarr``) when
  it exists and the starts have dates, else the mean field (the log says which).

The mean field is a fallback, not a fourth forecaster beside the day-of-year climatology: it is that
climatology averaged over the year, so it can only score worse, and an ACC has one reference. Its anomalies keep
the seasonal and daily cycles, so its ACC is not comparable with WeatherBench2's: the log says so, and where the
data has no store yet, names the command that builds one (the trajectories' optional ``climatology_command``).

The forecast's directory is named by the reference it used (:func:`directory_climatology`), not by how it was
asked for: the mean field is ``clim-timemean`` whether ``--climatology time-mean`` or the fallback chose it, so
the same command before and after ``dlscale data climatology`` writes two directories, never one over the other.

Every valid time of the forecast is checked against the store before the rollout (its hour of day, and the days
our stores mark as without data), so a climatology that cannot score the forecast stops it at once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dlscale.data.trajectories import ForecastStart, Trajectories
from dlscale.errors import ConfigError
from dlscale.scoring.climatologies import (
    TIME_MEAN_KIND,
    Climatology,
    TimeMeanClimatology,
    ValidTimeClimatology,
)

log = logging.getLogger("dlscale.train")

TIME_MEAN_OPTION = "time-mean"  # --climatology time-mean
NO_CLIMATOLOGY = "none"  # no climatology at all: no ACC (directory_climatology)
NOT_COMPARABLE = (
    "its anomalies keep the seasonal and daily cycles, so this ACC is higher than WeatherBench2's and not "
    "comparable with published ones"
)


def choose_climatology(
    requested: str | None, trajectories: Trajectories, starts: Sequence[ForecastStart], steps: int
) -> Climatology | None:
    """The climatology for a forecast of ``steps`` model steps from ``starts`` (see the module docstring);
    None when the data has none at all (the forecast then has no ACC and no climatology forecaster)."""
    if requested == TIME_MEAN_OPTION:
        return _time_mean(trajectories, f"--climatology {TIME_MEAN_OPTION}", logging.INFO)
    undated = next((start for start in starts if start.time is None), None)
    if requested is not None:
        if undated is not None:
            raise ConfigError(
                f"--climatology {requested}: the data's initial times have no dates ({undated.describe()}), and a "
                "climatology by day of year and hour of day needs them; leave --climatology out (the time mean)"
            )
        return _by_valid_time(Path(requested).expanduser(), trajectories, starts, steps, "--climatology")
    store = getattr(trajectories, "climatology_store", None)
    if store is None:
        command = getattr(trajectories, "climatology_command", None)
        advice = (
            f"; {command} builds WeatherBench2's climatology by day of year and hour of day, and the same "
            "forecast then scores against it, in a directory of its own"
            if command
            else ""
        )
        return _time_mean(
            trajectories, "the default: the data has no climatology by day of year", logging.WARNING, advice
        )
    if undated is not None:
        chosen_by = (
            f"the default: {store} needs dated initial times, and these have none ({undated.describe()})"
        )
        return _time_mean(trajectories, chosen_by, logging.WARNING)
    return _by_valid_time(
        Path(store), trajectories, starts, steps, "the default (the data's climatology store)"
    )


def directory_climatology(requested: str | None, climatology: Climatology | None) -> str | None:
    """What the ACC was scored against, as the forecast's directory is named by it
    (:func:`dlscale.run.results_directory.forecast_name_parts`): None for the data's own store by day of year
    (the default's reference: no part), the store's absolute path for ``--climatology PATH``,
    :data:`TIME_MEAN_OPTION` for the mean field however it was chosen, :data:`NO_CLIMATOLOGY` for none at all."""
    if climatology is None:
        return NO_CLIMATOLOGY
    if climatology.description.get("kind") == TIME_MEAN_KIND:
        return TIME_MEAN_OPTION
    if requested is None:
        return None
    return str(Path(requested).expanduser().absolute())  # never "none" nor "time-mean": it starts with /


def _by_valid_time(
    path: Path, trajectories: Trajectories, starts: Sequence[ForecastStart], steps: int, chosen_by: str
) -> ValidTimeClimatology:
    from dlscale.data.era5.climatology.reading import ClimatologyStore

    names = trajectories.channel_names
    known = getattr(trajectories, "weatherbench2_names", None) or (None,) * len(names)
    fields = [field if field is not None else (name, None) for name, field in zip(names, known, strict=True)]
    store = ClimatologyStore(path, names, fields, trajectories.latitudes, trajectories.longitudes)
    climatology = ValidTimeClimatology(
        store.at, trajectories.step_hours, {**store.describe(), "chosen_by": chosen_by}
    )
    every = np.concatenate([climatology.valid_times(starts, lead) for lead in range(steps + 1)])
    store.check_times(every)
    log.info(
        "Climatology: %s (by day of year and hour of day, years %s, %s-day window; %s)",
        path,
        "-".join(str(year) for year in store.years) if store.years else "not recorded",
        store.window_days if store.window_days is not None else "?",
        chosen_by,
    )
    return climatology


def _time_mean(
    trajectories: Trajectories, chosen_by: str, level: int, advice: str = ""
) -> TimeMeanClimatology | None:
    """The mean field, said on the console at ``level`` (a warning where the forecast fell back to it) with what
    its ACC is not, and ``advice``: how to score against WeatherBench2's instead."""
    field = trajectories.climatology()
    if field is None:
        return None
    log.log(
        level,
        "Climatology: one mean field over the training years (%s); %s%s",
        chosen_by,
        NOT_COMPARABLE,
        advice,
    )
    description = {
        "kind": TIME_MEAN_KIND,
        "path": None,
        "years": None,
        "window_days": None,
        "note": f"one mean field for every valid time (ERA5: data.time_means_path); {NOT_COMPARABLE}",
        "chosen_by": chosen_by,
    }
    return TimeMeanClimatology(field, description)
