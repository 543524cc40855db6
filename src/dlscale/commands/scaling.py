"""``dlscale scaling``: the weak/strong scaling table and plot from bench JSON taken at several GPU counts.

Submit one bench per GPU count (and, to measure the communication overhead, the same again with --noddp),
each writing its JSON where this command can find it, then combine them:

    for n in 1 2 4 8; do
        srun -n $n dlscale bench --config short --output results/bench-$n.json
        srun -n $n dlscale bench --config short --noddp --output results/bench-$n-noddp.json
    done
    dlscale scaling results/                    # results/scaling.md, scaling.json, scaling.png

On one machine, ``torchrun --standalone --nproc_per_node=$n -m dlscale bench ...`` takes srun's place (on the
CPU, 1 and 2 ranks over gloo exercise the whole path, though they measure no GPU scaling).

Weak scaling keeps --local_batch_size the same at every count; strong scaling keeps the global batch the same
(--local_batch_size = global / GPUs). The mode is read from the records; --mode forces it. A single GPU
cannot show multi-GPU scaling: the table then has one row and says so. This command launches no runs itself.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dlscale.commands.options import DEFAULT_SCALING_OUT
from dlscale.perf.bench.scaling import analyse_scaling, load_bench_runs, scaling_table, write_scaling_outputs


def output_directory(args: argparse.Namespace) -> Path:
    """--out, else the first results directory (outputs sit beside the records), else ./scaling."""
    if args.out is not None:
        return args.out
    return next((path for path in args.results if path.is_dir()), DEFAULT_SCALING_OUT)


def run_scaling_command(args: argparse.Namespace) -> int:
    """Read the records, print the table and notes, write the outputs; 0 on success."""
    runs = load_bench_runs(args.results)
    study = analyse_scaling(runs, args.mode, args.allow_mixed)
    paths = write_scaling_outputs(study, output_directory(args))
    print(f"{study.title} ({len(runs)} bench record(s))")
    for line in scaling_table(study):
        print(line)
    for note in study.notes:
        print(f"note: {note}")
    print(f"table {paths['md']}\nplot {paths['png']}\nJSON {paths['json']}")
    return 0
