"""The output directory of ``import-era5``: whose it is, and which year files of it are finished.

An import writes into OUT itself, year file by year file, so that an interrupted import of 40 years keeps
the years it finished. Before the first file, ``import.json`` records what is being imported (the channels
and where each comes from, dt, the years of each split, the grid); ``manifest.json`` replaces it at the end.
A rerun continues only an import of the same selection: OUT holding anything else (another selection, a
``synth-era5`` data set, files of the user's) is refused, never replaced. Each year file is written under a
temporary name and renamed when complete, and records its time steps, latitudes and longitudes, so a rerun
skips a finished year only after checking that it holds exactly the steps and grid the source gives now.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from dlscale.data.era5.coordinates import LATITUDE_KEY, LONGITUDE_KEY
from dlscale.data.era5.layout import FIELDS_KEY, TIME_KEY
from dlscale.errors import DataError
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.strict_json import to_json

PLAN_FILE = "import.json"
MANIFEST_FILE = "manifest.json"
GENERATOR = "dlscale data import-era5"


def claim_output(out: Path, selection: dict[str, Any]) -> str:
    """Make ``out`` this import's: ``new`` (created or empty, now holding the plan), ``resume`` (an unfinished
    import of this selection) or ``complete`` (a finished one). Anything else raises a DataError."""
    if out.exists() and not out.is_dir():
        raise DataError(f"import-era5: --out {out} is a file, expected a directory")
    if out.is_dir():
        manifest = _read_json(out / MANIFEST_FILE)
        if manifest is not None:
            if manifest.get("generator") == GENERATOR and manifest.get("selection") == selection:
                return "complete"
            what = manifest.get("generator") or "an unknown generator"
            if manifest.get("generator") == GENERATOR:
                what = f"an import of another selection ({_difference(manifest.get('selection'), selection)})"
            raise DataError(
                f"import-era5: {out} holds another data set ({what}); refusing to touch it: choose another --out"
            )
        plan = _read_json(out / PLAN_FILE)
        if plan is not None:
            if plan.get("selection") == selection:
                return "resume"
            raise DataError(
                f"import-era5: {out} holds an unfinished import of another selection "
                f"({_difference(plan.get('selection'), selection)}); rerun that import, or choose another --out"
            )
        entries = sorted(entry.name for entry in out.iterdir())
        if entries:
            raise DataError(
                f"import-era5: {out} is not empty ({', '.join(entries[:3])}{', ...' if len(entries) > 3 else ''}) "
                "and holds no dlscale ERA5 import; refusing to write into it: choose another --out"
            )
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomically(out / PLAN_FILE, to_json({"generator": GENERATOR, "selection": selection}))
    return "new"


def release_new_output(out: Path, status: str) -> None:
    """After a failed import that finished no year: leave no trace of a directory this import created."""
    if status != "new":
        return
    finished = [path for path in out.glob("*/*.h5")]
    if not finished:
        shutil.rmtree(out, ignore_errors=True)


def finished_year_matches(
    path: Path, times: np.ndarray, latitude: np.ndarray, longitude: np.ndarray, channels: list[str]
) -> bool:
    """Whether the finished file ``path`` exists; a DataError when it holds other steps, grid or channels than
    the source gives for its year now (a changed source must not be mixed with the old one's years)."""
    if not path.exists():
        return False
    try:
        with h5py.File(path, "r") as handle:
            stored_times = handle[TIME_KEY][...]
            stored_latitude = handle[LATITUDE_KEY][...]
            stored_longitude = handle[LONGITUDE_KEY][...]
            shape = handle[FIELDS_KEY].shape
            stored_channels = [str(name) for name in handle[FIELDS_KEY].attrs["channels"]]
    except Exception as exc:
        raise DataError(
            f"{path}: a finished year file that cannot be read back ({exc}); delete it to import it again"
        ) from exc
    expected_times = times.astype("datetime64[s]").astype(np.int64)
    problems = []
    if not np.array_equal(stored_times, expected_times):
        problems.append(
            f"its {len(stored_times)} time steps are not the {len(expected_times)} the source gives"
        )
    if not (np.array_equal(stored_latitude, latitude) and np.array_equal(stored_longitude, longitude)):
        problems.append("its grid is not the source's")
    if stored_channels != channels or shape != (len(times), len(channels), len(latitude), len(longitude)):
        problems.append(f"it holds fields {shape} of channels {stored_channels}")
    if problems:
        raise DataError(
            f"{path}: this finished year does not match the source ({'; '.join(problems)}); "
            "delete the file to import the year again, or choose another --out"
        )
    return True


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else {}


def _difference(theirs: Any, ours: dict[str, Any]) -> str:
    if not isinstance(theirs, dict):
        return "unreadable"
    keys = [key for key in ours if theirs.get(key) != ours[key]]
    return "it differs in " + ", ".join(keys) if keys else "it differs"
