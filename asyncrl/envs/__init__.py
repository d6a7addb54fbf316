"""Agentic environments: the text protocol, the registry, and the built-in environments."""

from asyncrl.envs import frozenlake as _frozenlake  # noqa: F401  (registers "frozenlake")
from asyncrl.envs import sokoban as _sokoban  # noqa: F401  (registers "sokoban")
from asyncrl.envs import tool_use as _tool_use  # noqa: F401  (registers "tool_use")
from asyncrl.envs.base import (
    Environment,
    EpisodeOver,
    NotAnEnvironment,
    StepResult,
    is_import_path,
    make,
    register,
    registered,
    resolve,
)

__all__ = ["Environment", "EpisodeOver", "NotAnEnvironment", "StepResult", "is_import_path", "make", "register",
           "registered", "resolve"]
