"""The tutorials' single-GPU optimization ladder, measured with dlscale's throughput trials.

Each rung is the ViT `short` config (360x720, 20 channels, batch 16) with a set of switches; each runs the
IO, SYNTHETIC and FULL trials of `dlscale bench`. The results go to benchmarks/results/<date>-<device>.json,
.md and .png: samples/s, TFLOP/s, MFU and peak memory per rung, with the device, versions and this command.

    # on a GPU machine (generates the full-grid data set first if it is missing):
    PYTHONPATH=src python3 benchmarks/ladder.py --data /scratch/era5_full
    # on a CPU: the `tiny` config on a tiny data set; rungs that need a GPU are marked skipped
    PYTHONPATH=src python3 benchmarks/ladder.py

Rungs are explicit (each lists every switch it sets), so one can be rerun alone with --rungs NAME,...
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import logging
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from dlscale import __version__
from dlscale.config import load_run_config
from dlscale.data.era5.synth import existing_spec, spec_from_preset, write_synthetic_era5
from dlscale.perf.bench.plot import plotted_interval, throughput_figure
from dlscale.perf.bench.report import TEST_NAMES, TrialSeries
from dlscale.report.figures import save_png
from dlscale.report.run_dir import setup_logging
from dlscale.run.bench import bench_one_config
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.device import Device

REPO = Path(__file__).resolve().parents[1]
CONFIG_FILE = REPO / "configs" / "vit_era5.yaml"
RESULTS = REPO / "benchmarks" / "results"
log = logging.getLogger("dlscale.ladder")

# Every rung sets all of these, so rungs do not depend on each other or on the config's own choices.
OFF = {
    "num_data_workers": "0",
    "data_loader_config": "pytorch",
    "amp_mode": "none",
    "tf32": "on",
    "enable_fused": "false",
    "enable_jit": "false",
    "cuda_graphs": "false",
}


@dataclass(frozen=True)
class Rung:
    name: str
    description: str
    switches: dict[str, str]
    needs_gpu: bool = False

    def overrides(self, workers: int) -> list[str]:
        values = {**OFF, **self.switches}
        if values["num_data_workers"] == "N":
            values["num_data_workers"] = str(workers)
        return [f"{key}={value}" for key, value in values.items()]


RUNGS = (
    Rung("baseline", "PyTorch DataLoader, 0 workers, fp32 (TF32 on)", {}),
    Rung("workers", "+ DataLoader worker processes", {"num_data_workers": "N"}),
    Rung(
        "gpu_pipeline",
        "+ dlscale gpu pipeline (threads, pinned, async copy)",
        {"num_data_workers": "N", "data_loader_config": "gpu"},
    ),
    Rung(
        "amp_fp16",
        "+ AMP fp16 (GradScaler)",
        {"num_data_workers": "N", "data_loader_config": "gpu", "amp_mode": "fp16"},
    ),
    Rung(
        "amp_bf16",
        "+ AMP bf16 instead",
        {"num_data_workers": "N", "data_loader_config": "gpu", "amp_mode": "bf16"},
    ),
    Rung(
        "fused",
        "+ fused Adam",
        {"num_data_workers": "N", "data_loader_config": "gpu", "amp_mode": "bf16", "enable_fused": "true"},
    ),
    Rung(
        "compile",
        "+ torch.compile",
        {
            "num_data_workers": "N",
            "data_loader_config": "gpu",
            "amp_mode": "bf16",
            "enable_fused": "true",
            "enable_jit": "true",
        },
    ),
    Rung(
        "cuda_graphs",
        "CUDA graphs instead of compile (optimizer captured)",
        {
            "num_data_workers": "N",
            "data_loader_config": "gpu",
            "amp_mode": "bf16",
            "enable_fused": "true",
            "cuda_graphs": "true",
        },
        needs_gpu=True,
    ),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data", help="ERA5 data root (default: a full-grid synthetic set on a GPU, tiny on CPU)"
    )
    parser.add_argument(
        "--config", help="config of configs/vit_era5.yaml (default short on a GPU, tiny on CPU)"
    )
    parser.add_argument(
        "--workers", type=int, help="loader workers of the rungs that use them (default 8 / 2)"
    )
    parser.add_argument("--rungs", help="comma-separated rung names (default: all)")
    parser.add_argument("--nwarmup", type=int, default=1)
    parser.add_argument("--ntrials", type=int, default=2)
    parser.add_argument("--nbatches", type=int, help="batches per trial (default 20 on a GPU, 10 on CPU)")
    parser.add_argument("--out", default=str(RESULTS), help="results directory")
    parser.add_argument("--set", action="append", default=[], help="extra config override for every rung")
    return parser.parse_args(argv)


def ensure_data(path: Path, on_gpu: bool) -> Path:
    """A synthetic data set at ``path``: the full 361x720 grid on a GPU, tiny on the CPU.

    The short config reads the first 512 training and 128 validation samples, so 520 six-hourly steps per file
    are enough: two files of about 11 GB each (the GPU machines have a 64 GB disk, so a set larger than GPU
    memory does not fit there; the reads come from the page cache either way). Generating it takes minutes.
    """
    if on_gpu:
        spec = spec_from_preset("full", train_years=1, valid_years=1, test_years=0, steps_per_year=520)
    else:
        spec = spec_from_preset("tiny")
    if existing_spec(path) != spec:
        log.info("Generating the synthetic data set %s (%dx%d) ...", path, spec.height, spec.width)
        write_synthetic_era5(path, spec)
    return path


def run_ladder(args: argparse.Namespace) -> dict:
    device = Device.select()
    on_gpu = device.is_gpu
    config = args.config or ("short" if on_gpu else "tiny")
    workers = args.workers if args.workers is not None else (8 if on_gpu else 2)
    nbatches = args.nbatches or (20 if on_gpu else 10)
    data = Path(args.data or (REPO / "data" / ("era5_ladder" if on_gpu else "era5_ladder_tiny"))).resolve()
    ensure_data(data, on_gpu)
    chosen = set(args.rungs.split(",")) if args.rungs else {r.name for r in RUNGS}
    unknown = chosen - {r.name for r in RUNGS}
    if unknown:
        raise SystemExit(f"unknown rung(s) {sorted(unknown)}; known: {', '.join(r.name for r in RUNGS)}")

    rows = []
    with tempfile.TemporaryDirectory(prefix="dlscale-ladder-") as scratch:
        for rung in RUNGS:
            if rung.name not in chosen:
                continue
            row = {"rung": rung.name, "description": rung.description, "overrides": rung.overrides(workers)}
            if rung.needs_gpu and not on_gpu:
                row["skipped"] = "needs a CUDA GPU"
                rows.append(row)
                log.info("Rung %s skipped: needs a CUDA GPU", rung.name)
                continue
            overrides = [
                f"data.root={data}",
                f"log.expdir={scratch}",
                f"log.run_num={rung.name}",
                "log.progress=none",
                "log.tensorboard=false",
                f"bench.nwarmup={args.nwarmup}",
                f"bench.ntrials={args.ntrials}",
                f"bench.nbatches={nbatches}",
                *row["overrides"],
                *args.set,
            ]
            cfg = load_run_config(CONFIG_FILE, config, overrides)
            log.info("=== Rung %s: %s", rung.name, rung.description)
            results = bench_one_config(cfg, Path(scratch) / f"{rung.name}.json", command=shlex.join(sys.argv))
            record = results.record
            row.update(
                {
                    name: {
                        "mean": series.mean,
                        "std": series.std,
                        "trials": series.trial_throughput,
                        "peak_memory_gb": series.peak_memory_gb,
                        "energy": series.energy,
                    }
                    for name, series in results.tests.items()
                }
            )
            row["utilization"] = results.utilization
            row["verdict"] = results.verdict.to_json()
            row["bench_record"] = record
            rows.append(row)
            del results
            gc.collect()  # the rung's model, optimizer and loader threads go before the next rung builds its own
            device.release_cached_memory()

    return {
        "benchmark": "dlscale optimization ladder",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": "PYTHONPATH=src python3 " + shlex.join(["benchmarks/ladder.py", *sys.argv[1:]]),
        "device": device.name,
        "versions": {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "driver": device.driver_version(),
            "dlscale": __version__,
        },
        "config": config,
        "data": str(data),
        "workers": workers,
        "bench": {"nwarmup": args.nwarmup, "ntrials": args.ntrials, "nbatches": nbatches},
        "rungs": rows,
    }


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(result: dict) -> str:
    lines = [
        f"# dlscale optimization ladder: {result['device']}",
        "",
        f"- date: {result['date']}",
        f"- command: `{result['command']}`",
        f"- torch {result['versions']['torch']}, CUDA {result['versions']['cuda']}, "
        f"driver {result['versions']['driver']}, dlscale {result['versions']['dlscale']}",
        f"- config `{result['config']}` of configs/vit_era5.yaml, data {result['data']}, "
        f"{result['workers']} loader workers where used",
        f"- trials: {result['bench']['nwarmup']} warm-up + {result['bench']['ntrials']} recorded, "
        f"{result['bench']['nbatches']} batches each; global samples/s (mean)",
        "",
        "| rung | what changed | IO | SYNTHETIC | FULL | FULL/SYN | TFLOP/s (FULL) | MFU (FULL) | peak mem GB "
        "| samples/J (FULL) | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in result["rungs"]:
        if "skipped" in row:
            lines.append(f"| {row['rung']} | {row['description']} | skipped: {row['skipped']} ||||||||| |")
            continue
        io, syn, full = (row.get(name, {}).get("mean") for name in ("IO", "SYNTHETIC", "FULL"))
        ratio = full / syn if full and syn else None
        util = row.get("utilization", {}).get("FULL", {})
        mfu = util.get("mfu")
        memory = row.get("FULL", {}).get("peak_memory_gb")
        energy = row.get("FULL", {}).get("energy") or {}
        lines.append(
            f"| {row['rung']} | {row['description']} | {_number(io)} | {_number(syn)} | {_number(full)} | "
            f"{_number(ratio, 2)} | {_number(util.get('tflops_per_gpu'), 2)} | "
            f"{'-' if mfu is None else f'{100 * mfu:.1f}%'} | {_number(memory, 2)} | "
            f"{_number(energy.get('samples_per_joule'), 3)} | {row['verdict']['kind']} |"
        )
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    """One panel per test, a bar per rung, error bars the 95% interval of the trials' mean (the std of the
    trials for a ladder recorded before the trials themselves were kept)."""
    rows = [row for row in result["rungs"] if "skipped" not in row]
    with_trials = all("trials" in row[name] for row in rows for name in TEST_NAMES if name in row)
    results = [
        {name: error_bar(row[name], with_trials) for name in TEST_NAMES if name in row} for row in rows
    ]
    title = f"dlscale ladder, {result['config']} on {result['device']}"
    label = "95% CI" if with_trials else "std of the trials"
    save_png(throughput_figure([row["rung"] for row in rows], results, title, error_label=label), path)


def error_bar(test: dict, with_trials: bool) -> tuple[float, float]:
    """(mean, half-width of the 95% interval, 0 for one trial) of a rung's test; (mean, std) without trials."""
    if not with_trials:
        return test["mean"], test["std"]
    return plotted_interval(TrialSeries("", trial_throughput=test["trials"]))


