"""GPU second light: the tutorial's own code beside dlscale on the same GPU, the other workloads' ladders, and the
attention ceiling, in one budgeted call (the first light's machinery: gpu_first_light.py).

    # the tutorial's code (NERSC/dl-at-scale-training) and the one package it lacks on the GPU image, once,
    # into ignored folders of the checkout that the device call carries (see docs/developing.md):
    git --git-dir=<its mirror> archive HEAD train.py config distributed networks utils | tar -x -C .ref47
    pip download --no-deps --only-binary=:all: ruamel.yaml==0.19.1 -d .whl
    # on the lent GPU machine (results go to $OUT as each part ends):
    PYTHONPATH=src python3 benchmarks/gpu_second_light.py --out "$OUT"
    # the same on a CPU at tiny sizes (the reference's train.py patched to run on a CPU, see CPU_PATCHES):
    PYTHONPATH=src python3 benchmarks/gpu_second_light.py --rehearse --out /tmp/second_light

=========  ====  =========================================================================================
part        box  what
=========  ====  =========================================================================================
env          20  nvidia-smi, versions, NVML, a bf16 GEMM (gpu_first_light.py's part)
data         40  `short`'s synthetic ERA5 (361 x 720, 272 steps per split: 11.3 GB)
ceiling      30  attention_ceiling.py: the model's matrix products and each attention kernel (head dim 48
                 and padded to 64) alone at `short`'s shapes, and the best MFU they allow
reference   400  the tutorial's ``train.py`` and ``dlscale train``, one process each per rung, interleaved, on
                 the same files, batch 16, 8 loader workers, TF32 on: fp32, AMP bf16, AMP bf16 + fused Adam +
                 torch.compile. Each runs 4 epochs: the first is the warm-up, the 3 others are the trials
                 (the tutorial's own "Time taken for epoch" line in both). Then dlscale's best rung alone
                 (its gpu pipeline, compile with CUDA graphs) against the reference's best.
tests        70  the GPU-only tests (``pytest -m gpu``), gpu_first_light.py's part
mixers      180  ladder.py's AMP bf16 and compile-with-CUDA-graphs rungs of `afno_short` and `sfno_short` (the
                 ViT's AFNO and SFNO mixers on the same data), samples/s and MFU beside the ViT's
tune        135  ``dlscale tune`` of `short` in a 2-minute box (skipped with less than that left)
workloads  rest  ladder.py on the U-Net, MNIST and CIFAR configs (``--workloads`` picks some): the fp32
                 baseline and the best rung, SYNTHETIC and FULL, peak memory beside `dlscale plan`
=========  ====  =========================================================================================

``--out`` receives ``second_light.json``, ``second_light.md``, ``second_light.log``, ``reference.png`` and ``models.png``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gpu_first_light as first_light
from gpu_first_light import Part, Session, dlscale, python, read_json

REPO = first_light.REPO
CONFIG_FILE = first_light.CONFIG_FILE
REFERENCE_SOURCE = (
    REPO / ".ref47"
)  # the tutorial's train.py, config, distributed, networks, utils (not committed)
WHEELS = REPO / ".whl"  # ruamel.yaml: the tutorial's YParams reads its YAML with it; the GPU image lacks it
REFERENCE_REPO = "NERSC/dl-at-scale-training"
REFERENCE_COMMIT = "cae476341f13108147df57ebcc5045346adb17f1"
OUT_FILES = ("second_light.json", "second_light.md", "second_light.log", "reference.png", "models.png")
EPOCH_LINE = re.compile(r"Time taken for epoch (\d+) is ([\d.]+) sec, avg ([\d.]+) samples/sec")
PERFORMANCE_LINE = re.compile(
    r"Performance: ([\d.]+) TFLOP/s per \w+, MFU ([\d.]+)%; peak memory ([\d.]+) GB"
)
TARGETS = {"every_rung": 1.0, "best_rung": 1.3, "ceiling_share": 0.85, "workload_speedup": 4.0}

# What the tutorial's code needs to run here, none of it a change to its code: its YAML paths are absolute, so a
# copy of ViT.yaml points them at the synthetic data; its logging filter reads SLURM_PROCID; its fp32 numbers came
# from NGC's container, where cuBLAS uses TF32, which this override asks plain PyTorch for.
REFERENCE_ENV = {
    "SLURM_PROCID": "0",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1",
    "HDF5_USE_FILE_LOCKING": "FALSE",
    "MPLBACKEND": "Agg",
}
# The rehearsal only: the tutorial's train.py asks for CUDA outright, so on a CPU these lines are replaced.
CPU_PATCHES = (
    ("torch.cuda.set_device(local_rank)", "pass"),
    ('torch.device("cuda:%d" % local_rank)', 'torch.device("cpu")'),
    ("torch.cuda.synchronize()", "None"),
    ("torch.cuda.profiler.start()", "None"),
    ("torch.cuda.profiler.stop()", "None"),
    ("torch.cuda.nvtx.range_push(", "str("),
    ("torch.cuda.nvtx.range_pop()", "None"),
)


@dataclass(frozen=True)
class Sizes:
    config: str
    data: tuple[str, ...]
    img_size: tuple[int, int] | None  # the reference's and dlscale's crop (None: the config's 360 x 720)
    steps: int  # per epoch, on the bf16 rungs
    fp32_steps: int  # per epoch, on the fp32 rung (each step is 6x slower)
    epochs: int  # the first is the warm-up
    workers: int
    workloads: tuple[Workload, ...]
    workload_ladder: tuple[str, ...]
    tune: tuple[str, ...]
    mixer_configs: tuple[str, ...] = ("afno_short", "sfno_short")  # the ViT's other mixers (docs/models.md)
    mixer_ladder: tuple[str, ...] = ("--nwarmup", "1", "--ntrials", "3", "--nbatches", "12", "--workers", "8")


@dataclass(frozen=True)
class Workload:
    name: str
    yaml_config: str
    config: str
    data: tuple[str, ...]  # `dlscale data` words that write its synthetic data (--out follows)
    best: str  # its best rung of ladder.py
    settings: tuple[str, ...] = ()  # ladder.py --set for every rung


# The U-Net's tutorial volumes are 1024^3 and 512^3 (40 GiB); crops of 64^3 from 256^3 and 128^3 volumes cost the
# same per sample, and the box is written in 6 s instead of minutes.
COSMO_GPU_BOX = ("synth-cosmo-box", "256", "128")
WORKLOAD_DATA_GPU = (
    Workload(
        "unet", "configs/unet_cosmo.yaml", "short", COSMO_GPU_BOX, "fp16_compile",
        ("data.train_path=train.h5", "data.val_path=valid.h5", "data.box_size=[256, 128]"),
    ),
    Workload("mnist", "configs/cnn_mnist.yaml", "base", ("synth-mnist", "--preset", "demo"), "bf16_graphs"),
    Workload("cifar", "configs/resnet_cifar.yaml", "base", ("synth-cifar", "--preset", "demo"), "cuda_graphs"),
)  # fmt: skip
GPU = Sizes(
    config="short",
    data=("--preset", "full", "--train-years", "1", "--valid-years", "1", "--test-years", "0")
    + ("--steps-per-year", "272", "--workers", "16"),
    img_size=None,
    steps=16,
    fp32_steps=6,
    epochs=4,
    workers=8,
    workloads=WORKLOAD_DATA_GPU,
    workload_ladder=("--nwarmup", "1", "--ntrials", "3", "--nbatches", "10", "--workers", "8"),
    tune=("--nbatches", "12", "--ntrials", "3", "--check_steps", "20"),
)
REHEARSAL = Sizes(
    config="short",
    data=("--preset", "tiny", "--steps-per-year", "40", "--workers", "2"),
    img_size=(16, 32),
    steps=2,
    fp32_steps=2,
    epochs=3,
    workers=2,
    workloads=(
        Workload("unet", "configs/unet_cosmo.yaml", "tiny", ("synth-cosmo-box", "48", "40"), "fp16_compile"),
        Workload(
            "mnist", "configs/cnn_mnist.yaml", "tiny", ("synth-mnist", "--preset", "tiny"), "bf16_graphs"
        ),
    ),
    workload_ladder=("--nwarmup", "1", "--ntrials", "2", "--nbatches", "2", "--workers", "0"),
    tune=("--nbatches", "3", "--ntrials", "2", "--check_steps", "5"),
    mixer_configs=("afno_tiny", "sfno_tiny"),
    mixer_ladder=("--nwarmup", "1", "--ntrials", "2", "--nbatches", "2", "--workers", "0"),
)


@dataclass(frozen=True)
class Rung:
    name: str
    description: str
    reference_flags: tuple[str, ...]  # train.py's own flags
    dlscale_knobs: tuple[str, ...]  # the same switches in dlscale's config
    fp32: bool = False


# Both tools: 8 DataLoader worker processes (PyTorch's loader: the reference's only one without DALI), TF32 on.
SHARED_KNOBS = ("data_loader_config=pytorch", "tf32=on", "cuda_graphs=false", "compile_mode=default")
RUNGS = (
    Rung(
        "fp32", "fp32 (TF32 on)", (), ("amp_mode=none", "enable_fused=false", "enable_jit=false"), fp32=True
    ),
    Rung(
        "bf16", "AMP bf16", ("--amp_mode=bf16",), ("amp_mode=bf16", "enable_fused=false", "enable_jit=false")
    ),
    Rung(
        "bf16_fused_compile",
        "AMP bf16 + fused Adam + torch.compile",
        ("--amp_mode=bf16", "--enable_fused", "--enable_jit"),
        ("amp_mode=bf16", "enable_fused=true", "enable_jit=true"),
    ),
)
# dlscale's best rung on the first light (its gpu pipeline: threads, pinned memory, copies on a side stream;
# compile in reduce-overhead mode), which the reference has no switch for.
DLSCALE_BEST = (
    "data_loader_config=gpu", "tf32=on", "amp_mode=bf16", "enable_fused=true", "enable_jit=true",
    "cuda_graphs=false", "compile_mode=reduce-overhead",
)  # fmt: skip
BEST_NEEDS_S = 60
PROCESS_CAP_S = 170  # one training process at most (a compile that hangs must not take the whole part)
TRIAL_CONFIGS = "# dlscale's second light: trial configs"


class SecondLight(Session):
    NAME = "second_light"
    TITLE = "second light"

    def __init__(self, args: argparse.Namespace):
        super().__init__(args)
        self.sizes = REHEARSAL if args.rehearse else GPU
        self.workload_names = set(args.workloads.split(",")) if args.workloads else set()
        self.report["config"] = self.sizes.config
        self.report["reference"] = {"repository": REFERENCE_REPO, "commit": REFERENCE_COMMIT}

    def markdown(self) -> str:
        return markdown(self.report)

    def draw_plots(self) -> None:
        rows = ((self.report["parts"].get("reference") or {}).get("rungs")) or []
        if any(row.get("ratio") for row in rows):
            reference_figure(self.report, self.out / "reference.png")
        models_figure(self.report, self.out / "models.png")


# ---- the reference beside dlscale -------------------------------------------------------------------------------


def reference_yaml(source: str, data: Path, logs: Path, sizes: Sizes) -> str:
    """The tutorial's ViT.yaml with its absolute paths on ``data`` and ``logs``, and two trial configs (the YAML
    anchors need them in the same file): ``bench`` (the bf16 rungs) and ``bench_fp32``."""
    text = source.replace("'/data/", f"'{data}/").replace("expdir: '/logs'", f"expdir: '{logs}'")
    if f"'{data}/train'" not in text or f"expdir: '{logs}'" not in text:
        raise ValueError("the tutorial's ViT.yaml no longer has the paths this script rewrites")
    crop = f", img_size: [{sizes.img_size[0]}, {sizes.img_size[1]}]" if sizes.img_size else ""
    lines = [text.rstrip("\n"), "", TRIAL_CONFIGS]
    for name, steps in (("bench", sizes.steps), ("bench_fp32", sizes.fp32_steps)):
        lines.append(
            f"{name}: {{<<: *short_ls, limit_nsamples: {16 * steps}, limit_nsamples_val: 16, "
            f"num_iters: {steps * sizes.epochs}{crop}}}"
        )
    return "\n".join(lines) + "\n"


def prepare_reference(s: Session) -> tuple[Path, Path]:
    """A copy of the tutorial's code in the scratch (patched for the CPU in a rehearsal), its trial config, and
    ruamel.yaml unpacked beside it; returns (its directory, the site directory for PYTHONPATH)."""
    if not (REFERENCE_SOURCE / "train.py").is_file():
        raise FileNotFoundError(
            f"{REFERENCE_SOURCE}/train.py: the tutorial's code is not there (see the docstring)"
        )
    ref = s.scratch / "reference"
    shutil.rmtree(ref, ignore_errors=True)
    shutil.copytree(REFERENCE_SOURCE, ref)
    if s.rehearse:
        train = ref / "train.py"
        text = train.read_text()
        for old, new in CPU_PATCHES:
            text = text.replace(old, new)
        train.write_text(text)
    config = reference_yaml(
        (ref / "config" / "ViT.yaml").read_text(), s.data, s.scratch / "reference_logs", s.sizes
    )
    (ref / "config" / "bench.yaml").write_text(config)
    site = s.scratch / "reference_site"
    shutil.rmtree(site, ignore_errors=True)
    wheels = sorted(WHEELS.glob("ruamel*yaml*.whl"))
    if not wheels:
        raise FileNotFoundError(f"{WHEELS}: no ruamel.yaml wheel (see the docstring)")
    with zipfile.ZipFile(wheels[-1]) as wheel:  # a pure-Python wheel: unpacking it is installing it
        wheel.extractall(site)
    return ref, site


def epoch_trials(output: Sequence[str]) -> dict[str, Any]:
    """samples/s of every epoch after the first (the warm-up), and dlscale's MFU and peak memory lines of them."""
    epochs = {int(m[1]): float(m[3]) for m in map(EPOCH_LINE.search, output) if m}
    performance = [
        (float(m[1]), float(m[2]) / 100, float(m[3])) for m in map(PERFORMANCE_LINE.search, output) if m
    ]
    trials = [speed for epoch, speed in sorted(epochs.items()) if epoch > 1]
    found: dict[str, Any] = {"epochs": epochs, "trials": trials}
    if len(performance) > 1:
        found["tflops"] = sum(p[0] for p in performance[1:]) / len(performance[1:])
        found["mfu"] = sum(p[1] for p in performance[1:]) / len(performance[1:])
        found["peak_memory_gb"] = max(p[2] for p in performance)
    return found


