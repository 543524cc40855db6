"""The options of ``dlscale bench``, ``scaling``, ``monitor``, ``plan`` and ``evaluate`` that set no config key.

They live apart from the command bodies so that :func:`dlscale.cli.build_parser` imports neither torch nor a
command's module: ``dlscale --help`` stays fast. The options that set config keys are in
:mod:`dlscale.commands.flags`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dlscale.commands.flags import BENCH_TRIALS_GROUP, add_group_flags
from dlscale.perf.bench.scaling import MODES
from dlscale.scoring.perturbation_spec import HALF_CIRCUMFERENCE_KM, MAX_SCALE, MIN_SCALE

# --mode of ``dlscale scaling``; the analysis (dlscale.perf.bench.scaling) checks a mode given from Python with it.
DEFAULT_SCALING_OUT = Path("scaling")
DEFAULT_GPU_MEMORY_GB = 80.0
# --preset of every `dlscale data synth-*`: the names of each generator's PRESETS, given to the parser so that a
# wrong one is refused before a generator (some import torch) is (tests/commands/test_early_errors.py compares them).
SYNTH_PRESETS = ("tiny", "demo", "full")


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dlscale bench`` beyond the config and tutorial flags: the sweep, the trials, the output."""
    group = parser.add_argument_group(BENCH_TRIALS_GROUP)
    group.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="run the trials once per value of a config key (dotted or flat, as --set takes); several "
        "--sweep options run every combination",
    )
    add_group_flags(group, BENCH_TRIALS_GROUP)  # --nwarmup, --ntrials, --nbatches, --report_freq
    group.add_argument(
        "--output",
        metavar="FILE",
        help="JSON file to write, relative to the current directory (default: a new <run dir>/bench/<date-time>-"
        "benchy_result.json); with --sweep, the combined JSON, with the table (.md) and plot (.png) beside it",
    )


def add_scaling_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dlscale scaling``."""
    parser.add_argument(
        "results",
        nargs="+",
        type=Path,
        metavar="RESULT",
        help="bench JSON files, or directories searched recursively for *.json (other JSON is skipped)",
    )
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="auto",
        help="weak (same local batch at every GPU count), strong (same global batch), or auto (default: "
        "read from the records' batch sizes)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help=f"where scaling.md, scaling.json and scaling.png go (default: the first directory given, "
        f"else ./{DEFAULT_SCALING_OUT})",
    )
    parser.add_argument(
        "--allow-mixed",
        action="store_true",
        help="combine records of different configs, devices or knobs (refused by default: not comparable)",
    )


def add_monitor_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dlscale monitor``."""
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    parser.add_argument("--csv", metavar="FILE", help="also append every sample to this CSV file")
    parser.add_argument("--once", action="store_true", help="print one table and exit (for batch logs)")
    parser.add_argument(
        "--count", type=int, metavar="N", help="stop after N refreshes (default: until Ctrl-C)"
    )


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dlscale plan`` (the parser already has --yaml_config, --config and --set)."""
    parser.add_argument("--gpus", type=int, required=True, help="number of GPUs to lay the run out on")
    parser.add_argument(
        "--gpu_memory_gb",
        type=float,
        default=DEFAULT_GPU_MEMORY_GB,
        help=f"memory of one GPU in GB of 2^30 bytes (default {DEFAULT_GPU_MEMORY_GB:g})",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write every row as JSON to FILE")
    # Underscores like plan's other options; the hyphenated spelling is accepted too.
    parser.add_argument(
        "--check_layout",
        "--check-layout",
        action="store_true",
        help="instead of ranking layouts, build the config's own layout (--set parallel.tensor_parallel=..., "
        "context_parallel, data_parallel) on --gpus fake ranks in this process and run one forward/backward on "
        "fake tensors: shard shapes, parameters and memory of one rank, or the first error",
    )
    parser.add_argument("--rank", type=int, default=0, help="the rank that --check_layout builds (default 0)")


def add_checkpoint_choice(parser: argparse.ArgumentParser, dest: str) -> None:
    """The checkpoint a command reads (``dlscale evaluate``, ``dlscale export``), as
    :func:`dlscale.checkpoint.selection.choose_checkpoint` chooses it: RUN_DIR|CHECKPOINT and --checkpoint."""
    parser.add_argument(
        dest,
        metavar="RUN_DIR|CHECKPOINT",
        help="a run directory (runs/<config>/<run_num>, holding config.yaml and checkpoints/), its checkpoints/ "
        "directory, or a checkpoint file",
    )
    parser.add_argument(
        "--checkpoint",
        metavar="best|latest|PATH",
        help="which checkpoint of RUN_DIR: latest (default), best, or a checkpoint file (a path, or a name in "
        "its checkpoints/)",
    )


def add_trained_config_changes(parser: argparse.ArgumentParser, example: str) -> None:
    """``--set`` of a command that reads a trained checkpoint (evaluate, forecast): any key but those that
    define the weights."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"change a config key, e.g. --set {example} (not the keys that define the weights); repeatable",
    )


