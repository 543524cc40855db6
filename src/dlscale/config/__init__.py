"""Typed, validated run configs from named YAML sections plus command-line overrides."""

from dlscale.config.run_config import RunConfig, config_reference, load_run_config

__all__ = ["RunConfig", "config_reference", "load_run_config"]
