"""How much the loader costs on top of the bare HDF5 reads: raw h5py samples/s vs the IO trial's samples/s.

    PYTHONPATH=src python benchmarks/io_overhead.py [--data data/era5_demo] [--processes 5]

(a) raw: exactly the samples the IO trial reads (same sampler order, same epochs, same crop), read as
    ``fields[t]`` and ``fields[t + dt]`` (in one strided selection when they have the same channels, the
    fastest h5py read) into numpy: no normalization, no torch, no batching. The target's reference.
(b) raw, two reads: the same samples read as the reference tutorial's reader does, ``fields[t, :n_in]`` and
    ``fields[t + dt, :n_out]`` in two calls; context for the numbers, not the target's reference.
(c) batch reads: the same samples through the data set's ``read_batch`` (what the loader calls once per
    batch), without and with normalization: where the loader's time goes between (a) and (d).
(d) IO: dlscale's IO trial (benchy's definition: drain the training loader) of the ``demo`` config with
    ``num_data_workers=0``, so all run in one process and compare like for like. ``--data_loader_config gpu``
    measures the gpu pipeline instead (its one reader thread at 0 workers); ``--read_method hdf5|mmap`` sets
    ``data.read_method`` (``auto`` maps the files on a local file system, so it usually measures ``mmap``).

Every sample is read once before either measurement, so both see a warm page cache (the first to run would
otherwise pay the disk for both), and rounds alternate raw and IO trials, so a change in the machine's load
hits both. Each measurement runs in ``--processes`` fresh processes: the IO rate of a process depends on its
allocator's state (whether glibc hands the freed memory of each batch back to the system and faults it in
again for the next), which differs from one process to the next, so a single process can mislead.

The target is IO >= 0.8 x raw: the loader's own work (normalization, tensors, batching) should cost at most a
quarter of the read's time. Results: ``benchmarks/results/<date>-<device>-io-overhead[-gpu][-hdf5|-mmap].json``
and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from benchmark_text import command_line

import dlscale
from dlscale.config import load_run_config
from dlscale.data.era5.layout import FIELDS_KEY
from dlscale.perf.bench.trials import run_trials
from dlscale.run.assembly import build_training
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.device import Device
from dlscale.runtime.launch import ProcessInfo

REPO = Path(__file__).resolve().parents[1]
TARGET_RATIO = 0.8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="data/era5_demo", help="ERA5 data set directory (made if missing)")
    parser.add_argument("--yaml_config", default=str(REPO / "configs" / "vit_era5.yaml"))
    parser.add_argument("--config", default="demo", help="config whose loader is measured (default demo)")
    parser.add_argument(
        "--data_loader_config", default="pytorch", choices=["pytorch", "gpu"], help="pipeline to measure"
    )
    parser.add_argument(
        "--read_method",
        default="auto",
        choices=["auto", "hdf5", "mmap"],
        help="data.read_method of the loader",
    )
    parser.add_argument("--nwarmup", type=int, default=1, help="unrecorded warm-up trials")
    parser.add_argument("--ntrials", type=int, default=4, help="recorded trials per round")
    parser.add_argument("--nbatches", type=int, default=60, help="batches per trial")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of raw trials, then IO trials")
    parser.add_argument("--processes", type=int, default=5, help="fresh processes that each measure both")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="results directory")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one measuring process
    return parser.parse_args(argv)


def ensure_data(data: Path) -> None:
    """Make the demo data set if it is not there (the same command a user would type)."""
    if (data / "train").is_dir():
        return
    command = [sys.executable, "-m", "dlscale", "data", "synth-era5", "--out", str(data), "--preset", "demo"]
    subprocess.run([*command, "--if-missing"], check=True)


def trial_indices(sampler: Any, nwarmup: int, ntrials: int, samples_per_trial: int) -> list[list[int]]:
    """The sample indices of each IO trial (warm-up ones first), in the order the trial reads them.

    The trial driver starts the sampler at epoch 0 and moves to the next epoch whenever a pass ends; a pass
    holds whole batches, so a batch never spans two epochs and this concatenation is the trial's order.
    """
    needed = (nwarmup + ntrials) * samples_per_trial
    order: list[int] = []
    epoch = 0
    while len(order) < needed:
        sampler.set_epoch(epoch)
        order.extend(sampler)
        epoch += 1
    return [order[k * samples_per_trial : (k + 1) * samples_per_trial] for k in range(nwarmup + ntrials)]


class RawReader:
    """Bare h5py reads of one sample's input and target, as the ERA5 reader's crop defines them."""

    def __init__(self, dataset: Any) -> None:
        cfg = dataset.cfg
        self.dataset = dataset
        self.height, self.width = cfg.img_size
        self.n_in, self.n_out, self.dt = cfg.n_in_channels, cfg.n_out_channels, cfg.dt
        self.files: dict[Path, h5py.File] = {}
        self.fields: dict[Path, h5py.Dataset] = {}

    def _open(self, index: int) -> tuple[h5py.Dataset, int]:
        path, t = self.dataset.location(index)
        fields = self.fields.get(path)
        if fields is None:  # open once and keep the dataset object: looking it up per read costs time too
            handle = self.files[path] = h5py.File(path, "r")
            fields = self.fields[path] = handle[FIELDS_KEY]
        return fields, t

    def read(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        fields, t = self._open(index)
        if self.n_in == self.n_out:
            # The fastest way h5py offers: both states in one strided selection (one HDF5 call, not two).
            pair = fields[t : t + self.dt + 1 : self.dt, : self.n_in, : self.height, : self.width]
            return pair[0], pair[1]
        return self.read_twice(index)

    def read_twice(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Input and target in two reads, as the reference tutorial's reader does."""
        fields, t = self._open(index)
        inputs = fields[t, : self.n_in, : self.height, : self.width]
        targets = fields[t + self.dt, : self.n_out, : self.height, : self.width]
        return inputs, targets

    def close(self) -> None:
        for handle in self.files.values():
            handle.close()


