"""The tune's climb against a fake backend whose speed per setting is known, with seeded noise and a fake clock."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from untuned_settings import UNTUNED

from dlscale.tuning.cache import TuneCache, settings_key
from dlscale.tuning.climb import Climb, TuneFailed, TuneOptions, TuneResult
from dlscale.tuning.knobs import BATCH_KEY, TuneContext
from dlscale.tuning.records import Measurement, NumericsCheck

CPU = TuneContext(on_gpu=False, cpus_per_rank=4)
START: dict[str, Any] = dict(UNTUNED)
BASE_SPEED = 100.0
BASE_LOSS = 0.5
# The true best on a CPU: the fused optimizer and a batch of 32 (amp is faster but changes the loss by 20 %).
BEST_GAIN = 1.3 * 1.5
FUSED = {**START, "optim.enable_fused": True}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeBackend:
    """Known speeds: fused x1.3, 2 workers x0.8, amp x2.0 (loss +20 %), batch 32 x1.5 (48 no more), OOM from 64."""

    def __init__(
        self,
        clock: FakeClock,
        *,
        seed: int = 0,
        noise: float = 0.02,
        seconds: float = 10.0,
        check_seconds: float = 5.0,
        amp_loss: float = 1.2,
        verdict: str = "balanced",
        oom_batch: int = 64,
        planner_limit: int | None = None,
        interrupt_at: int | None = None,
        fail: dict[str, Any] | None = None,
        history: list[dict[str, Any]] | None = None,
    ):
        self.clock = clock
        self.seed = seed
        self.noise = noise
        self.seconds = seconds
        self.check_seconds = check_seconds
        self.amp_loss = amp_loss
        self.verdict = verdict
        self.oom_batch = oom_batch
        self.planner_limit = planner_limit
        self.interrupt_at = interrupt_at
        self.fail = fail or {}  # a setting (key, value) whose measurement fails
        # Every measurement, of this backend and of the ones it continues (a resumed tune's noise goes on).
        self.measured: list[dict[str, Any]] = list(history or [])
        self.checked: list[dict[str, Any]] = []
        self.ends: list[float] = []  # the fake time each measurement or check ended at

    def speed(self, s: dict[str, Any]) -> float:
        gain = 1.0
        gain *= 1.3 if s["optim.enable_fused"] else 1.0
        gain *= 0.8 if s["loader.num_data_workers"] >= 2 else 1.0
        gain *= 2.0 if s["train.amp_mode"] != "none" else 1.0
        gain *= 1.5 if s[BATCH_KEY] >= 32 else 1.0  # no gain beyond 32
        gain *= 1.0 if s["train.enable_jit"] else 1.0  # compile: no gain
        return BASE_SPEED * gain

    def measure(self, settings: dict[str, Any]) -> Measurement:
        if self.interrupt_at is not None and len(self.measured) + 1 >= self.interrupt_at:
            raise KeyboardInterrupt
        self.measured.append(dict(settings))
        self.clock.now += self.seconds
        self.ends.append(self.clock.now)
        for key, value in self.fail.items():
            if settings[key] == value:
                return Measurement("failed", seconds=self.seconds, message="the build failed")
        if settings[BATCH_KEY] >= self.oom_batch:
            return Measurement("out of memory", seconds=self.seconds, message="CUDA out of memory")
        # The noise depends on the settings and how often they were measured, not on the order of measurements:
        # a resumed climb sees the same trials as an uninterrupted one.
        count = sum(m == settings for m in self.measured) - 1
        rng = random.Random(f"{self.seed}|{settings_key('measure', settings)}|{count}")
        speed = self.speed(settings)
        trials = [speed * (1 + rng.gauss(0, self.noise)) for _ in range(3)]
        return Measurement(
            "ok", {"IO": [1e6] * 3, "SYNTHETIC": trials, "FULL": trials}, self.verdict, seconds=self.seconds
        )

    def check_numerics(self, settings: dict[str, Any]) -> NumericsCheck:
        self.checked.append(dict(settings))
        self.clock.now += self.check_seconds
        self.ends.append(self.clock.now)
        loss = BASE_LOSS * (self.amp_loss if settings["train.amp_mode"] != "none" else 1.0)
        return NumericsCheck("ok", loss=loss, steps=20, seconds=self.check_seconds)

    def memory_problem(self, settings: dict[str, Any]) -> str | None:
        if self.planner_limit is not None and settings[BATCH_KEY] >= self.planner_limit:
            return f"batch {settings[BATCH_KEY]} needs 90 GB, the device has 80 GB"
        return None


def climb(
    backend: FakeBackend,
    *,
    cache: TuneCache | None = None,
    context: TuneContext = CPU,
    agree: Any = None,
    **options: Any,
) -> TuneResult:
    extra = {} if agree is None else {"agree": agree}
    # The start is re-measured only when its own interval is wide (tested on its own below); elsewhere the
    # tests count measurements, so the fake's noise must not trigger it by chance.
    options.setdefault("max_noise", 1.0)
    return Climb(
        backend,
        context,
        TuneOptions(**options),
        cache or TuneCache(None, {"test": 1}),
        clock=backend.clock,
        **extra,
    ).run(dict(START))


def decisions(result: TuneResult) -> list[tuple[str, str]]:
    return [(t.candidate.label, t.decision) for t in result.trials]


def kept(result: TuneResult) -> list[str]:
    return [t.candidate.label for t in result.trials if t.kept]


# ---------------------------------------------------------------------- 1. the known best


def test_finds_the_known_best_settings() -> None:
    backend = FakeBackend(FakeClock())
    result = climb(backend)
    assert kept(result) == ["optim.enable_fused=true", f"{BATCH_KEY}=32"]
    assert result.changes == {"optim.enable_fused": True, BATCH_KEY: 32}
    assert [p.label for p in result.path] == ["start", "optim.enable_fused=true", f"{BATCH_KEY}=32"]
    by_label = dict(decisions(result))
    assert by_label["loader.num_data_workers=2"] == "slower"
    assert by_label["train.amp_mode=bf16"] == "numerics"
    assert by_label[f"{BATCH_KEY}=64"] == "out of memory"
    assert by_label[f"{BATCH_KEY}=48"] != "kept"
    assert by_label["train.enable_jit=true"] != "kept"
    assert result.stop_reason == "no knob for 'balanced' is left to try"
    speedup = result.speedup
    assert speedup is not None and speedup.outcome == "faster"
    assert speedup.low <= BEST_GAIN <= speedup.high
    assert speedup.ratio == pytest.approx(BEST_GAIN, rel=0.05)
    # confirmed with fresh measurements of the start and the final settings
    assert backend.measured.count(START) == 2


# ---------------------------------------------------------------------- 2. numerics


def test_faster_knob_changing_the_loss_is_rejected_for_numerics() -> None:
    result = climb(FakeBackend(FakeClock(), amp_loss=1.2), loss_tolerance=0.05)
    amp = next(t for t in result.trials if t.candidate.knob == "mixed precision")
    assert amp.decision == "numerics"
    assert amp.comparison is not None and amp.comparison.outcome == "faster"
    assert "0.6" in amp.reason and "0.5" in amp.reason  # the check's loss and the start's
    assert amp.numerics is not None and amp.numerics.loss == pytest.approx(0.6)
    assert result.start_check is not None and result.start_check.loss == pytest.approx(0.5)
    assert result.final["train.amp_mode"] == "none"


def test_faster_knob_within_the_loss_tolerance_is_kept() -> None:
    result = climb(FakeBackend(FakeClock(), amp_loss=1.03), loss_tolerance=0.05)
    amp = next(t for t in result.trials if t.candidate.knob == "mixed precision")
    assert amp.decision == "kept"
    assert result.final["train.amp_mode"] == "bf16"


# ---------------------------------------------------------------------- 3. out of memory


def test_batch_backs_off_after_out_of_memory() -> None:
    backend = FakeBackend(FakeClock())
    result = climb(backend)
    batches = [
        (t.settings[BATCH_KEY], t.decision) for t in result.trials if t.candidate.knob == "local batch"
    ]
    assert batches[:2] == [(32, "kept"), (64, "out of memory")]
    assert batches[2][0] == 48 and len(batches) == 3
    assert {m[BATCH_KEY] for m in backend.measured} == {16, 32, 48, 64}


def test_memory_planner_rejects_without_measuring() -> None:
    backend = FakeBackend(FakeClock(), planner_limit=64)
    result = climb(backend)
    oom = next(t for t in result.trials if t.settings[BATCH_KEY] == 64)
    assert oom.decision == "out of memory"
    assert "needs 90 GB" in oom.reason and oom.measurement is None
    assert all(m[BATCH_KEY] < 64 for m in backend.measured)
    assert any(t.settings[BATCH_KEY] == 48 for t in result.trials)  # still backs off


# ---------------------------------------------------------------------- 4. and 5. the cache


def test_resume_from_the_cache_measures_nothing_twice(tmp_path: Path) -> None:
    fingerprint = {"config": "a", "trials": 3}
    reference_backend = FakeBackend(FakeClock())
    reference = climb(reference_backend, cache=TuneCache(tmp_path / "reference.json", fingerprint))

    path = tmp_path / "tune_cache.json"
    interrupted = FakeBackend(FakeClock(), interrupt_at=7)
    with pytest.raises(KeyboardInterrupt):
        climb(interrupted, cache=TuneCache(path, fingerprint))
    finished = list(interrupted.measured)
    assert len(finished) == 6 and interrupted.checked  # measurements and checks were cached

    cache = TuneCache(path, fingerprint)
    assert cache.resumed == len(finished) + len(interrupted.checked)
    resumed_backend = FakeBackend(FakeClock(), history=finished)
    resumed = climb(resumed_backend, cache=cache)
    # Nothing the first run finished is measured or checked again: the two runs together did the reference's work.
    assert resumed_backend.measured == reference_backend.measured
    assert interrupted.checked + resumed_backend.checked == reference_backend.checked
    assert decisions(resumed) == decisions(reference)
    assert resumed.final == reference.final
    assert resumed.stop_reason == reference.stop_reason
    assert resumed.speedup is not None and reference.speedup is not None
    assert resumed.speedup.ratio == pytest.approx(reference.speedup.ratio)

    # A third run finds everything in the cache.
    again = FakeBackend(FakeClock())
    assert decisions(climb(again, cache=TuneCache(path, fingerprint))) == decisions(reference)
    assert again.measured == [] and again.checked == []


def test_cache_of_another_fingerprint_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "tune_cache.json"
    bogus = Measurement("ok", {"FULL": [1e9, 1e9, 1e9]}, "balanced", seconds=1.0)
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "fingerprint": {"config": "other"},
                "entries": {settings_key("measure", START): bogus.to_json()},
            }
        )
    )
    cache = TuneCache(path, {"config": "mine"})
    assert cache.resumed == 0 and cache.entries == {}
    stale = tmp_path / "tune_cache.stale.json"
    assert stale.exists()
    assert json.loads(stale.read_text())["fingerprint"] == {"config": "other"}
    backend = FakeBackend(FakeClock())
    result = climb(backend, cache=cache)
    assert backend.measured[0] == START  # measured afresh, not taken from the stale cache
    assert result.path[0].measurement.full[0] < 1e6
    assert json.loads(path.read_text())["fingerprint"] == {"config": "mine"}


def test_unreadable_cache_is_an_error(tmp_path: Path) -> None:
    from dlscale.errors import ConfigError

    path = tmp_path / "tune_cache.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot be read"):
        TuneCache(path, {"config": "mine"})


# ---------------------------------------------------------------------- 6. the budget


def test_budget_stops_the_climb_before_a_trial_that_would_end_after_it() -> None:
    clock = FakeClock()
    began = clock.now
    backend = FakeBackend(clock, seconds=10.0)
    result = climb(backend, budget_s=25.0)
    assert "budget" in result.stop_reason
    assert backend.measured[0] == START
    assert len(backend.measured) == 2  # the start and the fused optimizer; a third would end at 30 s
    assert max(backend.ends) <= began + 25.0
    assert kept(result) == ["optim.enable_fused=true"]


def test_budget_estimates_a_check_by_the_checks_so_far() -> None:
    clock = FakeClock()
    began = clock.now
    backend = FakeBackend(clock, seconds=10.0, check_seconds=30.0)
    result = climb(backend, budget_s=80.0, confirm=False)
    # start ends at 10 s, fused 20 s, amp 30 s, the start's check (estimated as a measurement) 60 s;
    # amp's check, estimated 30 s like the start's, would end at 90 s
    assert "budget" in result.stop_reason
    assert backend.checked == [START]
    assert max(backend.ends) <= began + 80.0


@pytest.mark.parametrize("budget", [0.0, -5.0])
def test_the_start_is_always_measured(budget: float) -> None:
    backend = FakeBackend(FakeClock())
    result = climb(backend, budget_s=budget)
    assert backend.measured == [START]
    assert result.trials == [] and result.speedup is None
    assert "budget" in result.stop_reason
    assert result.path[0].measurement.full


# ---------------------------------------------------------------------- 7. a second measurement


class ScriptedBackend(FakeBackend):
    """FULL trials from a script per settings label (successive measurements), else the start's trials."""

    def __init__(self, clock: FakeClock, script: dict[str, list[list[float]]]):
        super().__init__(clock, verdict="compute-bound")
        self.script = {label: list(runs) for label, runs in script.items()}

    def measure(self, settings: dict[str, Any]) -> Measurement:
        self.measured.append(dict(settings))
        self.clock.now += self.seconds
        changed = " ".join(f"{k}={v}" for k, v in settings.items() if START[k] != v) or "start"
        runs = self.script.get(changed)
        trials = runs.pop(0) if runs else [100.0, 100.5, 99.5]
        return Measurement("ok", {"FULL": trials}, self.verdict, seconds=self.seconds)


