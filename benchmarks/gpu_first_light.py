"""GPU first light: one command that measures every GPU path of dlscale inside a hard time budget.

    # on the lent GPU machine (one call; results go to $OUT as each part ends):
    PYTHONPATH=src python3 benchmarks/gpu_first_light.py --out "$OUT"
    # a part that failed, again (on a fresh machine: the data it needs is made first):
    PYTHONPATH=src python3 benchmarks/gpu_first_light.py --out "$OUT" --parts train,tune
    # the same script on a CPU, at `tiny` sizes, writing the same files (the test suite runs it):
    PYTHONPATH=src python3 benchmarks/gpu_first_light.py --rehearse --out /tmp/first_light
    # two calls' records as one (a rerun's parts replace the first call's):
    PYTHONPATH=src python3 benchmarks/gpu_first_light.py --combine A/first_light.json B/first_light.json --out DIR

A machine is lent for 15 minutes of device time in all, its start (a few minutes) included, and one call runs
at most 10 minutes; so everything runs in one call of ``--budget`` seconds (420 by default), parts in this
order, each inside its own time box and the budget that is left, each as child processes killed at the box:

=========  ====  =========================================================================================
part        box  what (seconds it took on an H100: benchmarks/results/2026-11-26-h100-first-light.md)
=========  ====  =========================================================================================
env          20  nvidia-smi, driver, torch / CUDA / cuDNN / NCCL versions, NVML read through dlscale, a bf16
                 GEMM's TFLOP/s (the practical peak next to the datasheet's) (7 s)
tests        70  the GPU-only tests (``pytest -m gpu``) of the files that have them (21 s)
data         40  the `short` grid's synthetic ERA5 (361 x 720, 256 steps per split: 10.6 GB), 16 threads (13 s)
attention    30  ``attention_backends.py``: each SDPA kernel at the ViT's attention shape (9 s)
ladder      200  ``ladder.py``: fp32 (TF32) baseline, AMP bf16, fused Adam, CUDA graphs, torch.compile, compile
                 in reduce-overhead mode; IO, SYNTHETIC and FULL trials of 3 x 12 steps after a warm-up trial
                 each, peak memory next to `dlscale plan`'s estimate (the fp32 rung alone takes 80 s, each
                 bf16 eager rung about 15 s, the two compiled ones about 50 s each: ``--ladder-rungs``
                 picks them and their order)
train       120  ``dlscale train --config short`` with the best rung's knobs for 2 epochs: the efficiency
                 report (NVML power, utilization, energy), a torch profiler window summarized (GPU time by
                 kind of kernel, idle share, top kernels, host syncs per step), async sharded (DCP)
                 checkpoints staged through pinned memory; then the same command for a 3rd epoch, resumed
                 (50 to 75 s)
forecast     25  a 10-day rollout of `short`'s model (40 steps, 16 initial times) in fp32 and bf16 (13 s)
tune       rest  ``dlscale tune`` of `short` from the best rung's knobs, with short trials, in the time left
                 (skipped under 45 s)
=========  ====  =========================================================================================

What comes back is limited to a few small files, so ``--out`` receives only: ``first_light.json`` (every
part's numbers and status), ``first_light.md`` (the report, with the issue's targets against what was
measured), ``first_light.log`` (every command's output, each cut to its last 2 MB), and the plots
``ladder.png``, ``profile.png`` and ``tune.png`` (at most 8 files come back from a device call). Raw traces,
checkpoints and data stay in ``--scratch``.
All of them are rewritten after every part, so a call cut short still returns what was measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ladder_record import peak_memory_gb

REPO = Path(__file__).resolve().parents[1]
CONFIG_FILE = REPO / "configs" / "vit_era5.yaml"
OUT_FILES = ("first_light.json", "first_light.md", "first_light.log", "ladder.png", "profile.png", "tune.png")
LOG_CAP_BYTES = 2 * 1024 * 1024  # of each command's output in first_light.log (its last bytes are kept)
# Measured in this order, so that a ladder cut off at its box has the baseline and the best rungs; the table
# shows them in the ladder's order. amp_bf16 (within noise of fused on the H100) is left out to fit the box.
LADDER_RUNGS = "baseline,fused,compile_graphs,cuda_graphs,compile"
# Steps between the training loop's reads of the device (the divergence guard's flag, the logged losses): the
# "logging steps", the only ones that may wait for the GPU. Set explicitly, so the report knows which they are.
CHECK_EVERY = 10
TARGETS = {"mfu": 0.35, "full_over_synthetic": 0.95, "speedup_over_baseline": 4.0, "plan_error": 0.15}


@dataclass(frozen=True)
class Sizes:
    """What the GPU run and the CPU rehearsal do differently: sizes only, never which commands run."""

    config: str
    data: tuple[str, ...]  # synth-era5's options
    ladder: tuple[str, ...]  # ladder.py's trial options
    profiler: tuple[int, int, int]  # torch profiler wait, warm-up, active steps in the training run
    forecast: tuple[str, ...]  # forecast_throughput.py's options
    tune: tuple[str, ...]  # dlscale tune's trial lengths
    gemm_size: int


GPU = Sizes(
    config="short",
    data=("--preset", "full", "--train-years", "1", "--valid-years", "1", "--test-years", "0")
    + ("--steps-per-year", "256", "--workers", "16"),
    ladder=("--nwarmup", "1", "--ntrials", "3", "--nbatches", "12", "--workers", "8"),
    profiler=(6, 1, 5),  # global steps 7 to 11: step 9 is a logging step (CHECK_EVERY)
    forecast=("--configs", "short", "--model-batch", "16", "--model-batches", "5", "--trials", "3"),
    tune=("--nbatches", "12", "--ntrials", "3", "--check_steps", "20"),
    gemm_size=8192,
)
REHEARSAL = Sizes(
    config="tiny",
    data=("--preset", "tiny", "--workers", "2"),
    ladder=("--nwarmup", "1", "--ntrials", "2", "--nbatches", "3", "--workers", "2"),
    profiler=(2, 1, 3),
    forecast=("--configs", "tiny", "--model-batch", "4", "--model-batches", "2", "--trials", "2"),
    tune=("--nbatches", "3", "--ntrials", "2", "--check_steps", "5"),
    gemm_size=256,
)


# ---- running commands inside a budget ------------------------------------------------------------------------


@dataclass
class CommandResult:
    label: str
    argv: list[str]
    returncode: int | None  # None: killed at its time limit
    seconds: float
    output: list[str]  # its last 4000 lines

    @property
    def tail(self) -> list[str]:
        return self.output[-40:]

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "command": shlex.join(self.argv),
            "returncode": self.returncode,
            "timed_out": self.returncode is None,
            "seconds": round(self.seconds, 2),
            "tail": self.tail[-12:] if not self.ok else [],
        }


class Session:
    """The budget, the scratch and output directories, the log, and the report written after every part.

    ``NAME`` names the files in ``--out`` and ``TITLE`` the log lines: gpu_second_light.py's session is this one
    with its own names, sizes and report."""

    NAME = "first_light"
    TITLE = "first light"

    def __init__(self, args: argparse.Namespace):
        self.started = time.monotonic()
        self.deadline = self.started + args.budget
        self.budget = args.budget
        self.rehearse = args.rehearse
        self.sizes = REHEARSAL if args.rehearse else GPU
        self.ladder_rungs = args.ladder_rungs
        self.tune_minutes = args.tune_minutes
        self.out = Path(args.out).resolve()
        self.scratch = Path(args.scratch).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.log_path = self.out / f"{self.NAME}.log"
        self.log_path.write_text("")
        self.data = self.scratch / "era5"
        self.report: dict[str, Any] = {
            "benchmark": f"dlscale GPU {self.TITLE}",
            "rehearsal": self.rehearse,
            "date": datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": command_text(args.argv),
            "budget_s": args.budget,
            "config": self.sizes.config,
            "parts": {},
        }
        self.commands: list[CommandResult] = []  # of the part that runs now

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def say(self, message: str) -> None:
        line = f"[{self.TITLE} {self.elapsed():6.1f} s] {message}"
        print(line, flush=True)
        with self.log_path.open("a") as log:
            log.write(line + "\n")

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        if self.rehearse:
            env["DLSCALE_DEVICE"] = "cpu"  # a rehearsal on a GPU machine stays a rehearsal
        return env

    def command(
        self,
        label: str,
        argv: Sequence[str],
        deadline: float,
        cwd: Path | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> CommandResult:
        """Run ``argv`` (in ``cwd``, the checkout by default, with ``extra_env`` over the environment) in its own
        process group until it ends or ``deadline`` (then the group is killed); its output goes to the log as
        it comes (the last ``LOG_CAP_BYTES``)."""
        argv = [str(word) for word in argv]
        self.say(f"{label}: {shlex.join(argv)}")
        began = time.monotonic()
        process = subprocess.Popen(
            argv,
            cwd=cwd or REPO,
            env={**self.environment(), **(extra_env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        lines: deque[str] = deque(maxlen=4000)
        reader = threading.Thread(target=_collect_lines, args=(process.stdout, lines), daemon=True)
        reader.start()
        returncode: int | None
        try:
            returncode = process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            _stop_group(process)
            returncode = None
        reader.join(timeout=10)
        seconds = time.monotonic() - began
        self._log_output(label, list(lines))
        result = CommandResult(label, argv, returncode, seconds, list(lines))
        self.commands.append(result)
        outcome = "ok" if result.ok else "TIMED OUT" if returncode is None else f"FAILED (exit {returncode})"
        self.say(f"{label}: {outcome} after {seconds:.1f} s")
        if not result.ok:
            for line in result.tail[-6:]:
                self.say(f"  | {line}")
        return result

    def _log_output(self, label: str, lines: list[str]) -> None:
        text = "\n".join(lines)
        if len(text) > LOG_CAP_BYTES:
            text = f"[... cut to the last {LOG_CAP_BYTES} bytes ...]\n" + text[-LOG_CAP_BYTES:]
        with self.log_path.open("a") as log:
            log.write(f"----- output of {label} -----\n{text}\n----- end of {label} -----\n")

    def write(self) -> None:
        """The report, its markdown and plots, in ``--out`` (each file replaced atomically)."""
        self.report["elapsed_s"] = round(self.elapsed(), 1)
        write_atomically(
            self.out / f"{self.NAME}.json", json.dumps(self.report, indent=2, default=str) + "\n"
        )
        write_atomically(self.out / f"{self.NAME}.md", self.markdown())
        self.draw_plots()

    def markdown(self) -> str:
        return markdown(self.report)

    def draw_plots(self) -> None:
        draw_plots(self.report, self.out, self.scratch)


def _collect_lines(stream: Any, lines: deque[str]) -> None:
    for raw in iter(stream.readline, b""):
        lines.append(raw.decode(errors="replace").rstrip("\n"))
    stream.close()


def _stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to the process group (dlscale train saves a checkpoint and exits), SIGKILL 15 s later."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def command_text(argv: Sequence[str]) -> str:
    return "PYTHONPATH=src python3 " + shlex.join(["benchmarks/gpu_first_light.py", *argv])


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ---- the parts ---------------------------------------------------------------------------------------------


def python(*words: object) -> list[str]:
    return [sys.executable, *map(str, words)]


def dlscale(*words: object) -> list[str]:
    return python("-m", "dlscale", *words)


def part_env(s: Session, deadline: float) -> dict[str, Any]:
    result: dict[str, Any] = {}
    smi = shutil.which("nvidia-smi")
    if smi is None:
        result["nvidia_smi"] = "not found (no NVIDIA driver on this machine)"
    else:
        s.command("nvidia-smi", [smi], deadline)
        fields = "name,driver_version,memory.total,power.limit,clocks.max.sm,pcie.link.gen.max"
        query = s.command("nvidia-smi --query-gpu", [smi, f"--query-gpu={fields}", "--format=csv"], deadline)
        if query.ok and len(query.tail) >= 2:
            result["nvidia_smi"] = dict(
                zip(query.tail[0].split(", "), query.tail[1].split(", "), strict=False)
            )
    probe = s.scratch / "env.json"
    probe.unlink(missing_ok=True)
    s.command("versions, NVML, GEMM", python(__file__, "--probe-env", probe, *_rehearse_flag(s)), deadline)
    result.update(read_json(probe) or {})
    return result


def _rehearse_flag(s: Session) -> list[str]:
    return ["--rehearse"] if s.rehearse else []


def gpu_test_files() -> list[str]:
    """The test files that hold tests marked ``gpu`` (collecting only these keeps the part short)."""
    marked = re.compile(r"^@pytest\.mark\.gpu\b", re.MULTILINE)
    return sorted(
        str(path.relative_to(REPO))
        for path in (REPO / "tests").rglob("test_*.py")
        if marked.search(path.read_text())
    )


def part_tests(s: Session, deadline: float) -> dict[str, Any]:
    report = s.scratch / "gpu_tests.xml"
    report.unlink(missing_ok=True)
    files = gpu_test_files()
    argv = python("-m", "pytest", "-q", "-rs", "-m", "gpu", "-p", "no:cacheprovider", f"--junitxml={report}")
    s.command("GPU tests", [*argv, *files], deadline)
    result = {"files": files, **junit_outcomes(report)}
    if s.commands[-1].returncode == 5:  # pytest's "no tests collected" is no failure of the part
        s.commands[-1].returncode = 0
    return result


def junit_outcomes(path: Path) -> dict[str, Any]:
    """Counts and per-test outcomes of a pytest JUnit XML report (empty when there is none)."""
    import xml.etree.ElementTree as ElementTree

    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return {}
    outcomes = {}
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, detail = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                detail = (child.get("message") or "")[:300]
        outcomes[name] = {"outcome": outcome, "detail": detail, "seconds": float(case.get("time") or 0)}
    counts = {
        kind: sum(o["outcome"] == kind for o in outcomes.values())
        for kind in ("passed", "failed", "error", "skipped")
    }
    return {"counts": counts, "tests": outcomes}


def part_data(s: Session, deadline: float) -> dict[str, Any]:
    s.command("synthetic ERA5", dlscale("data", "synth-era5", "--out", s.data, *s.sizes.data), deadline)
    manifest = read_json(s.data / "manifest.json")
    size = sum(p.stat().st_size for p in s.data.rglob("*.h5")) if manifest else 0
    return {"path": str(s.data), "spec": (manifest or {}).get("spec"), "gigabytes": round(size / 1e9, 2)}


def part_ladder(s: Session, deadline: float) -> dict[str, Any]:
    ladder_dir = s.scratch / "ladder"
    shutil.rmtree(ladder_dir, ignore_errors=True)
    argv = python(
        REPO / "benchmarks" / "ladder.py", "--data", s.data, "--config", s.sizes.config, "--rungs", s.ladder_rungs,
        "--tests", "IO,SYNTHETIC,FULL", "--out", ladder_dir, *s.sizes.ladder,
    )  # fmt: skip
    s.command("ladder", argv, deadline)
    # Written after every rung: a ladder cut off at its time box still has the rungs it measured. Each rung's
    # row has its peak memory next to `dlscale plan`'s estimate (peak_memory_gb, plan_gb).
    found = sorted(ladder_dir.glob("*-ladder.json"))
    return {"ladder": read_json(found[-1]) if found else None}


def best_rung(ladder: dict | None) -> dict | None:
    """The measured rung with the highest FULL throughput (SYNTHETIC where no FULL ran)."""
    rows = [row for row in (ladder or {}).get("rungs", []) if "skipped" not in row]

    def speed(row: dict) -> float:
        return (row.get("FULL") or row.get("SYNTHETIC") or {}).get("mean") or 0.0

    return max(rows, key=speed, default=None)


# The training part resumes the run for a 3rd epoch only with this much of its box left (a compiled model
# compiles again in the new process).
RESUME_NEEDS_S = 45
# The knobs of the training run when no ladder ran (a rerun of `train` alone): the rung expected to be best.
DEFAULT_TRAIN_KNOBS = (
    "num_data_workers=8", "data_loader_config=gpu", "amp_mode=bf16", "enable_fused=true", "cuda_graphs=true",
)  # fmt: skip


def best_knobs(s: Session) -> tuple[str | None, list[str]]:
    """The best measured rung of this call's ladder and its knobs (the default knobs when no ladder ran)."""
    best = best_rung((s.report["parts"].get("ladder") or {}).get("ladder"))
    return (best["rung"], list(best["overrides"])) if best else (None, list(DEFAULT_TRAIN_KNOBS))


