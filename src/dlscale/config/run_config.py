"""A run's whole config: one named section of a YAML file, plus command-line overrides, as typed dataclasses.

Layout of a config (see ``configs/vit_era5.yaml``)::

    short:
      extends: base            # inherit, deeply merged
      workload: era5_vit       # which data + model + loss + metrics
      data:   {...}            # owned by the workload's data reader
      model:  {...}            # owned by the workload's model
      loader: {...}  optim: {...}  train: {...}  checkpoint: {...}  log: {...}  parallel: {...}
      profile: {...}  bench: {...}  monitor: {...}

Every key has exactly one home, so a key may also be written *flat* at the top of a section, the way the
tutorials' own YAML files are written (``lr: 5E-4`` means ``optim: {lr: 5E-4}``). An original tutorial
``ViT.yaml`` therefore loads as it is. Overrides use the dotted or the flat name: ``--set optim.lr=1e-3`` or
``--set lr=1e-3``.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from dlscale.checkpoint.checkpoint_config import CheckpointConfig
from dlscale.config.typed import build_section, check_section_class, coerce, field_types, section_to_dict
from dlscale.config.yaml_source import (
    dump_yaml,
    locate_config_file,
    parse_yaml_value,
    read_config_file,
    resolve_section,
)
from dlscale.data.loading.loader_config import LoaderConfig
from dlscale.errors import ConfigError, InvalidValue, config_location, did_you_mean
from dlscale.parallel.parallel_config import ParallelConfig
from dlscale.perf.bench.config import BenchConfig
from dlscale.perf.monitor.config import MonitorConfig
from dlscale.perf.profile.config import ProfileConfig
from dlscale.report.log_config import LogConfig
from dlscale.training.optim_config import OptimConfig
from dlscale.training.train_config import TrainConfig
from dlscale.workloads import DEFAULT_WORKLOAD, get_workload, workload_names

log = logging.getLogger(__name__)

GENERIC_SECTIONS: dict[str, type] = {
    "loader": LoaderConfig,
    "optim": OptimConfig,
    "train": TrainConfig,
    "checkpoint": CheckpointConfig,
    "log": LogConfig,
    "parallel": ParallelConfig,
    "profile": ProfileConfig,
    "bench": BenchConfig,
    "monitor": MonitorConfig,
}
SECTION_ORDER = ("data", "model", *GENERIC_SECTIONS)

# Keys of the tutorials' YAML files that only configured their own launch code: accepted, said, and ignored.
IGNORED_TUTORIAL_KEYS = {
    "wireup_info": "dlscale reads ranks from the launcher's environment (torchrun, Slurm, LSF)",
    "wireup_store": "dlscale reads ranks from the launcher's environment (torchrun, Slurm, LSF)",
}


@dataclass
class RunConfig:
    """The resolved config of one run. Each component receives only its own section."""

    name: str  # the config section's name, e.g. "short"
    source: str  # the YAML file it came from
    workload: str
    data: Any
    model: Any
    loader: LoaderConfig
    optim: OptimConfig
    train: TrainConfig
    checkpoint: CheckpointConfig
    log: LogConfig
    parallel: ParallelConfig
    profile: ProfileConfig
    bench: BenchConfig
    monitor: MonitorConfig
    overrides: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        """``file [config 'name']``, the prefix of every message about this config."""
        return config_location(self.source, self.name)

    def to_dict(self) -> dict[str, Any]:
        """All sections as plain values, every default filled in."""
        result: dict[str, Any] = {"workload": self.workload}
        for section in SECTION_ORDER:
            result[section] = section_to_dict(getattr(self, section))
        return result

    def to_yaml(self) -> str:
        """A YAML file that reproduces this config: ``--yaml_config it --config <name>``."""
        header = f"# Resolved dlscale config {self.name!r} from {self.source}\n"
        if self.overrides:
            header += "# with overrides: " + " ".join(self.overrides) + "\n"
        return header + dump_yaml({self.name: self.to_dict()})


def section_classes(workload: str) -> dict[str, type]:
    """The dataclass of every section, for a workload (its own two, then dlscale's)."""
    found = get_workload(workload)
    own = {"data": found.data_config, "model": found.model_config}
    homes: dict[str, str] = {key: name for name, cls in GENERIC_SECTIONS.items() for key in field_types(cls)}
    for section, cls in own.items():
        check_section_class(cls, section, f"workload {workload!r}")
        for key in field_types(cls):
            if key in homes:
                raise ConfigError(
                    f"workload {workload!r}: {section}.{key} ({cls.__qualname__}) has the name of "
                    f"{homes[key]}.{key}; rename it (every key has one home, so that it can be written flat)"
                )
            homes[key] = section
    return {**own, **GENERIC_SECTIONS}


def flat_key_homes(sections: dict[str, type]) -> dict[str, str]:
    """Map each key name to its section, for keys whose name is unique across sections."""
    homes: dict[str, str] = {}
    ambiguous: set[str] = set()
    for section, cls in sections.items():
        for key in field_types(cls):
            if key in homes:
                ambiguous.add(key)
            homes[key] = section
    return {k: v for k, v in homes.items() if k not in ambiguous}


def load_run_config(
    yaml_path: str | Path,
    config_name: str,
    overrides: list[str] | tuple[str, ...] = (),
    flag_values: dict[str, Any] | None = None,
    workload: str | None = None,
) -> RunConfig:
    """Read config ``config_name`` from ``yaml_path`` and apply overrides.

    ``overrides`` are ``key=value`` strings (``--set``); ``flag_values`` maps keys to already-typed values
    from dedicated command-line flags (``--num_iters 10``), applied last. ``workload`` replaces the config's
    ``workload:`` (a name or an import path).
    """
    yaml_path = locate_config_file(yaml_path)
    return _run_config(read_config_file(yaml_path), yaml_path, config_name, overrides, flag_values, workload)


def recorded_run_config(
    resolved: dict[str, Any], config_name: str, source: str, overrides: list[str] | tuple[str, ...] = ()
) -> RunConfig:
    """A config recorded as :meth:`RunConfig.to_dict` (a checkpoint's ``config`` entry), with ``--set``
    overrides; ``source`` names where it was recorded, for messages."""
    return _run_config({config_name: copy.deepcopy(resolved)}, Path(source), config_name, overrides)


def _run_config(
    document: dict[str, Any],
    yaml_path: Path,
    config_name: str,
    overrides: list[str] | tuple[str, ...] = (),
    flag_values: dict[str, Any] | None = None,
    workload: str | None = None,
) -> RunConfig:
    where = config_location(str(yaml_path), config_name)
    # The workload decides the data and model sections, so it is read first (it is never a flat key).
    if workload is None:
        workload = resolve_section(document, config_name, yaml_path).get("workload", DEFAULT_WORKLOAD)
    if not isinstance(workload, str):
        raise ConfigError(f"{where}: workload must be a name or an import path, got {workload!r}")
    try:
        sections = section_classes(workload)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    warned: set[str] = set()

    def nest(section: dict[str, Any], name: str, source: str | Path) -> dict[str, Any]:
        # source: the file this config is written in (a parent may be one of another file, FILE:NAME)
        return _nest_flat_keys(section, sections, config_location(str(source), name), warned)

    # Flat keys go into their sections config by config, before inheritance merges them, so that a child
    # overrides its parent's key whichever style each of them is written in.
    nested = resolve_section(document, config_name, yaml_path, normalize=nest)
    nested.pop("workload", None)

    applied = list(overrides)
    for text in overrides:
        key, sep, value = text.partition("=")
        if not sep:
            raise ConfigError(f"--set {text!r}: expected key=value, e.g. --set optim.lr=1e-3")
        _apply_override(nested, sections, key.strip(), value, origin=f"--set {text}", raw_text=True)
    for key, value in (flag_values or {}).items():
        _apply_override(
            nested, sections, key, value, origin=f"--{key.split('.')[-1]} {value}", raw_text=False
        )
        applied.append(f"{key}={value}")
    if applied:
        where += " with command-line overrides"

    built = {name: build_section(cls, nested.get(name, {}), where, name) for name, cls in sections.items()}
    _check_model_layout(built["model"], built["parallel"], where)
    _check_model_training(built["model"], built["train"], where)
    return RunConfig(
        name=config_name, source=str(yaml_path), workload=workload, overrides=tuple(applied), **built
    )


def _check_model_layout(model: Any, parallel: ParallelConfig, where: str) -> None:
    """A model section with a ``check_parallel(tensor_parallel, context_parallel)`` method refuses the layouts it
    has no form for (the ViT's AFNO mixer: no tp, no cp) here, when the config is read, before anything runs."""
    check = getattr(model, "check_parallel", None)
    if not callable(check):
        return
    try:
        check(parallel.tensor_parallel, parallel.context_parallel)
    except InvalidValue as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _check_model_training(model: Any, train: Any, where: str) -> None:
    """CRPS training needs a model with noise inputs: a model section with a ``check_training(train)`` method
    decides (the ViT's: ``model.noise_channels``), one without any noise key cannot be trained so."""
    check = getattr(model, "check_training", None)
    if callable(check):
        try:
            check(train)
        except InvalidValue as exc:
            raise ConfigError(f"{where}: {exc}") from None
    elif train.loss == "crps":
        raise ConfigError(
            f"{where}: train.loss crps trains the members of a model that reads noise, and this workload's model "
            f"({type(model).__name__}) has no noise inputs (the ERA5 ViT's is model.noise_channels); use "
            "train.loss=workload"
        )


def _nest_flat_keys(
    raw: dict[str, Any], sections: dict[str, type], where: str, warned: set[str]
) -> dict[str, Any]:
    """One config's own keys, with flat tutorial-style keys moved into their sections; rejects stray keys."""
    homes = flat_key_homes(sections)
    nested: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "workload":
            nested[key] = value
        elif key in sections:
            if value is None:
                value = {}
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: section '{key}' must be a mapping of keys, got {value!r}")
            for inner_key, inner_value in value.items():
                _put(nested, key, inner_key, inner_value, where)
        elif key in IGNORED_TUTORIAL_KEYS:
            if key not in warned:
                warned.add(key)
                log.warning("%s: ignoring key %r: %s", where, key, IGNORED_TUTORIAL_KEYS[key])
        elif key in homes:
            _put(nested, homes[key], key, value, where)
        else:
            candidates = [*sections, "workload", *homes]
            raise ConfigError(
                f"{where}: unknown key {key!r}{did_you_mean(key, candidates)}; a config holds the sections "
                f"{', '.join(sections)} (or their keys written flat, e.g. 'lr' for 'optim.lr')"
            )
    return nested


def _put(nested: dict[str, dict[str, Any]], section: str, key: str, value: Any, where: str) -> None:
    target = nested.setdefault(section, {})
    if key in target and target[key] != value:
        raise ConfigError(
            f"{where}: {section}.{key} is given twice, flat ('{key}') and in section '{section}', with different "
            "values (a `<<:` merge of a config written in the other style does this: write both configs in one "
            "style, or inherit with `extends:`)"
        )
    target[key] = value


def _apply_override(
    nested: dict[str, dict[str, Any]],
    sections: dict[str, type],
    key: str,
    value: Any,
    origin: str,
    raw_text: bool,
) -> None:
    section, dot, name = key.partition(".")
    if not dot:  # a flat key name
        homes = flat_key_homes(sections)
        if key not in homes:
            dotted = [f"{s}.{k}" for s, cls in sections.items() for k in field_types(cls)]
            raise ConfigError(f"{origin}: unknown key {key!r}{did_you_mean(key, [*homes, *dotted])}")
        section, name = homes[key], key
    if section not in sections:
        raise ConfigError(f"{origin}: unknown section {section!r}{did_you_mean(section, sections)}")
    types_by_name = field_types(sections[section])
    if name not in types_by_name:
        raise ConfigError(
            f"{origin}: unknown key {section}.{name}{did_you_mean(name, types_by_name)}; "
            f"valid keys of '{section}': {', '.join(types_by_name)}"
        )
    annotation = types_by_name[name]
    if raw_text and not _is_text_type(annotation):
        value = parse_yaml_value(value)
    nested.setdefault(section, {})[name] = coerce(value, annotation, origin)


def _is_text_type(annotation: Any) -> bool:
    """True for str, ``str | None`` and Literal-of-strings fields: their command-line value is taken verbatim
    (so ``--run_num 00`` stays "00" and ``--set log.progress=none`` is not read as YAML null)."""
    # Only a union's arguments are alternatives; list[str]'s argument is its items' type, not the value's.
    alternatives = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    members = [a for a in alternatives if a is not type(None)]
    if get_origin(annotation) is Literal:
        return all(isinstance(a, str) for a in get_args(annotation))
    return len(members) == 1 and (members[0] is str or get_origin(members[0]) is Literal)


def config_reference(workload: str = DEFAULT_WORKLOAD) -> str:
    """Every key of every section with its type and default: ``dlscale config --keys``."""
    from dlscale.config.typed import describe

    try:
        sections = section_classes(workload)
    except ConfigError as exc:
        raise ConfigError(f"--workload {workload}: {exc}") from None
    lines = [
        f"workload: one of {', '.join(workload_names())}, or an import path package.module:OBJECT "
        f"(default {DEFAULT_WORKLOAD}; these keys: {workload})"
    ]
    for section, cls in sections.items():
        lines.append(f"{section}:  ({cls.__name__})")
        types_by_name = field_types(cls)
        for field in dataclasses.fields(cls):
            default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
            lines.append(f"  {field.name}: {describe(types_by_name[field.name])} (default {default!r})")
    return "\n".join(lines)
