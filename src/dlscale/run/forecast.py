"""``dlscale forecast``: roll a trained model forward for days from many initial times and score every lead.

The checkpoint and its config are found as ``dlscale evaluate`` finds them (:func:`dlscale.run.evaluation.prepare`:
any layout's checkpoint, the run's config with ``--set`` changes). The workload gives the split as trajectories
(its ``forecast_data`` member); :func:`dlscale.scoring.rollout.roll_out` feeds each prediction back as the next
input, in inference mode with the run's precision, a batch of initial times at a time, scored against the
climatology :mod:`dlscale.run.forecast_climatology` chooses. Everything that can be checked is checked before the
first step (the split, the lead against the data's reach, the initial times, the output format and its memory,
the climatology at every valid time); rank 0 writes ``forecast/<split>-<checkpoint>[-<options>]/`` at
the end, in one piece (see :mod:`dlscale.report.forecast_report`; the name has a part per option that differs
from its default, see :mod:`dlscale.run.results_directory`).

Under ``torchrun`` (or srun) the ranks share the initial times, each a contiguous run of them with the whole
model, and add up their running sums at the end (:mod:`dlscale.scoring.rollout_ranks`): the scores are one
process's, up to the order of float64 additions, and an ensemble's perturbations are too, being drawn per
initial time. The forecasts kept for ``--write`` are gathered on rank 0, which writes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import torch

from dlscale.checkpoint.files import load_model_state
from dlscale.checkpoint.sharded_state import local_model_state
from dlscale.data.trajectories import ForecastStart, Trajectories
from dlscale.errors import ConfigError, DataError
from dlscale.perf.inference_memory import step_bytes_per_sample
from dlscale.report.ensemble_report import (
    RANK_HISTOGRAM_DAYS,
    perturbation_size_text,
    perturbation_std_entry,
)
from dlscale.report.forecast_files import (
    FORMATS,
    NAMES,
    check_writable_format,
    forecast_dataset,
    write_forecast_file,
    written_bytes,
    written_size_line,
)
from dlscale.report.forecast_report import (
    MAP_DAYS,
    MAPS_FIGURE,
    SCORES_JSON,
    forecast_document,
    log_forecast,
    map_channel,
    maps_figure,
)
from dlscale.report.forecast_selection import headline_channels, report_leads
from dlscale.report.progress_display import PassProgress
from dlscale.report.run_dir import early_logging
from dlscale.report.scores_directory import FORECAST_OPTION, score_figures, write_scores_directory
from dlscale.run.evaluation import Evaluation, prepare
from dlscale.run.forecast_climatology import choose_climatology, directory_climatology
from dlscale.run.forecast_memory import (
    NOISE_BYTES_PER_VALUE,
    WHITE_NOISE_BYTES_PER_VALUE,
    AvailableMemory,
    EnsembleShape,
    check_ensemble_memory,
)
from dlscale.run.forecast_times import DEFAULT_INIT, DEFAULT_LEAD, choose_starts, format_hours, lead_steps
from dlscale.run.process_group import distributed_run, written_on_rank_0
from dlscale.run.results_directory import forecast_name_parts, replacement_notice, results_directory_name
from dlscale.runtime.device import Device
from dlscale.runtime.distributed import (
    gather_rows_to_main,
    is_distributed,
    min_across_ranks,
    sum_across_ranks_,
)
from dlscale.runtime.launch import ProcessInfo, detect_process
from dlscale.runtime.rng import seed_everything
from dlscale.runtime.storage import probe_creatable, require_free_space
from dlscale.scoring.perturbation_scales import with_channel_scales
from dlscale.scoring.perturbation_spec import GAUSSIAN, Perturbation, check_ensemble_options
from dlscale.scoring.perturbations import ensemble_members, noise_in_units
from dlscale.scoring.rollout import EnsembleMembers, Rollout, roll_out
from dlscale.scoring.rollout_ranks import sum_rollout_across_ranks
from dlscale.training.precision import Precision
from dlscale.version import __version__

log = logging.getLogger("dlscale.train")

FORECAST_DIR = "forecast"
# The share of the memory available now that forecasts kept for --write may take.
KEPT_MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class ForecastOptions:
    """What to roll out: the split, the lead, the initial times, the batch and what to write."""

    split: str = "test"
    lead: str = DEFAULT_LEAD
    init: str = DEFAULT_INIT
    init_count: int | None = None
    batch_size: int | None = None  # initial times rolled out together (default: the run's global batch)
    write: str | None = None  # "netcdf" or "zarr": the forecasts themselves
    names: str = "wb2"  # the written variables' names: WeatherBench2's ("wb2") or the channels' ("short")
    # the ACC's reference: a climatology store's path, "time-mean", or None (the data's store, else the time
    # mean; see dlscale.run.forecast_climatology)
    climatology: str | None = None
    members: int = 1  # an ensemble's members, the control (the deterministic forecast) included
    perturb: str | None = None  # how the members differ: gaussian:SCALE[:LENGTH_KM] or dropout
    figures: bool = True  # the PNGs beside scores.json (seconds each; a loop of forecasts may not want them)
    # channels a caller needs the data to hold (fit-perturbation's --channels), checked before anything is written
    require_channels: tuple[str, ...] = ()


@dataclass
class ForecastResult:
    """The document (``scores.json``), the rollout (with the forecasts when they were kept), and the directory
    the results went to."""

    document: dict[str, Any]
    rollout: Rollout
    starts: list[ForecastStart]
    output_dir: Path


def forecast_checkpoint(
    target: str | Path,
    options: ForecastOptions = ForecastOptions(),
    checkpoint: str | None = None,
    overrides: Sequence[str] = (),
) -> ForecastResult:
    """Forecast from the checkpoint that ``target`` and ``checkpoint`` name (see
    :func:`dlscale.checkpoint.selection.choose_checkpoint`); bad input raises a DlscaleError before anything is
    written."""
    process = detect_process()
    with early_logging(process.is_main):
        evaluation = prepare(
            Path(target).expanduser(), options.split, checkpoint, tuple(overrides), "forecast"
        )
        device = Device.select(process.local_rank)
        with distributed_run(process, device, evaluation.config.parallel.timeout_s) as ending:
            result = _forecast(evaluation, options, device, process)
            ending.alike = True
            return result


def _forecast(
    evaluation: Evaluation, options: ForecastOptions, device: Device, process: ProcessInfo
) -> ForecastResult:
    cfg, workload = evaluation.config, evaluation.workload
    if options.write is not None:
        check_writable_format(options.write)
    if options.names not in NAMES:
        raise ConfigError(f"--names {options.names!r}: expected one of {', '.join(NAMES)}")
    if options.batch_size is not None and options.batch_size < 1:
        raise ConfigError(f"--batch-size {options.batch_size}: expected a number of initial times >= 1")
    perturbation = check_ensemble_options(options.members, options.perturb, noise_model=_reads_noise(cfg))
    if perturbation is not None and options.perturb is None:  # a noise model's default: its own noise
        options = replace(options, perturb=perturbation.kind)
    if options.split == "train":
        # A workload's forecast_data also gives the training split, which multi-step training reads.
        raise DataError(
            "no 'train' split to evaluate: a forecast scores held-out data, never the training samples; "
            "use --split valid or test"
        )
    trajectories = workload.forecast_data(cfg.data, options.split)
    headline_channels(trajectories)  # a wrong headline_channels fails here, before the rollout
    unknown = [name for name in options.require_channels if name not in trajectories.channel_names]
    if unknown:
        raise ConfigError(
            f"--channels: {', '.join(unknown)} not among the data's channels ({', '.join(trajectories.channel_names)})"
        )
    steps = lead_steps(options.lead, trajectories.step_hours)
    candidates = trajectories.starts()
    where = f"in the {options.split} split"
    choose = partial(
        choose_starts,
        candidates,
        [trajectories.reach(start) for start in candidates],
        steps,
        trajectories.step_hours,
        trajectories.hours_per_state,
        options.init,
    )
    starts = choose(options.init_count, where)
    # An --init-count that keeps every initial time changes nothing, so it names no directory of its own.
    counted = options.init_count if len(starts) < len(choose(None, where)) else None
    # The ACC's reference names the directory (a forecast against the mean field never replaces one against
    # the climatology by day of year), so it is chosen first.
    climatology = choose_climatology(options.climatology, trajectories, starts, steps)
    reference = directory_climatology(options.climatology, climatology)
    output_dir = _output_dir(evaluation, options, counted, trajectories.step_hours, reference)
    # A place that cannot take the results (read-only, full, not a directory) is said now, not after the rollout.
    probe_creatable(output_dir, FORECAST_OPTION)
    if options.write is not None:
        _check_memory_for_forecasts(len(starts) * options.members, steps, trajectories)
        _check_written_size(options, len(starts), steps, trajectories, output_dir)

    device.configure(cfg.train.deterministic, tf32=cfg.train.tf32)
    seed_everything(cfg.train.seed)
    model = workload.build_model(cfg.model, cfg.data).to(device.torch).eval()
    checkpoint = evaluation.source.checkpoint
    load_model_state(model, local_model_state(model, evaluation.payload["model"]), str(checkpoint))
    predict = Precision(cfg.train.amp_mode, device).wrap_inference(model)
    members = None
    if perturbation is not None:
        # gaussian:auto / FILE: the per-channel scales, checked against the data's channels
        perturbation = with_channel_scales(
            perturbation, evaluation.source.run_dir, trajectories.channel_names
        )
        latitudes, longitudes = trajectories.latitudes, trajectories.longitudes
        seed = cfg.train.seed
        members = ensemble_members(perturbation, options.members, latitudes, longitudes, model, predict, seed)
        _check_ensemble_memory(
            cfg, options, perturbation, members, model, trajectories, starts, steps, device, process
        )
    # An ensemble's members go through the model together: by default as many samples as the run's batch.
    batch_size = options.batch_size or max(1, cfg.train.global_batch_size // options.members)
    map_leads = report_leads(MAP_DAYS, trajectories.step_hours, steps)
    log.info(
        "Forecasting with %s: %s; %d initial times (%s .. %s), leads up to %s (%d steps), batches of %d, on %s",
        checkpoint,
        trajectories.describe(),
        len(starts),
        starts[0].describe(),
        starts[-1].describe(),
        format_hours(steps * trajectories.step_hours),
        steps,
        batch_size,
        device.name,
    )
    noise = None
    if members is not None:
        in_units = ""
        if perturbation is not None and perturbation.kind == GAUSSIAN:
            grid = (
                len(trajectories.channel_names),
                len(trajectories.latitudes),
                len(trajectories.longitudes),
            )
            scale = perturbation.channel_scales or perturbation.scale
            noise = noise_in_units(scale, trajectories.to_physical, grid)
            shown = headline_channels(trajectories).names
            sizes = perturbation_size_text(noise, trajectories.channel_names, trajectories.units, shown)
            in_units = f"; in the channels' units, its standard deviation at each point: {sizes}"
        log.info(
            "Ensemble of %d members: the control and %d with %s%s",
            members.count,
            members.count - 1,
            members.description,
            in_units,
        )
    notice = replacement_notice(output_dir, SCORES_JSON, "forecast")
    if notice is not None:
        log.info("%s", notice)
    progress = cfg.log.progress, cfg.log.progress_interval_s
    # Ranks share the initial times in contiguous runs (rank 0 the first, whose rollout the maps show).
    counts = _shares(len(starts), process.world_size)
    first = sum(counts[: process.rank])
    rollout = roll_out(
        predict,
        trajectories,
        starts[first : first + counts[process.rank]],
        steps,
        batch_size,
        device.torch,
        synchronize=device.synchronize,
        keep_forecasts=options.write is not None,
        map_leads=map_leads if process.is_main else (),
        show_progress=(lambda batches: PassProgress(batches, f"{options.split} rollouts", *progress))
        if process.is_main
        else iter,
        climatology=climatology,
        members=members,
    )
    _add_up_ranks(rollout, counts, device)
    identity = {
        "split": options.split,
        "checkpoint": str(checkpoint),
        "checkpoint_name": evaluation.source.name,
        "run_dir": str(evaluation.source.run_dir) if evaluation.source.run_dir is not None else None,
        "config": cfg.name,
        "workload": workload.name,
        "overrides": list(evaluation.overrides),
        "global_step": (evaluation.payload.get("progress") or {}).get("global_step"),
        "epochs_completed": (evaluation.payload.get("progress") or {}).get("epoch"),
        "data": trajectories.describe(),
        "climatology": climatology.description if climatology is not None else None,
        "lead": options.lead,
        "init": options.init,
        "init_count": options.init_count,
        "batch_size": batch_size,
        "members": options.members,
        "world_size": process.world_size,
        "amp_mode": cfg.train.amp_mode,
        "device": device.name,
        "dlscale_version": __version__,
        "torch_version": str(torch.__version__),
        # What was asked for (the directory's name says which of it changes the results), and where it went.
        "options": {**_recorded(options), "overrides": list(evaluation.overrides)},
        "output_dir": str(output_dir),
    }
    document = forecast_document(rollout, trajectories, identity, [start.describe() for start in starts])
    if noise is not None:
        document["ensemble"]["perturbation_std"] = perturbation_std_entry(noise, trajectories.channel_names)
    if perturbation is not None and perturbation.channel_scales is not None:
        document["ensemble"]["perturbation_scales"] = {
            "file": perturbation.scales_from,
            "scales": dict(zip(trajectories.channel_names, perturbation.channel_scales, strict=True)),
            "length_km": perturbation.length_km,
        }

    def write() -> None:
        written = _write(
            output_dir, document, rollout, trajectories, starts, options.write, options.names, options.figures
        )
        log_forecast(document, written)

    # Rank 0's document (with the files it wrote) on every rank.
    shared = written_on_rank_0(process, device, document, write, "forecast")
    return ForecastResult(shared, rollout, starts, output_dir)


def _recorded(options: ForecastOptions) -> dict[str, Any]:
    """The options scores.json records: what the user asked for (not a caller's internal checks)."""
    return {key: value for key, value in asdict(options).items() if key != "require_channels"}


def _shares(count: int, ranks: int) -> list[int]:
    """How many of ``count`` initial times each of ``ranks`` rolls out: as even as can be, the larger shares first
    (a rank may have none when there are fewer initial times than ranks)."""
    base, extra = divmod(count, ranks)
    return [base + (rank < extra) for rank in range(ranks)]


def _add_up_ranks(rollout: Rollout, counts: list[int], device: Device) -> None:
    """Every rank's sums added up, the slowest rank's seconds, and the forecasts kept for --write gathered on
    rank 0 (nothing to do in one process)."""
    if not is_distributed():
        return
    sum_rollout_across_ranks(rollout, sum_across_ranks_, device.torch)
    rollout.model_seconds = -min_across_ranks(-rollout.model_seconds, device)
    rollout.seconds = -min_across_ranks(-rollout.seconds, device)
    if rollout.forecasts is not None:
        rollout.forecasts = gather_rows_to_main(rollout.forecasts, counts, device)


def _output_dir(
    evaluation: Evaluation,
    options: ForecastOptions,
    counted: int | None,
    step_hours: float,
    reference: str | None,
) -> Path:
    """``<run dir>/forecast/<split>-<checkpoint>``, with a part for each option that changes the results and
    for the ACC's ``reference`` (:func:`dlscale.run.forecast_climatology.directory_climatology`)."""
    parts = forecast_name_parts(
        options.lead,
        options.init,
        counted,
        options.write,
        step_hours,
        evaluation.override_part,
        options.names,
        reference,
        options.members,
        options.perturb,
    )
    name = results_directory_name(options.split, evaluation.source.name, parts)
    return evaluation.source.output_dir / FORECAST_DIR / name


def _check_memory_for_forecasts(count: int, steps: int, trajectories: Trajectories) -> None:
    """Refuse, before the rollout, to keep more forecasts for --write than half the memory available."""
    height, width = len(trajectories.latitudes), len(trajectories.longitudes)
    needed = count * steps * len(trajectories.channel_names) * height * width * 4
    available = psutil.virtual_memory().available
    if needed > KEPT_MEMORY_SHARE * available:
        raise ConfigError(
            f"--write keeps the whole forecast in memory until it is written: {needed / 1e9:.1f} GB for {count} "
            f"initial times x {steps} leads, more than half of the {available / 1e9:.1f} GB available; write "
            "fewer with --init-count or a shorter --lead"
        )


def _check_written_size(
    options: ForecastOptions, initial_times: int, steps: int, trajectories: Trajectories, output_dir: Path
) -> None:
    """Say how large --write's file will be, before the rollout; refuse a netCDF file (written uncompressed, so
    its size is known) larger than the free space where it goes, rather than fill the disk at the end."""
    fmt = options.write
    assert fmt is not None
    log.info("%s", written_size_line(fmt, options.names, initial_times, options.members, steps, trajectories))
    if fmt == "netcdf":
        size = written_bytes(trajectories, options.names, initial_times, options.members, steps)
        existing = next(parent for parent in (output_dir, *output_dir.parents) if parent.exists())
        require_free_space(existing, size, FORMATS[fmt], FORECAST_OPTION, named=output_dir)


def _reads_noise(cfg: Any) -> bool:
    """Whether the run's model reads noise inputs (the ViT's ``model.noise_channels``; other models have none)."""
    return int(getattr(cfg.model, "noise_channels", 0) or 0) > 0


def _check_ensemble_memory(
    cfg: Any,
    options: ForecastOptions,
    perturbation: Perturbation,
    members: EnsembleMembers,
    model: torch.nn.Module,
    trajectories: Trajectories,
    starts: list[ForecastStart],
    steps: int,
    device: Device,
    process: ProcessInfo,
) -> None:
    """Refuse, before the first step, an ensemble whose sums, batch of members through the model and scores do not
    fit in memory (see :mod:`dlscale.run.forecast_memory`); the model's bytes per member are measured on it."""
    channels, height, width = (
        len(trajectories.channel_names),
        len(trajectories.latitudes),
        len(trajectories.longitudes),
    )
    per_rank = -(-len(starts) // process.world_size)  # the largest share of the initial times

    def batch(count: int) -> int:
        return min(options.batch_size or max(1, cfg.train.global_batch_size // count), per_rank)

    def kept(count: int) -> int:
        return len(starts) * count * steps * channels * height * width * 4 if options.write is not None else 0

    if perturbation.kind != GAUSSIAN:
        noise = 0  # dropout draws nothing of its own; a noise model's noise is a few channels of its input
    else:
        noise = WHITE_NOISE_BYTES_PER_VALUE if perturbation.length_km == 0 else NOISE_BYTES_PER_VALUE
    shape = EnsembleShape(
        batch=batch,
        leads=steps + 1,
        channels=channels,
        height=height,
        width=width,
        histogram_leads=len(report_leads(RANK_HISTOGRAM_DAYS, trajectories.step_hours, steps)),
        noise_bytes_per_value=noise,
        model_bytes_per_sample=step_bytes_per_sample(
            members.predict, (channels, height, width), device.torch
        ),
        ranks=process.world_size,
        kept_forecast_bytes=kept,
    )
    host = psutil.virtual_memory().available // max(1, process.local_world_size)  # this node's ranks share it
    gpu = None
    if device.is_gpu:
        weights = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
        gpu = int(device.memory_capacity_gb() * 1024**3) - weights
    check_ensemble_memory(shape, options.members, AvailableMemory(host, gpu, device.name))


def _write(
    directory: Path,
    document: dict[str, Any],
    rollout: Rollout,
    trajectories: Trajectories,
    starts: list[ForecastStart],
    fmt: str | None,
    names: str = "wb2",
    draw: bool = True,
) -> list[Path]:
    """Write the forecast's directory in one piece (an earlier one stays as it was if this fails); ``draw``: with
    the figures."""
    figures = score_figures(document) if draw else {}
    if draw and rollout.maps is not None and rollout.maps.leads:
        channel = map_channel(document["headline_channels"])
        figures[MAPS_FIGURE] = maps_figure(rollout.maps, trajectories, channel, trajectories.step_hours)

    def write_data(path: Path) -> None:
        if fmt is not None and rollout.forecasts is not None:
            attributes = {
                key: document[key] for key in ("workload", "checkpoint", "split", "dlscale_version")
            }
            if "ensemble" in document:  # how the members of the number dimension differ
                attributes["ensemble_perturbation"] = document["ensemble"]["perturbation"]
            dataset = forecast_dataset(rollout.forecasts, starts, trajectories, attributes, names)
            write_forecast_file(dataset, path, fmt)

    data_file = FORMATS[fmt] if fmt is not None else None
    return write_scores_directory(directory, document, figures, "the forecast", data_file, write_data)
