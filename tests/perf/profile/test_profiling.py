"""Profiling: step markers and CUDA profiler control (no-ops on the CPU), the nsys capture window, the nsys
command line, the torch profiler trace (one real run) and the line profiler table."""

from __future__ import annotations

import json
import logging
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dlscale.errors import ConfigError
from dlscale.perf.profile.capture import (
    CudaProfilerWindow,
    LineProfileObserver,
    TorchProfilerObserver,
    build_profiling,
    nsys_command,
    nsys_hint_lines,
)
from dlscale.perf.profile.config import ProfileConfig
from dlscale.runtime import nvtx
from dlscale.runtime.device import Device
from dlscale.runtime.launch import ProcessInfo
from dlscale.runtime.nvtx import NO_MARKERS, build_markers, cuda_profiler_start, cuda_profiler_stop
from dlscale.training.schedule import EpochPlan
from dlscale.training.train_progress import TrainProgress

CPU = Device("cpu")


# --- a miniature run: the trainer's hook order, without model or data --------------------------------------


class RecordingStep:
    """A training step that notes which (epoch, step) ran, into the run's shared event list."""

    def __init__(self, events: list[str], progress: TrainProgress):
        self.events = events
        self.progress = progress
        self.device = CPU
        self.read_loss_at: set[int] = set()  # global steps that read their loss on the host (a sync on a GPU)

    def __call__(self, size: int) -> torch.Tensor:
        self.events.append(f"step {self.progress.epoch}.{self.progress.step_in_epoch}")
        weights = torch.ones(size, size, device=self.device.torch)
        total = torch.zeros((), device=self.device.torch)
        for _ in range(3):
            total = total + (weights @ weights).sum()
        if self.progress.global_step in self.read_loss_at:
            total.item()
        return total


class FakeTrainer:
    """The attributes observers read (setup.plan/process/device/run_dir/step, progress) and a loop that calls
    the hooks in the order :class:`dlscale.training.trainer.Trainer` does."""

    def __init__(self, run_dir: Path, steps_per_epoch: int = 4, num_epochs: int = 3, rank: int = 0):
        self.events: list[str] = []
        self.progress = TrainProgress()
        plan = EpochPlan(steps_per_epoch, num_epochs, steps_per_epoch * num_epochs, "test plan")
        self.setup = SimpleNamespace(
            plan=plan,
            process=ProcessInfo(rank=rank, world_size=max(rank + 1, 1)),
            device=CPU,
            run_dir=run_dir,
            step=RecordingStep(self.events, self.progress),
        )
        self.observers: list = []
        self.stop_after_global_step: int | None = None

    def fit(self, observers: list) -> str:
        self.observers = observers
        p = self.progress
        self._notify("on_train_start")
        stopped = False
        while p.epoch < self.setup.plan.num_epochs and not stopped:
            self._notify("on_epoch_start")
            stopped = self._train_epoch()
            if not stopped:
                p.epoch += 1
                p.step_in_epoch = 0
                self._notify("on_epoch_end", None)
        outcome = "stopped" if stopped else "finished"
        self._notify("on_train_end", outcome)
        return outcome

    def _train_epoch(self) -> bool:
        p = self.progress
        while p.step_in_epoch < self.setup.plan.steps_in_epoch(p.epoch):
            self._notify("on_step_start")
            loss = self.setup.step(8)
            p.step_in_epoch += 1
            p.global_step += 1
            self._notify("on_step_end", loss)
            if p.global_step == self.stop_after_global_step:
                return True
        return False

    def _notify(self, hook: str, *args: object) -> None:
        for observer in self.observers:
            getattr(observer, hook)(self, *args)