def summarize(trials: Sequence[float]) -> dict[str, Any] | None:
    from dlscale.perf.bench.intervals import mean_interval

    if not trials:
        return None
    found = mean_interval(trials)
    return {"mean": found.mean, "low": found.low, "high": found.high, "trials": list(trials)}


def compare(dlscale_trials: Sequence[float], reference_trials: Sequence[float]) -> dict[str, float] | None:
    from dlscale.perf.bench.intervals import ratio_interval

    if not dlscale_trials or not reference_trials:
        return None
    found = ratio_interval(dlscale_trials, reference_trials)
    return {"ratio": found.ratio, "low": found.low, "high": found.high}


def reference_command(ref: Path, rung: Rung, s: Session, run_num: str) -> list[str]:
    config = "bench_fp32" if rung.fp32 else "bench"
    return python(
        ref / "train.py", f"--yaml_config={ref / 'config' / 'bench.yaml'}", f"--config={config}",
        f"--run_num={run_num}", "--data_loader_config=pytorch", f"--num_data_workers={s.sizes.workers}",
        *rung.reference_flags,
    )  # fmt: skip


def dlscale_command(s: Session, knobs: Sequence[str], steps: int, run_num: str) -> list[str]:
    crop = [f"data.img_size=[{s.sizes.img_size[0]}, {s.sizes.img_size[1]}]"] if s.sizes.img_size else []
    settings = [
        f"data.root={s.data}", f"data.limit_nsamples={16 * steps}", "data.limit_nsamples_val=16", *crop,
        "train.global_batch_size=16", f"train.num_epochs={s.sizes.epochs}", f"num_data_workers={s.sizes.workers}",
        f"log.expdir={s.scratch / 'dlscale_runs'}", "log.progress=lines", *knobs,
        "checkpoint.enabled=false",  # the reference writes none (dlscale's are written outside the timed epochs)
    ]  # fmt: skip
    return dlscale(
        "train", "--yaml_config", CONFIG_FILE, "--config", s.sizes.config, "--run_num", run_num,
        *[word for setting in settings for word in ("--set", setting)],
    )  # fmt: skip