def add_evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dlscale evaluate``."""
    parser.epilog = (
        "Writes RUN_DIR/eval/<split>-<checkpoint>/ (e.g. eval/test-ckpt_latest/); --set changes that can change "
        "the numbers add -set-<hash> (e.g. eval/valid-ckpt_latest-set-1a2b3c4d/), so evaluations with other "
        "settings stay beside it (those of the parallel and loader sections do not: they change how, not what). "
        "The same command again replaces its own directory, and says so. metrics.json records the options."
    )
    add_checkpoint_choice(parser, "target")
    parser.add_argument(
        "--split",
        default="valid",
        help="the held-out split: valid (default) or test (ERA5's test/ years; MNIST's and CIFAR's test set, "
        "which the runs validate on), or another split the workload offers",
    )
    add_trained_config_changes(parser, "data.root=/scratch/era5")


def add_forecast_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dlscale forecast`` (see dlscale.run.forecast_times for --lead and --init)."""
    parser.epilog = (
        "Writes RUN_DIR/forecast/<split>-<checkpoint>/ (e.g. forecast/test-ckpt_latest/) with the default options "
        "on data with a climatology by day of year (stats/climatology.zarr). Each option that differs adds a part, "
        "in this order: lead2d (--lead 2d or 48h), every1d (--init every:1d), init8 (--init-count 8), netcdf or "
        "zarr (--write; netcdf-short with --names short), the ACC's reference, ens8-gaussian0.75 (--members 8 "
        "--perturb gaussian:0.75; ens8-gaussian0.1-250km, ens8-dropout, ens8-noise, ens8-gaussianauto, "
        "ens8-gaussianfile-<hash>), set-<hash> (--set changes). The ACC's "
        "reference is named by what was used: clim-timemean for the one mean field, whether --climatology "
        "time-mean asked for it or the data has no climatology by day of year yet (its ACC is not comparable with "
        "WeatherBench2's; dlscale data climatology --root ROOT builds one), clim-<hash> for --climatology PATH, "
        "clim-none without any climatology (no ACC). So forecast/test-ckpt_latest-lead2d-init8-clim-timemean/ "
        "before dlscale data climatology and forecast/test-ckpt_latest-lead2d-init8/ after it stay side by side. "
        "--batch-size, and --set keys of the parallel and loader sections, add nothing (they change how, not "
        "what). The same command again replaces its own directory, and says so; scores.json records the options."
    )
    add_checkpoint_choice(parser, "target")
    parser.add_argument(
        "--split", default="test", help="the held-out split to start from: test (default) or valid"
    )
    parser.add_argument(
        "--lead",
        default="10d",
        help="how far to roll out, a positive duration with its unit: 10d (default), 36h; a multiple of the step",
    )
    parser.add_argument(
        "--init",
        default="every:12h",
        metavar="every:DURATION|DATES",
        help="initial times: every:12h (default: 00 and 12 UTC), every:N model steps, or dates "
        "2018-01-01T00,2018-02-01T12; only those whose whole rollout lies in the data",
    )
    parser.add_argument(
        "--init-count",
        type=int,
        metavar="N",
        help="keep N of those initial times, spread evenly over the split",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        help="initial times rolled out together (default: the run's batch)",
    )
    parser.add_argument(
        "--write",
        choices=("netcdf", "zarr"),
        help="also write the forecasts themselves (forecast.nc through h5netcdf, or forecast.zarr), for xarray; "
        "the log says the file's size before the rollout, and a netCDF file (uncompressed) larger than the free "
        "space is refused then",
    )
    parser.add_argument(
        "--names",
        choices=("wb2", "short"),
        help="with --write: the file's variable names, WeatherBench2's (geopotential with a level dimension, "
        "2m_temperature, ...; the default) or the channels' own (z500, t2m)",
    )
    parser.add_argument(
        "--climatology",
        metavar="PATH|time-mean",
        help="the ACC's reference and the climatology forecaster: a climatology store by day of year and hour "
        "of day in WeatherBench2's layout (dlscale data climatology writes one; WeatherBench2's published ones "
        "are read on the forecast's grid), or time-mean (one mean field over the training years: an ACC not "
        "comparable with WeatherBench2's). Default: data.climatology_path (stats/climatology.zarr) when it "
        "exists, else the time mean (a directory of its own: see below)",
    )
    parser.add_argument(
        "--members",
        type=int,
        default=1,
        metavar="N",
        help="an ensemble of N members: the control (the deterministic forecast) and N - 1 that --perturb makes "
        "differ; scored by CRPS, spread, spread/skill and rank histograms (default 1: deterministic)",
    )
    parser.add_argument(
        "--perturb",
        metavar="gaussian:SCALE[:LENGTH_KM]|gaussian:auto|gaussian:FILE.json|dropout|noise",
        help="how an ensemble's members differ: initial-state noise of SCALE x each channel's standard deviation "
        f"over the training data ({MIN_SCALE:g} to {MAX_SCALE:g}; the log says it in each channel's unit), "
        "correlated over LENGTH_KM (default 500 km; 0: white noise; at most "
        f"{HALF_CIRCUMFERENCE_KM:,.0f} km, half the Earth's circumference); gaussian:auto, per-channel scales "
        "that dlscale fit-perturbation fitted for the run (or gaussian:FILE.json, such a file); the model's "
        "dropout kept on; or noise, the own noise inputs of a model trained with train.loss crps",
    )
    add_figures_switch(parser)
    add_trained_config_changes(parser, "data.root=/scratch/era5 or train.amp_mode=bf16")


