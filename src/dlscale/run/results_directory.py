"""Where ``dlscale evaluate`` and ``dlscale forecast`` put their results: a directory per set of options.

A forecast of 2 days from 8 initial times must not replace the 10-day forecast from 236 that took 12 minutes,
so the directory's name says which options changed the results. With the default options (on data with a
climatology by day of year) it is ``<split>-<checkpoint>`` (``test-ckpt_latest``), as it always was; each option
that differs from its default adds a short part, written the same way whatever way it was asked for (``--lead
48h`` and ``--lead 2d`` are ``lead2d``):

* ``lead2d``: ``--lead`` (in days, else hours, else minutes);
* ``every1d``: ``--init every:...`` (``every:4`` model steps of 6 h is ``every1d`` too); ``at20180101T00`` for
  one date, ``at3dates-<8 hex>`` for several;
* ``init8``: ``--init-count 8``, when it keeps fewer than all the initial times;
* ``netcdf``, ``zarr``: ``--write``; ``netcdf-short``, ``zarr-short`` with ``--names short`` (the file's
  variables named as the channels, not as WeatherBench2's);
* ``clim-timemean``, ``clim-<8 hex>``, ``clim-none``: the ACC's reference, named by what was used, not by how it
  was asked for (:func:`dlscale.run.forecast_climatology.directory_climatology`): ``clim-timemean`` for the one
  mean field, whether ``--climatology time-mean`` or the fallback of data without a climatology by day of year
  chose it; ``clim-<8 hex>`` for ``--climatology PATH`` (a hash of the absolute path); ``clim-none`` for no
  climatology at all (no ACC). The data's own store by day of year (``data.climatology_path``, the ACC
  WeatherBench2 reports) adds nothing, so the same command before and after ``dlscale data climatology`` writes
  two directories;
* ``ens8-gaussian0.75``: ``--members 8 --perturb gaussian:0.75`` (``ens8-gaussian0.1-250km`` with a length,
  ``ens8-dropout``, ``ens8-noise``; ``ens8-gaussianauto`` for the run's fitted per-channel scales and
  ``ens8-gaussianfile-<8 hex>`` for a scales file, a hash of its absolute path);
* ``set-<8 hex>``: the ``--set`` changes (a hash of the keys, written in their sections, and their values; the
  last value of a key counts). Those of the ``parallel`` and ``loader`` sections only say how the work is laid
  out and read, not what it computes, and leave the name alone, as ``--batch-size`` does.

Rerunning with the same options replaces the directory (the checkpoint behind ``ckpt_latest`` may be newer), and
:func:`replacement_notice` says so first. The documents record the options and where they were written.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

from dlscale.run.durations import init_every_hours, parse_duration_hours, parse_init_date
from dlscale.run.forecast_times import DEFAULT_INIT, DEFAULT_LEAD
from dlscale.runtime.strict_json import to_json
from dlscale.scoring.perturbation_spec import AUTO, GAUSSIAN, parse_perturbation

# Sections whose keys change how the work is laid out or read, never the numbers.
LAYOUT_SECTIONS = frozenset({"parallel", "loader"})
HASH_LENGTH = 8


def results_directory_name(split: str, checkpoint_name: str, parts: Sequence[str] = ()) -> str:
    """``test-ckpt_latest``, then the non-default options' parts: ``test-ckpt_latest-lead2d-init8``."""
    return "-".join([f"{split}-{checkpoint_name}", *parts])


def forecast_name_parts(
    lead: str,
    init: str,
    effective_init_count: int | None,
    write: str | None,
    step_hours: float,
    override_part: str | None,
    names: str = "wb2",
    climatology: str | None = None,
    members: int = 1,
    perturb: str | None = None,
) -> list[str]:
    """The parts of a forecast's directory name for options that differ from the defaults. ``lead`` and
    ``init`` have been checked (by :mod:`dlscale.run.forecast_times`); ``effective_init_count`` is None when
    ``--init-count`` kept every initial time (it then changed nothing); ``climatology`` is the ACC's reference
    as :func:`dlscale.run.forecast_climatology.directory_climatology` says it (None: the data's own store)."""
    parts = []
    lead_label = duration_label(parse_duration_hours(lead, "--lead"))
    if lead_label != duration_label(parse_duration_hours(DEFAULT_LEAD, "--lead")):
        parts.append(f"lead{lead_label}")
    init_label = _init_label(init, step_hours)
    if init_label != _init_label(DEFAULT_INIT, step_hours):
        parts.append(init_label)
    if effective_init_count is not None:
        parts.append(f"init{effective_init_count}")
    if write is not None:
        parts.append(write if names == "wb2" else f"{write}-{names}")  # names change only a written file
    if climatology is not None:
        parts.append(_climatology_label(climatology))
    if members > 1:
        parts.append(_ensemble_label(members, perturb))
    if override_part is not None:
        parts.append(override_part)
    return parts