def _knob_settings(knobs: Sequence[str]) -> list[str]:
    """A rung's overrides as ``--set`` options: dlscale resolves their flat names (``amp_mode=bf16``) itself."""
    return [word for knob in knobs for word in ("--set", knob)]


def part_train(s: Session, deadline: float) -> dict[str, Any]:
    rung, knobs = best_knobs(s)
    runs = s.scratch / "runs"
    run_dir = runs / s.sizes.config / "first_light"
    shutil.rmtree(run_dir, ignore_errors=True)
    wait, warmup, active = s.sizes.profiler
    common = [
        "train", "--yaml_config", CONFIG_FILE, "--config", s.sizes.config, "--run_num", "first_light",
        "--set", f"data.root={s.data}", "--set", f"log.expdir={runs}", "--set", "log.progress=lines",
        "--set", "checkpoint.format=dcp", "--set", "checkpoint.async_save=true",
        "--set", f"train.nonfinite_check_every={CHECK_EVERY}",
        *_knob_settings(knobs),
    ]  # fmt: skip
    profiler = [
        "--set", "profile.torch_profiler=true", "--set", f"profile.torch_profiler_wait={wait}",
        "--set", f"profile.torch_profiler_warmup={warmup}", "--set", f"profile.torch_profiler_active={active}",
    ]  # fmt: skip
    result: dict[str, Any] = {"rung": rung, "knobs": knobs, "run_dir": str(run_dir)}
    first = s.command("train 2 epochs", dlscale(*common, *profiler, "--set", "train.num_epochs=2"), deadline)
    result["first"] = run_record(run_dir, first.output)
    if first.ok and deadline - time.monotonic() > RESUME_NEEDS_S:
        second = s.command(
            "resume for a 3rd epoch", dlscale(*common, "--set", "train.num_epochs=3"), deadline
        )
        result["resumed"] = run_record(run_dir, second.output)
    return result


