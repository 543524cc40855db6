"""Config files: reading YAML (extends, deep `<<` merges, YAML-1.2 floats, ${VAR}) and typed coercion."""

from __future__ import annotations

import textwrap
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from dlscale.config import load_run_config, yaml_source
from dlscale.config.typed import build_section, coerce, describe, section_to_dict
from dlscale.config.yaml_source import (
    MAX_EXPANDED_NODES,
    SHIPPED_CONFIGS,
    deep_merge,
    parse_yaml_value,
    read_config_file,
    resolve_section,
)
from dlscale.data.era5.config import ERA5DataConfig
from dlscale.errors import ConfigError
from dlscale.models.vit_config import ViTConfig
from dlscale.report.log_config import LogConfig


def write(tmp_path: Path, text: str, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def resolve(tmp_path: Path, text: str, name: str) -> dict:
    path = write(tmp_path, text)
    return resolve_section(read_config_file(path), name, path)


def error_of(call, *args) -> str:
    with pytest.raises(ConfigError) as info:
        call(*args)
    return str(info.value)


def assert_names(message: str, *fragments: str) -> None:
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from: {message}"


# --------------------------------------------------------------------------------------------- extends


FAMILY = """
    base:
      name: base
      optim: {optimizer: Adam, lr: 5E-4, warmup: 10, betas: [0.9, 0.95]}
      train: {global_batch_size: 16, num_iters: 100}
    child:
      extends: base
      name: child
      optim: {lr: 1e-3}
    grandchild:
      extends: child
      train: {num_iters: 7}
    left:
      optim: {lr: 1.0, warmup: 1}
      only_left: 1
    right:
      optim: {lr: 2.0}
      only_right: 2
    both:
      extends: [left, right]
      train: {seed: 3}
"""


def test_extends_inherits_and_the_child_overrides(tmp_path):
    child = resolve(tmp_path, FAMILY, "child")
    assert child["name"] == "child"
    assert child["train"] == {"global_batch_size": 16, "num_iters": 100}
    assert "extends" not in child


def test_extends_merges_nested_sections_deeply(tmp_path):
    child = resolve(tmp_path, FAMILY, "child")
    assert child["optim"] == {"optimizer": "Adam", "lr": 1e-3, "warmup": 10, "betas": [0.9, 0.95]}


def test_extends_chains_through_several_generations(tmp_path):
    grandchild = resolve(tmp_path, FAMILY, "grandchild")
    assert grandchild["optim"]["lr"] == 1e-3 and grandchild["optim"]["warmup"] == 10
    assert grandchild["train"] == {"global_batch_size": 16, "num_iters": 7}
    assert grandchild["name"] == "child"


def test_extends_list_merges_left_to_right(tmp_path):
    both = resolve(tmp_path, FAMILY, "both")
    assert both["optim"] == {"lr": 2.0, "warmup": 1}  # right wins on lr, left's warmup survives
    assert both["only_left"] == 1 and both["only_right"] == 2
    assert both["train"] == {"seed": 3}


def test_resolving_a_child_does_not_change_its_parent(tmp_path):
    path = write(tmp_path, FAMILY)
    document = read_config_file(path)
    resolve_section(document, "grandchild", path)
    assert resolve_section(document, "base", path)["optim"]["lr"] == 5e-4
    assert document["child"]["extends"] == "base"


def test_deep_merge_keeps_inputs_and_replaces_non_mappings():
    base = {"a": {"x": 1, "y": 2}, "b": [1, 2], "c": 1}
    override = {"a": {"y": 3}, "b": [3], "c": {"z": 1}}
    assert deep_merge(base, override) == {"a": {"x": 1, "y": 3}, "b": [3], "c": {"z": 1}}
    assert base == {"a": {"x": 1, "y": 2}, "b": [1, 2], "c": 1}
    assert override == {"a": {"y": 3}, "b": [3], "c": {"z": 1}}


def test_yaml_anchor_merge_is_deep(tmp_path):
    text = """
        base: &base
          optim: {lr: 5E-4, warmup: 10}
          train: {num_iters: 100}
        child:
          <<: *base
          optim: {lr: 1e-3}
    """
    child = resolve(tmp_path, text, "child")
    assert child["optim"] == {"lr": 1e-3, "warmup": 10}
    assert child["train"] == {"num_iters": 100}
    assert resolve(tmp_path, text, "base")["optim"] == {"lr": 5e-4, "warmup": 10}


def test_yaml_merge_of_several_anchors_is_deep_and_the_first_anchor_wins(tmp_path):
    text = """
        a: &a {optim: {lr: 1.0, warmup: 1}}
        b: &b {optim: {lr: 2.0, eps: 0.1}}
        child:
          <<: [*a, *b]
          optim: {end_lr: 0.5}
    """
    assert resolve(tmp_path, text, "child")["optim"] == {"lr": 1.0, "warmup": 1, "eps": 0.1, "end_lr": 0.5}


# The merge rule is dlscale's own (YAML 1.1's merge key, deepened), the same with every PyYAML: 6.0.4 changed
# its own answer for a merge list. The floors job (make test-oldest) runs these cases with the oldest PyYAML.
MERGE_RULE_CASES = [
    # an earlier mapping of the list wins a scalar, whether it comes first in the file or not
    ("a: &a {o: 1}\nb: &b {o: {lr: 2}}\nc: {<<: [*a, *b]}\n", {"o": 1}),
    ("a: &a {o: 1}\nb: &b {o: {lr: 2}}\nc: {<<: [*b, *a]}\n", {"o": {"lr": 2}}),
    # three mappings: each key from the first that has it; mappings merge deeply
    (
        "a: &a {o: {lr: 1}}\nb: &b {o: {lr: 2, w: 2}}\nd: &d {o: {lr: 3, w: 3, e: 3}, x: 4}\n"
        "c: {<<: [*a, *b, *d]}\n",
        {"o": {"lr": 1, "w": 2, "e": 3}, "x": 4},
    ),
    # the mapping's own keys win over every merged one, written before or after the << key
    ("a: &a {o: {lr: 1, w: 1}, x: 1}\nc: {x: 2, <<: *a, o: {lr: 9}}\n", {"o": {"lr": 9, "w": 1}, "x": 2}),
    # a merged anchor that merges another: its own keys win inside it too
    (
        "a: &a {o: {lr: 1}}\nb: &b {<<: *a, o: {w: 2}}\nc: {<<: [*b], o: {e: 3}}\n",
        {"o": {"lr": 1, "w": 2, "e": 3}},
    ),
]


@pytest.mark.parametrize(("text", "expected"), MERGE_RULE_CASES)
def test_merge_keys_follow_dlscales_rule_whatever_the_pyyaml(tmp_path, text, expected):
    assert resolve(tmp_path, text, "c") == expected


def test_merge_keys_leave_the_merged_anchors_as_written(tmp_path):
    text = "a: &a {o: {lr: 1}}\nb: &b {o: {w: 2}}\nc: {<<: [*a, *b]}\n"
    document = read_config_file(write(tmp_path, text))
    assert document["a"] == {"o": {"lr": 1}} and document["b"] == {"o": {"w": 2}}
    assert document["c"] == {"o": {"lr": 1, "w": 2}}


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("a: &a {x: 1}\nb: &b {y: 1}\nc: {<<: *a, <<: *b}\n", ["more than one << merge key", "line 3"]),
        ("a: &a 3\nc: {<<: *a}\n", ["expected a mapping or a list of mappings", "found scalar", "line 2"]),
        ("a: &a {x: 1}\nc: {<<: [*a, 3]}\n", ["expected a mapping or a list of mappings", "found scalar"]),
        ("a: &a {x: 1, <<: *a}\n", ["merges itself", "line 1"]),
    ],
    ids=["two-merge-keys", "scalar", "scalar-in-list", "merges-itself"],
)
def test_merge_keys_that_cannot_mean_one_thing_are_refused(tmp_path, text, fragments):
    path = write(tmp_path, text)
    assert_names(error_of(read_config_file, path), str(path), "not valid YAML", *fragments)


