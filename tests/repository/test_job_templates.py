"""The batch templates in scripts/: requeue and exit status come from the run's summary.json, not from the launcher.

Each template runs for real under bash, with stand-ins for srun/jsrun (they write the summary a run would, or
none, and exit with the status a launcher would) and for scontrol (it records a requeue).
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

import dlscale.errors as errors
from dlscale.runtime.signals import STOP_SIGNALS_ENV, parse_signal, stop_signals

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = {
    "slurm-1gpu": REPO / "scripts" / "slurm" / "train_1gpu.sh",
    "slurm-multinode": REPO / "scripts" / "slurm" / "train_multinode.sh",
    "lsf-summit": REPO / "scripts" / "lsf" / "train_summit.lsf",
}
SLURM = ("slurm-1gpu", "slurm-multinode")

# A launcher: records the stop signals dlscale would catch (DLSCALE_STOP_SIGNALS), writes summary.json as dlscale does (a new file replacing the old) unless FAKE_OUTCOME is "none",
# then exits with FAKE_STATUS.
FAKE_LAUNCHER = """#!/bin/bash
echo "${DLSCALE_STOP_SIGNALS:-}" > "$FAKE_STOP_SIGNALS"
if [[ "$FAKE_OUTCOME" != none ]]; then
    mkdir -p "$(dirname "$FAKE_SUMMARY")"
    printf '{\\n  "config": "short",\\n  "outcome": "%s"\\n}\\n' "$FAKE_OUTCOME" > "$FAKE_SUMMARY.tmp"
    mv "$FAKE_SUMMARY.tmp" "$FAKE_SUMMARY"