def add_fit_perturbation_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dlscale fit-perturbation`` (see dlscale.run.perturbation_fit)."""
    parser.epilog = (
        "Forecasts the validation split's initial times as an ensemble, iteration after iteration, dividing each "
        "channel's scale by its spread/skill ratio at --lead, until every ratio is within a factor 1.1 of 1 or the "
        "iterations end; writes the best iteration's scales to RUN_DIR/perturbation_scales.json (every "
        "iteration's scales and ratios in it too). Then: dlscale forecast RUN_DIR --members 16 --perturb "
        "gaussian:auto. Each iteration is a forecast under RUN_DIR/forecast/ (the next replaces it)."
    )
    add_checkpoint_choice(parser, "target")
    parser.add_argument(
        "--lead", default="5d", help="the lead whose spread/skill is fitted to 1 (default 5d)"
    )
    parser.add_argument("--members", type=int, default=16, metavar="N", help="ensemble members (default 16)")
    parser.add_argument(
        "--init-count", type=int, default=16, metavar="N",
        help="validation initial times, spread evenly over the split (default 16)",
    )  # fmt: skip
    parser.add_argument(
        "--start", type=float, default=0.75, metavar="SCALE",
        help="the first iteration's scale for every channel, in standard deviations (default 0.75)",
    )  # fmt: skip
    parser.add_argument(
        "--length-km", type=float, metavar="KM",
        help="the noise's correlation length (default: 500 km on a latitude-longitude grid; 0: white noise)",
    )  # fmt: skip
    parser.add_argument("--iterations", type=int, default=4, help="forecasts at most (default 4)")
    parser.add_argument(
        "--channels", metavar="NAMES",
        help="comma-separated channels whose spread/skill is fitted, e.g. z500,t850,t2m,u10 (default: all the "
        "model's; every channel keeps a scale)",
    )  # fmt: skip
    parser.add_argument(
        "--out", metavar="FILE", help="where to write (default RUN_DIR/perturbation_scales.json)"
    )
    parser.add_argument("--batch-size", type=int, metavar="N", help="initial times rolled out together")
    add_trained_config_changes(parser, "data.root=/scratch/era5")


def add_figures_switch(parser: argparse.ArgumentParser) -> None:
    """``--no-figures``: scores.json and scores.csv without the PNGs (seconds each), for loops of many runs."""
    parser.add_argument(
        "--no-figures",
        dest="figures",
        action="store_false",
        help="write scores.json and scores.csv without the figures (PNGs take seconds each)",
    )


def add_score_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dlscale score`` (see dlscale.run.score)."""
    parser.epilog = (
        "Reads forecasts in WeatherBench2's layout (dims time, prediction_timedelta, latitude, longitude, level; "
        "a zarr store or a netCDF file, e.g. dlscale forecast --write zarr's, or a WeatherBench2 baseline) and "
        "writes scores.json, scores.csv, skill_vs_lead.png, bias.png (and spectra.png for one forecast) into "
        "--out, default score-<name> beside the forecast. The demo: dlscale forecast runs/demo/00 --write zarr, "
        "then dlscale score runs/demo/00/forecast/<its directory>/forecast.zarr --truth data/era5_demo."
    )
    parser.add_argument(
        "forecast", metavar="FORECAST", help="the forecast: a zarr store or netCDF file, or LABEL=PATH"
    )
    parser.add_argument(
        "--truth",
        required=True,
        metavar="STORE|DATA_ROOT",
        help="the truth: an ERA5 store import-era5 reads (a WeatherBench2 or ARCO-ERA5 zarr store, CDS netCDF "
        "files), or a dlscale data root (synth-era5's or import-era5's: data/era5_demo; its year files, dates "
        "and grid), holding the forecast's valid times on its grid",
    )
    parser.add_argument(
        "--climatology",
        metavar="PATH",
        help="a climatology store by day of year and hour of day in WeatherBench2's layout, for the ACC and "
        "the climatology forecaster (without it: no ACC)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="the scores' directory (default: score-<name> beside FORECAST)",
    )
    parser.add_argument(
        "--compare",
        nargs="+",
        default=[],
        metavar="[LABEL=]PATH",
        help="more forecasts scored beside FORECAST on the initial times and leads all of them have: one "
        "table (a forecaster per forecast in scores.csv) and one skill figure (deterministic forecasts only: an "
        "ensemble, with a number dimension, is scored alone)",
    )
    parser.add_argument(
        "--channels",
        metavar="A,B,...",
        help="score exactly these channels (each in every forecast and in the truth); without it every channel "
        "they share is scored, and score refuses when less than half of the forecast's channels can be",
    )
    parser.add_argument(
        "--times",
        metavar="FIRST..LAST",
        help="score the initial times from FIRST to LAST (dates: 2018-01-01..2018-12-31, 2018-01-01T00..; a "
        "date takes in its whole day); without it every initial time the truth can score is, and score refuses "
        "when less than half of the forecast's can be",
    )
    add_figures_switch(parser)