def _ensemble_label(members: int, perturb: str | None) -> str:
    """``ens16-gaussian0.05`` (``--members 16 --perturb gaussian:0.05``), ``ens8-gaussian0.1-250km``,
    ``ens8-dropout``: the perturbation as it was written, checked (dlscale.scoring.perturbation_spec), spelled
    alike however it was written (``gaussian:0.050`` and ``gaussian:5e-2`` name one directory)."""
    spec = parse_perturbation(perturb or "")
    if spec.kind != GAUSSIAN:
        return f"ens{members}-{spec.kind}"
    if spec.scales_from == AUTO:
        return f"ens{members}-gaussianauto"
    if spec.scales_from is not None:  # a scales file: named by its absolute path
        return (
            f"ens{members}-gaussianfile-{short_hash([str(Path(spec.scales_from).expanduser().absolute())])}"
        )
    length = f"-{spec.length_km:g}km" if spec.length_km is not None else ""
    return f"ens{members}-gaussian{spec.scale:g}{length}"


def _climatology_label(climatology: str) -> str:
    """``clim-timemean`` for the mean field, ``clim-none`` for no climatology, else ``clim-<8 hex>`` of the
    store's absolute path."""
    if climatology == "time-mean":  # dlscale.run.forecast_climatology.TIME_MEAN_OPTION
        return "clim-timemean"
    if climatology == "none":  # dlscale.run.forecast_climatology.NO_CLIMATOLOGY
        return "clim-none"
    return f"clim-{short_hash([str(Path(climatology).expanduser().absolute())])}"


def duration_label(hours: float) -> str:
    """A duration in its largest whole unit: 48 h -> ``2d``, 36 h -> ``36h``, 1.5 h -> ``90m``."""
    minutes = round(hours * 60)
    if minutes % (24 * 60) == 0:
        return f"{minutes // (24 * 60)}d"
    if minutes % 60 == 0:
        return f"{minutes // 60}h"
    return f"{minutes}m"


def _init_label(init: str, step_hours: float) -> str:
    """``every12h`` for ``every:12h`` and for ``every:2`` model steps of 6 h; ``at20180101T00`` for one date,
    ``at3dates-<hash>`` for several (in their order: the order is the document's)."""
    text = str(init).strip()
    hours = init_every_hours(text, step_hours)
    if hours is not None:
        return f"every{duration_label(hours)}"
    dates = [_date_label(item.strip()) for item in text.split(",") if item.strip()]
    if len(dates) == 1:
        return f"at{dates[0]}"
    return f"at{len(dates)}dates-{short_hash(dates)}"


def _date_label(item: str) -> str:
    """``2018-01-01T00`` -> ``20180101T00``; minutes only when there are some (``20180101T0030``)."""
    minute = str(parse_init_date(item))  # 2018-01-01T00:30
    day, clock = minute.split("T")
    hour, minutes = clock.split(":")
    return f"{day.replace('-', '')}T{hour}{minutes if minutes != '00' else ''}"


def override_name_part(overrides: Sequence[str], homes: Mapping[str, str]) -> str | None:
    """``set-<8 hex>`` for the ``--set`` changes that can change the results, or None when there are none.
    ``homes``: each flat key's section (``lr`` -> ``optim``), so that ``lr=1e-3`` and ``optim.lr=1e-3`` agree."""
    changes = canonical_overrides(overrides, homes)
    kept = sorted((key, value) for key, value in changes.items() if key.split(".")[0] not in LAYOUT_SECTIONS)
    return f"set-{short_hash(kept)}" if kept else None


def canonical_overrides(overrides: Sequence[str], homes: Mapping[str, str]) -> dict[str, str]:
    """``--set`` strings as ``{"section.key": value}``, the last value of a key winning as it does in the
    config (the config loader has already refused malformed ones)."""
    changes: dict[str, str] = {}
    for text in overrides:
        key, _, value = str(text).partition("=")
        key = key.strip()
        if "." not in key and key in homes:
            key = f"{homes[key]}.{key}"
        changes[key] = value
    return changes


def short_hash(items: Sequence[object]) -> str:
    """The first 8 hex digits of the SHA-256 of ``items`` as JSON: short, and the same on every machine."""
    text = to_json(list(items), indent=None)
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]


def replacement_notice(directory: Path, document_file: str, what: str) -> str | None:
    """The line saying that this ``what`` (``forecast``, ``evaluation``) will replace ``directory``, naming the
    earlier one by its checkpoint's step and when it was written; None when there is nothing to replace."""
    if not directory.is_dir():
        return None
    document_path = directory / document_file
    try:
        earlier = json.loads(document_path.read_text())
        step = earlier.get("global_step") if isinstance(earlier, dict) else None
        source = f"step {step}" if step is not None else "step unknown"
        written_at = document_path.stat().st_mtime
    except (OSError, ValueError):
        source = f"no readable {document_file}"
        written_at = directory.stat().st_mtime
    when = datetime.fromtimestamp(written_at).strftime("%Y-%m-%d %H:%M")
    return f"This {what} will replace {directory} ({source}, written {when})"