def test_a_possible_gain_within_noise_is_measured_again_and_decided_pooled() -> None:
    fused = "optim.enable_fused=True"
    backend = ScriptedBackend(FakeClock(), {fused: [[100.0, 115.0, 115.0], [110.0, 110.0, 110.0]]})
    result = climb(backend, confirm=False)
    trial = result.trials[0]
    assert trial.candidate.knob == "fused optimizer"
    assert trial.decision == "kept"  # 1.10x, confirmed by the pooled six trials
    assert trial.measurement is not None and len(trial.measurement.full) == 6
    assert backend.measured.count(FUSED) == 2


def test_a_second_measurement_that_does_not_confirm_the_gain() -> None:
    fused = "optim.enable_fused=True"
    backend = ScriptedBackend(FakeClock(), {fused: [[100.0, 115.0, 115.0], [100.0, 100.0, 100.0]]})
    result = climb(backend, confirm=False)
    trial = result.trials[0]
    assert trial.decision == "within noise"
    assert trial.measurement is not None and len(trial.measurement.full) == 6


def test_no_gain_within_noise_is_measured_once() -> None:
    backend = ScriptedBackend(FakeClock(), {"optim.enable_fused=True": [[100.0, 101.0, 99.0]]})
    result = climb(backend, confirm=False)
    assert result.trials[0].decision == "within noise"
    assert backend.measured.count(FUSED) == 1