@pytest.mark.parametrize(
    ("text", "chain"),
    [
        ("a: {extends: b}\nb: {extends: a}\n", "a -> b -> a"),
        ("a: {extends: a}\n", "a -> a"),
        ("a: {extends: b}\nb: {extends: c}\nc: {extends: a}\n", "a -> b -> c -> a"),
    ],
)
def test_inheritance_cycles_are_reported(tmp_path, text, chain):
    path = write(tmp_path, text)
    message = error_of(resolve_section, read_config_file(path), "a", path)
    assert_names(message, str(path), "inherit in a cycle")
    assert message.endswith(f"cycle: {chain}")


def test_unknown_parent_is_named_with_a_suggestion(tmp_path):
    path = write(tmp_path, "base: {x: 1}\nchild: {extends: bsae}\n")
    message = error_of(resolve_section, read_config_file(path), "child", path)
    assert_names(message, str(path), "'child'", "'bsae'", "not defined", "did you mean 'base'?")


def test_unknown_config_name_is_named_with_a_suggestion_and_the_list(tmp_path):
    path = write(tmp_path, "base: {x: 1}\nshort: {x: 2}\n")
    message = error_of(resolve_section, read_config_file(path), "shrot", path)
    assert_names(message, str(path), "no config named 'shrot'", "did you mean 'short'?", "base, short")