@pytest.fixture
def profiler_calls(monkeypatch: pytest.MonkeyPatch):
    """Replaces the runtime's CUDA profiler start/stop with recorders writing into a trainer's event list."""

    def attach(trainer: FakeTrainer) -> None:
        def start(device: Device) -> bool:
            trainer.events.append("start")
            return False

        def stop(device: Device) -> bool:
            trainer.events.append("stop")
            return False

        monkeypatch.setattr(nvtx, "cuda_profiler_start", start)
        monkeypatch.setattr(nvtx, "cuda_profiler_stop", stop)

    return attach


def window(trainer: FakeTrainer, **settings: object) -> CudaProfilerWindow:
    cfg = ProfileConfig(enable_manual_profiling=True, **settings)
    return CudaProfilerWindow(cfg, trainer.setup.plan, trainer.setup.process.rank, argv=["dlscale", "train"])


def around(events: list[str], marker: str) -> tuple[str, str]:
    """The events just before and just after ``marker``."""
    index = events.index(marker)
    return events[index - 1], events[index + 1]


# --- markers and CUDA profiler control on the CPU ----------------------------------------------------------


def test_markers_and_cuda_profiler_calls_are_harmless_no_ops_on_cpu():
    markers = build_markers(CPU, nvtx=True, record_functions=False)
    assert markers is NO_MARKERS and not markers.nvtx and not markers.active
    for name in ("step 0", "data", "forward", "backward", "optimizer"):
        with markers.range(name):
            torch.ones(2).sum()
    with NO_MARKERS.range("outer"), NO_MARKERS.range("inner"):  # one shared context, reusable when nested
        pass
    assert cuda_profiler_start(CPU) is False
    assert cuda_profiler_stop(CPU) is False


def test_record_function_markers_name_ranges_in_a_torch_profiler_trace_on_cpu():
    markers = build_markers(CPU, nvtx=True, record_functions=True)
    assert markers.record_functions and not markers.nvtx  # no NVTX on the CPU, but torch profiler ranges
    cpu_only = [torch.profiler.ProfilerActivity.CPU]
    with (
        torch.profiler.profile(activities=cpu_only) as prof,
        markers.range("step 7"),
        markers.range("forward"),
    ):
        torch.ones(4, 4).matmul(torch.ones(4, 4))
    names = {event.name for event in prof.events()}
    assert {"step 7", "forward"} <= names


# --- the CUDA profiler window ------------------------------------------------------------------------------


def test_window_opens_and_closes_at_the_chosen_epoch_and_steps(tmp_path, profiler_calls, caplog):
    trainer = FakeTrainer(tmp_path)
    profiler_calls(trainer)
    observer = window(trainer, profile_epoch=2, profile_start_step=1, profile_end_step=3)
    with caplog.at_level(logging.INFO, logger="dlscale.profile"):
        trainer.fit([observer])
    assert trainer.events.count("start") == 1 and trainer.events.count("stop") == 1
    assert around(trainer.events, "start") == ("step 1.0", "step 1.1")
    assert around(trainer.events, "stop") == ("step 1.2", "step 1.3")
    assert "window opened at epoch 2, step 1 (global step 5)" in caplog.text
    assert "2 step(s) captured (global steps 5 to 6)" in caplog.text


def test_window_defaults_to_the_whole_last_epoch(tmp_path, profiler_calls):
    trainer = FakeTrainer(tmp_path, steps_per_epoch=3, num_epochs=2)
    profiler_calls(trainer)
    trainer.fit([window(trainer)])
    assert trainer.events[trainer.events.index("start") :] == [
        "start",
        "step 1.0",
        "step 1.1",
        "step 1.2",
        "stop",
    ]


def test_window_past_the_epoch_end_closes_with_the_epoch(tmp_path, profiler_calls):
    trainer = FakeTrainer(tmp_path, steps_per_epoch=3, num_epochs=2)
    profiler_calls(trainer)
    trainer.fit([window(trainer, profile_epoch=1, profile_start_step=2, profile_end_step=50)])
    assert around(trainer.events, "start") == ("step 0.1", "step 0.2")
    assert around(trainer.events, "stop") == ("step 0.2", "step 1.0")