LOG_LINES_KEPT = ("Performance:", "in the background", "CUDA graphs", "Time taken for epoch", "Resuming from")


def run_record(run_dir: Path, output: list[str]) -> dict[str, Any]:
    """What one training command left: summary, efficiency report, profile summary, and its log lines about
    speed, memory, checkpoints and resuming (from its own output: the run's out.log holds every attempt)."""
    summary = read_json(run_dir / "summary.json") or {}
    traces = sorted((run_dir / "profiler").glob("*.summary.json"))
    latest = run_dir / "checkpoints" / "ckpt_latest"
    return {
        "outcome": summary.get("outcome"),
        "device": summary.get("device"),
        "epochs_completed": summary.get("epochs_completed"),
        "steps_per_epoch": summary["global_step"] // summary["epochs_completed"]
        if summary.get("epochs_completed")
        else None,
        "global_step": summary.get("global_step"),
        "throughput_samples_per_second": summary.get("throughput_samples_per_second"),
        "final_val_loss": (summary.get("final") or {}).get("val_loss"),
        "efficiency": read_json(run_dir / "monitor" / "efficiency.json"),
        "profile": read_json(traces[-1]) if traces else None,
        "checkpoint_latest": str(latest.resolve()) if latest.exists() else None,
        "checkpoint_complete": (latest / "dlscale_state.pt").is_file(),
        "log_lines": [line.split(" - ", 3)[-1] for line in output if any(w in line for w in LOG_LINES_KEPT)][
            -30:
        ],
    }


