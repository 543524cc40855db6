"""The tutorials' single-GPU optimization ladder, measured with dlscale's throughput trials.

Each rung is the ViT `short` config (360x720, 20 channels, batch 16) with a set of switches; each runs the
IO, SYNTHETIC and FULL trials of `dlscale bench`. The results go to benchmarks/results/<date>-<device>.json,
.md and .png: samples/s, TFLOP/s, MFU and peak memory per rung, with the device, versions and this command.

    # on a GPU machine (generates the full-grid data set first if it is missing):
    PYTHONPATH=src python3 benchmarks/ladder.py --data /scratch/era5_full
    # on a CPU: the `tiny` config on a tiny data set; rungs that need a GPU are marked skipped
    PYTHONPATH=src python3 benchmarks/ladder.py
    # another workload's config file, on data made beforehand (its `dlscale data synth-*` command)
    PYTHONPATH=src python3 benchmarks/ladder.py --yaml_config configs/unet_cosmo.yaml --config short \
        --data /scratch/cosmo --rungs baseline,fp16_compile

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from ladder_record import peak_memory_gb

from dlscale import __version__
from dlscale.config import load_run_config
from dlscale.data.era5.synth import existing_spec, spec_from_preset, write_synthetic_era5
from dlscale.errors import ConfigError
from dlscale.perf.bench.plot import plotted_interval, throughput_figure
from dlscale.perf.bench.report import TEST_NAMES, TrialSeries
from dlscale.perf.plan.layout_cost import GIB, Layout, TrainingSettings, estimate_memory
from dlscale.perf.plan.layouts import model_shape_of
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
    "compile_mode": "default",
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
        "compile_graphs",
        "+ torch.compile in reduce-overhead mode (compiled kernels replayed as CUDA graphs)",
        {
            "num_data_workers": "N",
            "data_loader_config": "gpu",
            "amp_mode": "bf16",
            "enable_fused": "true",
            "enable_jit": "true",
            "compile_mode": "reduce-overhead",
        },
        needs_gpu=True,
    ),
    # The best rungs of the other workloads' tutorials: the U-Net's short_opt (fp16 AMP, fused Adam, compile, the
    # gpu pipeline in place of DALI), and CUDA graphs for an optimizer without a fused implementation (MNIST's
    # Adadelta).
    Rung(
        "fp16_compile",
        "AMP fp16 + fused Adam + torch.compile (the U-Net tutorial's short_opt)",
        {
            "num_data_workers": "N",
            "data_loader_config": "gpu",
            "amp_mode": "fp16",
            "enable_fused": "true",
            "enable_jit": "true",
        },
    ),
    Rung(
        "bf16_graphs",
        "AMP bf16 + CUDA graphs, optimizer unfused",
        {"num_data_workers": "N", "data_loader_config": "gpu", "amp_mode": "bf16", "cuda_graphs": "true"},
        needs_gpu=True,
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
        "--yaml_config",
        default=str(CONFIG_FILE),
        help="YAML file of named configs (default configs/vit_era5.yaml; another workload's needs --data)",
    )
    parser.add_argument("--config", help="config of the YAML file (default short on a GPU, tiny on CPU)")
    parser.add_argument(
        "--workers", type=int, help="loader workers of the rungs that use them (default 8 / 2)"
    )
    parser.add_argument(
        "--rungs", help="comma-separated rung names, measured in this order (default: all, in ladder order)"
    )
    parser.add_argument(
        "--tests",
        default=",".join(TEST_NAMES),
        help=f"comma-separated tests of every rung (default {','.join(TEST_NAMES)})",
    )
    parser.add_argument("--nwarmup", type=int, default=1)
    parser.add_argument("--ntrials", type=int, default=2)
    parser.add_argument("--nbatches", type=int, help="batches per trial (default 20 on a GPU, 10 on CPU)")
    parser.add_argument("--out", default=str(RESULTS), help="results directory")
    parser.add_argument("--set", action="append", default=[], help="extra config override for every rung")
    return parser.parse_args(argv)


def ensure_data(path: Path, on_gpu: bool, given: bool = False) -> Path:
    """A synthetic data set at ``path``: the full 361x720 grid on a GPU, tiny on the CPU.

    The short config reads the first 512 training and 128 validation samples, so 520 six-hourly steps per file
    are enough: two files of about 11 GB each (the GPU machines have a 64 GB disk, so a set larger than GPU
    memory does not fit there; the reads come from the page cache either way). Generating it takes minutes.
    A ``given`` path (``--data``) that holds a synthetic data set is used as it is, whatever its size (e.g. the
    few hundred steps that benchmarks/gpu_first_light.py writes in seconds).
    """
    if given and existing_spec(path) is not None:
        return path
    if on_gpu:
        spec = spec_from_preset("full", train_years=1, valid_years=1, test_years=0, steps_per_year=520)
    else:
        spec = spec_from_preset("tiny")
    if existing_spec(path) != spec:
        log.info("Generating the synthetic data set %s (%dx%d) ...", path, spec.height, spec.width)
        write_synthetic_era5(path, spec)
    return path


def chosen_rungs(names: str | None) -> list[Rung]:
    """The rungs ``--rungs`` names, in its order (all of them in ladder order when None)."""
    if not names:
        return list(RUNGS)
    by_name = {rung.name: rung for rung in RUNGS}
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in by_name]
    if unknown:
        raise SystemExit(f"unknown rung(s) {unknown}; known: {', '.join(by_name)}")
    return [by_name[name] for name in dict.fromkeys(wanted)]


def chosen_tests(names: str) -> list[str]:
    """The tests ``--tests`` names (IO, SYNTHETIC, FULL; any case)."""
    wanted = [name.strip().upper() for name in names.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in TEST_NAMES]
    if unknown or not wanted:
        raise SystemExit(f"--tests: expected some of {', '.join(TEST_NAMES)}, got {names!r}")
    return wanted


def run_ladder(args: argparse.Namespace, on_rung: Callable[[dict], None] | None = None) -> dict:
    """Measure the chosen rungs; ``on_rung(result so far)`` after each, so a run cut off keeps what it measured."""
    device = Device.select()
    on_gpu = device.is_gpu
    config = args.config or ("short" if on_gpu else "tiny")
    workers = args.workers if args.workers is not None else (8 if on_gpu else 2)
    nbatches = args.nbatches or (20 if on_gpu else 10)
    data = Path(args.data or (REPO / "data" / ("era5_ladder" if on_gpu else "era5_ladder_tiny"))).resolve()
    config_file = Path(args.yaml_config).resolve()
    rungs = chosen_rungs(args.rungs)
    tests = chosen_tests(args.tests)
    if config_file == CONFIG_FILE.resolve():
        ensure_data(data, on_gpu, given=args.data is not None)
    elif args.data is None:
        raise SystemExit(f"--data: {config_file.name} is not the ViT's config file; give its data root")
    test_switches = [f"bench.run_{name.lower()}={str(name in tests).lower()}" for name in TEST_NAMES]

    rows: list[dict] = []
    result = {
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
        "yaml_config": str(
            config_file.relative_to(REPO) if config_file.is_relative_to(REPO) else config_file
        ),
        "data": str(data),
        "workers": workers,
        "bench": {"nwarmup": args.nwarmup, "ntrials": args.ntrials, "nbatches": nbatches, "tests": tests},
        "rungs": rows,
    }
    with tempfile.TemporaryDirectory(prefix="dlscale-ladder-") as scratch:
        for rung in rungs:
            row = {"rung": rung.name, "description": rung.description, "overrides": rung.overrides(workers)}
            if rung.needs_gpu and not on_gpu:
                row["skipped"] = "needs a CUDA GPU"
                rows.append(row)
                log.info("Rung %s skipped: needs a CUDA GPU", rung.name)
                if on_rung is not None:
                    on_rung(result)
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
                *test_switches,
                *row["overrides"],
                *args.set,
            ]
            try:
                cfg = load_run_config(config_file, config, overrides)
            except ConfigError as exc:  # a rung this workload cannot take (Adadelta has no fused version)
                row["skipped"] = f"not for this workload: {exc}"
                rows.append(row)
                log.info("Rung %s skipped: %s", rung.name, exc)
                if on_rung is not None:
                    on_rung(result)
                continue
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
            row["peak_memory_gb"] = peak_memory_gb(row)
            row["plan_gb"] = planned_memory_gb(cfg)
            row["utilization"] = results.utilization
            row["verdict"] = results.verdict.to_json()
            row["bench_record"] = record
            rows.append(row)
            del results
            gc.collect()  # the rung's model, optimizer and loader threads go before the next rung builds its own
            device.release_cached_memory()
            if on_rung is not None:
                on_rung(result)
    return result


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
        f"- config `{result['config']}` of {result.get('yaml_config', 'configs/vit_era5.yaml')}, data {result['data']}, "
        f"{result['workers']} loader workers where used",
        f"- trials: {result['bench']['nwarmup']} warm-up + {result['bench']['ntrials']} recorded, "
        f"{result['bench']['nbatches']} batches each; global samples/s (mean)",
        "",
        "| rung | what changed | IO | SYNTHETIC | FULL | FULL/SYN | TFLOP/s (FULL) | MFU (FULL) | peak mem GB "
        "| plan GB | samples/J (FULL) | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in result["rungs"]:
        if "skipped" in row:
            lines.append(f"| {row['rung']} | {row['description']} | skipped: {row['skipped']} |||||||||| |")
            continue
        io, syn, full = (row.get(name, {}).get("mean") for name in ("IO", "SYNTHETIC", "FULL"))
        ratio = full / syn if full and syn else None
        util = row.get("utilization", {}).get("FULL", {})
        mfu = util.get("mfu")
        memory = peak_memory_gb(row)
        energy = row.get("FULL", {}).get("energy") or {}
        lines.append(
            f"| {row['rung']} | {row['description']} | {_number(io)} | {_number(syn)} | {_number(full)} | "
            f"{_number(ratio, 2)} | {_number(util.get('tflops_per_gpu'), 2)} | "
            f"{'-' if mfu is None else f'{100 * mfu:.1f}%'} | {_number(memory, 2)} | {_number(row.get('plan_gb'), 2)} | "
            f"{_number(energy.get('samples_per_joule'), 3)} | {row['verdict']['kind']} |"
        )
    return "\n".join(lines) + "\n"


def planned_memory_gb(cfg) -> float | None:
    """``dlscale plan``'s estimate of what one GPU's tensors hold for ``cfg`` (its total less the CUDA context
    allowance, which torch's allocator does not count), in GB of 2^30 bytes: the attention ViT's analytic model,
    the traced step of another mixer or workload (as ``dlscale plan`` picks them)."""
    from dlscale.models.vit_config import ViTConfig

    if isinstance(cfg.model, ViTConfig) and cfg.model.mixer == "attention":
        memory = estimate_memory(model_shape_of(cfg), TrainingSettings.from_run_config(cfg), Layout(1, 1, 1))
    else:
        from dlscale.run.config_plan import traced_plan_of

        memory = traced_plan_of(cfg, 1, 80.0).plan.rows[0].memory
        if memory is None:
            return None
    return (memory.total - memory.cuda_allowance) / GIB


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


def results_stem(out: Path, result: dict) -> Path:
    """``<out>/<date>-<device>-ladder`` (``-<config file>-ladder`` for another workload's config file): the .json,
    .md and .png share it."""
    device_slug = re.sub(r"[^a-z0-9]+", "-", result["device"].lower()).strip("-")
    workload = Path(result.get("yaml_config") or CONFIG_FILE).stem
    suffix = "" if workload == CONFIG_FILE.stem else f"-{workload.replace('_', '-')}"
    return out / f"{result['date'][:10]}-{device_slug}{suffix}-ladder"


def write_results(out: Path, result: dict) -> Path:
    """The ladder's .json, .md and .png (the plot once a rung was measured); returns their stem."""
    out.mkdir(parents=True, exist_ok=True)
    stem = results_stem(out, result)
    write_text_atomically(stem.with_suffix(".json"), json.dumps(result, indent=2) + "\n")
    write_text_atomically(stem.with_suffix(".md"), markdown(result))
    if any("skipped" not in row for row in result["rungs"]):
        plot(result, stem.with_suffix(".png"))
    return stem


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(None, enabled=True)
    out = Path(args.out)
    earlier = None
    if args.rungs:  # a part of the ladder: merged into the day's earlier ladder on this device, if any
        today = results_stem(out, {"date": datetime.date.today().isoformat(), "device": Device.select().name})
        if today.with_suffix(".json").is_file():
            earlier = json.loads(today.with_suffix(".json").read_text())
    written: list[Path] = []

    def save(result: dict) -> None:
        # After every rung, so a run cut off (a time limit, a crash) keeps the rungs it measured.
        merged = merge_rungs(earlier, result) if earlier is not None else result
        written[:] = [write_results(out, merged)]

    run_ladder(args, on_rung=save)
    stem = written[0]
    print(stem.with_suffix(".md").read_text())
    print(f"Results: {stem}.json, .md, .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
