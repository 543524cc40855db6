"""What ``dlscale score`` is given, checked with the file system alone (before torch is imported, and again by
the Python API, with the same messages): each forecast (``PATH`` or ``LABEL=PATH``) exists and is a zarr store
or a file, the labels differ, the truth and the climatology exist, ``--channels`` and ``--times`` are well
formed, and ``--out`` is a directory ``score`` may write (:func:`check_out`). What needs the files' contents
(their dimensions, channels, grid, times) is checked when they are opened (:mod:`dlscale.run.score`).

``--out`` is replaced as a whole, so it must be new, empty, or an earlier score's own directory: its
``scores.json`` says ``"command": "score"`` and it holds nothing but the files that document lists. Anything
else (a forecast's results directory, a user's directory with other files, the input being scored or a
directory around it or inside it) is refused in one line, with nothing touched.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.data.era5.forecast_reading import check_forecast_path
from dlscale.errors import ConfigError, DataError

# The baselines' forecaster names (dlscale.scoring.rollout's; that module imports torch): no label may be one.
BASELINE_NAMES = ("persistence", "climatology")
SCORES_FILE = "scores.json"  # an earlier score's document: what marks a directory score may replace


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
    """The truth exists: a store, netCDF files or a dlscale data root (a remote ``gs://`` or ``s3://`` store is
    checked when it is opened)."""
    if _local(truth):
        path = Path(truth).expanduser()
        if not path.exists():
            raise DataError(
                f"--truth {truth}: no such zarr store, netCDF file or data root (a directory holding train/, "
                "valid/ and test/ year files, as dlscale data synth-era5 and import-era5 write)"
            )


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


def parse_channel_choice(text: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """``--channels A,B,...`` as a tuple of channel names (None: not given, every channel that can be scored)."""
    if text is None:
        return None
    parts = text.split(",") if isinstance(text, str) else [str(part) for part in text]
    names = tuple(part.strip() for part in parts if part.strip())
    shown = text if isinstance(text, str) else ",".join(parts)
    if not names:
        raise ConfigError(
            f"--channels {shown!r}: names no channel; name the forecast's channels to score, e.g. z500,t850,t2m"
        )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(f"--channels {shown}: names {', '.join(repeated)} more than once; name each once")
    return names


# numpy's nanosecond dates, which the forecast's and the truth's times are, hold the years 1678 to 2261.
EARLIEST_DATE, LATEST_DATE = np.datetime64("1678-01-01", "D"), np.datetime64("2262-01-01", "D")
TIMES_FORMAT = (
    "expected FIRST..LAST, dates such as 2018-01-01..2018-12-31 or 2018-01-01T00..2018-01-15T12 (either side "
    "may be left out; a date without an hour takes in its whole day, a month or a year its whole month or year)"
)


@dataclass(frozen=True)
class TimeChoice:
    """``--times FIRST..LAST``: the initial times ``first <= t < end`` (None: no bound on that side)."""

    text: str
    first: np.datetime64 | None
    end: np.datetime64 | None  # exclusive: LAST plus one of its own unit (a day for a date)

    def contains(self, times: np.ndarray) -> np.ndarray:
        """Whether each of ``times`` (datetime64[ns]) is chosen."""
        chosen = np.ones(len(times), dtype=bool)
        if self.first is not None:
            chosen &= times >= self.first.astype("datetime64[ns]")
        if self.end is not None:
            chosen &= times < self.end.astype("datetime64[ns]")
        return chosen

    def name_part(self) -> str:
        """The part of the default directory's name: ``times20180101-20181231`` (``start``/``end`` when open)."""
        first, _, last = self.text.partition("..")
        return f"times{_compact(first) or 'start'}-{_compact(last) or 'end'}"


def _compact(date: str) -> str:
    return "".join(character for character in date.strip() if character.isalnum())


def parse_time_choice(text: str | None) -> TimeChoice | None:
    """``--times FIRST..LAST`` (see :data:`TIMES_FORMAT`), checked; None when not given."""
    if text is None:
        return None
    first_text, separator, last_text = str(text).partition("..")
    if not separator or not (first_text.strip() or last_text.strip()):
        raise ConfigError(f"--times {text!r}: {TIMES_FORMAT}")
    first = _date(text, first_text) if first_text.strip() else None
    last = _date(text, last_text) if last_text.strip() else None
    end = None if last is None else last + np.timedelta64(1, np.datetime_data(last.dtype)[0])
    if first is not None and end is not None and first >= end:
        raise ConfigError(
            f"--times {text}: {first_text.strip()} comes after {last_text.strip()}; give FIRST..LAST"
        )
    return TimeChoice(str(text), first, end)


def _date(text: str, part: str) -> np.datetime64:
    try:
        value = np.datetime64(part.strip())
    except ValueError:
        raise ConfigError(f"--times {text!r}: {part.strip()!r} is no date; {TIMES_FORMAT}") from None
    if np.isnat(value) or not (EARLIEST_DATE <= value.astype("datetime64[D]") < LATEST_DATE):
        raise ConfigError(
            f"--times {text}: {part.strip()} is outside the years 1678 to 2261 that forecasts' times can hold"
        )
    return value