def merge_rungs(earlier: dict, latest: dict) -> dict:
    """The ladder of an earlier call on the same day and device, with the rungs measured now replaced or added.

    A full ladder at full size takes longer than one batch step or device call allows, so it can be run in
    parts (``--rungs baseline,workers`` then ``--rungs amp_bf16,...``) into one table. Rungs keep the
    ladder's order; each keeps the command that measured it.
    """
    if earlier.get("config") != latest["config"] or earlier.get("device") != latest["device"]:
        raise SystemExit(
            f"cannot merge into the earlier ladder of {earlier.get('config')!r} on {earlier.get('device')!r}; "
            "use another --out"
        )
    for row in latest["rungs"]:
        row["command"] = latest["command"]
    rows = {row["rung"]: row for row in earlier.get("rungs", [])}
    rows.update({row["rung"]: row for row in latest["rungs"]})
    order = [rung.name for rung in RUNGS]
    merged = dict(latest)
    merged["rungs"] = sorted(rows.values(), key=lambda row: order.index(row["rung"]))
    merged["command"] = (
        "several calls, see each rung's command" if len(rows) > len(latest["rungs"]) else latest["command"]
    )
    return merged


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(None, enabled=True)
    result = run_ladder(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device_slug = re.sub(r"[^a-z0-9]+", "-", result["device"].lower()).strip("-")
    stem = out / f"{result['date'][:10]}-{device_slug}-ladder"
    if args.rungs and stem.with_suffix(".json").is_file():
        result = merge_rungs(json.loads(stem.with_suffix(".json").read_text()), result)
    write_text_atomically(stem.with_suffix(".json"), json.dumps(result, indent=2) + "\n")
    write_text_atomically(stem.with_suffix(".md"), markdown(result))
    plot(result, stem.with_suffix(".png"))
    print(markdown(result))
    print(f"Results: {stem}.json, .md, .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
