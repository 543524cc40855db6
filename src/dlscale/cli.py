"""The ``dlscale`` command: parse arguments, then hand over to :mod:`dlscale.commands`.

dlscale train --yaml_config configs/vit_era5.yaml --config short [--set optim.lr=1e-3] [tutorial flags]
dlscale bench --yaml_config configs/vit_era5.yaml --config short [--sweep num_data_workers=0,2,4]
dlscale data synth-era5 --out data/era5_demo --preset demo
dlscale config --yaml_config configs/vit_era5.yaml --config short     # the resolved config
dlscale info                                                           # versions and device
dlscale plan --yaml_config configs/vit_era5.yaml --config mp --gpus 4   # memory/traffic of each dp x tp x cp
"""

from __future__ import annotations

import argparse
import sys

from dlscale import __version__
from dlscale.errors import DlscaleError

DEFAULT_YAML = "configs/vit_era5.yaml"

# The tutorials' own flags, spelled as their users type them, and the config key each one sets. They are
# applied after --set, and unlike the tutorials' scripts they also switch things *off* (--num_data_workers 0).
TUTORIAL_FLAGS: dict[str, str] = {
    "run_num": "log.run_num",
    "num_epochs": "train.num_epochs",
    "num_iters": "train.num_iters",
    "local_batch_size": "train.local_batch_size",
    "num_data_workers": "loader.num_data_workers",
    "amp_mode": "train.amp_mode",
    "enable_fused": "optim.enable_fused",
    "enable_jit": "train.enable_jit",
    "tf32": "train.tf32",
    "cuda_graphs": "train.cuda_graphs",
    "enable_benchy": "bench.enable_benchy",
    "enable_manual_profiling": "profile.enable_manual_profiling",
    "torch_profiler": "profile.torch_profiler",
    "line_profile": "profile.line_profile",
    "data_loader_config": "loader.data_loader_config",
    "bucket_cap_mb": "parallel.bucket_cap_mb",
    "disable_broadcast_buffers": "parallel.disable_broadcast_buffers",
    "noddp": "parallel.noddp",
    "tensor_parallel": "parallel.tensor_parallel",
    "context_parallel": "parallel.context_parallel",
    "parallel_order": "parallel.parallel_order",
    # dlscale's own shortcuts
    "expdir": "log.expdir",
    "seed": "train.seed",
    "resume": "checkpoint.resume",
    "resume_weights_only": "checkpoint.resume_weights_only",
    "progress": "log.progress",
}


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """--yaml_config, --config and --set: which config to read and what to change in it."""
    parser.add_argument(
        "--yaml_config", default=DEFAULT_YAML, help=f"YAML file of named configs (default {DEFAULT_YAML})"
    )
    parser.add_argument("--config", default="base", help="name of the config in the YAML file (default base)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key, dotted (optim.lr=1e-3) or flat (lr=1e-3); repeatable",
    )


# The tutorials' on/off switches: --flag switches on, --no-flag off (the tutorials could only switch on).
TUTORIAL_SWITCHES: dict[str, str] = {
    "enable_fused": "fused optimizer step (optim.enable_fused)",
    "enable_jit": "torch.compile the model (train.enable_jit)",
    "cuda_graphs": "capture the training step in a CUDA graph (train.cuda_graphs)",
    "enable_benchy": "run IO/SYNTHETIC/FULL throughput trials instead of training (bench.enable_benchy)",
    "enable_manual_profiling": "NVTX ranges and a cudaProfilerApi capture window for nsys (profile.*)",
    "torch_profiler": "write a torch.profiler trace over a step window (profile.torch_profiler_*)",
    "line_profile": "per-line timings of the training step (needs line_profiler)",
    "disable_broadcast_buffers": "DDP: do not broadcast buffers every step (parallel.disable_broadcast_buffers)",
    "noddp": "no gradient sync between ranks (parallel.noddp)",
}


