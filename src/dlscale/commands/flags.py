"""The command-line flags that set config keys: one table, from which the options and their values come.

``dlscale train``, ``config`` and ``bench`` take the tutorials' own flags (``--num_data_workers 4``) as
shortcuts for ``--set loader.num_data_workers=4``; ``bench`` also takes its trial options (``--nbatches``).
Each flag is written once, in :data:`CONFIG_FLAGS`: :func:`add_flag_arguments` makes the argparse options of a
parser from it and :func:`config_flag_values` turns the parsed arguments back into ``{config key: value}``.

This module imports neither torch nor any command body: building the parser for ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dlscale.config.yaml_source import DEFAULT_YAML

# The titles of the argparse groups the flags are listed under in --help.
TUTORIAL_FLAGS_GROUP = "the tutorials' flags (each sets one config key; see docs/configs.md)"
RUN_CONTROL_GROUP = "run control"
BENCH_TRIALS_GROUP = "throughput trials (benchy)"

# The groups of flags that train a run: ``dlscale train``, ``config`` and ``bench`` all take them.
TRAINING_FLAG_GROUPS = (TUTORIAL_FLAGS_GROUP, RUN_CONTROL_GROUP)


@dataclass(frozen=True)
class ConfigFlag:
    """One command-line flag that sets one config key.

    A switch is ``--name`` (on) / ``--no-name`` (off); any other flag takes one value, converted by
    ``value_type`` and limited to ``choices`` when there are some. The value reaches the config as argparse
    parsed it: ``--tf32 on`` gives the text ``"on"``, which the config turns into its bool like a YAML value.
    """

    name: str  # as typed, without the leading dashes
    config_key: str  # section.key
    help: str  # what it does; --help adds the config key after it
    group: str = TUTORIAL_FLAGS_GROUP  # title of the --help group it is listed under
    switch: bool = False
    value_type: Callable[[str], object] = str
    choices: tuple[str, ...] | None = None

    @property
    def help_with_key(self) -> str:
        """The help text, naming the config key the flag sets."""
        return f"{self.help} ({self.config_key})"


# Spelled as the tutorials' users type them. They are applied after --set, in this order (which is also the
# order of the overrides a run records), and unlike the tutorials' scripts they also switch things *off*
# (--num_data_workers 0, --no-enable_jit), so a 0 or a False is a value, not an absent flag.
CONFIG_FLAGS: tuple[ConfigFlag, ...] = (
    ConfigFlag("run_num", "log.run_num", "run tag: outputs go to <expdir>/<config>/<run_num>"),
    ConfigFlag("num_epochs", "train.num_epochs", "epochs to train; wins over num_iters", value_type=int),
    ConfigFlag("num_iters", "train.num_iters", "optimizer steps", value_type=int),
    ConfigFlag(
        "local_batch_size", "train.local_batch_size", "per-rank batch; global = local x ranks", value_type=int
    ),
    ConfigFlag("num_data_workers", "loader.num_data_workers", "DataLoader worker processes", value_type=int),
    ConfigFlag("amp_mode", "train.amp_mode", "mixed precision", choices=("none", "fp16", "bf16")),
    ConfigFlag("enable_fused", "optim.enable_fused", "fused optimizer step", switch=True),
    ConfigFlag("enable_jit", "train.enable_jit", "torch.compile the model", switch=True),
    ConfigFlag("tf32", "train.tf32", "TF32 tensor cores for fp32 math", choices=("on", "off")),
    ConfigFlag("cuda_graphs", "train.cuda_graphs", "capture the training step in a CUDA graph", switch=True),
    ConfigFlag(
        "enable_benchy",
        "bench.enable_benchy",
        "run IO/SYNTHETIC/FULL throughput trials instead of training",
        switch=True,
    ),
    ConfigFlag(
        "enable_manual_profiling",
        "profile.enable_manual_profiling",
        "NVTX ranges and a cudaProfilerApi capture window for nsys",
        switch=True,
    ),
    ConfigFlag(
        "torch_profiler",
        "profile.torch_profiler",
        "write a torch.profiler trace over the step window of profile.torch_profiler_*",
        switch=True,
    ),
    ConfigFlag(
        "line_profile",
        "profile.line_profile",
        "per-line timings of the training step; needs line_profiler",
        switch=True,
    ),
    ConfigFlag(
        "data_loader_config",
        "loader.data_loader_config",
        "data pipeline: pytorch DataLoader, or dlscale's threaded gpu pipeline (dali and dali-lowmem are "
        "aliases of gpu)",
        choices=("pytorch", "gpu", "dali", "dali-lowmem"),
    ),
    ConfigFlag("bucket_cap_mb", "parallel.bucket_cap_mb", "DDP gradient bucket size", value_type=float),
    ConfigFlag(
        "disable_broadcast_buffers",
        "parallel.disable_broadcast_buffers",
        "DDP: do not broadcast buffers every step",
        switch=True,
    ),
    ConfigFlag("noddp", "parallel.noddp", "no gradient sync between ranks", switch=True),
    ConfigFlag("tensor_parallel", "parallel.tensor_parallel", "tensor-parallel size", value_type=int),
    ConfigFlag("context_parallel", "parallel.context_parallel", "context-parallel size", value_type=int),
    ConfigFlag("parallel_order", "parallel.parallel_order", "rank order of the mesh, e.g. tp-cp-dp"),
    # dlscale's own shortcuts
    ConfigFlag("expdir", "log.expdir", "root of the run directories", group=RUN_CONTROL_GROUP),
    ConfigFlag("seed", "train.seed", "random seed", group=RUN_CONTROL_GROUP, value_type=int),
    ConfigFlag(
        "resume",
        "checkpoint.resume",
        "auto (default), never, a checkpoint file, or a run or checkpoints directory",
        group=RUN_CONTROL_GROUP,
    ),
    ConfigFlag(
        "resume_weights_only",
        "checkpoint.resume_weights_only",
        "start a new run from the weights of --resume PATH only: fresh optimizer, schedule and position, and "
        "model keys may differ",
        group=RUN_CONTROL_GROUP,
        switch=True,
    ),
    ConfigFlag(
        "progress",
        "log.progress",
        "progress display",
        group=RUN_CONTROL_GROUP,
        choices=("auto", "bar", "lines", "none"),
    ),
    # dlscale bench's trial options
    ConfigFlag(
        "nwarmup",
        "bench.nwarmup",
        "unrecorded warm-up trials per test",
        group=BENCH_TRIALS_GROUP,
        value_type=int,
    ),
    ConfigFlag(
        "ntrials", "bench.ntrials", "recorded trials per test", group=BENCH_TRIALS_GROUP, value_type=int
    ),
    ConfigFlag(
        "nbatches", "bench.nbatches", "timed batches per trial", group=BENCH_TRIALS_GROUP, value_type=int
    ),
    ConfigFlag(
        "report_freq",
        "bench.report_freq",
        "print an iteration's throughput every N batches",
        group=BENCH_TRIALS_GROUP,
        value_type=int,
    ),
)


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
    parser.add_argument(
        "--debug",
        action="store_true",
        help="print the whole traceback with an error's one line (an error in a workload's own code writes "
        "it to the run's out.log anyway)",
    )


def add_group_flags(container: argparse._ActionsContainer, group: str) -> None:
    """Add the table's flags of ``group`` to ``container`` (a parser or an argument group), in table order."""
    for flag in CONFIG_FLAGS:
        if flag.group != group:
            continue
        if flag.switch:
            # --name / --no-name; absent leaves None, so the config's own value stays.
            container.add_argument(
                f"--{flag.name}", action=argparse.BooleanOptionalAction, help=flag.help_with_key
            )
        else:
            container.add_argument(
                f"--{flag.name}", type=flag.value_type, choices=flag.choices, help=flag.help_with_key
            )


def add_flag_arguments(parser: argparse.ArgumentParser, groups: Iterable[str] = TRAINING_FLAG_GROUPS) -> None:
    """Add the flags of each of ``groups`` to ``parser``, each group under its own --help title."""
    for group in groups:
        add_group_flags(parser.add_argument_group(group), group)


def config_flag_values(args: argparse.Namespace) -> dict[str, object]:
    """The config keys set by the table's flags that were given on the command line, in table order.

    A flag left out is None (argparse's default) and sets nothing; a flag the command does not have is not
    in ``args`` at all. A given 0 or --no-x (False) is kept.
    """
    return {
        flag.config_key: getattr(args, flag.name)
        for flag in CONFIG_FLAGS
        if getattr(args, flag.name, None) is not None
    }