def run_reference_process(s: Session, ref: Path, site: Path, rung: Rung, deadline: float) -> dict[str, Any]:
    argv = reference_command(ref, rung, s, rung.name)
    # PYTHONPATH: ruamel.yaml only (dlscale's src is not on the reference's path)
    extra = {**REFERENCE_ENV, "PYTHONPATH": str(site)}
    deadline = min(deadline, time.monotonic() + PROCESS_CAP_S)
    result = s.command(f"reference {rung.name}", argv, deadline, cwd=ref, extra_env=extra)
    return {
        "returncode": result.returncode,
        "seconds": round(result.seconds, 1),
        **epoch_trials(result.output),
    }


def run_dlscale_process(
    s: Session, label: str, knobs: Sequence[str], steps: int, deadline: float
) -> dict[str, Any]:
    argv = dlscale_command(s, knobs, steps, label)
    result = s.command(f"dlscale {label}", argv, min(deadline, time.monotonic() + PROCESS_CAP_S))
    return {
        "returncode": result.returncode,
        "seconds": round(result.seconds, 1),
        **epoch_trials(result.output),
    }


def part_reference(s: Session, deadline: float) -> dict[str, Any]:
    ref, site = prepare_reference(s)
    rows: list[dict[str, Any]] = []
    found: dict[str, Any] = {
        "reference": {
            "repository": REFERENCE_REPO,
            "commit": REFERENCE_COMMIT,
            "environment": REFERENCE_ENV,
            "code_patches": list(CPU_PATCHES) if s.rehearse else [],
            # config/ViT.yaml copied with its data and log paths on this machine's, plus these trial configs
            "config": (ref / "config" / "bench.yaml").read_text().split(TRIAL_CONFIGS)[-1],
        },
        "epochs": s.sizes.epochs,
        "workers": s.sizes.workers,
        "rungs": rows,
    }
    for index, rung in enumerate(RUNGS):
        steps = s.sizes.fp32_steps if rung.fp32 else s.sizes.steps
        row: dict[str, Any] = {"rung": rung.name, "description": rung.description, "steps_per_epoch": steps}
        rows.append(row)
        # interleaved: the reference first on even rungs, dlscale first on odd ones
        order = ("reference", "dlscale") if index % 2 == 0 else ("dlscale", "reference")
        for tool in order:
            if tool == "reference":
                row["reference"] = run_reference_process(s, ref, site, rung, deadline)
            else:
                row["dlscale"] = run_dlscale_process(
                    s, rung.name, (*SHARED_KNOBS, *rung.dlscale_knobs), steps, deadline
                )
        finish_row(row)
        s.report["parts"]["reference"] = found  # written after every rung: a call cut short keeps it
        s.write()
    if deadline - time.monotonic() > BEST_NEEDS_S:
        best = run_dlscale_process(s, "dlscale_best", DLSCALE_BEST, s.sizes.steps, deadline)
        reference_best = rows[-1].get("reference") or {}
        found["dlscale_best"] = {
            "knobs": list(DLSCALE_BEST),
            **best,
            "summary": summarize(best.get("trials") or []),
            "ratio_to_reference_best": compare(best.get("trials") or [], reference_best.get("trials") or []),
        }
    else:
        found["dlscale_best"] = {"skipped": f"under {BEST_NEEDS_S} s of the part's box left"}
    return found


def finish_row(row: dict[str, Any]) -> None:
    for tool in ("reference", "dlscale"):
        if tool in row:
            row[tool]["summary"] = summarize(row[tool].get("trials") or [])
    row["ratio"] = compare(
        (row.get("dlscale") or {}).get("trials") or [], (row.get("reference") or {}).get("trials") or []
    )