def test_window_opens_only_on_the_chosen_ranks(tmp_path, profiler_calls):
    for rank, ranks, opens in [(1, "0", False), (1, "0,1", True), (3, "all", True), (0, "0", True)]:
        trainer = FakeTrainer(tmp_path, rank=rank)
        profiler_calls(trainer)
        trainer.fit([window(trainer, profile_ranks=ranks)])
        assert ("start" in trainer.events) is opens, (rank, ranks)
        assert trainer.events.count("start") == trainer.events.count("stop")


def test_window_is_closed_when_the_run_stops_inside_it(tmp_path, profiler_calls):
    trainer = FakeTrainer(tmp_path)
    trainer.stop_after_global_step = 6  # a SIGTERM during epoch 2, step 1
    profiler_calls(trainer)
    observer = window(trainer, profile_epoch=2, profile_start_step=0, profile_end_step=4)
    assert trainer.fit([observer]) == "stopped"
    assert trainer.events[-3:] == ["step 1.0", "step 1.1", "stop"]
    assert not observer.is_open


def test_resume_past_the_window_never_opens_it(tmp_path, profiler_calls, caplog):
    trainer = FakeTrainer(tmp_path)
    trainer.progress.epoch, trainer.progress.step_in_epoch, trainer.progress.global_step = 1, 3, 7
    profiler_calls(trainer)
    with caplog.at_level(logging.INFO, logger="dlscale.profile"):
        trainer.fit([window(trainer, profile_epoch=2, profile_start_step=0, profile_end_step=2)])
    assert "start" not in trainer.events and "stop" not in trainer.events
    assert trainer.events[0] == "step 1.3"
    assert "resumes past the profiling window" in caplog.text


def test_resume_inside_the_window_captures_the_rest_of_it(tmp_path, profiler_calls):
    trainer = FakeTrainer(tmp_path)
    trainer.progress.epoch, trainer.progress.step_in_epoch, trainer.progress.global_step = 1, 1, 5
    profiler_calls(trainer)
    trainer.fit([window(trainer, profile_epoch=2, profile_start_step=0, profile_end_step=3)])
    assert trainer.events[:4] == ["start", "step 1.1", "step 1.2", "stop"]


def test_window_outside_the_run_is_a_config_error(tmp_path):
    trainer = FakeTrainer(tmp_path, steps_per_epoch=4, num_epochs=3)
    with pytest.raises(ConfigError, match=r"profile\.profile_epoch is 4, but this run trains 3 epoch"):
        window(trainer, profile_epoch=4)
    with pytest.raises(ConfigError, match=r"profile\.profile_start_step is 4, but epoch 3 has 4 step"):
        window(trainer, profile_start_step=4)


def test_train_start_logs_the_nsys_command_and_makes_its_folder(tmp_path, profiler_calls, caplog):
    trainer = FakeTrainer(tmp_path)
    profiler_calls(trainer)
    with caplog.at_level(logging.INFO, logger="dlscale.profile"):
        trainer.fit([window(trainer)])
    assert "nsys profile -c cudaProfilerApi" in caplog.text
    assert "Manual profiling on the CPU" in caplog.text
    assert (tmp_path / "nsys").is_dir()


# --- the nsys command line ---------------------------------------------------------------------------------


def test_nsys_command_captures_the_profiler_api_range_of_the_typed_command(tmp_path):
    argv = ["/venv/bin/dlscale", "train", "--config", "short", "--enable_manual_profiling"]
    run_dir = tmp_path / "runs" / "short" / "00"
    command = nsys_command(run_dir, argv)
    assert command.startswith("nsys profile -c cudaProfilerApi --capture-range-end=stop ")
    assert "-t cuda,nvtx,osrt,cudnn,cublas" in command
    assert f"-o {run_dir / 'nsys' / 'rank0'} --force-overwrite true" in command
    assert command.endswith(" ".join(argv) + " --run_num 00-nsys")