def raw_rates(read: Callable[[int], Any], trials: list[list[int]]) -> list[float]:
    """samples/s of each trial's raw reads."""
    rates = []
    for indices in trials:
        start = time.perf_counter()
        for index in indices:
            read(index)
        rates.append(len(indices) / (time.perf_counter() - start))
    return rates


def batch_read_rates(
    read_batch: Callable[[list[int]], Any], trials: list[list[int]], batch_size: int
) -> list[float]:
    """samples/s of each trial's samples read with ``read_batch``, batch by batch; as in a training loop, the
    previous batch is still alive while the next one is read."""
    rates = []
    for indices in trials:
        start = time.perf_counter()
        kept = None
        for first in range(0, len(indices), batch_size):
            kept = read_batch(indices[first : first + batch_size])
        rates.append(len(indices) / (time.perf_counter() - start))
        del kept
    return rates


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Raw and IO samples/s of every recorded trial, measured in this process."""
    with tempfile.TemporaryDirectory() as run_dir:
        overrides = [
            f"data.root={Path(args.data).resolve()}",
            "loader.num_data_workers=0",
            f"loader.data_loader_config={args.data_loader_config}",
            f"data.read_method={args.read_method}",
            f"log.expdir={run_dir}",
            "log.tensorboard=false",
            f"bench.nwarmup={args.nwarmup}",
            f"bench.ntrials={args.ntrials}",
            f"bench.nbatches={args.nbatches}",
            "bench.report_freq=0",
            "bench.run_synthetic=false",
            "bench.run_full=false",
        ]
        cfg = load_run_config(args.yaml_config, args.config, overrides)
        device = Device.select()
        run = build_training(cfg, Path(run_dir), ProcessInfo(), device, training=False)
        setup = run.setup
        dataset = run.datasets["train"]
        samples_per_trial = args.nbatches * setup.local_batch_size
        trials = trial_indices(setup.train_sampler, args.nwarmup, args.ntrials, samples_per_trial)
        reader = RawReader(dataset)
        for indices in trials:  # warm the page cache with every sample either measurement reads
            for index in indices:
                reader.read(index)
        unnormalized, _ = dataset.device_normalization()  # the same samples, not normalized
        batch = setup.local_batch_size
        raw, raw_two_reads, batch_reads, batch_reads_normalized, io = [], [], [], [], []
        for _ in range(args.rounds):
            # Every IO run starts again at sampler epoch 0: each round reads the same samples all ways.
            recorded = trials[args.nwarmup :]
            raw += raw_rates(reader.read, recorded)
            raw_two_reads += raw_rates(reader.read_twice, recorded)
            batch_reads += batch_read_rates(unnormalized.read_batch, recorded, batch)
            batch_reads_normalized += batch_read_rates(dataset.read_batch, recorded, batch)
            io += run_trials(setup, cfg.bench)["IO"].trial_throughput
        reader.close()
    return {
        "raw": raw,
        "raw_two_reads": raw_two_reads,
        "batch_reads": batch_reads,
        "batch_reads_normalized": batch_reads_normalized,
        "io": io,
        "read_method": dataset.read_method,  # what data.read_method resolved to
        "device": device.name,
        "device_type": device.torch.type,
        "local_batch_size": setup.local_batch_size,
        "samples_per_trial": samples_per_trial,
        "crop": list(dataset.cfg.img_size),
        "channels_in_out": [dataset.cfg.n_in_channels, dataset.cfg.n_out_channels],
    }


def measure_in_fresh_processes(args: argparse.Namespace, argv: list[str]) -> list[dict[str, Any]]:
    """Run ``measure`` in ``args.processes`` new interpreters (same arguments) and collect their results."""
    # The children import dlscale from wherever this process found it (a checkout's src/ or the venv).
    package_root = str(Path(dlscale.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")])}
    results = []
    for _ in range(args.processes):
        child = subprocess.run(
            [sys.executable, __file__, *argv, "--child"], env=env, check=True, capture_output=True, text=True
        )
        results.append(json.loads(child.stdout.strip().splitlines()[-1]))
    return results


def summarize(args: argparse.Namespace, argv: list[str], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One JSON document: each process's means and ratio, and the median ratio over processes."""
    per_process = []
    for run in runs:
        raw_mean, io_mean = float(np.mean(run["raw"])), float(np.mean(run["io"]))
        two_reads_mean = float(np.mean(run["raw_two_reads"]))
        per_process.append(
            {
                "batch_reads_mean": float(np.mean(run["batch_reads"])),
                "batch_reads_normalized_mean": float(np.mean(run["batch_reads_normalized"])),
                "raw_mean": raw_mean,
                "raw_std": float(np.std(run["raw"])),
                "raw_two_reads_mean": two_reads_mean,
                "io_mean": io_mean,
                "io_std": float(np.std(run["io"])),
                "ratio": io_mean / raw_mean,
                "ratio_to_two_reads": io_mean / two_reads_mean,
                "raw_trials": run["raw"],
                "raw_two_reads_trials": run["raw_two_reads"],
                "io_trials": run["io"],
            }
        )
    ratio = statistics.median(p["ratio"] for p in per_process)
    first = runs[0]
    return {
        "benchmark": "io-overhead",
        "ratio_io_over_raw_median": ratio,
        "ratio_io_over_raw_min": min(p["ratio"] for p in per_process),
        "ratio_io_over_raw_max": max(p["ratio"] for p in per_process),
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio >= TARGET_RATIO,
        "processes_meeting_target": sum(p["ratio"] >= TARGET_RATIO for p in per_process),
        "ratio_io_over_raw_two_reads_median": statistics.median(p["ratio_to_two_reads"] for p in per_process),
        "raw_samples_per_s_median": statistics.median(p["raw_mean"] for p in per_process),
        "raw_two_reads_samples_per_s_median": statistics.median(p["raw_two_reads_mean"] for p in per_process),
        "batch_reads_samples_per_s_median": statistics.median(p["batch_reads_mean"] for p in per_process),
        "batch_reads_normalized_samples_per_s_median": statistics.median(
            p["batch_reads_normalized_mean"] for p in per_process
        ),
        "io_samples_per_s_median": statistics.median(p["io_mean"] for p in per_process),
        "per_process": per_process,
        "config": args.config,
        "data_loader_config": args.data_loader_config,
        "read_method": first["read_method"],
        "data": args.data,
        "num_data_workers": 0,
        **{key: first[key] for key in ("crop", "channels_in_out", "local_batch_size", "samples_per_trial")},
        **{key: getattr(args, key) for key in ("nwarmup", "ntrials", "nbatches", "rounds", "processes")},
        "device": first["device"],
        "device_type": first["device_type"],
        "cpu": platform.processor() or platform.machine(),
        "load_average_1min": os.getloadavg()[0],  # other processes on the machine slow both rates
        "torch_version": torch.__version__,
        "h5py_version": h5py.__version__,
        "dlscale_version": dlscale.__version__,
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command_line(sys.argv[0], argv),
    }