# ---- the ceiling, the other workloads, tune -----------------------------------------------------------------------


def part_ceiling(s: Session, deadline: float) -> dict[str, Any]:
    out = s.scratch / "ceiling"
    shutil.rmtree(out, ignore_errors=True)
    rehearse = ["--rehearse", "--trials", "2", "--repeats", "1"] if s.rehearse else []
    s.command(
        "attention ceiling",
        python(REPO / "benchmarks" / "attention_ceiling.py", "--out", out, *rehearse),
        deadline,
    )
    found = sorted(out.glob("*-attention-ceiling.json"))
    return {"record": read_json(found[-1]) if found else None}


def part_workloads(s: Session, deadline: float) -> dict[str, Any]:
    found: dict[str, Any] = {}
    chosen = [work for work in s.sizes.workloads if not s.workload_names or work.name in s.workload_names]
    count = len(chosen)
    for index, work in enumerate(chosen):
        name = work.name
        box = time.monotonic() + (deadline - time.monotonic()) / (
            count - index
        )  # an equal share of what is left
        data = s.scratch / f"data_{name}"
        if work.data[0] == "synth-cosmo-box":
            writer = python(__file__, "--cosmo-box", data, *work.data[1:])
        else:
            writer = dlscale("data", *work.data, "--out", data, "--if-missing")
        made = s.command(f"{name} data", writer, box)
        if not made.ok:
            found[name] = {"status": "no data"}
            continue
        out = s.scratch / f"ladder_{name}"
        shutil.rmtree(out, ignore_errors=True)
        argv = python(
            REPO / "benchmarks" / "ladder.py", "--yaml_config", REPO / work.yaml_config, "--config", work.config,
            "--data", data, "--rungs", f"baseline,{work.best}", "--tests", "SYNTHETIC,FULL", "--out", out,
            *s.sizes.workload_ladder, *[w for setting in work.settings for w in ("--set", setting)],
        )  # fmt: skip
        s.command(f"{name} ladder", argv, box)
        records = sorted(out.glob("*-ladder.json"))
        found[name] = {"yaml_config": work.yaml_config, "config": work.config, "best": work.best}
        found[name]["ladder"] = read_json(records[-1]) if records else None
        s.report["parts"]["workloads"] = {"by_workload": found}  # a call cut short keeps what was measured
        s.write()
    return {"by_workload": found}


# The mixers' rungs: AMP bf16 with the gpu pipeline, and the ViT's best rung (compile with CUDA graphs).
MIXER_RUNGS = "amp_bf16,compile_graphs"


def part_mixers(s: Session, deadline: float) -> dict[str, Any]:
    """ladder.py's bf16 and best rungs for the AFNO and SFNO models of `short`'s grid, on the same data, for
    their samples/s and MFU next to the attention ViT's (the reference part's best rung)."""
    found: dict[str, Any] = {}
    configs = s.sizes.mixer_configs
    for index, config in enumerate(configs):
        box = time.monotonic() + (deadline - time.monotonic()) / (len(configs) - index)
        out = s.scratch / f"ladder_{config}"
        shutil.rmtree(out, ignore_errors=True)
        argv = python(
            REPO / "benchmarks" / "ladder.py", "--data", s.data, "--config", config, "--rungs", MIXER_RUNGS,
            "--tests", "SYNTHETIC,FULL", "--out", out, *s.sizes.mixer_ladder,
        )  # fmt: skip
        s.command(f"{config} ladder", argv, box)
        records = sorted(out.glob("*-ladder.json"))
        found[config] = {"ladder": read_json(records[-1]) if records else None}
        s.report["parts"]["mixers"] = {"by_config": found}  # a call cut short keeps what was measured
        s.write()
    return {"by_config": found}


TUNE_BOX_S = 120


def part_tune(s: Session, deadline: float) -> dict[str, Any]:
    out = s.scratch / "tune"
    shutil.rmtree(out, ignore_errors=True)
    minutes = min(TUNE_BOX_S, deadline - time.monotonic() - 10) / 60
    crop = [f"data.img_size=[{s.sizes.img_size[0]}, {s.sizes.img_size[1]}]"] if s.sizes.img_size else []
    knobs = (f"num_data_workers={s.sizes.workers}", *DLSCALE_BEST, *crop)
    argv = dlscale(
        "tune", "--yaml_config", CONFIG_FILE, "--config", s.sizes.config, "--set", f"data.root={s.data}",
        "--set", f"log.expdir={s.scratch / 'tune_runs'}", *[w for k in knobs for w in ("--set", k)],
        *s.sizes.tune, "--budget", f"{minutes:.2f}", "--out", out / "tuned.yaml",
    )  # fmt: skip
    result = s.command("tune", argv, deadline)
    return {
        "budget_minutes": round(minutes, 2),
        "seconds": round(result.seconds, 1),
        "finished_in_box": result.ok,
        "record": read_json(out / "tuned.json"),
    }


PARTS = (
    Part("env", 20, first_light.part_env),
    Part("data", 40, first_light.part_data),
    Part("ceiling", 30, part_ceiling),
    Part("reference", 400, part_reference, needs_data=True, min_s=60),
    Part("tests", 70, first_light.part_tests),
    Part("mixers", 180, part_mixers, needs_data=True, min_s=60),
    # tune's box is fixed, so it runs before the part that takes the rest of the budget
    Part("tune", TUNE_BOX_S + 15, part_tune, needs_data=True, min_s=TUNE_BOX_S + 10),
    Part("workloads", float("inf"), part_workloads, min_s=45),
)


# ---- the report ---------------------------------------------------------------------------------------------------


def _interval(summary: dict | None) -> str:
    if not summary:
        return "-"
    return f"{summary['mean']:.1f} ({summary['low']:.1f}-{summary['high']:.1f})"