def test_nsys_command_reruns_python_dash_m_and_names_reports_per_rank(tmp_path):
    argv = ["/src/dlscale/__main__.py", "train", "--run_num", "my run"]
    run_dir = tmp_path / "my run"
    command = nsys_command(run_dir, argv, rank_variable="SLURM_PROCID")
    assert command.endswith(f"{sys.executable} -m dlscale train --run_num 'my run-nsys'")
    assert f"'{run_dir / 'nsys'}/rank%q{{SLURM_PROCID}}'" in command
    hints = "\n".join(nsys_hint_lines(run_dir, argv))
    assert "srun ... nsys profile" in hints and "rank%q{SLURM_PROCID}" in hints
    assert "torchrun ... --no-python nsys profile" in hints and "rank%q{RANK}" in hints


def printed_run_nums(command: str) -> list[str]:
    """The values of every way a pasted ``dlscale train`` command sets the run_num, in order."""
    words = shlex.split(command)
    found = []
    for index, word in enumerate(words):
        if word == "--run_num" or (word == "--set" and words[index + 1].split("=")[0].endswith("run_num")):
            found.append(words[index + 1].split("=")[-1])
        elif word.startswith(("--run_num=", "--set=run_num=", "--set=log.run_num=")):
            found.append(word.split("=")[-1])
    return found


@pytest.mark.parametrize(
    "typed",
    [
        [],
        ["--run_num", "nvtx"],
        ["--run_num=nvtx"],
        ["--set", "log.run_num=nvtx"],
        ["--set=run_num=nvtx", "--set", "optim.lr=1e-3"],
    ],
)
def test_printed_nsys_command_trains_a_fresh_run_whatever_set_the_run_num(tmp_path, typed):
    run_dir = tmp_path / "runs" / "short" / "nvtx"
    run_dir.mkdir(parents=True)
    argv = ["/venv/bin/dlscale", "train", "--config", "short", *typed, "--enable_manual_profiling"]
    lines = nsys_hint_lines(run_dir, argv)
    command = next(line.strip() for line in lines if line.strip().startswith("nsys profile"))
    assert command == nsys_command(run_dir, argv)
    # Pasted as it is, the command trains into one run directory, and not into this run's.
    assert printed_run_nums(command) == ["nvtx-nsys"]
    assert not (run_dir.parent / "nvtx-nsys").exists()
    assert "--set optim.lr=1e-3" in command or "optim.lr" not in " ".join(typed)
    # The words name the run_num the command uses, and never ask for a change the command does not make.
    text = "\n".join(lines)
    assert "fresh run (--run_num nvtx-nsys)" in text and "another --run_num" not in text
    for line in lines:
        if "dlscale train" in line:
            assert printed_run_nums(line.split("nsys profile", 1)[-1]) == ["nvtx-nsys"]


def test_printed_run_num_is_not_a_directory_that_exists(tmp_path):
    run_dir = tmp_path / "00"
    (tmp_path / "00-nsys").mkdir(parents=True)
    (tmp_path / "00-nsys2").mkdir()
    command = nsys_command(run_dir, ["dlscale", "train", "--run_num", "00"])
    assert printed_run_nums(command) == ["00-nsys3"]


def test_nsys_hint_of_a_script_names_a_fresh_run_num_in_words(tmp_path):
    argv = ["train_my_model.py", "--epochs", "3"]
    run_dir = tmp_path / "00"
    command = nsys_command(run_dir, argv)
    assert command.endswith(" train_my_model.py --epochs 3")  # a script's own options are left alone
    text = "\n".join(nsys_hint_lines(run_dir, argv))
    assert "with another log.run_num than '00' (e.g. '00-nsys')" in text


# --- build_profiling ---------------------------------------------------------------------------------------