@pytest.mark.parametrize("extends", ["5", "[base, 3]", "{base: 1}"])
def test_extends_must_be_a_name_or_a_list_of_names(tmp_path, extends):
    path = write(tmp_path, f"base: {{x: 1}}\nchild: {{extends: {extends}}}\n")
    message = error_of(resolve_section, read_config_file(path), "child", path)
    assert_names(message, str(path), "'child'", "'extends' must be a config name or a list of names")


OTHER = """
    base:
      optim: {optimizer: Adam, lr: 5E-4, warmup: 10}
      train: {num_iters: 100}
    mid:
      extends: base
      train: {seed: 7}
"""


def test_extends_a_config_of_another_file_and_merges_deeply(tmp_path):
    write(tmp_path, OTHER, "other.yaml")
    path = write(tmp_path, "tuned:\n  extends: other.yaml:base\n  optim: {lr: 1e-3}\n", "tuned.yaml")
    tuned = resolve_section(read_config_file(path), "tuned", path)
    assert tuned == {"optim": {"optimizer": "Adam", "lr": 1e-3, "warmup": 10}, "train": {"num_iters": 100}}


def test_another_file_is_found_relative_to_the_including_file(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    (tmp_path / "tuned").mkdir()
    write(tmp_path / "configs", OTHER, "other.yaml")
    path = write(tmp_path / "tuned", "tuned: {extends: ../configs/other.yaml:base}\n", "tuned.yaml")
    # From here, ../configs/other.yaml is a decoy: the including file's directory must win.
    (tmp_path / "elsewhere" / "sub").mkdir(parents=True)
    (tmp_path / "elsewhere" / "configs").mkdir()
    write(tmp_path / "elsewhere" / "configs", "base: {train: {num_iters: 1}}\n", "other.yaml")
    monkeypatch.chdir(tmp_path / "elsewhere" / "sub")
    assert resolve_section(read_config_file(path), "tuned", path)["train"] == {"num_iters": 100}


def test_the_other_files_own_extends_refer_to_its_configs(tmp_path):
    write(tmp_path, OTHER, "other.yaml")
    # This file has a 'base' too; other.yaml's `extends: base` must still mean other.yaml's base.
    text = "base: {optim: {lr: 9.0}, only_here: 1}\ntuned: {extends: other.yaml:mid}\n"
    path = write(tmp_path, text, "tuned.yaml")
    tuned = resolve_section(read_config_file(path), "tuned", path)
    assert tuned == {
        "optim": {"optimizer": "Adam", "lr": 5e-4, "warmup": 10},
        "train": {"num_iters": 100, "seed": 7},
    }


def test_extends_list_mixes_same_file_and_other_file_parents(tmp_path):
    write(tmp_path, OTHER, "other.yaml")
    text = """
        local: {optim: {lr: 1.0, eps: 0.1}, train: {num_iters: 5}}
        tuned: {extends: [local, other.yaml:mid], optim: {warmup: 3}}
        reverse: {extends: [other.yaml:mid, local]}
    """
    path = write(tmp_path, text, "tuned.yaml")
    document = read_config_file(path)
    tuned = resolve_section(document, "tuned", path)
    assert tuned["optim"] == {"lr": 5e-4, "eps": 0.1, "optimizer": "Adam", "warmup": 3}
    assert tuned["train"] == {"num_iters": 100, "seed": 7}
    assert resolve_section(document, "reverse", path)["train"] == {"num_iters": 5, "seed": 7}


def test_each_other_file_is_read_once(tmp_path, monkeypatch):
    write(tmp_path, OTHER, "other.yaml")
    path = write(tmp_path, "tuned: {extends: [other.yaml:base, ./other.yaml:mid]}\n", "tuned.yaml")
    document = read_config_file(path)
    reads: list[Path] = []

    def counting_read(file: str | Path) -> dict:
        reads.append(Path(file))
        return read_config_file(file)

    monkeypatch.setattr(yaml_source, "read_config_file", counting_read)
    assert resolve_section(document, "tuned", path)["train"] == {"num_iters": 100, "seed": 7}
    assert reads == [(tmp_path / "other.yaml").resolve()]


def test_another_file_not_beside_the_including_file_is_found_as_yaml_config_would_be(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no vit_era5.yaml here either: the shipped one is meant
    path = write(tmp_path, "tuned: {extends: vit_era5.yaml:tiny}\n", "tuned.yaml")
    assert resolve_section(read_config_file(path), "tuned", path)["data"]["root"] == "data/era5_tiny"


def test_missing_other_file_is_named(tmp_path):
    path = write(tmp_path, "tuned: {extends: ../configs/nope.yaml:demo}\n", "tuned.yaml")
    message = error_of(resolve_section, read_config_file(path), "tuned", path)
    assert_names(
        message,
        f"{path}: config 'tuned' extends '../configs/nope.yaml:demo': no such file",
        str(tmp_path.resolve()),
    )


def test_missing_config_of_other_file_is_named_with_a_suggestion(tmp_path):
    other = write(tmp_path, OTHER, "other.yaml")
    path = write(tmp_path, "tuned: {extends: other.yaml:bsae}\n", "tuned.yaml")
    message = error_of(resolve_section, read_config_file(path), "tuned", path)
    assert_names(message, str(path), str(other.resolve()), "'bsae'", "did you mean 'base'?", "base, mid")


def test_inheritance_cycles_across_files_name_file_and_config(tmp_path):
    a = write(tmp_path, "x: {extends: b.yaml:y}\n", "a.yaml")
    b = write(tmp_path, "y: {extends: a.yaml:x}\n", "b.yaml")
    message = error_of(resolve_section, read_config_file(a), "x", a)
    assert message.endswith(f"configs inherit in a cycle: {a}:x -> {b.resolve()}:y -> {a}:x")


def test_a_name_with_a_colon_but_no_yaml_suffix_is_a_config_of_the_same_file(tmp_path):
    text = """
        "opt:fast": {optim: {lr: 2.0}}
        child: {extends: "opt:fast"}
        orphan: {extends: "other.txt:base"}
    """
    path = write(tmp_path, text)
    document = read_config_file(path)
    assert resolve_section(document, "child", path) == {"optim": {"lr": 2.0}}
    message = error_of(resolve_section, document, "orphan", path)
    assert_names(message, str(path), "'orphan' extends 'other.txt:base', which is not defined")


def test_run_config_of_a_tuned_file_inherits_every_other_value_of_tiny(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "tuned").mkdir()
    original = tmp_path / "configs" / "vit_era5.yaml"
    original.write_text((SHIPPED_CONFIGS / "vit_era5.yaml").read_text())
    text = "tiny_tuned:\n  extends: ../configs/vit_era5.yaml:tiny\n  train: {enable_jit: true}\n"
    tuned_path = write(tmp_path / "tuned", text, "tuned.yaml")
    tiny = load_run_config(original, "tiny").to_dict()
    tuned = load_run_config(tuned_path, "tiny_tuned").to_dict()
    assert tiny["train"]["enable_jit"] is False and tuned["train"]["enable_jit"] is True
    tuned["train"]["enable_jit"] = False
    assert tuned == tiny


def test_run_config_names_the_other_file_of_a_bad_flat_key(tmp_path):
    other = write(tmp_path, "base: {lr: 1e-3, bogus_key: 1}\n", "other.yaml")
    tuned_path = write(
        tmp_path, "tuned: {extends: other.yaml:base, train: {enable_jit: true}}\n", "tuned.yaml"
    )
    message = error_of(load_run_config, tuned_path, "tuned")
    assert_names(message, f"{other.resolve()} [config 'base']: unknown key 'bogus_key'")


@pytest.mark.parametrize(("text", "kind"), [("base: [1, 2]\n", "list"), ("base: 5\n", "int")])
def test_a_config_that_is_not_a_mapping_is_refused(tmp_path, text, kind):
    path = write(tmp_path, text)
    assert_names(error_of(read_config_file, path), str(path), "'base'", "must be a mapping", kind)


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "just text\n", "{}\n"])
def test_a_file_that_is_not_a_mapping_of_configs_is_refused(tmp_path, text):
    path = write(tmp_path, text)
    assert_names(error_of(read_config_file, path), str(path), "expected a mapping of config names")