def _ratio(ratio: dict | None) -> str:
    if not ratio:
        return "-"
    return f"{ratio['ratio']:.2f}x ({ratio['low']:.2f}-{ratio['high']:.2f})"


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    parts = report["parts"]
    reference = parts.get("reference") or {}
    rows = reference.get("rungs") or []
    out = []
    measured = [row for row in rows if row.get("ratio")]
    if measured:
        worst = min(measured, key=lambda row: row["ratio"]["low"])
        out.append(
            {
                "target": "dlscale against the reference on every rung it offers",
                "wanted": ">= 1.0x, interval clear of 1.0",
                "measured": "; ".join(f"{row['rung']} {_ratio(row['ratio'])}" for row in measured),
                "met": all(row["ratio"]["low"] > TARGETS["every_rung"] for row in measured)
                and len(measured) == len(RUNGS),
                "worst": worst["rung"],
            }
        )
    best = reference.get("dlscale_best") or {}
    like = next((row for row in rows if row["rung"] == RUNGS[-1].name and row.get("ratio")), None)
    candidates = [(f"{RUNGS[-1].name} (same switches)", like["ratio"])] if like else []
    if best.get("ratio_to_reference_best"):
        candidates.append(
            ("dlscale's best (gpu pipeline, compile + CUDA graphs)", best["ratio_to_reference_best"])
        )
    if candidates:
        name, ratio = max(candidates, key=lambda c: c[1]["ratio"])
        out.append(
            {
                "target": "dlscale's best against the reference's best rung",
                "wanted": ">= 1.3x, interval clear of 1.0",
                "measured": f"{name}: {_ratio(ratio)}",
                "met": ratio["ratio"] >= TARGETS["best_rung"] and ratio["low"] > 1.0,
            }
        )
    ceiling = ((parts.get("ceiling") or {}).get("record") or {}).get("ceilings") or []
    default = next((row for row in ceiling if row["backend"] == "cudnn" and row["head_dim"] % 64), None)
    best_mfu = max(
        [m for m in ((best.get("mfu"),) + tuple((row.get("dlscale") or {}).get("mfu") for row in rows)) if m],
        default=None,
    )
    if default and default.get("mfu") and best_mfu:
        share = best_mfu / default["mfu"]
        out.append(
            {
                "target": "the ViT's best rung against its MFU ceiling (cuDNN attention, the kernel it runs)",
                "wanted": ">= 85%",
                "measured": f"MFU {100 * best_mfu:.1f}% of a {100 * default['mfu']:.1f}% ceiling: {100 * share:.0f}%",
                "met": share >= TARGETS["ceiling_share"],
            }
        )
    for name, record in ((parts.get("workloads") or {}).get("by_workload") or {}).items():
        ladder = (record or {}).get("ladder") or {}
        by_rung = {row["rung"]: row for row in ladder.get("rungs", []) if "skipped" not in row}
        base = by_rung.get("baseline")
        top, partial = by_rung.get(record.get("best")), None
        if not top and record.get("partial_best"):
            top = partial = record["partial_best"]  # the trials it finished before the call's timeout
        if not base or not top:
            continue
        speed = (top.get("FULL") or {}).get("mean", 0) / max(
            (base.get("FULL") or {}).get("mean") or 1e-9, 1e-9
        )
        full_syn = (top.get("FULL") or {}).get("mean", 0) / max(
            (top.get("SYNTHETIC") or {}).get("mean") or 1e-9, 1e-9
        )
        peak, plan = top.get("peak_memory_gb"), top.get("plan_gb")
        plan_error = (plan - peak) / peak if peak and plan else None
        plan_text = "-" if plan_error is None else f"{plan:.2f} vs {peak:.2f} GB ({100 * plan_error:+.0f}%)"
        if partial:
            finished = ", ".join(
                f"{len(partial[t]['trials'])} {t}" for t in ("SYNTHETIC", "FULL") if partial.get(t)
            )
            plan_text += f" (best rung cut short: {finished} trials)"
        out.append(
            {
                "target": f"{name}: best rung {record.get('best')} over the fp32 baseline; FULL/SYNTHETIC; plan",
                "wanted": ">= 4x; >= 0.95; within 15%",
                "measured": f"{speed:.2f}x; {full_syn:.2f}; {plan_text}",
                "met": speed >= 4 and full_syn >= 0.95 and plan_error is not None and abs(plan_error) <= 0.15,
            }
        )
    tune = parts.get("tune") or {}
    if tune.get("budget_minutes"):
        found = tune.get("record") or {}
        out.append(
            {
                "target": "tune finishes inside its box",
                "wanted": f"<= {tune['budget_minutes']} min",
                "measured": f"{tune.get('seconds')} s; {len(found.get('trials') or [])} trials after its start; "
                f"stopped: {found.get('stop_reason', '-')}",
                "met": bool(tune.get("finished_in_box")),
            }
        )
    return out


def mixer_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each forecast model's fastest rung beside the attention ViT's, FULL samples/s on the same data and GPU:
    the ViT from tune's measurement of its best rung (the same bench trials as ladder.py's) and from the
    reference part's training epochs."""
    parts = report["parts"]
    rows = []
    start = ((((parts.get("tune") or {}).get("record") or {}).get("path")) or [{}])[0].get("full")
    if start:
        rows.append({"model": "attention ViT (`short`)", "rung": "compile_graphs, via tune", "full": start})
    best = (parts.get("reference") or {}).get("dlscale_best") or {}
    if best.get("summary"):
        rows.append(
            {"model": "attention ViT (`short`)", "rung": "compile_graphs, training epochs", "full": best["summary"],
             "mfu": best.get("mfu"), "peak_memory_gb": best.get("peak_memory_gb")}
        )  # fmt: skip
    for name, record in ((parts.get("mixers") or {}).get("by_config") or {}).items():
        ladder = (record or {}).get("ladder") or {}
        measured = [row for row in ladder.get("rungs", []) if (row.get("FULL") or {}).get("mean")]
        if not measured:
            continue
        top = max(measured, key=lambda row: row["FULL"]["mean"])
        rows.append(
            {"model": name, "rung": top["rung"], "full": summarize(top["FULL"]["trials"]),
             "mfu": ((top.get("utilization") or {}).get("FULL") or {}).get("mfu"),
             "peak_memory_gb": top.get("peak_memory_gb")}
        )  # fmt: skip
    return rows


