"""The ``dlscale`` command: parse arguments, then run the command's function from :mod:`dlscale.commands`.

dlscale train --yaml_config configs/vit_era5.yaml --config short [--set optim.lr=1e-3] [tutorial flags]
dlscale bench --yaml_config configs/vit_era5.yaml --config short [--sweep num_data_workers=0,2,4]
dlscale tune --yaml_config configs/vit_era5.yaml --config short --budget 60   # climb the ladder, write the tuned config
dlscale data synth-era5 --out data/era5_demo --preset demo
dlscale data import-era5 era5.zarr --out data/era5 --split 1979-2015:train,2016-2017:valid,2018:test
dlscale data climatology --root data/era5 --split train --years 1990-2015   # stats/climatology.zarr
dlscale config --yaml_config configs/vit_era5.yaml --config short     # the resolved config
dlscale info                                                           # versions and device
dlscale plan --yaml_config configs/vit_era5.yaml --config mp --gpus 4   # memory/traffic of each dp x tp x cp
dlscale export runs/short/00 --out exports/short                        # the model without the run
dlscale evaluate runs/short/00 --split test --checkpoint best            # metrics on held-out data (eval/)
dlscale forecast runs/short/00 --lead 10d                                # rollouts scored per lead (forecast/)
dlscale fit-perturbation runs/short/00 --lead 5d       # per-channel ensemble scales (--perturb gaussian:auto)
dlscale score forecast.zarr --truth era5.zarr --compare ifs=hres.zarr     # forecasts in WeatherBench2's layout
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Callable

from dlscale.commands.flags import (
    TRAINING_FLAG_GROUPS,
    add_config_arguments,
    add_flag_arguments,
)
from dlscale.commands.options import (
    SYNTH_PRESETS,
    add_bench_arguments,
    add_evaluate_arguments,
    add_export_arguments,
    add_fit_perturbation_arguments,
    add_forecast_arguments,
    add_monitor_arguments,
    add_plan_arguments,
    add_scaling_arguments,
    add_score_arguments,
    add_tune_arguments,
)
from dlscale.errors import DlscaleError
from dlscale.version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dlscale", description="Train scientific deep-learning models at scale."
    )
    parser.add_argument("--version", action="version", version=f"dlscale {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = commands.add_parser("train", help="train a model from a named config")
    train.set_defaults(run="dlscale.commands.train:run_train")
    add_config_arguments(train)
    add_flag_arguments(train, TRAINING_FLAG_GROUPS)
    train.add_argument(
        "--dry_run",
        action="store_true",
        help="only check the workload on its first samples and time one training step; writes nothing",
    )

    data = commands.add_parser(
        "data", help="generate synthetic data sets in the real on-disk formats, or import real ERA5"
    )
    data.set_defaults(run="dlscale.commands.data:run_data")
    generators = data.add_subparsers(dest="generator", required=True, metavar="GENERATOR")
    era5 = generators.add_parser("synth-era5", help="ERA5-like fields in the NERSC tutorial's HDF5 layout")
    era5.add_argument("--out", required=True, help="output directory (holds train/ valid/ test/ stats/)")
    era5.add_argument(
        "--preset",
        default="demo",
        choices=SYNTH_PRESETS,
        help="tiny | demo | full (361x720, real year length); default demo",
    )
    era5.add_argument("--height", type=int, help="grid rows (from +90 to -90 degrees)")
    era5.add_argument("--width", type=int, help="grid columns")
    era5.add_argument("--train-years", type=int, help="files in train/")
    era5.add_argument("--valid-years", type=int, help="files in valid/")
    era5.add_argument("--test-years", type=int, help="files in test/")
    era5.add_argument("--steps-per-year", type=int, help="6-hourly steps per file (1460 in a real year)")
    era5.add_argument("--first-year", type=int, help="year of the first training file (default 1979)")
    era5.add_argument("--seed", type=int, help="seed of the synthetic atmosphere")
    era5.add_argument("--noise", type=float, help="i.i.d. noise as a fraction of each channel's spread")
    era5.add_argument(
        "--workers",
        type=int,
        help="threads computing the fields (default: cores, at most 8); the files do not depend on it",
    )
    era5.add_argument(
        "--if-missing", action="store_true", help="do nothing if OUT already holds this data set"
    )

    importer = generators.add_parser(
        "import-era5",
        help="real ERA5 (zarr store or netCDF files) into the tutorial's HDF5 layout, with stats",
    )
    importer.set_defaults(run="dlscale.commands.data:run_import_era5")
    importer.add_argument(
        "source", help="zarr store (path, gs:// or s3:// URL), directory or glob of netCDF files, or one file"
    )
    importer.add_argument("--out", required=True, help="output directory (train/ valid/ test/ stats/)")
    importer.add_argument(
        "--channels", help="comma-separated channels, e.g. u10,t2m,z500 (default: the tutorial's 20)"
    )
    importer.add_argument("--dt", type=int, default=6, help="hours between steps, from 00 UTC (default 6)")
    importer.add_argument(
        "--split", help="years per split, e.g. 1979-2015:train,2016-2017:valid,2018:test (the default)"
    )
    importer.add_argument(
        "--allow-nan", action="store_true", help="keep NaN values (the statistics skip them)"
    )
    importer.add_argument(
        "--block-mb",
        type=float,
        default=256.0,
        help="MB of time steps read and written at once (default 256)",
    )
    importer.add_argument("--readers", type=int, help="threads reading channels (default: cores, at most 8)")
    importer.add_argument(
        "--progress", default="auto", choices=("auto", "bar", "lines", "none"), help="progress display"
    )
    importer.add_argument(
        "--climatology-years",
        metavar="FIRST-LAST",
        help="years of the climatology by day of year and hour of day computed at the end into "
        "stats/climatology.zarr (WeatherBench2's: 1990-2019); imported years of any split (default: the train years)",
    )

    climatology = generators.add_parser(
        "climatology",
        help="WeatherBench2's climatology by day of year and hour of day of a data root's year files "
        "(imported or synthetic), into ROOT/stats/climatology.zarr",
    )
    climatology.set_defaults(run="dlscale.commands.data:run_climatology")
    climatology.add_argument("--root", required=True, help="the data root (holds train/ valid/ test/ stats/)")
    climatology.add_argument(
        "--split", default="train", help="the splits whose files it averages, comma-separated (default train)"
    )
    climatology.add_argument(
        "--years", metavar="FIRST-LAST", help="the years it averages (default: every year of the splits)"
    )
    climatology.add_argument(
        "--window",
        type=int,
        default=61,
        help="days of the triangular smoothing window (default 61, WeatherBench2's)",
    )
    climatology.add_argument(
        "--memory-gb",
        type=float,
        default=2.0,
        help="memory for one latitude band's sums; the grid is streamed in bands that fit (default 2)",
    )

    for name, what in (
        ("synth-cosmo", "dark-matter -> gas volumes in the sc21 U-Net tutorial's HDF5 layout (Nbody, Hydro)"),
        ("synth-mnist", "digit-like images in MNIST's idx format"),
        ("synth-cifar", "100-class images in CIFAR-100's binary format"),
    ):
        generator = generators.add_parser(name, help=what)
        generator.add_argument("--out", required=True, help="output directory")
        generator.add_argument(
            "--preset", default="demo", choices=SYNTH_PRESETS, help="tiny | demo | full (default demo)"
        )
        generator.add_argument("--seed", type=int, help="seed of the synthetic data (default: the preset's)")
        generator.add_argument(
            "--if-missing", action="store_true", help="do nothing if OUT already holds this data set"
        )

    config = commands.add_parser("config", help="print a resolved config, or every key with --keys")
    config.set_defaults(run="dlscale.commands.info:run_config")
    add_config_arguments(config)
    add_flag_arguments(config, TRAINING_FLAG_GROUPS)
    config.add_argument("--keys", action="store_true", help="list every config key with its type and default")
    config.add_argument(
        "--workload",
        help="with --keys: whose data/model keys to list, a name or package.module:OBJECT (default: the "
        "workload of --config)",
    )

    bench = commands.add_parser(
        "bench", help="IO / SYNTHETIC / FULL throughput trials of a config, optionally swept over a key"
    )
    bench.set_defaults(run="dlscale.commands.bench:run_bench_command")
    add_config_arguments(bench)
    add_flag_arguments(bench, TRAINING_FLAG_GROUPS)
    add_bench_arguments(bench)  # the sweep, the trials' flags and the output

    tune = commands.add_parser(
        "tune",
        help="climb the optimization ladder automatically: trials, verdict, knobs kept only when faster beyond "
        "the noise (and numerically the same); writes the tuned config",
    )
    tune.set_defaults(run="dlscale.commands.tune:run_tune_command")
    add_config_arguments(tune)
    add_flag_arguments(tune, TRAINING_FLAG_GROUPS)
    add_tune_arguments(tune)

    scaling = commands.add_parser(
        "scaling", help="weak/strong scaling table and plot from bench results at several GPU counts"
    )
    scaling.set_defaults(run="dlscale.commands.scaling:run_scaling_command")
    add_scaling_arguments(scaling)

    monitor = commands.add_parser(
        "monitor", help="live view of the local GPUs' utilization, power, energy and memory, and the host"
    )
    monitor.set_defaults(run="dlscale.commands.monitor:run_monitor_command")
    add_monitor_arguments(monitor)

    plan = commands.add_parser(
        "plan",
        help="per-GPU memory and traffic of every dp x tp x cp layout of a config, ranked (no GPU needed)",
    )
    plan.set_defaults(run="dlscale.commands.plan:run_plan_command")
    add_config_arguments(plan)
    add_plan_arguments(plan)

    evaluate = commands.add_parser(
        "evaluate",
        help="a trained checkpoint's metrics on the valid or test split, with the run's figures (eval/)",
    )
    evaluate.set_defaults(
        run="dlscale.commands.evaluate:run_evaluate",
        early_check="dlscale.commands.trained_run_checks:check_evaluate_command",
    )
    add_evaluate_arguments(evaluate)

    forecast = commands.add_parser(
        "forecast",
        help="roll a trained model forward for days: RMSE and ACC per lead time against persistence and "
        "climatology, figures, optionally the forecasts as netCDF/zarr (forecast/)",
    )
    forecast.set_defaults(
        run="dlscale.commands.forecast:run_forecast",
        early_check="dlscale.commands.trained_run_checks:check_forecast_command",
    )
    add_forecast_arguments(forecast)

    fit = commands.add_parser(
        "fit-perturbation",
        help="fit per-channel scales of --perturb gaussian on the validation split, so that each channel's "
        "spread/skill at a lead is 1 (perturbation_scales.json, read by --perturb gaussian:auto)",
    )
    fit.set_defaults(
        run="dlscale.commands.fit_perturbation:run_fit_perturbation",
        early_check="dlscale.commands.fit_perturbation:check_fit_perturbation_command",
    )
    add_fit_perturbation_arguments(fit)

    score = commands.add_parser(
        "score",
        help="score forecasts in WeatherBench2's layout (ours or another model's) against a truth store: RMSE, "
        "bias, ACC per lead, several side by side with --compare",
    )
    score.set_defaults(
        run="dlscale.commands.score:run_score", early_check="dlscale.commands.score:check_score_command"
    )
    add_score_arguments(score)

    export = commands.add_parser(
        "export",
        help="a checkpoint's model without the run: safetensors weights, config, normalization statistics, a "
        "torch.export program",
    )
    export.set_defaults(run="dlscale.commands.export:run_export_command")
    add_export_arguments(export)

    info = commands.add_parser("info", help="versions and the device dlscale would train on")
    info.set_defaults(run="dlscale.commands.info:run_info")
    return parser


def command_function(reference: str) -> Callable[[argparse.Namespace], int | None]:
    """The function named by a subparser's ``run`` (or ``early_check``) default, ``"package.module:function"``.

    The parser names each command's function as text, and its module is imported only here, once the command
    line is parsed: the command bodies import torch, which ``--help`` and ``--version`` must not wait for. A
    command body checks what it can before it imports torch; ``early_check`` names the checks of a command
    whose module imports torch at once (evaluate, forecast), run before that module is imported.
    """
    module_name, _, function_name = reference.partition(":")
    return getattr(importlib.import_module(module_name), function_name)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``dlscale`` console script."""
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "early_check", None) is not None:
            command_function(args.early_check)(args)
        return command_function(args.run)(args)
    except DlscaleError as exc:
        if getattr(args, "debug", False):  # the whole chain: an exception in the user's code comes first
            traceback.print_exception(exc, file=sys.stderr)
        if not getattr(exc, "quiet", False):  # quiet: another rank printed the same error
            print(f"dlscale: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("dlscale: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