def test_invalid_yaml_names_the_file(tmp_path):
    path = write(tmp_path, "base:\n  lr: [1, 2\n  x: 1\n")
    assert_names(error_of(read_config_file, path), str(path), "not valid YAML")


def test_missing_file_is_named(tmp_path):
    path = tmp_path / "nowhere.yaml"
    assert_names(error_of(read_config_file, path), str(path), "does not exist", "--yaml_config")


# --------------------------------------------------------------------------------------------- scalars


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5E-4", 5e-4),
        ("1e-3", 1e-3),
        ("2.E-4", 2e-4),
        ("7.07e-4", 7.07e-4),
        ("2E-3", 2e-3),
        ("1e3", 1000.0),
        ("-1.5e+2", -150.0),
        ("0.5", 0.5),
        (".5", 0.5),
        ("1.", 1.0),
        ("1_000.5", 1000.5),
    ],
)
def test_yaml_1_2_floats_are_floats(tmp_path, text, expected):
    path = write(tmp_path, f"base:\n  value: {text}\n  listed: [{text}]\n")
    values = read_config_file(path)["base"]
    for value in (values["value"], values["listed"][0], parse_yaml_value(text)):
        assert isinstance(value, float)
        assert value == pytest.approx(expected, rel=1e-12)


def test_infinity_and_nan_still_parse():
    assert parse_yaml_value(".inf") == float("inf")
    assert parse_yaml_value("-.inf") == float("-inf")
    assert parse_yaml_value(".nan") != parse_yaml_value(".nan")