def markdown(result: dict[str, Any]) -> str:
    """The result as a short Markdown report."""
    r = result
    verdict = "meets" if r["meets_target"] else "misses"
    rows = "".join(
        f"| {k + 1} | {p['raw_mean']:.1f} ± {p['raw_std']:.1f} | {p['raw_two_reads_mean']:.1f} "
        f"| {p['io_mean']:.1f} ± {p['io_std']:.1f} | {p['ratio']:.3f} | {p['ratio_to_two_reads']:.3f} |\n"
        for k, p in enumerate(r["per_process"])
    )
    header = (
        "| process | raw h5py `fields[t:t+dt+1:dt]` samples/s | raw, two reads (tutorial) samples/s "
        f"| IO trial samples/s (`{r['config']}`, {r['data_loader_config']} loader, {r['read_method']} reads, "
        "0 workers) | IO / raw "
        "| IO / two reads |\n|---:|---:|---:|---:|---:|---:|\n"
    )
    median = (
        f"| **median** | {r['raw_samples_per_s_median']:.1f} | {r['raw_two_reads_samples_per_s_median']:.1f} "
        f"| {r['io_samples_per_s_median']:.1f} | **{r['ratio_io_over_raw_median']:.3f}** "
        f"| {r['ratio_io_over_raw_two_reads_median']:.3f} |\n"
    )
    crop, channels = r["crop"], r["channels_in_out"]

    def us(key: str) -> float:  # microseconds per sample of a median rate
        return 1e6 / r[key]

    breakdown = (
        "Where the time goes (µs per sample, medians over processes): raw read "
        f"{us('raw_samples_per_s_median'):.1f}; `read_batch` without normalization "
        f"{us('batch_reads_samples_per_s_median'):.1f}, with it {us('batch_reads_normalized_samples_per_s_median'):.1f}; "
        f"IO trial (loader and trial loop too) {us('io_samples_per_s_median'):.1f}.\n\n"
    )
    spread_note = ""
    if r["ratio_io_over_raw_min"] < r["target_ratio"] <= r["ratio_io_over_raw_max"]:
        spread_note = (
            " The processes disagree: the loader's rate depends on the process's allocator state (whether "
            "glibc gives each batch's freed memory back to the system and faults it in again for the next)."
        )
    return (
        f"# IO overhead: raw h5py reads vs the IO trial ({r['date']})\n\n{header}{rows}{median}\n"
        f"Median ratio {r['ratio_io_over_raw_median']:.3f} {verdict} the target >= {r['target_ratio']} "
        f"({r['processes_meeting_target']} of {r['processes']} processes meet it; ratios "
        f"{r['ratio_io_over_raw_min']:.3f} to {r['ratio_io_over_raw_max']:.3f}).{spread_note}\n\n{breakdown}"
        f"- Each process: {r['rounds']} rounds of {r['ntrials']} trials of each raw read, of `read_batch` "
        f"without and with normalization, then {r['ntrials']} IO trials "
        f"(after {r['nwarmup']} IO warm-up trial); {r['nbatches']} batches x {r['local_batch_size']} samples "
        f"per trial, crop {crop[0]}x{crop[1]}, {channels[0]}/{channels[1]} channels in/out, "
        f"data `{r['data']}`\n"
        f"- Device: {r['device']} ({r['cpu']}, 1-min load average {r['load_average_1min']:.2f}); "
        f"torch {r['torch_version']}, h5py {r['h5py_version']}, dlscale {r['dlscale_version']}\n"
        f"- Command: `{r['command']}`\n"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.child:
        print(json.dumps(measure(args)))
        return 0
    ensure_data(Path(args.data))
    result = summarize(args, argv, measure_in_fresh_processes(args, argv))
    variant = "".join(
        f"-{value}"
        for value, default in ((args.data_loader_config, "pytorch"), (args.read_method, "auto"))
        if value != default
    )
    stem = f"{result['date'][:10]}-{result['device_type']}-io-overhead{variant}"
    out = Path(args.out)
    write_text_atomically(out / f"{stem}.json", json.dumps(result, indent=2) + "\n")
    write_text_atomically(out / f"{stem}.md", markdown(result))
    print(markdown(result))
    print(f"Wrote {out / stem}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
