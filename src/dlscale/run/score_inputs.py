"""What ``dlscale score`` is given, checked with the file system alone (before torch is imported, and again by
the Python API, with the same messages): each forecast (``PATH`` or ``LABEL=PATH``) exists and is a zarr store
or a file, the labels differ, the truth and the climatology exist, and ``--out`` is no directory of someone
else's. What needs the files' contents (their dimensions, channels, grid, times) is checked when they are opened
(:mod:`dlscale.run.score`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dlscale.data.era5.forecast_reading import check_forecast_path
from dlscale.errors import ConfigError, DataError

# The baselines' forecaster names (dlscale.scoring.rollout's; that module imports torch): no label may be one.
BASELINE_NAMES = ("persistence", "climatology")
SCORES_FILE = "scores.json"  # what marks a directory as one dlscale score may replace


@dataclass(frozen=True)
class NamedForecast:
    """A forecast to score and its label (the forecaster's name in a comparison)."""

    label: str
    path: Path


def named_forecasts(texts: Sequence[str]) -> list[NamedForecast]:
    """Each ``PATH`` or ``LABEL=PATH`` as a labelled forecast; the label defaults to the file's name without its
    suffix (``forecast`` for ``forecast.zarr``), or the directory above and it where two would share one."""
    parsed: list[tuple[str | None, Path]] = []
    for text in texts:
        label, separator, rest = str(text).partition("=")
        if separator and label and not Path(text).expanduser().exists():
            parsed.append((label, Path(rest).expanduser()))
        else:
            parsed.append((None, Path(text).expanduser()))
    for _, path in parsed:
        check_forecast_path(path)
    stems = [path.stem for label, path in parsed if label is None]
    named = []
    for label, path in parsed:
        if label is None:
            label = path.stem if stems.count(path.stem) == 1 else f"{path.parent.name}/{path.stem}"
        named.append(NamedForecast(label, path))
    labels = [forecast.label for forecast in named]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ConfigError(
            f"two forecasts have the label {repeated[0]!r}; name them apart with LABEL=PATH (e.g. mine={named[0].path})"
        )
    taken = [label for label in labels if label in BASELINE_NAMES]
    if taken:
        raise ConfigError(
            f"a forecast's label is {taken[0]!r}, the name of a baseline dlscale score adds; give it another with "
            "LABEL=PATH"
        )
    return named


def check_truth(truth: str) -> None:
    """The truth store exists (a remote ``gs://`` or ``s3://`` one is checked when it is opened)."""
    if "://" not in truth and not any(character in truth for character in "*?["):
        path = Path(truth).expanduser()
        if not path.exists():
            raise DataError(f"--truth {truth}: no such zarr store, netCDF file or directory")


def check_climatology(climatology: str | None) -> None:
    """A climatology store's path that exists; ``time-mean`` (a training run's mean field) means nothing here."""
    if climatology is None:
        return
    if climatology == "time-mean":
        raise ConfigError(
            "--climatology time-mean: a scored forecast has no training years to average; name a climatology "
            "store by day of year and hour (WeatherBench2's, or one dlscale data climatology writes)"
        )
    if not Path(climatology).expanduser().exists():
        raise DataError(
            f"--climatology {climatology}: no such climatology store; expected a zarr store in WeatherBench2's "
            "layout"
        )


def check_out(out: Path) -> None:
    """``--out`` is replaced as a whole: refuse a file, or a directory with files that holds no scores."""
    if out.is_file():
        raise ConfigError(f"--out {out}: is a file; name a directory for the scores")
    if out.is_dir() and any(out.iterdir()) and not (out / SCORES_FILE).is_file():
        raise ConfigError(
            f"--out {out}: holds files but no {SCORES_FILE}, and dlscale score replaces the directory as a whole; "
            "name a new directory"
        )


def default_out(forecasts: Sequence[NamedForecast]) -> Path:
    """``score-<label>`` (``score-<label>-<label>...`` for a comparison) beside the first forecast."""
    name = "-".join(forecast.label.replace("/", "_") for forecast in forecasts)
    return forecasts[0].path.parent / f"score-{name}"


def check_score_inputs(
    forecasts: Sequence[str], truth: str, climatology: str | None, out: str | Path | None
) -> tuple[list[NamedForecast], Path]:
    """The labelled forecasts and the output directory, once every check above passes."""
    named = named_forecasts(forecasts)
    check_truth(truth)
    check_climatology(climatology)
    directory = Path(out).expanduser() if out is not None else default_out(named)
    check_out(directory)
    return named, directory