def part_attention(s: Session, deadline: float) -> dict[str, Any]:
    out = s.scratch / "attention"
    shutil.rmtree(out, ignore_errors=True)
    argv = python(REPO / "benchmarks" / "attention_backends.py", "--config", s.sizes.config, "--out", out)
    s.command("attention kernels", argv, deadline)
    found = sorted(out.glob("*-attention-backends.json"))
    if not found:
        return {"record": None}
    return {"record": read_json(found[-1]), "markdown": found[-1].with_suffix(".md").read_text()}


def part_forecast(s: Session, deadline: float) -> dict[str, Any]:
    out = s.scratch / "forecast"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    argv = python(
        REPO / "benchmarks" / "forecast_throughput.py", "--model-only", "--amp-modes", "none,bf16", "--out", out,
        *s.sizes.forecast,
    )  # fmt: skip
    s.command("10-day rollout", argv, deadline)
    found = sorted(out.glob("*-forecast-throughput.json"))
    return {"record": read_json(found[-1]) if found else None}


def part_tune(s: Session, deadline: float) -> dict[str, Any]:
    out = s.scratch / "tune"
    shutil.rmtree(out, ignore_errors=True)
    minutes = max((deadline - time.monotonic() - 15) / 60, 0.1)  # 15 s for its start and its files
    if s.tune_minutes is not None:
        minutes = min(minutes, s.tune_minutes)
    # From the ladder's best rung, with short trials: from `short`'s fp32 start (21 samples/s on an H100) the
    # first trial alone outlasted the two minutes left on the first GPU call.
    rung, knobs = best_knobs(s)
    argv = dlscale(
        "tune", "--yaml_config", CONFIG_FILE, "--config", s.sizes.config, "--set", f"data.root={s.data}",
        "--set", f"log.expdir={s.scratch / 'tune_runs'}", *_knob_settings(knobs), *s.sizes.tune,
        "--budget", f"{minutes:.2f}", "--out", out / f"{s.sizes.config}_tuned.yaml",
    )  # fmt: skip
    s.command("tune", argv, deadline)
    return {
        "start": rung,
        "budget_minutes": round(minutes, 2),
        "record": read_json(out / f"{s.sizes.config}_tuned.json"),
        "tuned_yaml": (out / f"{s.sizes.config}_tuned.yaml").read_text()
        if (out / f"{s.sizes.config}_tuned.yaml").is_file()
        else None,
    }


@dataclass(frozen=True)
class Part:
    name: str
    box_s: float  # its time box on the GPU (inf: all the time left)
    run: Callable[[Session, float], dict[str, Any]]
    needs_data: bool = False
    min_s: float = 10.0  # not started with less time left than this


PARTS = (
    Part("env", 20, part_env),
    Part("tests", 70, part_tests),
    Part("data", 40, part_data),
    Part("attention", 30, part_attention),
    Part("ladder", 200, part_ladder, needs_data=True),
    Part("train", 120, part_train, needs_data=True),
    Part("forecast", 25, part_forecast),
    Part("tune", float("inf"), part_tune, needs_data=True, min_s=45),
)


def run_part(s: Session, part: Part) -> None:
    left = s.deadline - time.monotonic()
    record: dict[str, Any] = {"box_s": part.box_s if part.box_s != float("inf") else None}
    if part.needs_data and not (s.data / "manifest.json").is_file():
        record.update(status="skipped", reason="no data set (the data part did not finish)")
    elif left < part.min_s:
        record.update(
            status="skipped", reason=f"{left:.0f} s of the budget left, under its {part.min_s:.0f} s"
        )
    if "status" in record:
        s.report["parts"][part.name] = record
        s.say(f"== {part.name}: skipped: {record['reason']}")
        s.write()
        return
    s.say(f"== {part.name} (at most {min(part.box_s, left):.0f} s)")
    s.commands = []
    began = time.monotonic()
    try:
        record.update(part.run(s, began + min(part.box_s, left)))
    except Exception:  # a bug in a part must not cost the parts after it
        record["error"] = traceback.format_exc()
    record["seconds"] = round(time.monotonic() - began, 1)
    record["commands"] = [c.to_json() for c in s.commands]
    timed_out = any(c.returncode is None for c in s.commands)
    failed = "error" in record or any(not c.ok for c in s.commands)
    record["status"] = "timed out" if timed_out else "failed" if failed else "ok"
    s.report["parts"][part.name] = record
    s.say(f"== {part.name}: {record['status']} in {record['seconds']:.1f} s")
    s.write()


# ---- the environment probe (a child process: the parent never imports torch) -----------------------------------