def markdown(report: dict[str, Any]) -> str:
    parts = report["parts"]
    env = parts.get("env") or {}
    lines = [
        f"# dlscale GPU second light: {env.get('device', 'no device')}",
        "",
        f"- date: {report['date']}; budget {report['budget_s']} s, used {report.get('elapsed_s', 0)} s",
        f"- command: `{report['command']}`",
        f"- device: {env.get('device')}; driver {env.get('driver')}; torch {env.get('torch')}, CUDA {env.get('cuda')}, "
        f"cuDNN {env.get('cudnn')}",
        f"- reference: {REFERENCE_REPO} at `{REFERENCE_COMMIT[:12]}` (its train.py, unmodified on the GPU)",
    ]
    gemm = env.get("gemm_bf16")
    if gemm:
        lines.append(
            f"- bf16 GEMM {gemm['size']}^3: {gemm['mean_tflops']:.0f} TFLOP/s mean, {gemm['best_tflops']:.0f} best"
        )
    for number, call in enumerate(report.get("calls") or [], 1):
        lines.append(f"- call {number}: {call['date']}, {call['elapsed_s']} s: `{call['command']}`")
    lines += ["", "## Parts", "", "| part | call | status | seconds | note |", "|---|---|---|---:|---|"]
    for name, record in parts.items():
        note = record.get("reason") or ("error: see the JSON" if "error" in record else "")
        lines.append(
            f"| {name} | {record.get('call', 1)} | {record.get('status')} | {record.get('seconds', '-')} | {note} |"
        )
    if report.get("notes"):
        lines += ["", "## Notes", ""] + [
            f"{number}. {note}" for number, note in enumerate(report["notes"], 1)
        ]
    lines += ["", "## Targets", "", "| target | wanted | measured | met |", "|---|---|---|---|"]
    for row in targets(report):
        lines.append(
            f"| {row['target']} | {row['wanted']} | {row['measured']} | {'yes' if row['met'] else '**no**'} |"
        )
    if parts.get("tests"):
        lines += first_light._tests_section(parts["tests"])
    reference = parts.get("reference") or {}
    if reference.get("rungs"):
        lines += [
            "",
            "## The tutorial's train.py beside dlscale train",
            "",
            f"Same synthetic files, batch 16, {reference.get('workers')} DataLoader workers, TF32 on; {reference.get('epochs')} "
            "epochs per process, the first a warm-up, the others the trials; samples/s from each tool's own "
            "'Time taken for epoch' line, mean (95% CI); the ratio is dlscale's over the reference's (95% CI).",
            "",
            "| rung | steps/epoch | reference | dlscale | dlscale / reference | dlscale MFU | dlscale peak GB |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for row in reference["rungs"]:
            ref, dls = row.get("reference") or {}, row.get("dlscale") or {}
            mfu = dls.get("mfu")
            lines.append(
                f"| {row['description']} | {row['steps_per_epoch']} | {_interval(ref.get('summary'))} | "
                f"{_interval(dls.get('summary'))} | {_ratio(row.get('ratio'))} | "
                f"{'-' if mfu is None else f'{100 * mfu:.1f}%'} | {dls.get('peak_memory_gb', '-')} |"
            )
        best = reference.get("dlscale_best") or {}
        if best.get("summary"):
            best_mfu = "-" if best.get("mfu") is None else f"{100 * best['mfu']:.1f}%"
            lines.append(
                f"| dlscale's best: gpu pipeline, compile + CUDA graphs | {reference['rungs'][-1]['steps_per_epoch']} "
                f"| (its best rung above) | {_interval(best['summary'])} | {_ratio(best.get('ratio_to_reference_best'))} "
                f"| {best_mfu} | {best.get('peak_memory_gb', '-')} |"
            )
        lines += [
            "",
            "The reference's trial configs, appended to a copy of its config/ViT.yaml:",
            "",
            "```yaml",
        ]
        lines += [reference["reference"]["config"].strip(), "```", ""]
        lines.append(
            "Environment for the reference: "
            + ", ".join(f"`{k}={v}`" for k, v in reference["reference"]["environment"].items())
        )
    ceiling = (parts.get("ceiling") or {}).get("record")
    if ceiling:
        from attention_ceiling import markdown as ceiling_markdown

        lines += ["", ceiling_markdown(ceiling).replace("# ", "## ", 1)]
    beside = mixer_rows(report)
    if len(beside) > 1:
        lines += [
            "",
            "## The forecast models beside the ViT",
            "",
            "FULL samples/s, mean (95% CI), on the same synthetic `short` files and GPU; MFU counts each model's "
            "own FLOPs (AFNO's and SFNO's mixing is FFTs, far fewer FLOPs than attention).",
            "",
            "| model | fastest rung | FULL samples/s | MFU | peak GB |",
            "|---|---|---:|---:|---:|",
        ]
        for row in beside:
            mfu, peak = row.get("mfu"), row.get("peak_memory_gb")
            lines.append(
                f"| {row['model']} | {row['rung']} | {_interval(row['full'])} | "
                f"{'-' if mfu is None else f'{100 * mfu:.1f}%'} | {'-' if peak is None else f'{peak:.2f}'} |"
            )
    for name, record in ((parts.get("workloads") or {}).get("by_workload") or {}).items():
        partial = (record or {}).get("partial_best")
        if partial:
            lines += [
                "",
                f"## {name}: best rung {partial['rung']} cut short by call {partial.get('call')}'s timeout",
                "",
                "Trials it finished (warm-ups excluded): "
                + "; ".join(
                    f"{test} {_interval(partial[test])} samples/s over {len(partial[test]['trials'])} trials"
                    for test in ("SYNTHETIC", "FULL")
                    if partial.get(test)
                ),
            ]
    mixer_ladders = ((parts.get("mixers") or {}).get("by_config") or {}).items()
    workload_ladders = ((parts.get("workloads") or {}).get("by_workload") or {}).items()
    for name, record in [*mixer_ladders, *workload_ladders]:
        ladder = (record or {}).get("ladder")
        if ladder:
            from ladder import markdown as ladder_markdown

            lines += ["", ladder_markdown(ladder).replace("# ", f"## {name}: ", 1)]
    tune = parts.get("tune") or {}
    if tune.get("budget_minutes"):
        lines += [
            "",
            "## tune",
            "",
            f"- box {tune['budget_minutes']} min; took {tune.get('seconds')} s; finished: {tune.get('finished_in_box')}",
        ]
        table = (tune.get("record") or {}).get("table")
        if table:
            lines += ["", *table]
    return "\n".join(lines) + "\n"


def reference_figure(report: dict[str, Any], path: Path) -> None:
    """Samples/s of both tools per rung, with the trials' 95% intervals."""
    import matplotlib

    from dlscale.report.figures import save_png

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    reference = report["parts"]["reference"]
    rows = [row for row in reference["rungs"] if row.get("ratio")]
    labels = [row["rung"] for row in rows]
    figure = Figure(figsize=(7, 4))
    axes = figure.add_subplot()
    for offset, tool, colour in ((-0.2, "reference", "tab:gray"), (0.2, "dlscale", "tab:blue")):
        means = [row[tool]["summary"]["mean"] for row in rows]
        errors = [row[tool]["summary"]["mean"] - row[tool]["summary"]["low"] for row in rows]
        axes.bar([i + offset for i in range(len(rows))], means, 0.4, yerr=errors, capsize=4, color=colour,
                 label="NERSC tutorial train.py" if tool == "reference" else "dlscale train")  # fmt: skip
    best = reference.get("dlscale_best") or {}
    if best.get("summary"):
        error = best["summary"]["mean"] - best["summary"]["low"]
        axes.bar([len(rows)], [best["summary"]["mean"]], 0.4, yerr=[error], capsize=4, color="tab:green",
                 label="dlscale's best rung (its gpu pipeline)")  # fmt: skip
        labels.append("dlscale best")
    axes.set_xticks(range(len(labels)), labels)
    axes.set_ylabel("samples/s (95% CI)")
    axes.set_xlabel("rungs of the tutorial: PyTorch DataLoader, 8 workers, in both tools")
    device = (report["parts"].get("env") or {}).get("device", "")
    axes.set_title(f"ViT `short`, batch 16, on {device}")
    axes.legend()
    save_png(figure, path)


def models_figure(report: dict[str, Any], path: Path) -> bool:
    """The forecast models' samples/s beside the ViT's, and each workload's best rung over its fp32 baseline
    (SYNTHETIC and FULL) against the 4x target. False when there is nothing to draw."""
    import matplotlib

    from dlscale.report.figures import save_png

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    beside = mixer_rows(report)
    speedups = []
    for name, record in ((report["parts"].get("workloads") or {}).get("by_workload") or {}).items():
        rungs = {row["rung"]: row for row in ((record or {}).get("ladder") or {}).get("rungs", [])}
        base, top = rungs.get("baseline"), rungs.get(record.get("best")) or record.get("partial_best")
        if base and top:
            ratios = [
                (top.get(t) or {}).get("mean", 0) / base[t]["mean"] if (base.get(t) or {}).get("mean") else 0
                for t in ("SYNTHETIC", "FULL")
            ]
            speedups.append((f"{name}\n{record.get('best')}", ratios))
    if len(beside) < 2 and not speedups:
        return False
    figure = Figure(figsize=(11, 4.2))
    left, right = figure.subplots(1, 2)
    labels = [
        f"{'ViT' if row['model'].startswith('attention') else row['model']}\n{row['rung'].replace(', ', chr(10))}"
        for row in beside
    ]
    means = [row["full"]["mean"] for row in beside]
    errors = [row["full"]["mean"] - row["full"]["low"] for row in beside]
    colours = ["tab:blue" if row["model"].startswith("attention") else "tab:orange" for row in beside]
    left.bar(range(len(beside)), means, 0.6, yerr=errors, capsize=4, color=colours)
    left.set_xticks(range(len(beside)), labels, fontsize=8)
    left.set_ylabel("FULL samples/s (95% CI)")
    left.set_title("forecast models at `short`'s shape, fastest rung")
    for offset, index, colour, label in ((-0.2, 0, "tab:gray", "SYNTHETIC"), (0.2, 1, "tab:green", "FULL")):
        right.bar([i + offset for i in range(len(speedups))], [r[index] for _, r in speedups], 0.4, color=colour,
                  label=label)  # fmt: skip
    right.axhline(4.0, color="tab:red", linestyle="--", label="target 4x")
    right.set_xticks(range(len(speedups)), [name for name, _ in speedups], fontsize=8)
    right.set_ylabel("best rung / fp32 baseline")
    right.set_title("the other workloads: best rung over fp32")
    right.legend(fontsize=8)
    device = (report["parts"].get("env") or {}).get("device", "")
    figure.suptitle(f"dlscale on {device}")
    figure.subplots_adjust(bottom=0.2)  # three-line tick labels
    save_png(figure, path)
    return True


# The parts whose entries (one ladder per config or workload) are merged entry by entry across calls.
LADDER_PARTS = {"mixers": "by_config", "workloads": "by_workload"}
BENCH_TRIAL_LINE = re.compile(r"BENCHY::(SYNTHETIC|FULL)_(\d+)::Trial Throughput: ([0-9.eE+-]+)")
BENCH_RUNG_LINE = re.compile(r"Overrides: .*\blog\.run_num=(\S+)")


def partial_rung(output: Sequence[str], rung: str) -> dict[str, Any] | None:
    """The trials a ladder's rung finished before its process was stopped, from the bench's own lines (warm-ups
    excluded): what a call that ran out of time still measured. None when the rung did not start."""
    current, trials = None, {"SYNTHETIC": [], "FULL": []}
    for line in output:
        started = BENCH_RUNG_LINE.search(line)
        if started:
            current = started[1]
        found = BENCH_TRIAL_LINE.search(line)
        if found and current == rung:
            trials[found[1]].append(float(found[3]))
    if not any(trials.values()):
        return None
    return {"rung": rung, **{test: summarize(values) for test, values in trials.items() if values}}


def ladders_in(folder: Path) -> dict[str, dict[str, Any]]:
    """``ladder_<name>/*-ladder.json`` records a call wrote into its results folder, by name."""
    found = {}
    for path in sorted(folder.glob("ladder_*/*-ladder.json")):
        found[path.parent.name.removeprefix("ladder_")] = read_json(path)
    return found


def call_record(source: Path, command: str, seconds: float | None = None) -> dict[str, Any]:
    """One call's record: its second_light.json, or, for a call that ran ladder.py directly into its results
    folder, a record of those ladders (the mixers' configs under mixers, the workloads under workloads)."""
    if source.is_file():
        return json.loads(source.read_text())
    record_file = source / "second_light.json"
    record = (
        json.loads(record_file.read_text())
        if record_file.is_file()
        else {"date": None, "command": command, "elapsed_s": seconds, "parts": {}}
    )
    workloads = {work.name: work for work in WORKLOAD_DATA_GPU}
    for name, ladder in ladders_in(source).items():
        record["date"] = record["date"] or ladder.get("date")
        if name in workloads:
            work = workloads[name]
            entry = {
                "yaml_config": work.yaml_config,
                "config": work.config,
                "best": work.best,
                "ladder": ladder,
            }
            part, key = "workloads", "by_workload"
        else:
            entry, part, key = {"ladder": ladder}, "mixers", "by_config"
        record["parts"].setdefault(part, {"status": "ladder.py run directly", "seconds": None, key: {}})
        record["parts"][part][key][name] = entry
    return record


def _merge_entries(old: dict[str, Any], new: dict[str, Any], call: int) -> dict[str, Any]:
    """A later call's ladder replaces an earlier one only where it measured at least as many rungs."""
    merged = dict(old)
    for name, entry in new.items():
        rungs = len(((entry or {}).get("ladder") or {}).get("rungs") or [])
        before = len(((old.get(name) or {}).get("ladder") or {}).get("rungs") or [])
        if name not in old or rungs and rungs >= before:
            merged[name] = {**entry, "call": call}
    return merged


def combine_records(
    first: dict[str, Any],
    second: dict[str, Any],
    dlscale_logs: dict[str, list[str]],
    second_command: str,
    partial_logs: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """One record of several calls: the later call's parts are added (replacing a part of the same name, except
    the ladders of mixers and workloads, merged entry by entry), except the reference, whose rungs take the
    `dlscale train` outputs (``dlscale_logs``: rung name or ``best`` -> lines) that the later call ran because an
    earlier one ran out of time. ``partial_logs`` (workload -> a ladder's output) adds the trials a workload's best
    rung finished before the call's timeout stopped it."""
    calls = list(first.get("calls") or [])
    if not calls:
        calls = [{"date": first["date"], "command": first["command"], "elapsed_s": first.get("elapsed_s")}]
    number = len(calls) + 1
    parts = {name: {"call": 1, **record} for name, record in first["parts"].items()}
    for name, record in second["parts"].items():
        if name == "reference":
            continue
        key = LADDER_PARTS.get(name)
        if key and name in parts:
            before = parts[name]
            entries = _merge_entries(before.get(key) or {}, record.get(key) or {}, number)
            seconds = [
                x for x in (before.get("seconds"), record.get("seconds")) if isinstance(x, (int, float))
            ]
            parts[name] = {
                **before, key: entries, "call": f"{before.get('call')}, {number}",
                "status": f"{before.get('status')} (call {before.get('call')}); {record.get('status')} (call {number})",
                "seconds": round(sum(seconds), 1) if seconds else None,
            }  # fmt: skip
        else:
            parts[name] = {**record, "call": number}
            if key:
                parts[name][key] = {
                    entry: {**found, "call": number} for entry, found in (record.get(key) or {}).items()
                }
    for name, lines in (partial_logs or {}).items():
        workloads = parts.setdefault("workloads", {"status": "ok", "by_workload": {}})["by_workload"]
        entry = workloads.setdefault(name, {})
        best = entry.get("best") or next(w.best for w in WORKLOAD_DATA_GPU if w.name == name)
        found = partial_rung(lines, best)
        if found:
            workloads[name] = {**entry, "best": best, "partial_best": {**found, "call": number}}
    reference = parts.get("reference")
    if reference and dlscale_logs:
        for row in reference["rungs"]:
            if row["rung"] in dlscale_logs:
                row["dlscale"] = {"call": number, **epoch_trials(dlscale_logs[row["rung"]])}
                finish_row(row)
        if "best" in dlscale_logs:
            best = {"call": number, "knobs": list(DLSCALE_BEST), **epoch_trials(dlscale_logs["best"])}
            best["summary"] = summarize(best["trials"])
            best["ratio_to_reference_best"] = compare(
                best["trials"], (reference["rungs"][-1].get("reference") or {}).get("trials") or []
            )
            reference["dlscale_best"] = best
    merged = {**first, "parts": parts}
    command = second_command or second["command"]
    merged["calls"] = [
        *calls,
        {"date": second["date"], "command": command, "elapsed_s": second.get("elapsed_s")},
    ]
    merged["command"] = f"{first['command']}; then {command}"
    return merged


def combine(
    first: Path,
    second: Path,
    logs: Sequence[str],
    second_command: str,
    out: Path,
    notes: Sequence[str] = (),
    partial_logs: Sequence[str] = (),
    second_seconds: float | None = None,
) -> int:
    dlscale_logs = {}
    for item in logs:
        rung, _, path = item.partition("=")
        if rung not in {r.name for r in RUNGS} | {"best"} or not path:
            raise SystemExit(
                f"--dlscale-log: expected RUNG=LOG with RUNG one of {[r.name for r in RUNGS]} or best"
            )
        dlscale_logs[rung] = Path(path).read_text().splitlines()
    partial = {}
    for item in partial_logs:
        name, _, path = item.partition("=")
        if name not in {w.name for w in WORKLOAD_DATA_GPU} or not path:
            raise SystemExit(
                f"--partial-log: expected WORKLOAD=LOG with WORKLOAD one of {[w.name for w in WORKLOAD_DATA_GPU]}"
            )
        partial[name] = Path(path).read_text().splitlines()
    merged = combine_records(
        json.loads(first.read_text()),
        call_record(second, second_command, second_seconds),
        dlscale_logs,
        second_command,
        partial,
    )
    merged["notes"] = [*(merged.get("notes") or []), *notes]
    out.mkdir(parents=True, exist_ok=True)
    first_light.write_atomically(out / "second_light.json", json.dumps(merged, indent=2) + "\n")
    first_light.write_atomically(out / "second_light.md", markdown(merged))
    if any(row.get("ratio") for row in merged["parts"].get("reference", {}).get("rungs", [])):
        reference_figure(merged, out / "reference.png")
    models_figure(merged, out / "models.png")
    return 0


def write_cosmo_box(out: str, train_box: str, valid_box: str) -> int:
    """The U-Net's synthetic volumes at sides other than the presets' (a child process: it imports numpy)."""
    from dlscale.data.cosmo.synth import SynthCosmoSpec, existing_spec, write_synthetic_cosmo

    spec = SynthCosmoSpec(train_box=int(train_box), valid_box=int(valid_box))
    if existing_spec(Path(out)) != spec:
        write_synthetic_cosmo(Path(out), spec, print)
    return 0


# ---- main ---------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="second_light", help="results")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run (default 480)")
    parser.add_argument(
        "--parts", help=f"comma-separated parts (default all: {','.join(p.name for p in PARTS)})"
    )
    parser.add_argument(
        "--workloads",
        help=f"comma-separated workloads of the workloads part (default all: {','.join(w.name for w in WORKLOAD_DATA_GPU)})",
    )
    parser.add_argument("--scratch", default="/tmp/dlscale-second-light", help="data, runs and logs")
    parser.add_argument("--rehearse", action="store_true", help="on the CPU, at tiny sizes")
    parser.add_argument("--cosmo-box", nargs=3, metavar=("OUT", "TRAIN", "VALID"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--combine",
        nargs=2,
        type=Path,
        metavar=("JSON", "LATER"),
        help="merge a later call's record (its JSON, or its results folder, where ladder_<name>/ folders of "
        "ladder.py runs are taken too) into the record of the earlier calls, in --out",
    )
    parser.add_argument(
        "--dlscale-log",
        action="append",
        default=[],
        metavar="RUNG=LOG",
        help="with --combine: the output of a `dlscale train` of a reference rung (or `best`) run in the second call",
    )
    parser.add_argument("--second-command", default="", help="with --combine: the second call's command line")
    parser.add_argument(
        "--partial-log",
        action="append",
        default=[],
        metavar="WORKLOAD=LOG",
        help="with --combine: a workload ladder's output whose best rung the call's timeout stopped",
    )
    parser.add_argument(
        "--second-seconds",
        type=float,
        help="with --combine: the later call's wall seconds, when it has no record",
    )
    parser.add_argument("--note", action="append", default=[], help="with --combine: a note for the report")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.ladder_rungs = ""
    args.tune_minutes = None
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cosmo_box:
        return write_cosmo_box(*args.cosmo_box)
    if args.combine:
        first, later = args.combine
        return combine(
            first, later, args.dlscale_log, args.second_command, Path(args.out), args.note, args.partial_log,
            args.second_seconds,
        )  # fmt: skip
    parts = first_light.chosen_parts(args.parts, PARTS)  # a wrong name ends here, before any folder is made
    known = {work.name for work in WORKLOAD_DATA_GPU}
    if args.workloads and not set(args.workloads.split(",")) <= known:
        raise SystemExit(f"--workloads: {args.workloads!r}; expected names among {sorted(known)}")
    session = SecondLight(args)
    session.report["command"] = "PYTHONPATH=src python3 " + " ".join(
        ["benchmarks/gpu_second_light.py", *args.argv]
    )
    return first_light.run_session(session, parts)


if __name__ == "__main__":
    raise SystemExit(main())