# ---------------------------------------------------------------------- 8. GPU knobs on a CPU


def test_skipped_gpu_knobs_are_recorded_and_never_measured() -> None:
    backend = FakeBackend(FakeClock())
    result = climb(backend)
    skipped = {t.candidate.knob: t for t in result.trials if t.decision == "needs a GPU"}
    assert set(skipped) == {"TF32", "CUDA graphs", "pinned memory"}
    assert all("CPU" in t.reason and t.measurement is None for t in skipped.values())
    for m in backend.measured:
        assert not m["train.tf32"] and not m["train.cuda_graphs"] and m["loader.pin_memory"] is None


def test_gpu_knobs_are_measured_on_a_gpu() -> None:
    backend = FakeBackend(FakeClock())
    result = climb(backend, context=TuneContext(on_gpu=True, cpus_per_rank=4))
    assert not any(t.decision == "needs a GPU" for t in result.trials)
    assert any(m["train.tf32"] for m in backend.measured)


# ---------------------------------------------------------------------- 9. failures


def test_a_failing_start_raises() -> None:
    with pytest.raises(TuneFailed, match="the build failed"):
        climb(FakeBackend(FakeClock(), fail={"optim.enable_fused": False}))
    with pytest.raises(TuneFailed, match="out of memory"):
        climb(FakeBackend(FakeClock(), oom_batch=16))


