"""How ``dlscale forecast`` and ``dlscale evaluate`` name their results' directories: the default options keep
the old names, every option that changes the results adds a canonical part (the same however it was written),
and a directory about to be replaced is named with its checkpoint's step and when it was written."""

from __future__ import annotations

import json
import os
import re
from datetime import datetime

import pytest

from dlscale.run.forecast_times import DEFAULT_INIT, DEFAULT_LEAD
from dlscale.run.results_directory import (
    duration_label,
    forecast_name_parts,
    override_name_part,
    replacement_notice,
    results_directory_name,
)

HOMES = {"lr": "optim", "tensor_parallel": "parallel", "limit_nsamples_val": "data"}
SAFE_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")


def forecast_name(
    lead=DEFAULT_LEAD, init=DEFAULT_INIT, count=None, write=None, step_hours=6.0, overrides=(), names="wb2"
):
    parts = forecast_name_parts(
        lead, init, count, write, step_hours, override_name_part(overrides, HOMES), names
    )
    return results_directory_name("test", "ckpt_latest", parts)


def test_the_default_options_keep_the_names_results_always_had():
    assert forecast_name() == "test-ckpt_latest"
    assert results_directory_name("valid", "ckpt_best") == "valid-ckpt_best"
    assert override_name_part([], HOMES) is None
    # The defaults written another way are the defaults: 240 h is 10 d, every:2 model steps of 6 h is 12 h.
    assert forecast_name(lead="240h", init="every:2") == "test-ckpt_latest"
    assert forecast_name(init="every:1", step_hours=12.0) == "test-ckpt_latest"


def test_each_option_that_changes_the_results_adds_a_readable_part_in_a_fixed_order():
    name = forecast_name("2d", "every:1d", 8, "netcdf", overrides=["optim.lr=1e-3"])
    assert re.fullmatch(r"test-ckpt_latest-lead2d-every1d-init8-netcdf-set-[0-9a-f]{8}", name), name
    assert forecast_name(lead="2d", count=8) == "test-ckpt_latest-lead2d-init8"
    assert forecast_name(write="zarr") == "test-ckpt_latest-zarr"
    # the file's variable names are part of what a written forecast is; without a file they change nothing
    assert forecast_name(write="netcdf", names="short") == "test-ckpt_latest-netcdf-short"
    assert forecast_name(names="short") == "test-ckpt_latest"


@pytest.mark.parametrize(
    ("spellings", "label"),
    [
        (["2d", "48h", "2880m", "2.0d", " 48 h"], "lead2d"),
        (["36h", "1.5d", "2160m"], "lead36h"),
        (["90m", "1.5h"], "lead90m"),
    ],
)
def test_a_lead_written_in_other_units_names_the_same_directory(spellings, label):
    assert {forecast_name(lead=lead) for lead in spellings} == {f"test-ckpt_latest-{label}"}


def test_initial_times_are_named_by_their_spacing_in_hours_or_their_dates():
    assert {forecast_name(init=init) for init in ("every:1d", "every:24h", "every:4")} == {
        "test-ckpt_latest-every1d"
    }
    assert forecast_name(init="every:2", step_hours=12.0) == "test-ckpt_latest-every1d"
    assert forecast_name(init="every:6h") == "test-ckpt_latest-every6h"
    assert forecast_name(init="2018-01-01T00") == forecast_name(init=" 2018-01-01T00:00 ")
    assert forecast_name(init="2018-01-01T00") == "test-ckpt_latest-at20180101T00"
    assert forecast_name(init="2018-01-01T12:30") == "test-ckpt_latest-at20180101T1230"
    several = forecast_name(init="2018-01-01T00,2018-03-15T12")
    assert re.fullmatch(r"test-ckpt_latest-at2dates-[0-9a-f]{8}", several), several
    assert forecast_name(init="2018-01-01T00:00, 2018-03-15T12:00") == several
    assert forecast_name(init="2018-01-01T00,2018-03-15T18") != several
    assert forecast_name(init="2018-03-15T12,2018-01-01T00") != several  # the document lists them in order