def check_out(out: Path, inputs: Sequence[tuple[str, Path]] = ()) -> dict[str, Any] | None:
    """Refuse an ``--out`` that score may not replace as a whole (see the module's docstring); ``inputs``: what
    is read, (what it is, its path). The earlier score's document when ``out`` is one (it will be replaced), else
    None."""
    if out.is_symlink():
        raise ConfigError(
            f"--out {out}: is a symbolic link (to {os.readlink(out)}); name the directory itself, or a new one"
        )
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: is a file; name a directory for the scores")
    resolved = Path(os.path.realpath(out))
    for what, path in inputs:
        read = Path(os.path.realpath(path))
        relation = (
            "is"
            if read == resolved
            else "is inside"
            if read in resolved.parents
            else "holds"
            if resolved in read.parents
            else None
        )
        if relation is not None:
            raise ConfigError(
                f"--out {out}: {relation} {what} {path}, which dlscale score reads, and the scores' directory is "
                "replaced as a whole; name a directory apart from the files scored (or leave --out out: "
                "score-<name> beside the forecast)"
            )
    if not out.is_dir():
        return None
    entries = sorted(entry.name for entry in out.iterdir())
    if not entries:
        return None
    earlier = _earlier_score(out / SCORES_FILE)
    if earlier is None:
        what = (
            f"a {SCORES_FILE} that no dlscale score wrote (a dlscale forecast's results, or another's)"
            if SCORES_FILE in entries
            else f"files ({', '.join(entries[:3])}{' ..' if len(entries) > 3 else ''}) and no {SCORES_FILE}"
        )
        raise ConfigError(
            f"--out {out}: holds {what}, and dlscale score replaces its directory as a whole; it replaces only "
            "an earlier score's own directory: name a new directory"
        )
    listed = set(earlier["files"])
    other = [name for name in entries if name not in listed or not _plain_file(out / name)]
    if other:
        raise ConfigError(
            f"--out {out}: holds an earlier score's results and also {other[0]!r}, which that score did not "
            "write, and dlscale score replaces its directory as a whole; move it away or name a new directory"
        )
    return earlier


def _earlier_score(path: Path) -> dict[str, Any] | None:
    """The document of an earlier ``dlscale score`` at ``path``: it parses, says ``command: score`` and lists
    its files by plain names; None otherwise."""
    if not _plain_file(path):
        return None
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict) or document.get("command") != "score":
        return None
    files = document.get("files")
    if not isinstance(files, list) or not all(
        isinstance(name, str) and name == Path(name).name and name not in ("", ".", "..") for name in files
    ):
        return None
    return document


def _plain_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def default_out(
    forecasts: Sequence[NamedForecast],
    channels: Sequence[str] | None = None,
    times: TimeChoice | None = None,
) -> Path:
    """``score-<label>`` (``score-<label>-<label>...`` for a comparison) beside the first forecast; ``--times``
    and ``--channels`` add a part each (``-times20180101-20180131``, ``-channels-<8 hex>``), so scores of other
    options never replace each other."""
    parts = [forecast.label.replace("/", "_") for forecast in forecasts]
    if times is not None:
        parts.append(times.name_part())
    if channels is not None:
        # the channels' hash, as results_directory's parts (which module imports torch, too slow for the check)
        digest = hashlib.sha256(",".join(sorted(channels)).encode()).hexdigest()[:8]
        parts.append(f"channels-{digest}")
    return forecasts[0].path.parent / f"score-{'-'.join(parts)}"


@dataclass(frozen=True)
class ScoreInputs:
    """What was asked for, checked: the labelled forecasts, the directory, the earlier score's document that it
    replaces (None: nothing to replace), and the ``--channels`` and ``--times`` choices (None: not given)."""

    forecasts: list[NamedForecast]
    directory: Path
    replaces: dict[str, Any] | None
    channels: tuple[str, ...] | None
    times: TimeChoice | None


def check_score_inputs(
    forecasts: Sequence[str],
    truth: str,
    climatology: str | None,
    out: str | Path | None,
    channels: str | Sequence[str] | None = None,
    times: str | None = None,
) -> ScoreInputs:
    """Every check above, in the order a user meets them."""
    named = named_forecasts(forecasts)
    check_truth(truth)
    check_climatology(climatology)
    chosen_channels = parse_channel_choice(channels)
    chosen_times = parse_time_choice(times)
    directory = (
        Path(out).expanduser() if out is not None else default_out(named, chosen_channels, chosen_times)
    )
    inputs = [("the forecast", forecast.path) for forecast in named]
    if _local(truth):
        inputs.append(("the truth", Path(truth).expanduser()))
    if climatology is not None:
        inputs.append(("the climatology", Path(climatology).expanduser()))
    replaces = check_out(directory, inputs)
    return ScoreInputs(named, directory, replaces, chosen_channels, chosen_times)


def _local(truth: str) -> bool:
    """Whether the truth is one local path (not a gs:// or s3:// store, not a glob of netCDF files)."""
    return "://" not in truth and not any(character in truth for character in "*?[")
