"""A scores directory written in one piece: ``scores.json``, ``scores.csv``, the figures drawn from the document
and, when asked, a data file; what ``dlscale forecast`` and ``dlscale score`` both write
(:mod:`dlscale.report.forecast_report` says what each file holds)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from dlscale.report.ensemble_figures import ensemble_figures
from dlscale.report.figures import save_png
from dlscale.report.forecast_figures import BIAS_FIGURE, SPECTRA_FIGURE, bias_figure, spectra_figure
from dlscale.report.forecast_report import SCORES_CSV, SCORES_JSON, SKILL_FIGURE, scores_csv, skill_figure
from dlscale.runtime.output_directory import write_results_directory
from dlscale.runtime.strict_json import to_json

# The option that chooses where each command's directory goes, which the advice of a failed write names: score's
# --out; a forecast goes into the run directory of the checkpoint it reads, or beside a checkpoint file outside
# of one.
SCORE_OPTION = "--out"
FORECAST_OPTION = (
    "RUN_DIR|CHECKPOINT (a checkpoint file outside its run directory has its forecast/ beside it)"
)


def score_figures(document: dict[str, Any]) -> dict[str, Figure]:
    """File name -> figure: the skill and the bias against lead, the spectra where the document has them (a
    grid with mid-latitude rows) and an ensemble's figures where it has an ``ensemble`` entry."""
    figures = {SKILL_FIGURE: skill_figure(document), BIAS_FIGURE: bias_figure(document)}
    spectra = spectra_figure(document)
    if spectra is not None:
        figures[SPECTRA_FIGURE] = spectra
    figures.update(ensemble_figures(document))
    return figures


def write_scores_directory(
    directory: Path,
    document: dict[str, Any],
    figures: dict[str, Figure],
    what: str,
    data_file: str | None = None,
    write_data: Callable[[Path], None] | None = None,
) -> list[Path]:
    """Write ``document`` (its ``files`` entry set here), its CSV, ``figures`` and, with ``write_data``, the file
    ``data_file`` that it writes at the path it is given, into ``directory`` in one piece: an earlier directory
    stays as it was if this fails (a StorageError naming ``what`` and the option of the command the document's
    ``command`` names, ``score`` or else ``forecast``), and another process writing it now is refused
    (:func:`~dlscale.runtime.output_directory.write_results_directory`). The paths written."""
    document["files"] = [SCORES_JSON, SCORES_CSV, *figures, *([data_file] if data_file else [])]

    def fill(tmp: Path) -> None:
        for name, figure in figures.items():
            save_png(figure, tmp / name)
        if data_file is not None and write_data is not None:
            write_data(tmp / data_file)
        (tmp / SCORES_CSV).write_text(scores_csv(document))
        (tmp / SCORES_JSON).write_text(to_json(document))

    option = SCORE_OPTION if document.get("command") == "score" else FORECAST_OPTION
    write_results_directory(directory, fill, what, option)
    return [directory / name for name in document["files"]]