def probe_env(path: Path, rehearse: bool, gemm_size: int) -> int:
    import importlib.util
    import platform

    import numpy
    import torch

    from dlscale.perf.flops import peak_tflops
    from dlscale.runtime.device import Device
    from dlscale.runtime.gpu_metrics import open_gpu_backend
    from dlscale.version import __version__

    device = Device("cpu") if rehearse or not torch.cuda.is_available() else Device("cuda:0")
    found: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "numpy": numpy.__version__,
        "dlscale": __version__,
        "device": device.name,
        "driver": device.driver_version(),
        "packages": {
            name: importlib.util.find_spec(name) is not None
            for name in ("h5py", "pynvml", "nvtx", "xarray", "h5netcdf", "zarr", "safetensors", "tensorboard")
        },
    }
    if device.is_gpu:
        properties = torch.cuda.get_device_properties(device.torch)
        found.update(
            capability=f"{properties.major}.{properties.minor}",
            multiprocessors=properties.multi_processor_count,
            memory_gb=properties.total_memory / 2**30,
            nccl=".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None,
            datasheet_tflops={p: peak_tflops(device.name, p) for p in ("fp32", "tf32", "bf16")},
        )
    backend = open_gpu_backend([0]) if device.is_gpu else None
    if backend is not None:
        readings = backend.read()
        backend.close()
        found["nvml"] = {"backend": backend.name, "readings": [vars(r) for r in readings]}
    else:
        found["nvml"] = None
    found["gemm_bf16"] = gemm_tflops(device, gemm_size, torch.bfloat16)
    path.write_text(json.dumps(found, indent=2, default=str) + "\n")
    print(json.dumps(found, indent=2, default=str))
    return 0


def gemm_tflops(device: Any, size: int, dtype: Any) -> dict[str, float]:
    """TFLOP/s of a size^3 matrix product: the mean and the best of 10 after 3 warm-ups."""
    import torch

    a = torch.randn(size, size, device=device.torch, dtype=dtype)
    b = torch.randn(size, size, device=device.torch, dtype=dtype)
    seconds = []
    for index in range(13):
        device.synchronize()
        began = time.perf_counter()
        a @ b
        device.synchronize()
        if index >= 3:
            seconds.append(time.perf_counter() - began)
    flop = 2 * size**3
    return {
        "size": size,
        "mean_tflops": flop / (sum(seconds) / len(seconds)) / 1e12,
        "best_tflops": flop / min(seconds) / 1e12,
    }


# ---- what the numbers say: targets, markdown, plots ----------------------------------------------------------


