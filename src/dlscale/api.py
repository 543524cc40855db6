"""The Python API: what ``dlscale train``, ``bench`` and ``tune`` do, for notebooks and scripts.

    import dlscale

    summary = dlscale.train("examples/heat2d/heat2d.yaml", "demo", ["optim.lr=1e-3"], workload="heat2d")
    print(summary["final"]["val_loss"])
    results = dlscale.bench("examples/heat2d/heat2d.yaml", "demo", workload="heat2d", nbatches=20)
    tuned = dlscale.tune("configs/vit_era5.yaml", "demo", budget_minutes=20)   # tuned.tuned_yaml, .result
    dlscale.export("runs/demo/00", "exports/demo")          # the model without the run: weights, stats, program
    exported = dlscale.load_model("exports/demo")           # .model, .normalize, .denormalize, .config
    metrics = dlscale.evaluate("runs/demo/00", split="test", checkpoint="best")   # its eval/.../metrics.json
    scores = dlscale.forecast("runs/demo/00", lead="10d")   # RMSE/ACC per lead: its forecast/.../scores.json
    scores = dlscale.score("forecast.zarr", "era5.zarr", compare=["ifs=hres.zarr"])  # forecasts made anywhere

Every function that reads a config takes ``yaml_config`` and ``config`` first (the YAML file and the name of
a config in it) and ``workload`` by keyword; the old order of ``train``, ``bench`` and ``load_config``,
workload first, still works with a DeprecationWarning (:mod:`dlscale.legacy_call_order`). ``workload`` is what
the config's ``workload:`` key would say (a built-in name, an installed package's name, an import path
``package.module:OBJECT``), a workload object itself (one defined in the notebook), or None for the config's
own. ``overrides`` are ``--set`` strings (``"optim.lr=1e-3"``); further keyword arguments set config
keys by their flat names with Python values (``num_iters=20``), as the command-line flags do.

The same script runs on every rank under ``torchrun`` (``torchrun --nproc_per_node 4 script.py``): each call
starts the process group from the launcher's environment and leaves it at the end, and every rank gets rank
0's summary. Errors a user can fix are :class:`dlscale.errors.DlscaleError` subclasses with one-line messages.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlscale.config import RunConfig, load_run_config
from dlscale.config.yaml_source import DEFAULT_YAML
from dlscale.errors import InvalidValue
from dlscale.exported.loader import ExportedModel
from dlscale.exported.loader import load_model as load_exported_model
from dlscale.exported.writer import ExportSummary, export_run
from dlscale.legacy_call_order import accept_workload_first
from dlscale.perf.bench.trials import BenchResults
from dlscale.run.bench import bench_one_config
from dlscale.run.evaluation import evaluate_checkpoint
from dlscale.run.forecast import ForecastOptions, forecast_checkpoint
from dlscale.run.forecast_times import DEFAULT_INIT, DEFAULT_LEAD
from dlscale.run.process_group import distributed_run
from dlscale.run.score import score_forecasts
from dlscale.run.training import train_and_summarize
from dlscale.runtime.device import Device
from dlscale.runtime.launch import detect_process
from dlscale.tuning.climb import TuneOptions
from dlscale.tuning.run_backend import ConfigSource, TrialLengths
from dlscale.tuning.session import TuneOutputs, default_out, run_tune
from dlscale.workloads import Workload, use_workload


@accept_workload_first
def load_config(
    yaml_config: str | Path = DEFAULT_YAML,
    config: str = "base",
    overrides: Sequence[str] = (),
    *,
    workload: str | Workload | None = None,
    **keys: Any,
) -> RunConfig:
    """The resolved config (see the module docstring for the arguments), as ``dlscale config`` prints it."""
    if isinstance(overrides, str):
        overrides = [overrides]  # one "key=value" given alone, not a sequence of characters
    reference = workload if workload is None or isinstance(workload, str) else use_workload(workload)
    return load_run_config(yaml_config, config, list(overrides), keys, workload=reference)


@accept_workload_first
def train(
    yaml_config: str | Path = DEFAULT_YAML,
    config: str = "base",
    overrides: Sequence[str] = (),
    *,
    workload: str | Workload | None = None,
    **keys: Any,
) -> dict[str, Any] | None:
    """Train (or resume) a config; its ``summary.json`` document: final validation metrics, throughput, paths.

    None only when a finished run's directory holds no readable summary. Raises TrainingDiverged when the loss
    diverged (the last good checkpoint is kept), and the other DlscaleErrors for what a user can fix.
    """
    return train_and_summarize(load_config(yaml_config, config, overrides, workload=workload, **keys)).summary


@accept_workload_first
def bench(
    yaml_config: str | Path = DEFAULT_YAML,
    config: str = "base",
    overrides: Sequence[str] = (),
    output: str | Path | None = None,
    *,
    workload: str | Workload | None = None,
    **keys: Any,
) -> BenchResults:
    """IO / SYNTHETIC / FULL throughput trials of a config and the verdict (``dlscale bench``); the JSON goes to
    ``output`` (default: a new ``<run dir>/bench/<date-time>-benchy_result.json``). Trials are set by ``bench:`` keys,
    e.g. ``nbatches=20, ntrials=3``."""
    cfg = load_config(yaml_config, config, overrides, workload=workload, **keys)
    return bench_config(cfg, Path(output).expanduser().resolve() if output is not None else None)


def bench_config(cfg: RunConfig, output: Path | None = None, command: str | None = None) -> BenchResults:
    """The trials of a loaded config on every rank of the launch (in a process group of their own)."""
    process = detect_process()
    with distributed_run(process, Device.select(process.local_rank), cfg.parallel.timeout_s) as ending:
        results = bench_one_config(cfg, output, command)
        ending.alike = True
        return results


def evaluate(
    run_dir_or_checkpoint: str | Path,
    split: str = "valid",
    checkpoint: str | Path | None = None,
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """``dlscale evaluate``: a trained checkpoint's metrics on a held-out ``split`` (``valid``, ``test``), through
    the workload's own evaluator; the ``metrics.json`` document (strict JSON values: NaN is None).

    ``run_dir_or_checkpoint`` is a run directory (its ``config.yaml`` and, per ``checkpoint``, its
    ``ckpt_latest.pt`` by default, ``"best"`` or a file's path) or a checkpoint file. ``overrides`` are ``--set``
    strings for any key but those that define the weights (``"data.root=/scratch/era5"``). Rank 0 writes
    ``<run dir>/eval/<split>-<checkpoint>/`` (metrics.json, metrics.csv and the run's figures), or
    ``<split>-<checkpoint>-set-<hash>/`` with overrides that can change the results, so that evaluations with
    other overrides stay beside it (see :mod:`dlscale.run.results_directory`); ``doc["output_dir"]`` is the
    directory, ``doc["options"]`` what was asked for.
    """
    if isinstance(overrides, str):
        overrides = [overrides]
    choice = str(checkpoint) if checkpoint is not None else None
    return evaluate_checkpoint(run_dir_or_checkpoint, split, choice, overrides)


def forecast(
    run_dir_or_checkpoint: str | Path,
    split: str = "test",
    lead: str = DEFAULT_LEAD,
    init: str = DEFAULT_INIT,
    init_count: int | None = None,
    batch_size: int | None = None,
    write: str | None = None,
    checkpoint: str | Path | None = None,
    overrides: Sequence[str] = (),
    names: str = "wb2",
    climatology: str | Path | None = None,
    members: int = 1,
    perturb: str | None = None,
    figures: bool = True,
) -> dict[str, Any]:
    """``dlscale forecast``: roll the checkpoint's model forward up to ``lead`` (``"10d"``, ``"36h"``) from the
    initial times ``init`` (``"every:12h"``, ``"every:4"`` model steps, or ``"2018-01-01T00,2018-02-01T12"``; at most
    ``init_count`` of them) of ``split``, and score every lead against persistence and the climatology.

    Returns the ``scores.json`` document as a plain dict of lists (strict JSON values: NaN is None):
    ``doc["scores"]["model"]["rmse"]["z500"][k]`` is the latitude-weighted RMSE at ``doc["lead_hours"][k]``,
    ``["acc"]`` the anomaly correlation, ``["bias"]`` the mean error (forecast - truth), ``doc["headline"]``
    the table. A dict, not an xarray Dataset: it is what
    the file holds, needs no extra package, and converts in one line where wanted
    (``pandas.read_csv(".../scores.csv")``, or ``--write netcdf`` for the forecasts themselves, which xarray
    opens). Rank 0 writes ``<run dir>/forecast/<split>-<checkpoint>/`` with the default options, and a directory
    of its own for other options (``test-ckpt_latest-lead2d-init8``; see :mod:`dlscale.run.results_directory`):
    ``doc["output_dir"]`` is the directory, ``doc["options"]`` what was asked for. Under torchrun the ranks share
    the initial times, and every rank returns rank 0's document.

    ``write="netcdf"`` or ``"zarr"`` also writes the forecasts, in WeatherBench2's layout (``names="wb2"``:
    ``geopotential`` with a ``level`` dimension, ``2m_temperature``, ...; see
    :mod:`dlscale.report.forecast_files`) or one variable per channel (``names="short"``: ``z500``, ``t2m``).

    ``climatology``: the ACC's reference and the climatology forecaster. A path: a climatology store in
    WeatherBench2's layout (by day of year and hour of day; ``dlscale data climatology`` writes one, and
    WeatherBench2's published ones are read on the forecast's grid); ``"time-mean"``: the one mean field over the
    training years; None (the default): ERA5's ``data.climatology_path`` when it exists, else the mean field.
    ``doc["climatology"]`` says which was used (kind, path, years, window); the mean field, however it was
    chosen, names a directory of its own (``-clim-timemean``: its ACC is not comparable with WeatherBench2's).

    ``members=N`` (N >= 2) forecasts an ensemble: the control (the deterministic forecast, ``doc["scores"]["model"]``)
    and N - 1 members that ``perturb`` makes differ, ``"gaussian:SCALE[:LENGTH_KM]"`` (initial-state noise of SCALE
    standard deviations, correlated over LENGTH_KM, 500 by default) or ``"dropout"`` (the model's dropout on; see
    :mod:`dlscale.scoring.perturbations`). ``doc["scores"]["ensemble"]`` is the ensemble mean's RMSE, bias and ACC,
    ``doc["ensemble"]`` its CRPS, spread, spread/skill ratio and rank histograms per lead (see
    :mod:`dlscale.report.ensemble_report`); ``batch_size`` still counts initial times (by default the run's batch
    divided by N, so that as many samples go through the model at once as in training).

    ``figures=False`` writes the scores without the PNGs (a loop of many forecasts saves seconds each).
    """
    if isinstance(overrides, str):
        overrides = [overrides]
    chosen = str(climatology) if climatology is not None else None
    options = ForecastOptions(
        split, lead, init, init_count, batch_size, write, names, chosen, members, perturb, figures
    )
    choice = str(checkpoint) if checkpoint is not None else None
    return forecast_checkpoint(run_dir_or_checkpoint, options, choice, overrides).document


def score(
    forecast: str | Path,
    truth: str | Path,
    climatology: str | Path | None = None,
    out: str | Path | None = None,
    compare: Sequence[str | Path] = (),
    figures: bool = True,
    channels: str | Sequence[str] | None = None,
    times: str | None = None,
) -> dict[str, Any]:
    """``dlscale score``: score ``forecast`` (a zarr store or netCDF file in WeatherBench2's layout, or
    ``"LABEL=PATH"``), and each of ``compare`` beside it, against ``truth`` (a store ``import-era5`` reads, or a
    dlscale data root such as ``data/era5_demo``), with the code that scores ``dlscale forecast``'s rollouts;
    ``climatology``: a climatology store by day of year and hour of day for the ACC and the climatology
    forecaster (None: no ACC).

    Returns the ``scores.json`` document, as :func:`forecast` does: one forecast is ``doc["scores"]["model"]``,
    each compared one ``doc["scores"][label]``, beside ``"persistence"`` (and ``"climatology"``); ``doc["common"]``
    says which initial times and leads were scored. Written to ``out`` (default: ``score-<name>`` beside the
    forecast) in one piece. An ensemble (a ``number`` dimension) is scored alone, as :func:`forecast` scores
    one: its control (number 0) is ``"model"``, the members' mean ``"ensemble"``, and ``doc["ensemble"]`` holds
    the CRPS, spread, spread/skill and rank histograms; ``compare`` with an ensemble is refused. See
    :mod:`dlscale.run.score`. ``figures=False``: the scores without the PNGs. ``channels`` (``"z500,t850"`` or a
    list): score exactly these; ``times`` (``"2018-01-01..2018-12-31"``): the initial times from the first date to
    the last; without them, what cannot be scored is left out and said, and less than half of the forecast's
    channels or initial times left is refused.
    """
    if isinstance(compare, (str, Path)):
        compare = [compare]
    return score_forecasts([forecast, *compare], truth, climatology, out, figures, channels, times).document


def tune(
    yaml_config: str | Path = DEFAULT_YAML,
    config: str = "base",
    overrides: Sequence[str] = (),
    out: str | Path | None = None,
    budget_minutes: float = 30.0,
    loss_tolerance: float = 0.05,
    workload: str | Workload | None = None,
    **keys: Any,
) -> TuneOutputs:
    """``dlscale tune``: climb the optimization ladder from a config and write the tuned YAML (default
    ``tuned/<config>_tuned.yaml``), its table, plot and record (rank 0 writes; every rank gets the climb).
    The same call again continues an interrupted tune from its cache. ``workload`` as for :func:`train`.
    The arguments and the config are checked before anything is written."""
    if isinstance(overrides, str):
        overrides = [overrides]
    if not _finite_number(budget_minutes) or budget_minutes <= 0:
        raise InvalidValue("budget_minutes", f"must be a number of minutes > 0, got {budget_minutes!r}")
    if not _finite_number(loss_tolerance) or loss_tolerance < 0:
        raise InvalidValue("loss_tolerance", f"must be a fraction >= 0 (0.05 = 5%), got {loss_tolerance!r}")
    path = Path(out).expanduser() if out is not None else default_out(config)
    if path.suffix not in (".yaml", ".yml"):
        raise InvalidValue("out", f"the tuned config is a YAML file: give a name ending in .yaml, got {path}")
    reference = workload if workload is None or isinstance(workload, str) else use_workload(workload)
    source = ConfigSource(str(yaml_config), config, tuple(overrides), keys, reference)
    options = TuneOptions(budget_s=budget_minutes * 60, loss_tolerance=loss_tolerance)
    return run_tune(source, path, options, TrialLengths(), f"dlscale.tune({config!r})")


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def export(
    run_dir_or_checkpoint: str | Path,
    out: str | Path,
    checkpoint: str | Path | None = None,
    force: bool = False,
) -> ExportSummary:
    """``dlscale export``: a checkpoint's model as a directory ``out`` that works without the run: the weights
    (``model.safetensors``), the resolved config, the normalization statistics (``stats/*.npy``), a torch.export
    program (``model.pt2``) and ``manifest.json``. ``checkpoint``: ``"latest"`` (default), ``"best"`` or a file.
    An existing ``out`` is replaced only with ``force`` (and only an earlier export). Load it with
    :func:`load_model`."""
    choice = str(checkpoint) if checkpoint is not None else None
    return export_run(run_dir_or_checkpoint, out, choice, force)


def load_model(directory: str | Path) -> ExportedModel:
    """The model exported to ``directory`` (every file checked against the manifest's sha256): ``.model`` (a plain
    torch module in eval mode), ``.config``, ``.workload``, ``.stats`` and ``.normalize`` / ``.denormalize``.

        exported = dlscale.load_model("exports/demo")
        with torch.no_grad():
            forecast = exported.denormalize(exported.model(exported.normalize(fields)))
    """
    return load_exported_model(directory)