def test_a_failed_candidate_is_recorded_and_the_climb_goes_on() -> None:
    backend = FakeBackend(FakeClock(), fail={"optim.enable_fused": True})
    result = climb(backend)
    fused = result.trials[0]
    assert (fused.candidate.knob, fused.decision, fused.reason) == (
        "fused optimizer",
        "failed",
        "the build failed",
    )
    assert len(result.trials) > 1
    assert kept(result) == [f"{BATCH_KEY}=32"]


def test_a_candidate_without_full_trials_is_a_failure() -> None:
    class NoFull(FakeBackend):
        def measure(self, settings: dict[str, Any]) -> Measurement:
            measurement = super().measure(settings)
            if settings["optim.enable_fused"]:
                measurement.throughputs = {"IO": [1.0, 1.0, 1.0]}
            return measurement

    result = climb(NoFull(FakeClock()))
    fused = result.trials[0]
    assert (fused.decision, fused.reason) == ("failed", "no FULL trials")
    assert len(result.trials) > 1


# ---------------------------------------------------------------------- 10. agree


def test_agree_sees_cache_lookups_and_budget_decisions() -> None:
    seen: list[Any] = []

    def recording(value: Any) -> Any:
        seen.append(value)
        return value

    backend = FakeBackend(FakeClock())
    result = climb(backend, agree=recording)
    calls = len(backend.measured) + len(backend.checked)
    budgets = [v for v in seen if isinstance(v, bool)]
    assert budgets == [False] * calls  # one budget decision before every backend call
    batch_trials = [t for t in result.trials if t.candidate.knob == "local batch"]
    # a cache lookup (nothing found) for every call, and the memory planner's answer for every batch
    assert [v for v in seen if not isinstance(v, bool)] == [None] * (calls + len(batch_trials))
    assert kept(result) == ["optim.enable_fused=true", f"{BATCH_KEY}=32"]