def profiling_place(rank: int = 0) -> tuple:
    """(rank, device, plan) of a CPU run of 3 epochs x 4 steps, as build_profiling takes them."""
    return rank, CPU, EpochPlan(4, 3, 12, "test")


def test_build_profiling_attaches_only_what_is_enabled():
    markers, observers = build_profiling(ProfileConfig(), *profiling_place())
    assert markers is NO_MARKERS and observers == []

    markers, observers = build_profiling(ProfileConfig(enable_manual_profiling=True), *profiling_place())
    assert markers is NO_MARKERS  # NVTX is a no-op on the CPU, so nothing to mark
    assert [type(o) for o in observers] == [CudaProfilerWindow]

    cfg = ProfileConfig(enable_manual_profiling=True, torch_profiler=True)
    markers, observers = build_profiling(cfg, *profiling_place())
    assert markers.record_functions and not markers.nvtx
    assert [type(o) for o in observers] == [CudaProfilerWindow, TorchProfilerObserver]


def test_build_profiling_leaves_trace_writers_off_other_ranks():
    cfg = ProfileConfig(enable_manual_profiling=True, torch_profiler=True, profile_ranks="0")
    markers, observers = build_profiling(cfg, *profiling_place(rank=2))
    assert markers is NO_MARKERS
    assert [type(o) for o in observers] == [CudaProfilerWindow]  # validates the window; idle off the ranks
    assert not observers[0].enabled
    with pytest.raises(ConfigError, match="profile_epoch"):
        build_profiling(
            ProfileConfig(enable_manual_profiling=True, profile_epoch=9), *profiling_place(rank=2)
        )


# --- torch profiler ----------------------------------------------------------------------------------------


def trace_step_names(path: Path) -> list[str]:
    with path.open() as file:
        trace = json.load(file)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return sorted({e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")})


def test_torch_profiler_records_its_window_then_stops(tmp_path, caplog):
    trainer = FakeTrainer(tmp_path, steps_per_epoch=4, num_epochs=2)
    observer = TorchProfilerObserver(wait=2, warmup=1, active=2, top_operators=5)
    with caplog.at_level(logging.INFO, logger="dlscale.profile"):
        trainer.fit([observer])
    assert observer.trace_path is not None and observer.trace_path.parent == tmp_path / "profiler"
    assert observer.trace_path.name.startswith("rank0.") and observer.trace_path.name.endswith(
        ".pt.trace.json"
    )
    assert trace_step_names(observer.trace_path) == ["ProfilerStep#3", "ProfilerStep#4"]
    assert observer._profiler is None  # stopped right after the window, not at the end of the run
    assert "aten::mm" in observer.top_table
    assert (
        "trace of 2 step(s) (global steps 3 to 4)" in caplog.text
        and "Top operators (at most 5)" in caplog.text
    )


def test_torch_profiler_writes_what_it_recorded_when_the_run_stops_early(tmp_path, caplog):
    trainer = FakeTrainer(tmp_path)
    trainer.stop_after_global_step = 3
    observer = TorchProfilerObserver(wait=0, warmup=1, active=5)
    trainer.fit([observer])
    assert {"ProfilerStep#1", "ProfilerStep#2"} <= set(trace_step_names(observer.trace_path))

    short = FakeTrainer(tmp_path / "short", steps_per_epoch=2, num_epochs=1)
    too_late = TorchProfilerObserver(wait=3, warmup=1, active=1)
    with caplog.at_level(logging.WARNING, logger="dlscale.profile"):
        short.fit([too_late])
    assert too_late.trace_path is None and "no trace written" in caplog.text


@pytest.mark.slow
def test_real_run_writes_a_valid_trace_of_exactly_the_active_steps(tiny_config):
    from dlscale.run.training import train

    cfg = tiny_config("train.num_epochs=1", "log.tensorboard=false", "checkpoint.enabled=false")
    observer = TorchProfilerObserver(wait=1, warmup=1, active=3)
    assert train(cfg, extra_observers=[observer]) == 0
    run_dir = Path(cfg.log.expdir) / cfg.name / cfg.log.run_num
    traces = list((run_dir / "profiler").glob("*.pt.trace.json"))
    assert traces == [observer.trace_path]
    assert trace_step_names(traces[0]) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]


# --- line profiler -----------------------------------------------------------------------------------------


def test_line_profile_table_lists_the_step_lines_with_hit_counts(tmp_path):
    pytest.importorskip("line_profiler", reason="profile.line_profile needs the line_profiler package")
    trainer = FakeTrainer(tmp_path, steps_per_epoch=3, num_epochs=2)
    observer = LineProfileObserver()
    trainer.fit([observer])
    table = (tmp_path / "line_profile.txt").read_text()
    assert table == observer.table
    # line_profiler 5 prints qualified names (RecordingStep.__call__), older versions the bare name.
    assert "__call__ at line" in table and "_train_epoch at line" in table
    assert "% Time" in table and "Hits" in table
    # 6 steps, 3 loop turns each: the loop body ran 18 times, the step's first line 6 times.
    body = next(line for line in table.splitlines() if "total = total + (weights @ weights).sum()" in line)
    assert body.split()[1] == "18"
    first = next(line for line in table.splitlines() if 'self.events.append(f"step' in line)
    assert first.split()[1] == "6"
    assert (tmp_path / "line_profile.lprof").is_file()


def test_line_profile_without_line_profiler_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "line_profiler", None)  # makes `import line_profiler` fail
    with pytest.raises(
        ConfigError, match="profile.line_profile needs the line_profiler package: pip install"
    ):
        LineProfileObserver()
    with pytest.raises(ConfigError, match="line_profiler"):
        build_profiling(ProfileConfig(line_profile=True), *profiling_place(rank=1))