def add_tune_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dlscale tune`` (the parser already has the config arguments and the tutorials' flags)."""
    group = parser.add_argument_group("tune")
    group.add_argument(
        "--budget",
        type=float,
        default=30.0,
        metavar="MINUTES",
        help="wall time of this invocation: no trial starts that would end after it (default 30)",
    )
    group.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help="the tuned YAML to write (default tuned/<config>_tuned.yaml); the table (.md), plot (.png), record "
        "(.json) and the cache of finished trials (<stem>_trials/) go beside it, so running the same command "
        "again continues an interrupted tune",
    )
    group.add_argument(
        "--loss_tolerance",
        type=float,
        default=0.05,
        metavar="FRACTION",
        help="a knob that changes the numerics is kept only if the check's validation loss is within this "
        "relative difference of the starting config's (default 0.05)",
    )
    group.add_argument(
        "--check_steps",
        type=int,
        default=40,
        metavar="N",
        help="optimizer steps of the numerics check at the starting batch size (same samples at another batch)",
    )
    group.add_argument(
        "--min_gain",
        type=float,
        default=0.02,
        metavar="FRACTION",
        help="a change faster beyond the noise is kept only if it gains at least this (default 0.02)",
    )
    group.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="KEY",
        help="a setting no knob may change, e.g. amp_mode (numerically sensitive model) or enable_jit; repeatable",
    )
    group.add_argument("--ntrials", type=int, default=3, help="recorded trials per measurement (default 3)")
    group.add_argument("--nbatches", type=int, default=20, help="timed batches per trial (default 20)")
    group.add_argument("--nwarmup", type=int, default=1, help="unrecorded warm-up trials (default 1)")
    group.add_argument(
        "--no-confirm",
        dest="confirm",
        action="store_false",
        help="skip the last measurement of the start and the result side by side",
    )


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dlscale export``."""
    add_checkpoint_choice(parser, "source")
    parser.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="the directory to write (must not exist)"
    )
    parser.add_argument(
        "--force", action="store_true", help="replace DIR if it holds an earlier export (or is empty)"
    )