@pytest.mark.parametrize("text", ["'5E-4'", '"5E-4"', "'1e-3'", "'7.07e-4'"])
def test_quoted_numbers_stay_strings(tmp_path, text):
    path = write(tmp_path, f"base:\n  value: {text}\n")
    value = read_config_file(path)["base"]["value"]
    assert value == text.strip("'\"")
    assert isinstance(value, str)


@pytest.mark.parametrize(("text", "expected"), [("16", 16), ("0", 0), ("-3", -3), ("30000", 30000)])
def test_integers_stay_integers(tmp_path, text, expected):
    path = write(tmp_path, f"base:\n  value: {text}\n")
    value = read_config_file(path)["base"]["value"]
    assert value == expected and type(value) is int
    assert type(parse_yaml_value(text)) is int


def test_other_scalars_keep_their_yaml_meaning():
    assert parse_yaml_value("true") is True
    assert parse_yaml_value("null") is None
    assert parse_yaml_value("none") == "none"
    assert parse_yaml_value("[32, 64]") == [32, 64]
    assert parse_yaml_value("tp-cp-dp") == "tp-cp-dp"


def test_an_unparsable_command_line_value_is_named():
    assert_names(error_of(parse_yaml_value, "[1, 2"), "cannot parse value '[1, 2'")


# --------------------------------------------------------------------------------------------- ${VAR}


ENV_TEXT = """
    base:
      data: {root: "${DLSCALE_TEST_ROOT}", stats: "${DLSCALE_TEST_ROOT}/stats/${DLSCALE_TEST_SUB}"}
      listed: ["${DLSCALE_TEST_SUB}", 3]
      number: 5
    fallback:
      data: {root: "${DLSCALE_TEST_ROOT:-/data}"}
"""


def test_env_variables_are_expanded_everywhere_in_strings(tmp_path, monkeypatch):
    monkeypatch.setenv("DLSCALE_TEST_ROOT", "/scratch/era5")
    monkeypatch.setenv("DLSCALE_TEST_SUB", "v2")
    base = resolve(tmp_path, ENV_TEXT, "base")
    assert base["data"] == {"root": "/scratch/era5", "stats": "/scratch/era5/stats/v2"}
    assert base["listed"] == ["v2", 3]
    assert base["number"] == 5


def test_an_unset_env_variable_names_the_file_config_key_and_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("DLSCALE_TEST_ROOT", raising=False)
    monkeypatch.setenv("DLSCALE_TEST_SUB", "v2")
    path = write(tmp_path, ENV_TEXT)
    message = error_of(resolve_section, read_config_file(path), "base", path)
    assert_names(message, str(path), "'base'", "data.root", "DLSCALE_TEST_ROOT", "is not set", ":-default")


def test_env_default_is_used_only_when_the_variable_is_unset(tmp_path, monkeypatch):
    monkeypatch.delenv("DLSCALE_TEST_ROOT", raising=False)
    assert resolve(tmp_path, ENV_TEXT, "fallback")["data"]["root"] == "/data"
    monkeypatch.setenv("DLSCALE_TEST_ROOT", "/scratch/era5")
    assert resolve(tmp_path, ENV_TEXT, "fallback")["data"]["root"] == "/scratch/era5"


