"""Run configuration: the pydantic schema and its YAML/override loader."""

from asyncrl.config.load import (
    ConfigError,
    apply_override,
    config_from_json,
    load_config,
    with_cache_dir_from_env,
)
from asyncrl.config.schema import RunConfig

__all__ = ["ConfigError", "RunConfig", "apply_override", "config_from_json", "load_config", "with_cache_dir_from_env"]