def logging_steps(steps_per_epoch: int | None) -> Callable[[int], bool]:
    """Whether a global step (0-based) ends with the loop reading the device: every CHECK_EVERY steps, and at
    the end of each epoch (validation, checkpoints)."""

    def is_logging(step: int) -> bool:
        return (step + 1) % CHECK_EVERY == 0 or bool(steps_per_epoch and (step + 1) % steps_per_epoch == 0)

    return is_logging


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets against what was measured (``met`` None where nothing was measured)."""
    from dlscale.perf.bench.intervals import ratio_interval

    parts = report["parts"]
    ladder = (parts.get("ladder") or {}).get("ladder") or {}
    rows = {row["rung"]: row for row in ladder.get("rungs", []) if "skipped" not in row}
    best = best_rung(ladder)
    found: list[dict[str, Any]] = []

    def add(name: str, target: str, measured: str | None, met: bool | None, note: str = "") -> None:
        found.append(
            {
                "target": name,
                "wanted": target,
                "measured": measured or "not measured",
                "met": met,
                "note": note,
            }
        )

    mfu = ((best or {}).get("utilization") or {}).get("FULL", {}).get("mfu") if best else None
    add(
        "best rung bf16 MFU",
        f">= {TARGETS['mfu']:.0%}",
        f"{mfu:.1%} ({best['rung']}, FULL)" if mfu is not None else None,
        None if mfu is None else mfu >= TARGETS["mfu"],
    )

    def add_ratio(
        name: str, numerator: dict, denominator: dict, least: float, unit: str, note: str = ""
    ) -> None:
        """A target on how many times one test's throughput is another's (95 % interval of the trials)."""
        wanted = f">= {least:g}{unit}"
        if not (numerator.get("trials") and denominator.get("trials")):
            add(name, wanted, None, None)
            return
        ratio = ratio_interval(numerator["trials"], denominator["trials"])
        digits = 3 if not unit else 2
        measured = (
            f"{ratio.ratio:.{digits}f}{unit} (95% CI {ratio.low:.{digits}f} to {ratio.high:.{digits}f})"
        )
        add(name, wanted, measured, ratio.ratio >= least, note)

    full, synthetic = ((best or {}).get(name) or {} for name in ("FULL", "SYNTHETIC"))
    add_ratio("FULL / SYNTHETIC on the best rung", full, synthetic, TARGETS["full_over_synthetic"], "")
    baseline = rows.get("baseline") or {}
    across = best is not None and baseline and best.get("call") != baseline.get("call")
    add_ratio(
        "best rung over the fp32 baseline (FULL)",
        full,
        baseline.get("FULL") or {},
        TARGETS["speedup_over_baseline"],
        "x",
        f"{best['rung']} in call {best.get('call')}, the baseline in call {baseline.get('call')}: two machines "
        "of the same kind"
        if across
        else "",
    )
    profile = (((parts.get("train") or {}).get("first") or {}).get("profile")) or {}
    first_run = (parts.get("train") or {}).get("first") or {}
    if profile.get("step_syncs"):
        logging = logging_steps(first_run.get("steps_per_epoch"))
        quiet = [s for s in profile["step_syncs"] if not logging(s["step"])]
        listed = ", ".join(
            f"step {s['step']}{'*' if logging(s['step']) else ''}: {s['host_syncs']}"
            for s in profile["step_syncs"]
        )
        add(
            "host syncs per training step (profiled steps)",
            "0 outside logging steps",
            listed + " (* a logging step)",
            all(s["host_syncs"] == 0 for s in quiet) if quiet else None,
        )
    else:
        add("host syncs per training step (profiled steps)", "0 outside logging steps", None, None)
    errors = []
    for name, row in rows.items():
        measured, plan = row.get("peak_memory_gb"), row.get("plan_gb")
        if measured and plan:
            errors.append((name, plan, measured, plan / measured - 1))
    if errors:
        worst = max(errors, key=lambda item: abs(item[3]))
        add(
            "plan's peak against the measured peak",
            f"within {TARGETS['plan_error']:.0%}",
            "; ".join(f"{n} {p:.2f} vs {m:.2f} GB ({e:+.0%})" for n, p, m, e in errors),
            all(abs(e) <= TARGETS["plan_error"] for *_, e in errors),
            f"worst: {worst[0]}",
        )
    else:
        add("plan's peak against the measured peak", f"within {TARGETS['plan_error']:.0%}", None, None)
    return found


def markdown(report: dict[str, Any]) -> str:
    parts = report["parts"]
    env = parts.get("env") or {}
    smi = env.get("nvidia_smi") if isinstance(env.get("nvidia_smi"), dict) else {}
    title = "rehearsal on the CPU" if report["rehearsal"] else (env.get("device") or "GPU")
    lines = [
        f"# dlscale GPU first light: {title}",
        "",
        f"- date: {report['date']}; budget {report['budget_s']} s, used {report.get('elapsed_s', 0)} s",
        f"- command: `{report['command']}`",
        f"- device: {env.get('device', '?')}; driver {env.get('driver') or smi.get('driver_version', '?')}; "
        f"torch {env.get('torch', '?')}, CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}, NCCL {env.get('nccl')}; "
        f"dlscale {env.get('dlscale', '?')}; config `{report['config']}`",
    ]
    gemm = env.get("gemm_bf16")
    if gemm:
        sheet = (env.get("datasheet_tflops") or {}).get("bf16")
        lines.append(
            f"- bf16 GEMM {gemm['size']}^3: {gemm['mean_tflops']:.0f} TFLOP/s mean, {gemm['best_tflops']:.0f} best"
            + (f" (datasheet dense peak {sheet:.0f}, which MFU divides by)" if sheet else "")
        )
    if env.get("nvml"):
        reading = env["nvml"]["readings"][0] if env["nvml"]["readings"] else {}
        lines.append(
            f"- NVML ({env['nvml']['backend']}) readable: power {reading.get('power_w')} W of "
            f"{reading.get('power_limit_w')} W, energy counter {reading.get('energy_j')} J"
        )
    for number, call in enumerate(report.get("calls", []), start=1):
        lines.append(
            f"- call {number}: {call['date']}, budget {call['budget_s']} s, used {call['elapsed_s']} s: "
            f"`{call['command']}`"
        )
    lines += [
        "",
        "## Parts",
        "",
        "| part | call | status | seconds | box | note |",
        "|---|---|---|---:|---:|---|",
    ]
    for name, record in parts.items():
        note = record.get("reason", "")
        failed = [c for c in record.get("commands", []) if c["returncode"] != 0]
        if failed:
            note = "; ".join(
                f"{c['label']}: {'timed out' if c['timed_out'] else 'exit ' + str(c['returncode'])}"
                for c in failed
            )
        if record.get("error"):
            note = record["error"].strip().splitlines()[-1]
        lines.append(
            f"| {name} | {record.get('call', 1)} | {record['status']} | {record.get('seconds', '-')} | "
            f"{record.get('box_s') or 'rest'} | {note} |"
        )
    lines += ["", "## Targets", "", "| target | wanted | measured | met |", "|---|---|---|---|"]
    for row in targets(report):
        met = {True: "yes", False: "**no**", None: "-"}[row["met"]]
        lines.append(
            f"| {row['target']} | {row['wanted']} | {row['measured']} | {met}{' (' + row['note'] + ')' if row['note'] else ''} |"
        )
    lines += _tests_section(parts.get("tests")) + _ladder_section(parts.get("ladder"))
    lines += _attention_section(parts.get("attention"))
    lines += _train_section(parts.get("train")) + _forecast_section(parts.get("forecast"))
    lines += _tune_section(parts.get("tune"))
    return "\n".join(lines) + "\n"


def _tests_section(record: dict | None) -> list[str]:
    if not record or not record.get("counts"):
        return []
    counts = record["counts"]
    lines = [
        "",
        "## GPU tests",
        "",
        ", ".join(f"{n} {k}" for k, n in counts.items()) + f" ({', '.join(record['files'])})",
    ]
    for name, test in record["tests"].items():
        if test["outcome"] != "passed":
            lines.append(f"- {test['outcome']}: `{name}` {test['detail']}")
    return lines


def _ladder_section(record: dict | None) -> list[str]:
    ladder = (record or {}).get("ladder")
    if not ladder:
        return []
    bench = ladder["bench"]
    lines = [
        "",
        "## The ladder",
        "",
        f"`{ladder['config']}` on {ladder['device']}; {bench['nwarmup']} warm-up + {bench['ntrials']} trials of "
        f"{bench['nbatches']} steps per test; samples/s, mean (95% CI); peak memory allocated by tensors next to "
        "`dlscale plan`'s estimate of the same (its total less the CUDA context allowance).",
        "",
        "| rung | call | IO | SYNTHETIC | FULL | FULL/SYN | TFLOP/s | MFU | peak GB | plan GB | samples/J | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in ladder["rungs"]:
        if "skipped" in row:
            lines.append(f"| {row['rung']} | {row.get('call', 1)} | skipped: {row['skipped']} ||||||||||")
            continue
        syn, full = row.get("SYNTHETIC") or {}, row.get("FULL") or {}
        util = (row.get("utilization") or {}).get("FULL") or {}
        plan = row.get("plan_gb")
        energy = full.get("energy") or {}
        lines.append(
            f"| {row['rung']} | {row.get('call', 1)} | {_interval(row.get('IO') or {})} | {_interval(syn)} | "
            f"{_interval(full)} | "
            f"{_fmt(full.get('mean') / syn['mean'] if full.get('mean') and syn.get('mean') else None, 2)} | "
            f"{_fmt(util.get('tflops_per_gpu'), 1)} | {_fmt(100 * util['mfu'] if util.get('mfu') else None, 1)}% | "
            f"{_fmt(row.get('peak_memory_gb'), 2)} | {_fmt(plan, 2)} | "
            f"{_fmt(energy.get('samples_per_joule'), 3)} | {row['verdict']['kind']} |"
        )
    return lines


def _interval(test: dict) -> str:
    from dlscale.perf.bench.intervals import mean_interval

    trials = test.get("trials")
    if not trials:
        return "-"
    found = mean_interval(trials)
    half = found.half_width if found.half_width != float("inf") else None
    return f"{found.mean:.1f}" + (
        f" ({found.mean - half:.1f}-{found.mean + half:.1f})" if half is not None else ""
    )


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _train_section(record: dict | None) -> list[str]:
    if not record or not record.get("first"):
        return []
    first, resumed = record["first"], record.get("resumed") or {}
    lines = [
        "",
        "## Training run",
        "",
        f"Knobs of rung `{record.get('rung')}`: `{' '.join(record['knobs'])}`; async sharded checkpoints (DCP).",
        f"- 2 epochs: {first.get('outcome')}, {_fmt(first.get('throughput_samples_per_second'), 1)} samples/s, "
        f"final validation loss {_fmt(first.get('final_val_loss'), 4)}",
        f"- then a 3rd epoch: {resumed.get('outcome')} at global step {resumed.get('global_step')}; latest "
        f"checkpoint complete: {resumed.get('checkpoint_complete')}",
        "",
        "Log lines of the two commands:",
        "",
    ]
    lines += [f"- `{line}`" for line in first.get("log_lines", []) + resumed.get("log_lines", [])]
    lines.append("")
    efficiency = first.get("efficiency") or {}
    for gpu in (efficiency.get("summary") or {}).get("gpus", []):
        lines.append(
            f"- efficiency (NVML): power mean {_fmt(gpu.get('mean_power_w'), 0)} W, peak {_fmt(gpu.get('peak_power_w'), 0)} W of "
            f"{_fmt(gpu.get('power_limit_w'), 0)} W; utilization {_fmt(gpu.get('mean_utilization_pct'), 0)}%; energy "
            f"{_fmt(efficiency.get('energy_j'), 0)} J, {_fmt(efficiency.get('joules_per_sample'), 3)} J per sample"
        )
    profile = first.get("profile")
    if profile and profile.get("device_events"):
        shares = ", ".join(f"{k} {100 * v:.1f}%" for k, v in profile["category_share"].items() if v)
        lines += [
            f"- profile of {profile['steps']} steps ({profile['window_ms']:.1f} ms): {shares} of the GPU's busy time; "
            f"GPU idle {100 * (profile.get('idle_share') or 0):.1f}% of the window",
            f"- host syncs per profiled step: {profile.get('host_syncs_per_step')} "
            f"({[s['calls'] for s in profile['step_syncs'] if s['host_syncs']] or 'none'}); outside them: {profile['other_syncs']}",
            "",
            "| top kernel | kind | calls | ms | share |",
            "|---|---|---:|---:|---:|",
        ]
        lines += [
            f"| `{k['name'][:90]}` | {k['category']} | {k['count']} | {k['ms']:.2f} | {100 * k['share']:.1f}% |"
            for k in profile["top_kernels"][:12]
        ]
    elif profile:
        lines.append(f"- profile: {profile['steps']} steps, no GPU activity (a CPU run)")
    return lines


def _attention_section(record: dict | None) -> list[str]:
    """attention_backends.py's own table (its heading one level down)."""
    text = (record or {}).get("markdown")
    return ["", "#" + text.strip()] if text else []