def test_env_default_is_used_when_the_variable_is_empty(tmp_path, monkeypatch):
    monkeypatch.setenv("DLSCALE_TEST_ROOT", "")
    assert resolve(tmp_path, ENV_TEXT, "fallback")["data"]["root"] == "/data"


# --------------------------------------------------------------------------------------------- aliases


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """A "billion laughs" config: each anchor lists the one before ``width`` times (width**levels values)."""
    lines = ["anchors:", f"  l0: &l0 [{', '.join(['x'] * width)}]"]
    for level in range(1, levels):
        lines.append(f"  l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * width)}]")
    lines.append(f"base: {{data: {{root: *l{levels - 1}}}}}")
    return "\n".join(lines) + "\n"


def merge_bomb(levels: int, width: int = 9) -> str:
    """Two chains of mappings whose keys alias the level below, merged with ``<<:``: merging them key by key
    visits every path through the aliases, width**levels of them."""
    keys = [f"k{i}" for i in range(width)]
    lines = ["anchors:"]
    for chain in ("p", "q"):
        lines.append(f"  {chain}0: &{chain}0 {{{', '.join(f'{k}: x' for k in keys)}}}")
        for level in range(1, levels):
            values = ", ".join(f"{k}: *{chain}{level - 1}" for k in keys)
            lines.append(f"  {chain}{level}: &{chain}{level} {{{values}}}")
    lines.append(f"base: {{data: {{<<: [*p{levels - 1}, *q{levels - 1}]}}}}")
    return "\n".join(lines) + "\n"


def peak_memory_and_seconds_of(call, *args) -> tuple[str, float, float]:
    """The ConfigError message of ``call(*args)``, the peak memory it allocated (MB) and its duration (s)."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        message = error_of(call, *args)
        seconds = time.perf_counter() - started
        peak_mb = tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()
    return message, peak_mb, seconds


@pytest.mark.parametrize("text", [alias_bomb(), merge_bomb(levels=6)], ids=["list-aliases", "merge-keys"])
def test_an_alias_bomb_is_refused_at_once_and_in_little_memory(tmp_path, text):
    assert len(text) < 2048  # 9**9 = 387 million values written out, from under 2 KB
    path = write(tmp_path, text)
    message, peak_mb, seconds = peak_memory_and_seconds_of(read_config_file, path)
    assert_names(message, str(path), f"more than {MAX_EXPANDED_NODES} values", "YAML aliases", "alias bomb")
    assert peak_mb < 50, f"reading the bomb took {peak_mb:.0f} MB"
    # A guard against blowing up (a bomb once took minutes and gigabytes), not a speed claim.
    assert seconds < 5, f"reading the bomb took {seconds:.1f} s"


def test_an_alias_bomb_is_refused_by_the_run_config_loader(tmp_path):
    from dlscale.config import load_run_config

    path = write(tmp_path, alias_bomb())
    message, peak_mb, _ = peak_memory_and_seconds_of(load_run_config, path, "base")
    assert_names(message, str(path), f"more than {MAX_EXPANDED_NODES} values")
    assert peak_mb < 50


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("base:\n  data: &d [1, *d]\n", "base.data"),
        ("base:\n  data: &d {root: x, again: *d}\n", "base.data"),
        ("base: &b {data: {more: [*b]}}\n", "base"),
    ],
    ids=["list", "mapping", "section"],
)
def test_an_alias_inside_its_own_anchor_is_refused(tmp_path, text, where):
    path = write(tmp_path, text)
    assert_names(error_of(read_config_file, path), str(path), "a YAML alias refers to itself", where)


def test_a_file_just_under_the_bound_loads_and_aliased_values_stay_shared(tmp_path):
    path = write(tmp_path, alias_bomb(levels=5, width=8))  # about 80000 values written out, twice 8**5 leaves
    data = resolve_section(read_config_file(path), "base", path)["data"]
    assert len(data["root"]) == 8 and data["root"][0] == data["root"][7]
    # One object per anchor, not one copy per alias: resolving costs the size of the file, not of its expansion.
    assert data["root"][0] is data["root"][7]
    assert data["root"][0][0] is data["root"][7][7]


def test_merge_keys_of_aliased_mappings_merge_each_pair_once(tmp_path):
    path = write(tmp_path, merge_bomb(levels=3))
    data = resolve_section(read_config_file(path), "base", path)["data"]
    assert list(data) == [f"k{i}" for i in range(9)] and data["k0"]["k8"] == {f"k{i}": "x" for i in range(9)}
    assert data["k0"] is data["k8"]  # the merge of p1 and q1, made once


ALIASED_TEXT = """
    shared: &paths {root: "${DLSCALE_TEST_ROOT}", stats: "${DLSCALE_TEST_ROOT}/stats"}
    base:
      data: *paths
      extra: [*paths, {inner: *paths}]
    merged:
      data:
        <<: *paths
        stats: /elsewhere