def add_tutorial_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("the tutorials' flags (each sets one config key; see README)")
    group.add_argument("--run_num", help="run tag: outputs go to <expdir>/<config>/<run_num> (log.run_num)")
    group.add_argument(
        "--num_epochs", type=int, help="epochs to train; wins over num_iters (train.num_epochs)"
    )
    group.add_argument("--num_iters", type=int, help="optimizer steps (train.num_iters)")
    group.add_argument("--local_batch_size", type=int, help="per-rank batch; global = local x ranks")
    group.add_argument(
        "--num_data_workers", type=int, help="DataLoader worker processes (loader.num_data_workers)"
    )
    group.add_argument(
        "--amp_mode", choices=["none", "fp16", "bf16"], help="mixed precision (train.amp_mode)"
    )
    group.add_argument(
        "--data_loader_config",
        choices=["pytorch", "gpu", "dali", "dali-lowmem"],
        help="data pipeline: pytorch DataLoader, or dlscale's threaded gpu pipeline (dali and dali-lowmem are aliases of gpu)",
    )
    group.add_argument("--tf32", choices=["on", "off"], help="TF32 tensor cores for fp32 math (train.tf32)")
    for flag, help_text in TUTORIAL_SWITCHES.items():
        group.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, help=help_text)
    group.add_argument(
        "--bucket_cap_mb", type=float, help="DDP gradient bucket size (parallel.bucket_cap_mb)"
    )
    group.add_argument("--tensor_parallel", type=int, help="tensor-parallel size (parallel.tensor_parallel)")
    group.add_argument(
        "--context_parallel", type=int, help="context-parallel size (parallel.context_parallel)"
    )
    group.add_argument(
        "--parallel_order", help="rank order of the mesh, e.g. tp-cp-dp (parallel.parallel_order)"
    )
    own = parser.add_argument_group("run control")
    own.add_argument("--expdir", help="root of the run directories (log.expdir)")
    own.add_argument("--seed", type=int, help="random seed (train.seed)")
    own.add_argument(
        "--resume",
        help="auto (default), never, a checkpoint file, or a run or checkpoints directory (checkpoint.resume)",
    )
    own.add_argument(
        "--resume_weights_only",
        action=argparse.BooleanOptionalAction,
        help="start a new run from the weights of --resume PATH only: fresh optimizer, schedule and position, "
        "and model keys may differ (checkpoint.resume_weights_only)",
    )
    own.add_argument(
        "--progress", choices=["auto", "bar", "lines", "none"], help="progress display (log.progress)"
    )


def tutorial_flag_values(args: argparse.Namespace) -> dict[str, object]:
    """Config keys set by the tutorial flags given on the command line."""
    return {
        key: getattr(args, flag)
        for flag, key in TUTORIAL_FLAGS.items()
        if getattr(args, flag, None) is not None
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dlscale", description="Train scientific deep-learning models at scale."
    )
    parser.add_argument("--version", action="version", version=f"dlscale {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = commands.add_parser("train", help="train a model from a named config")
    add_config_arguments(train)
    add_tutorial_flags(train)

    data = commands.add_parser("data", help="generate synthetic data sets in the real on-disk formats")
    generators = data.add_subparsers(dest="generator", required=True, metavar="GENERATOR")
    era5 = generators.add_parser("synth-era5", help="ERA5-like fields in the NERSC tutorial's HDF5 layout")
    era5.add_argument("--out", required=True, help="output directory (holds train/ valid/ test/ stats/)")
    era5.add_argument(
        "--preset", default="demo", help="tiny | demo | full (361x720, real year length); default demo"
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
        "--if-missing", action="store_true", help="do nothing if OUT already holds this data set"
    )

    for name, what in (
        ("synth-cosmo", "dark-matter -> gas volumes in the sc21 U-Net tutorial's HDF5 layout (Nbody, Hydro)"),
        ("synth-mnist", "digit-like images in MNIST's idx format"),
        ("synth-cifar", "100-class images in CIFAR-100's binary format"),
    ):
        generator = generators.add_parser(name, help=what)
        generator.add_argument("--out", required=True, help="output directory")
        generator.add_argument("--preset", default="demo", help="tiny | demo | full (default demo)")
        generator.add_argument("--seed", type=int, help="seed of the synthetic data (default: the preset's)")
        generator.add_argument(
            "--if-missing", action="store_true", help="do nothing if OUT already holds this data set"
        )

    config = commands.add_parser("config", help="print a resolved config, or every key with --keys")
    add_config_arguments(config)
    add_tutorial_flags(config)
    config.add_argument("--keys", action="store_true", help="list every config key with its type and default")

    bench = commands.add_parser(
        "bench", help="IO / SYNTHETIC / FULL throughput trials of a config, optionally swept over a key"
    )
    add_config_arguments(bench)
    add_tutorial_flags(bench)
    from dlscale.commands.bench import add_bench_arguments  # the bench command owns its options

    add_bench_arguments(bench)

    scaling = commands.add_parser(
        "scaling", help="weak/strong scaling table and plot from bench results at several GPU counts"
    )
    from dlscale.commands.scaling import add_scaling_arguments  # the scaling command owns its options

    add_scaling_arguments(scaling)

    monitor = commands.add_parser(
        "monitor", help="live view of the local GPUs' utilization, power, energy and memory, and the host"
    )
    from dlscale.commands.monitor import add_monitor_arguments  # the monitor command owns its options

    add_monitor_arguments(monitor)

    plan = commands.add_parser(
        "plan",
        help="per-GPU memory and traffic of every dp x tp x cp layout of a config, ranked (no GPU needed)",
    )
    add_config_arguments(plan)
    from dlscale.commands.plan import add_plan_arguments  # the plan command owns its options

    add_plan_arguments(plan)

    commands.add_parser("info", help="versions and the device dlscale would train on")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``dlscale`` console script."""
    args = build_parser().parse_args(argv)
    from dlscale import commands  # imported here so that --help and --version stay fast

    try:
        return commands.run(args)
    except DlscaleError as exc:
        if not getattr(exc, "quiet", False):  # quiet: another rank printed the same error
            print(f"dlscale: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("dlscale: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