def test_rank_zero_answers_drive_every_rank(tmp_path: Path) -> None:
    # Rank 0 has the whole climb in its cache; another rank with an empty cache takes rank 0's answers.
    cache = TuneCache(tmp_path / "cache.json", {"config": "a"})
    reference = climb(FakeBackend(FakeClock()), cache=cache)
    answers: list[Any] = []

    def rank0(value: Any) -> Any:
        answers.append(value)
        return value

    rank0_backend = FakeBackend(FakeClock())
    climb(rank0_backend, cache=TuneCache(tmp_path / "cache.json", {"config": "a"}), agree=rank0)
    assert rank0_backend.measured == []
    assert all(isinstance(a, dict) for a in answers if a is not None)  # cache hits (None: the memory planner)

    replay = iter(answers)
    other = FakeBackend(FakeClock(), seed=99)
    result = climb(other, cache=TuneCache(None, {"config": "a"}), agree=lambda value: next(replay))
    assert other.measured == [] and other.checked == []
    assert decisions(result) == decisions(reference)


def test_rank_zero_budget_decision_stops_every_rank() -> None:
    def budget_spent_on_rank0(value: Any) -> Any:
        return True if isinstance(value, bool) else value

    backend = FakeBackend(FakeClock())
    result = climb(backend, agree=budget_spent_on_rank0, budget_s=3600.0)
    assert "budget" in result.stop_reason
    assert backend.measured == [START]


def test_a_noisy_start_is_measured_again_and_pooled():
    clock = FakeClock()
    backend = FakeBackend(clock, noise=0.2, seed=3)
    result = climb(backend, max_noise=0.05)
    starts = [m for m in backend.measured if m == START]
    assert len(starts) >= 2  # the start, then once more because its interval was wide
    assert len(result.path[0].measurement.full) == 6
    quiet = FakeBackend(FakeClock(), noise=0.001)
    climb(quiet, max_noise=0.05, confirm=False)
    assert sum(m == START for m in quiet.measured) == 1


def test_leave_alone_keeps_a_setting_untouched():
    backend = FakeBackend(FakeClock())
    result = climb(backend, leave_alone=(BATCH_KEY, "optim.enable_fused"))
    touched = {key for trial in result.trials for key, _ in trial.candidate.changes}
    assert BATCH_KEY not in touched and "optim.enable_fused" not in touched
    assert all(m[BATCH_KEY] == 16 and not m["optim.enable_fused"] for m in backend.measured)