def test_set_changes_name_the_same_hash_however_they_are_written_and_a_different_one_for_other_values():
    part = override_name_part(["optim.lr=1e-3", "data.limit_nsamples_val=1"], HOMES)
    assert part is not None and re.fullmatch(r"set-[0-9a-f]{8}", part)
    assert override_name_part(["limit_nsamples_val=1", " lr =1e-3"], HOMES) == part  # flat keys, any order
    assert override_name_part(["optim.lr=5", "data.limit_nsamples_val=1", "optim.lr=1e-3"], HOMES) == part
    assert override_name_part(["optim.lr=1e-3", "data.limit_nsamples_val=2"], HOMES) != part
    assert override_name_part(["optim.lr=1e-3"], HOMES) != part


def test_set_changes_of_the_layout_and_the_loader_leave_the_name_alone():
    layout = ["parallel.tensor_parallel=2", "tensor_parallel=2", "loader.num_data_workers=4"]
    assert override_name_part(layout, HOMES) is None
    assert override_name_part([*layout, "optim.lr=1e-3"], HOMES) == override_name_part(
        ["optim.lr=1e-3"], HOMES
    )


def test_every_name_is_safe_in_a_path():
    names = [
        forecast_name("36h", "2018-01-01T12:30", 3, "zarr", overrides=["data.root=/scratch/my era5:x"]),
        forecast_name(init="2018-01-01T00,2018-03-15T12", overrides=["log.image_channel=t 2m"]),
        forecast_name(lead="90m", init="every:45m"),
    ]
    for name in names:
        assert SAFE_NAME.match(name), name
    assert duration_label(0.75) == "45m"


def test_nothing_to_replace_is_no_notice(tmp_path):
    assert replacement_notice(tmp_path / "test-ckpt_latest", "scores.json", "forecast") is None


def test_the_notice_names_the_earlier_checkpoints_step_and_when_it_was_written(tmp_path):
    directory = tmp_path / "forecast" / "test-ckpt_latest"
    directory.mkdir(parents=True)
    (directory / "scores.json").write_text(json.dumps({"global_step": 400, "split": "test"}))
    written = datetime(2026, 11, 26, 10, 2, 41).timestamp()
    os.utime(directory / "scores.json", (written, written))
    assert replacement_notice(directory, "scores.json", "forecast") == (
        f"This forecast will replace {directory} (step 400, written 2026-11-26 10:02)"
    )
    (directory / "scores.json").write_text(json.dumps({"global_step": None}))
    assert "(step unknown, written " in replacement_notice(directory, "scores.json", "forecast")


def test_a_directory_without_a_readable_document_is_still_named_with_its_time(tmp_path):
    directory = tmp_path / "eval" / "valid-ckpt_latest"
    directory.mkdir(parents=True)
    (directory / "metrics.json").write_text("{not json")
    written = datetime(2026, 1, 2, 3, 4).timestamp()
    os.utime(directory, (written, written))
    assert replacement_notice(directory, "metrics.json", "evaluation") == (
        f"This evaluation will replace {directory} (no readable metrics.json, written 2026-01-02 03:04)"
    )


def test_a_named_climatology_has_a_part_of_its_own(tmp_path):
    def named(climatology):
        parts = forecast_name_parts(DEFAULT_LEAD, DEFAULT_INIT, None, None, 6.0, None, "wb2", climatology)
        return results_directory_name("test", "ckpt_latest", parts)

    assert named(None) == "test-ckpt_latest"  # the data's default climatology
    assert named("time-mean") == "test-ckpt_latest-clim-timemean"
    one, other = named(str(tmp_path / "a.zarr")), named(str(tmp_path / "b.zarr"))
    assert one.startswith("test-ckpt_latest-clim-") and one != other and SAFE_NAME.match(one)
    assert named(str(tmp_path / "a.zarr")) == one  # the same store, the same directory


@pytest.mark.parametrize(
    ("members", "perturb", "part"),
    [
        (16, "gaussian:0.050", "ens16-gaussian0.05"),
        (16, "gaussian:5e-2", "ens16-gaussian0.05"),
        (4, "gaussian:0.1:250", "ens4-gaussian0.1-250km"),
        (8, "dropout", "ens8-dropout"),
    ],
)
def test_an_ensemble_names_its_members_and_perturbation_however_they_were_written(members, perturb, part):
    parts = forecast_name_parts("10d", "every:12h", None, None, 6.0, None, members=members, perturb=perturb)
    assert parts == [part]
    assert forecast_name_parts("10d", "every:12h", None, None, 6.0, None) == []  # one member: no part