"""


def test_env_variables_are_expanded_in_an_aliased_mapping_used_several_times(tmp_path, monkeypatch):
    monkeypatch.setenv("DLSCALE_TEST_ROOT", "/scratch/era5")
    base = resolve(tmp_path, ALIASED_TEXT, "base")
    expanded = {"root": "/scratch/era5", "stats": "/scratch/era5/stats"}
    assert base["data"] == expanded
    assert base["extra"] == [expanded, {"inner": expanded}]
    merged = resolve(tmp_path, ALIASED_TEXT, "merged")
    assert merged["data"] == {"root": "/scratch/era5", "stats": "/elsewhere"}
    path = write(tmp_path, ALIASED_TEXT)
    document = read_config_file(path)
    resolve_section(document, "base", path)
    assert document["shared"]["root"] == "${DLSCALE_TEST_ROOT}"  # expanding made copies, the file stays


def test_an_unset_variable_in_an_aliased_mapping_names_where_it_was_met_first(tmp_path, monkeypatch):
    monkeypatch.delenv("DLSCALE_TEST_ROOT", raising=False)
    path = write(tmp_path, ALIASED_TEXT)
    message = error_of(resolve_section, read_config_file(path), "base", path)
    assert_names(message, str(path), "'base'", "key data.root", "DLSCALE_TEST_ROOT", "is not set")


# --------------------------------------------------------------------------------------------- coercion


@dataclass
class Sample:
    flag: bool = False
    count: int = 1
    rate: float = 0.5
    name: str = "x"
    limit: int | None = None
    size: tuple[int, int] = (1, 2)
    names: list[str] = field(default_factory=list)
    mode: Literal["none", "fp16", "bf16"] = "none"
    either: int | str = 0


WHERE = "cfg.yaml [config 'base']: sample.key"


def coerced(value, annotation):
    return coerce(value, annotation, WHERE)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, True), (False, False), ("yes", True), ("off", False), ("TRUE", True), (1, True), (0, False)],
)
def test_bool_accepts_yaml_and_text_spellings(value, expected):
    assert coerced(value, bool) is expected


@pytest.mark.parametrize("value", [2, "maybe", 1.0, None, [True]])
def test_bool_refuses_other_values(value):
    assert_names(error_of(coerced, value, bool), WHERE, "expected true or false", repr(value))


@pytest.mark.parametrize(
    ("value", "expected"), [(3, 3), ("3", 3), ("1_000", 1000), (1e3, 1000), ("1e3", 1000), (-2.0, -2)]
)
def test_int_accepts_whole_numbers(value, expected):
    result = coerced(value, int)
    assert result == expected and type(result) is int


@pytest.mark.parametrize("value", [1.5, "1.5", True, "abc", None, [1]])
def test_int_refuses_fractions_bools_and_text(value):
    assert_names(error_of(coerced, value, int), WHERE, "expected an integer", repr(value))


@pytest.mark.parametrize(("value", "expected"), [(1, 1.0), (2.5, 2.5), ("5E-4", 5e-4), (" 1_0.5 ", 10.5)])
def test_float_accepts_numbers_and_numeric_text(value, expected):
    result = coerced(value, float)
    assert result == expected and type(result) is float


@pytest.mark.parametrize("value", [True, "abc", None, [1.0]])
def test_float_refuses_bools_and_text(value):
    assert_names(error_of(coerced, value, float), WHERE, "expected a number", repr(value))


@pytest.mark.parametrize("value", [0, 1.5, True, None])
def test_str_accepts_only_strings_and_hints_at_quotes(value):
    message = error_of(coerced, value, str)
    assert_names(message, WHERE, "expected a string", repr(value), "put it in quotes")
    assert coerced("00", str) == "00"


@pytest.mark.parametrize("value", [None, "None", "null", "~", "", " NONE "])
def test_optional_fields_accept_null_spellings(value):
    assert coerced(value, int | None) is None
    assert coerced(value, str | None) is None


def test_optional_fields_coerce_other_values_to_their_type():
    assert coerced(5, int | None) == 5
    assert coerced("5", int | None) == 5
    assert coerced(1e3, int | None) == 1000
    assert_names(error_of(coerced, 1.5, int | None), "expected an integer")


def test_a_union_takes_the_first_member_that_fits():
    assert coerced(5, int | str) == 5
    assert coerced("abc", int | str) == "abc"
    assert_names(error_of(coerced, 1.5, int | str), WHERE, "expected an integer or a string", "1.5")


def test_fixed_length_tuples_are_checked_and_converted():
    assert coerced([360, 720], tuple[int, int]) == (360, 720)
    assert coerced(("16", 3.2e1), tuple[int, int]) == (16, 32)
    message = error_of(coerced, [1, 2, 3], tuple[int, int])
    assert_names(message, WHERE, "2 values", "[1, 2, 3]")
    assert_names(error_of(coerced, [1], tuple[int, int]), "2 values")
    assert_names(error_of(coerced, "360x720", tuple[int, int]), "expected a list [an integer, an integer]")
    assert_names(error_of(coerced, [1, "x"], tuple[int, int]), f"{WHERE}[1]", "expected an integer")


def test_lists_convert_every_item():
    assert coerced(["a", "b"], list[str]) == ["a", "b"]
    assert coerced(("a",), list[str]) == ["a"]
    assert coerced([1, "2"], tuple[int, ...]) == (1, 2)
    assert_names(error_of(coerced, ["a", 1], list[str]), f"{WHERE}[1]", "expected a string")
    assert_names(error_of(coerced, "a", list[str]), "expected a list of a string")


def test_literal_accepts_its_choices():
    mode = Literal["none", "fp16", "bf16"]
    assert coerced("fp16", mode) == "fp16"
    assert coerced(" bf16 ", mode) == "bf16"
    assert coerced(2, Literal[1, 2]) == 2
    assert coerced("2", Literal[1, 2]) == 2


def test_literal_errors_list_the_choices_and_suggest_the_closest():
    message = error_of(coerced, "fp61", Literal["none", "fp16", "bf16"])
    assert_names(message, WHERE, "'fp61' is not one of none, fp16, bf16", "did you mean 'fp16'?")
    assert "did you mean" not in error_of(coerced, "zzzzzz", Literal["none", "fp16", "bf16"])


def test_describe_names_types_for_humans():
    assert describe(int | None) == "an integer or null"
    assert describe(tuple[int, int]) == "a list [an integer, an integer]"
    assert describe(list[str]) == "a list of a string"
    assert describe(Literal["a", "b"]) == "one of a, b"
    assert describe(bool) == "true or false"


def test_build_section_coerces_every_key():
    built = build_section(
        Sample,
        {"flag": "yes", "count": 1e3, "limit": "None", "size": [3, 4], "names": ["a"], "mode": "bf16"},
        "cfg.yaml",
        "sample",
    )
    assert built == Sample(flag=True, count=1000, limit=None, size=(3, 4), names=["a"], mode="bf16")
    assert section_to_dict(built)["size"] == [3, 4]


def test_build_section_names_an_unknown_key_and_the_closest_one():
    message = error_of(build_section, Sample, {"cuont": 3}, "cfg.yaml [config 'base']", "sample")
    assert_names(
        message,
        "cfg.yaml [config 'base']",
        "unknown key sample.cuont",
        "did you mean 'count'?",
        "flag, count",
    )


def test_build_section_adds_file_and_section_to_a_component_error():
    message = error_of(
        build_section, ViTConfig, {"embed_dim": 100, "num_heads": 8}, "cfg.yaml [config 'x']", "model"
    )
    assert_names(message, "cfg.yaml [config 'x']", "model.embed_dim", "not a multiple of num_heads=8")


def test_a_bare_number_for_run_num_is_refused_with_a_hint_to_quote_it():
    message = error_of(build_section, LogConfig, {"run_num": 0}, "cfg.yaml [config 'x']", "log")
    assert_names(message, "cfg.yaml [config 'x']", "log.run_num", "expected a string", "put it in quotes")
    assert build_section(LogConfig, {"run_num": "00"}, "cfg.yaml", "log").run_num == "00"


def test_a_wrong_length_img_size_is_refused():
    message = error_of(build_section, ERA5DataConfig, {"img_size": [360]}, "cfg.yaml [config 'x']", "data")
    assert_names(message, "cfg.yaml [config 'x']", "data.img_size", "2 values", "[360]")
    assert build_section(ERA5DataConfig, {"img_size": [32, 64]}, "f", "data").img_size == (32, 64)