def _forecast_section(record: dict | None) -> list[str]:
    found = (record or {}).get("record")
    if not found:
        return []
    from dlscale.perf.bench.intervals import mean_interval

    lines = [
        "",
        "## 10-day rollout (model only)",
        "",
        "| precision | batch | s per step | s per 10-day rollout |",
        "|---|---:|---:|---:|",
    ]
    for entry in found["model_only"]:
        step = mean_interval(entry["seconds_per_batch"])
        lines.append(
            f"| {entry['amp_mode']} | {entry['batch_size']} | {step.mean:.4f} | {40 * step.mean:.2f} |"
        )
    return lines


def _tune_section(record: dict | None) -> list[str]:
    if not record or record.get("status") == "skipped":
        return []
    found = record.get("record")
    lines = ["", "## dlscale tune", "", f"Budget {record.get('budget_minutes')} min."]
    if found:
        speedup = found.get("speedup") or {}
        lines += [
            f"Kept: `{found.get('changes')}`; speed-up {_fmt(speedup.get('ratio'), 2)}x (95% CI "
            f"{_fmt(speedup.get('low'), 2)} to {_fmt(speedup.get('high'), 2)}, {speedup.get('outcome')}); "
            f"stopped: {found.get('stop_reason')}",
            "",
            *found.get("table", []),
        ]
    return lines


def draw_plots(report: dict[str, Any], out: Path, scratch: Path) -> None:
    """ladder.png and tune.png as their scripts drew them; profile.png from the training run's profile."""
    for pattern, name in (("ladder/*-ladder.png", "ladder.png"), ("tune/*_tuned.png", "tune.png")):
        found = sorted(scratch.glob(pattern))
        if found:
            shutil.copyfile(found[-1], out / name)
    profile = ((report["parts"].get("train") or {}).get("first") or {}).get("profile")
    if profile and profile.get("device_events"):
        profile_figure(profile, report["parts"].get("env", {}).get("device", "GPU"), out / "profile.png")