# --- on a GPU ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_nvtx_ranges_and_cuda_profiler_run_for_real_on_a_gpu():
    gpu = Device("cuda:0")
    markers = build_markers(gpu, nvtx=True, record_functions=True)
    assert markers.nvtx and markers.record_functions
    with markers.range("step 0"), markers.range("forward"):
        torch.ones(8, device=gpu.torch).sum()
    assert cuda_profiler_start(gpu) is True
    torch.ones(8, device=gpu.torch).sum()
    assert cuda_profiler_stop(gpu) is True


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_torch_profiler_records_gpu_kernels(tmp_path):
    trainer = FakeTrainer(tmp_path, steps_per_epoch=3, num_epochs=1)
    trainer.setup.device = trainer.setup.step.device = Device("cuda:0")
    observer = TorchProfilerObserver(wait=0, warmup=1, active=1)
    trainer.fit([observer])
    with observer.trace_path.open() as file:
        trace = json.load(file)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert any(event.get("cat") == "kernel" for event in events)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_trace_summary_counts_a_real_host_sync_and_the_matmul_kernels(tmp_path):
    trainer = FakeTrainer(tmp_path, steps_per_epoch=5, num_epochs=1)
    trainer.setup.device = trainer.setup.step.device = Device("cuda:0")
    trainer.setup.step.read_loss_at = {3}  # `.item()` in the second recorded step only
    observer = TorchProfilerObserver(wait=1, warmup=1, active=3)
    trainer.fit([observer])
    summary = observer.summary
    assert summary is not None and summary.on_gpu
    assert [(s.step, s.host_syncs) for s in summary.step_syncs] == [(2, 0), (3, 1), (4, 0)]
    assert set(summary.step_syncs[1].calls) == {"cudaStreamSynchronize"}
    assert summary.category_ms["matmul"] > 0 and 0 <= summary.idle_share < 1
    assert json.loads(observer.summary_path.read_text())["host_syncs_per_step"] == [0, 1, 0]
