"""The tune's cache is keyed by everything its numbers depend on: a tune with other trial lengths (``--nbatches``,
``--ntrials``, ``--nwarmup``, ``--check_steps``) measures afresh instead of reusing trials of another length."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dlscale.tuning import session
from dlscale.tuning.cache import TuneCache, settings_key
from dlscale.tuning.run_backend import ConfigSource, TrialLengths
from dlscale.tuning.session import run_tune

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "vit_era5.yaml"
# Short lengths like the e2e tune's (--nbatches 3 --ntrials 2 --check_steps 4), and the CLI's default 20 batches.
SHORT = TrialLengths(nwarmup=1, ntrials=2, nbatches=3, check_steps=4)
OTHER_LENGTHS = {
    "nbatches": dataclasses.replace(SHORT, nbatches=20),
    "ntrials": dataclasses.replace(SHORT, ntrials=3),
    "nwarmup": dataclasses.replace(SHORT, nwarmup=2),
    "check_steps": dataclasses.replace(SHORT, check_steps=40),
}


class ClimbReached(Exception):
    """Raised by the stand-in climb: the tune's set-up, cache included, is done."""


class CacheRecordingClimb:
    """Stands in for the climb, which would run real trials: records the cache the tune hands it, finishes one
    trial into it (as a measured start would be), and ends the tune."""

    caches: list[TuneCache] = []

    def __init__(self, backend, context, options, cache: TuneCache, **callbacks):
        self.cache = cache

    def run(self, start: dict) -> None:
        CacheRecordingClimb.caches.append(self.cache)
        self.cache.put(settings_key("measure", start), {"status": "ok", "throughput": 1.0})
        raise ClimbReached


@pytest.fixture
def tune_to_the_climb(tmp_path, monkeypatch):
    """A function running the real ``run_tune`` of the tiny config up to its climb; it returns the cache the
    climb got. Every call writes to the same output, as running the same command again does."""
    monkeypatch.setattr(session, "Climb", CacheRecordingClimb)
    monkeypatch.setattr(session, "setup_logging", lambda *args, **kwargs: None)  # keep pytest's log capture
    monkeypatch.setattr(CacheRecordingClimb, "caches", [])
    source = ConfigSource(str(CONFIG_FILE), "tiny", (f"data.root={tmp_path / 'data'}",))
    out = tmp_path / "tuned" / "tiny_tuned.yaml"

    def tune(lengths: TrialLengths) -> TuneCache:
        with pytest.raises(ClimbReached):
            run_tune(source, out, session.TuneOptions(budget_s=60), lengths, "dlscale tune (test)")
        return CacheRecordingClimb.caches[-1]

    return tune


@pytest.mark.parametrize("changed", sorted(OTHER_LENGTHS))
def test_a_tune_of_other_trial_lengths_does_not_reuse_the_cached_trials(tune_to_the_climb, changed):
    first = tune_to_the_climb(SHORT)
    assert first.resumed == 0 and len(first.entries) == 1
    # The same lengths continue from the cache: the fingerprint is read back and matches.
    assert tune_to_the_climb(SHORT).resumed == 1

    other = tune_to_the_climb(OTHER_LENGTHS[changed])
    assert other.resumed == 0
    assert other.path is not None and other.path.with_suffix(".stale.json").exists()
