"""`dlscale tune` end to end on the tiny config: the climb, its outputs, the tuned config trains, resume; what a
tune runs (numerics checks, the memory bound) on the AFNO and SFNO mixers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dlscale.cli import main
from dlscale.config import load_run_config
from dlscale.config.run_config import SECTION_ORDER
from dlscale.report.summary import RunSummary
from dlscale.runtime.device import Device
from dlscale.runtime.launch import detect_process
from dlscale.tuning.knobs import BATCH_KEY
from dlscale.tuning.run_backend import ConfigSource, RunBackend, TrialLengths
from dlscale.tuning.settings import read_settings

REPO = Path(__file__).resolve().parents[2]
CONFIG_FILE = REPO / "configs" / "vit_era5.yaml"


def _tune(tiny_era5: Path, out: Path, *extra: str) -> int:
    return main(
        [
            "tune", "--yaml_config", str(CONFIG_FILE), "--config", "tiny", "--set", f"data.root={tiny_era5}",
            "--out", str(out), "--budget", "10", "--nbatches", "3", "--ntrials", "2", "--check_steps", "4",
            *extra,
        ]
    )  # fmt: skip


def _differing_keys(first: dict, second: dict) -> dict[str, dict]:
    return {
        section: {k: v for k, v in second[section].items() if first[section][k] != v}
        for section in SECTION_ORDER
        if any(first[section][k] != v for k, v in second[section].items())
    }


# torch.compile is left out: its trial is a cold C++ compile (about 20 s on CI's cores) and adds nothing to what
# the climb's outputs show; tests/tuning/test_tune_climb.py climbs past it.
TUNED_OPTIONS = ("--num_data_workers", "0", "--skip", "enable_jit")


@pytest.fixture(scope="module")
def tuned(tiny_era5: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tune") / "tuned" / "tiny_tuned.yaml"
    assert _tune(tiny_era5, out, *TUNED_OPTIONS) == 0
    return out


@pytest.mark.slow
def test_tune_writes_a_config_that_extends_the_original_with_only_the_changed_keys(tuned, tiny_era5):
    document = yaml.safe_load(tuned.read_text())
    assert list(document) == ["tiny_tuned"]
    section = document["tiny_tuned"]
    assert section["extends"].endswith("vit_era5.yaml:tiny")
    record = json.loads(tuned.with_suffix(".json").read_text())
    original = load_run_config(CONFIG_FILE, "tiny").to_dict()
    written = load_run_config(tuned, "tiny_tuned").to_dict()
    # Exactly the command line's own keys and the kept knobs differ from the original, no other.
    differing = _differing_keys(original, written)
    assert {k: v for k, v in section.items() if k != "extends"} == differing
    assert differing["data"] == {"root": str(tiny_era5)}
    kept = [trial for trial in record["trials"] if trial["decision"] == "kept"]
    for trial in kept:
        for key, value in trial["change"].items():
            if key != "train.local_batch_size":
                section_name, name = key.split(".")
                assert written[section_name][name] == value
    # tiny asks for the global batch: a kept batch is written in its spelling, times the one replica.
    batch = [t["change"]["train.local_batch_size"] for t in kept if "train.local_batch_size" in t["change"]]
    if batch:
        assert written["train"]["global_batch_size"] == batch[-1]
        assert written["train"]["local_batch_size"] is None


@pytest.mark.slow
def test_tune_record_table_and_plot_describe_every_trial(tuned):
    record = json.loads(tuned.with_suffix(".json").read_text())
    assert record["start"]["measurement"]["status"] == "ok"
    # --ntrials 2, or twice that when the start scattered by more than 10% and was measured again
    assert len(record["start"]["measurement"]["throughputs"]["FULL"]) in (2, 4)
    decisions = {trial["label"]: trial["decision"] for trial in record["trials"]}
    # On a CPU the GPU-only knobs are listed as skipped, never measured.
    assert (
        "needs a GPU" in decisions.values()
    )  # CUDA graphs, or compile's reduce-overhead once compile is kept
    assert all(
        trial["measurement"] is None for trial in record["trials"] if trial["decision"] == "needs a GPU"
    )
    # The cheapest knob of the compute group first, when the start's verdict puts that group first (3-batch
    # trials on a busy machine may also read "overhead" or "IO-bound", whose groups start with the data loader).
    verdict = record["start"]["measurement"]["verdict"]
    if verdict not in ("overhead", "IO-bound"):
        assert record["trials"][0]["label"] == "optim.enable_fused=true", verdict
    assert record["stop_reason"]
    table = tuned.with_suffix(".md").read_text()
    for label in decisions:
        assert f"`{label}`" in table
    assert tuned.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_tuned_config_trains(tuned, tmp_path):
    assert main(
        ["train", "--yaml_config", str(tuned), "--config", "tiny_tuned", "--expdir", str(tmp_path), "--num_epochs", "1"]
    ) == 0  # fmt: skip
    summary = json.loads((tmp_path / "tiny_tuned" / "00" / "summary.json").read_text())
    assert summary["outcome"] == "finished"
    written = load_run_config(tuned, "tiny_tuned")
    assert summary["global_batch_size"] == written.train.global_batch_size


@pytest.mark.slow
def test_running_the_same_tune_again_continues_from_its_cache(tuned, tiny_era5, monkeypatch):
    record = json.loads(tuned.with_suffix(".json").read_text())
    # Every trial is in the cache: a second run measures and trains nothing.
    import dlscale.tuning.run_backend as backend

    def must_not_run(*args, **kwargs):
        raise AssertionError("a cached trial was run again")

    monkeypatch.setattr(backend, "bench_one_config", must_not_run)
    monkeypatch.setattr(backend, "train_and_summarize", must_not_run)
    assert _tune(tiny_era5, tuned, *TUNED_OPTIONS) == 0
    again = json.loads(tuned.with_suffix(".json").read_text())
    assert [(t["label"], t["decision"]) for t in again["trials"]] == [
        (t["label"], t["decision"]) for t in record["trials"]
    ]


def test_bad_tune_options_are_one_clear_error(tiny_era5, tmp_path, capsys):
    assert _tune(tiny_era5, tmp_path / "t.yaml", "--budget", "0") == 2
    assert "--budget" in capsys.readouterr().err
    assert _tune(tiny_era5, tmp_path / "t.txt") == 2
    assert ".yaml" in capsys.readouterr().err


def test_a_start_that_cannot_run_is_one_line_naming_the_cause(tmp_path, capsys):
    assert _tune(tmp_path / "no_such_data", tmp_path / "t.yaml") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "could not be measured" in err[0] and "no_such_data" in err[0]
    assert not (tmp_path / "t.yaml").exists()


def test_an_unwritable_output_is_a_storage_error_before_any_trial(tiny_era5, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert _tune(tiny_era5, blocker / "tuned.yaml") == 74
    assert "a_file" in capsys.readouterr().err


def test_skip_names_a_tunable_setting(tiny_era5, tmp_path, capsys):
    assert _tune(tiny_era5, tmp_path / "t.yaml", "--skip", "num_iters") == 2
    assert "no setting the tune changes" in capsys.readouterr().err


@pytest.mark.parametrize("mixer", ["afno", "sfno"])
def test_the_tunes_numerics_checks_and_memory_bound_run_on_a_spectral_mixer(
    mixer, tiny_era5, tmp_path, monkeypatch
):
    """What a tune runs of a config, on the ViT with ``model.mixer`` afno and sfno: the numerics check of a setting
    that changes the numbers (bf16) beside the start's, and the memory planner's bound on the local batch. Its
    throughput trials are `dlscale bench`'s (tests/perf/bench/test_bench.py runs them on both mixers); the climb
    around them sees only their results (tests/tuning/test_tune_climb.py)."""
    # (the end-of-run figures of each check are not under test: a second each)
    monkeypatch.setattr(RunSummary, "_write_figures", lambda self, trainer: [])
    source = ConfigSource(str(CONFIG_FILE), f"{mixer}_tiny", (f"data.root={tiny_era5}",), {})
    start = source.load({"loader.num_data_workers": 0})
    process = detect_process()
    backend = RunBackend(source, start, tmp_path, TrialLengths(check_steps=2), process, Device.select(0), 1)
    settings = read_settings(start, 1)
    start_check = backend.check_numerics(settings)
    bf16 = backend.check_numerics({**settings, "train.amp_mode": "bf16"})
    assert start_check.status == bf16.status == "ok" and start_check.steps == bf16.steps == 2
    assert bf16.loss != start_check.loss and bf16.loss == pytest.approx(start_check.loss, rel=0.05)
    logs = list((tmp_path / "checks" / f"{mixer}_tiny").glob("*/out.log"))
    assert len(logs) == 2 and all(f"mixer {mixer}" in log.read_text() for log in logs)
    assert backend.memory_problem(settings) is None
    # the traced plan of a batch far too large for this machine's memory
    assert "GB" in backend.memory_problem({**settings, BATCH_KEY: 10**7})