fi
exit "$FAKE_STATUS"
"""
FAKE_SCONTROL = """#!/bin/bash
echo "$*" >> "$FAKE_REQUEUES"
"""


def executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_template(
    tmp_path: Path, name: str, outcome: str, status: int, earlier: str | None = None, **env: str
):
    """Run template ``name`` whose launch writes ``outcome`` ("none": no summary) and exits ``status``, in a run
    directory that holds an earlier attempt's summary with ``earlier`` as its outcome (None: no summary).
    Returns (the script's exit status, the requeues it asked for, its output)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for launcher in ("srun", "jsrun"):
        executable(bin_dir / launcher, FAKE_LAUNCHER)
    executable(bin_dir / "scontrol", FAKE_SCONTROL)
    summary = tmp_path / "runs" / "short" / "00" / "summary.json"
    if earlier is not None:
        summary.parent.mkdir(parents=True, exist_ok=True)
        summary.write_text(json.dumps({"config": "short", "outcome": earlier}, indent=2))
    hosts = tmp_path / "hostfile"
    hosts.write_text("batch1\n" + "h1\n" * 42 + "h2\n" * 42)
    requeues = tmp_path / "requeues.txt"
    environment = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "EXPDIR": str(tmp_path / "runs"),
        "SLURM_JOB_ID": "4242",
        "LSB_DJOB_HOSTFILE": str(hosts),
        "FAKE_OUTCOME": outcome,
        "FAKE_STATUS": str(status),
        "FAKE_SUMMARY": str(summary),
        "FAKE_REQUEUES": str(requeues),
        "FAKE_STOP_SIGNALS": str(tmp_path / "stop_signals.txt"),
    }
    for inherited in ("SCRATCH", "SBATCH_SIGNAL", "DLSCALE_STOP_SIGNALS"):
        environment.pop(inherited, None)
    environment.update(env)
    result = subprocess.run(
        ["bash", str(TEMPLATES[name])],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    asked = requeues.read_text().splitlines() if requeues.exists() else []
    return result.returncode, asked, result.stdout + result.stderr


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("launcher_status", [0, 1], ids=["srun-passes-0", "torchrun-turns-it-into-1"])
def test_a_stopped_run_is_requeued_and_succeeds_whatever_the_launcher_says(tmp_path, name, launcher_status):
    status, requeues, output = run_template(tmp_path, name, "stopped", launcher_status)
    assert status == 0, output
    assert requeues == (["requeue 4242"] if name in SLURM else []), output


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_finished_run_succeeds_and_is_not_requeued(tmp_path, name):
    status, requeues, output = run_template(tmp_path, name, "finished", 0, earlier="stopped")
    assert (status, requeues) == (0, []), output


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_diverged_run_fails_with_3_and_is_not_requeued_even_when_the_launcher_says_1(tmp_path, name):
    status, requeues, output = run_template(tmp_path, name, "diverged", 1, earlier="stopped")
    assert (status, requeues) == (3, []), output
    assert "diverged" in output


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("launcher_status", [75, 1], ids=["srun-says-75", "torchrun-says-1"])
def test_a_refused_launch_is_not_requeued_on_the_previous_attempts_summary(tmp_path, name, launcher_status):
    # The run directory is in use (75): this launch writes no summary; the one there is an earlier attempt's.
    status, requeues, output = run_template(tmp_path, name, "none", launcher_status, earlier="stopped")
    assert (status, requeues) == (launcher_status, []), output


@pytest.mark.parametrize("name", SLURM)
def test_a_profiling_run_that_stopped_is_not_requeued(tmp_path, name):
    status, requeues, output = run_template(tmp_path, name, "stopped", 0, PROFILE="1")
    assert (status, requeues) == (0, []), output


def test_the_docs_say_what_each_status_becomes_under_srun_and_torchrun():
    page = (REPO / "docs" / "troubleshooting.md").read_text()  # "When things go wrong"
    rows = {
        int(match.group(1)): (match.group(2), match.group(3))
        for match in re.finditer(r"^\| (\d+) \| .* \| (\d+) \| (.*) \|$", page, re.MULTILINE)
    }
    codes = {0} | {
        cls.exit_code for cls in vars(errors).values() if isinstance(getattr(cls, "exit_code", None), int)
    }
    assert set(rows) == codes
    for code, (under_srun, under_torchrun) in rows.items():
        assert int(under_srun) == code  # srun passes the highest status of its tasks through
        assert under_torchrun == (
            "0 when finished; **1** when stopped by a signal sent to torchrun" if code == 0 else "1"
        )
    assert "read `outcome` in `summary.json`, not the exit status" in page


@pytest.mark.parametrize(
    ("env", "caught"),
    [
        pytest.param({}, "USR1", id="the-SBATCH-line"),
        pytest.param({"SBATCH_SIGNAL": "USR2@300"}, "USR2", id="SBATCH_SIGNAL"),
        pytest.param({"SBATCH_SIGNAL": "R:12@60"}, "12", id="reservation-prefix-and-number"),
        pytest.param(
            {"SBATCH_SIGNAL": "TERM@60", "DLSCALE_STOP_SIGNALS": "HUP"}, "HUP,TERM", id="user-adds-one"
        ),
    ],
)
@pytest.mark.parametrize("name", SLURM)
def test_slurm_templates_tell_dlscale_the_signal_slurm_sends(tmp_path, name, env, caught):
    status, _, output = run_template(tmp_path, name, "stopped", 0, **env)
    assert status == 0, output
    sent = (tmp_path / "stop_signals.txt").read_text().strip()
    assert sent == caught
    assert all(
        signum in stop_signals({STOP_SIGNALS_ENV: sent}) for signum in map(parse_signal, sent.split(","))
    )


@pytest.mark.parametrize("name", SLURM)
def test_slurm_templates_refuse_a_signal_for_the_batch_script_only(tmp_path, name):
    status, requeues, output = run_template(tmp_path, name, "stopped", 0, SBATCH_SIGNAL="B:USR1@120")
    assert (status, requeues) == (2, []), output
    assert "the B: prefix signals only this batch script" in output
    assert not (tmp_path / "stop_signals.txt").exists()  # dlscale was never launched