def profile_figure(profile: dict[str, Any], device: str, path: Path) -> None:
    """Left: the GPU's busy time by kind of kernel and its idle share; right: the top kernels."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.2), layout="constrained")
    shares_axis, kernels_axis = figure.subplots(1, 2, width_ratios=(1, 1.6))
    # Copies overlap kernels on their own stream, so the kinds are shares of the summed busy time; idle (no
    # kernel and no copy at all) is a share of the window's wall time.
    names = [n for n, v in profile["category_share"].items() if v] + ["idle (of the window)"]
    values = [100 * v for v in profile["category_share"].values() if v] + [
        100 * (profile.get("idle_share") or 0.0)
    ]
    shares_axis.barh(names[::-1], values[::-1], color=["tab:gray"] + ["tab:blue"] * (len(names) - 1))
    shares_axis.set_xlabel("% of the GPU's busy time")
    shares_axis.set_title(
        f"GPU time, {profile['steps']} steps ({profile['window_ms']:.0f} ms)", fontsize="medium"
    )
    top = profile["top_kernels"][:10][::-1]
    kernels_axis.barh(
        [k["name"][:48].strip() for k in top], [100 * k["share"] for k in top], color="tab:orange"
    )
    kernels_axis.set_xlabel("% of the GPU's busy time")
    kernels_axis.tick_params(axis="y", labelsize=7)
    kernels_axis.set_title("top kernels", fontsize="medium")
    figure.suptitle(f"dlscale training step profile on {device}", fontsize="medium")
    figure.savefig(path, dpi=110)


# ---- entry points --------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=os.environ.get("OUT", "first_light"), help="results (default $OUT)")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds for the whole run (default 420)")
    parser.add_argument(
        "--parts", help=f"comma-separated parts (default all: {','.join(p.name for p in PARTS)})"
    )
    parser.add_argument("--scratch", default="/tmp/dlscale-first-light", help="data, runs and traces")
    parser.add_argument("--rehearse", action="store_true", help="on the CPU, at `tiny` sizes")
    parser.add_argument(
        "--ladder-rungs", default=LADDER_RUNGS, help=f"rungs of ladder.py (default {LADDER_RUNGS})"
    )
    parser.add_argument(
        "--tune-minutes", type=float, help="at most this long for tune (default: the time left)"
    )
    parser.add_argument("--probe-env", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--combine", nargs=2, type=Path, metavar="JSON", help="merge two records into --out")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def chosen_parts(names: str | None, parts: Sequence[Part] = PARTS) -> list[Part]:
    """The ``parts`` that ``--parts`` names (all when None), with the data part when one of them needs data."""
    if not names:
        return list(parts)
    wanted = {name.strip() for name in names.split(",") if name.strip()}
    unknown = wanted - {part.name for part in parts}
    if unknown:
        raise SystemExit(f"--parts: unknown {sorted(unknown)}; known: {', '.join(p.name for p in parts)}")
    if wanted & {p.name for p in parts if p.needs_data}:
        wanted.add("data")  # a fresh machine has none
    return [part for part in parts if part.name in wanted]


def combine_records(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """One record of two calls. The second's parts replace the first's, except the ladder: its rungs are merged
    (a rung measured in both calls keeps the second's). Every part and rung notes the call (1 or 2) it is from."""
    parts = {name: {**record, "call": 1} for name, record in a["parts"].items()}
    parts.update({name: {**record, "call": 2} for name, record in b["parts"].items()})
    first_ladder = (a["parts"].get("ladder") or {}).get("ladder")
    second_ladder = (b["parts"].get("ladder") or {}).get("ladder")
    if first_ladder and second_ladder:
        rows = {row["rung"]: {**row, "call": 1} for row in first_ladder["rungs"]}
        rows.update({row["rung"]: {**row, "call": 2} for row in second_ladder["rungs"]})
        from ladder import RUNGS  # imports torch: only here, never in a run's parent process

        order = [rung.name for rung in RUNGS]
        ranked = sorted(
            rows.values(), key=lambda row: order.index(row["rung"]) if row["rung"] in order else len(order)
        )
        parts["ladder"] = {**parts["ladder"], "call": "1 and 2", "ladder": {**second_ladder, "rungs": ranked}}
    ladder = (parts.get("ladder") or {}).get("ladder")
    if ladder:
        refresh_memory_columns(ladder)
    merged = {**b, "parts": parts}
    merged["calls"] = [
        {key: record.get(key) for key in ("date", "command", "budget_s", "elapsed_s")} for record in (a, b)
    ]
    merged["command"] = f"{a['command']}; then {b['command']}"
    merged["elapsed_s"] = round(a.get("elapsed_s", 0) + b.get("elapsed_s", 0), 1)
    return merged


def refresh_memory_columns(ladder: dict[str, Any]) -> None:
    """Each measured rung's peak memory (the highest of its tests') and `dlscale plan`'s estimate for its config,
    as this checkout computes them: records of earlier calls get the columns they lack, and every plan column
    is the current estimate (the record's command says which checkout measured the peaks)."""
    from ladder import planned_memory_gb  # imports torch: only here, never in a run's parent process

    from dlscale.config import load_run_config

    for row in ladder["rungs"]:
        if "skipped" not in row:
            row["peak_memory_gb"] = peak_memory_gb(row)
            row["plan_gb"] = planned_memory_gb(
                load_run_config(CONFIG_FILE, ladder["config"], row["overrides"])
            )


def combine(first: Path, second: Path, out: Path) -> int:
    """Write :func:`combine_records` of two ``first_light.json`` files into ``out``, with its markdown and
    profile plot."""
    merged = combine_records(json.loads(first.read_text()), json.loads(second.read_text()))
    out.mkdir(parents=True, exist_ok=True)
    ladder = (merged["parts"].get("ladder") or {}).get("ladder")
    if ladder:
        from ladder import plot  # imports torch: only here, never in a run's parent process

        plot(ladder, out / "ladder.png")
    write_atomically(out / "first_light.json", json.dumps(merged, indent=2) + "\n")
    write_atomically(out / "first_light.md", markdown(merged))
    profile = ((merged["parts"].get("train") or {}).get("first") or {}).get("profile")
    if profile and profile.get("device_events"):
        profile_figure(profile, merged["parts"].get("env", {}).get("device", "GPU"), out / "profile.png")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.probe_env is not None:
        return probe_env(args.probe_env, args.rehearse, (REHEARSAL if args.rehearse else GPU).gemm_size)
    if args.combine:
        return combine(*args.combine, Path(args.out))
    return run_session(Session(args), chosen_parts(args.parts))


def run_session(session: Session, parts: Sequence[Part]) -> int:
    """Every part in turn, the report written after each; 0 when all of them are ok."""
    session.say(
        f"{'rehearsal (CPU, tiny sizes)' if session.rehearse else 'GPU run'}: {', '.join(p.name for p in parts)}"
    )
    for part in parts:
        run_part(session, part)
    session.write()
    statuses = {name: record["status"] for name, record in session.report["parts"].items()}
    session.say(f"done: {statuses}; results in {session.out}")
    return 0 if all(status == "ok" for status in statuses.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
