"""A node's config, loaded: defaults < TOML file < environment < CLI flags.

The typed tree itself (every option, its bounds and cross-field checks) is
sapo_node/options/; this module reads it from its sources, and its names are importable
from here (``from sapo_node.config import Config, load_config``).

Environment overrides use ``SAPO_<SECTION>__<FIELD>`` with a TOML value, for example
``SAPO_NODE__DATA_DIR='"/data"'`` or ``SAPO_TRAIN__LR=1e-5``.

A swarm file (``net.swarm_file``, ``--swarm-file``; sapo_node/swarmfile.py) slides in
above the defaults, under the user's file: its swarm's name, bootstrap peers, tasks and
recommended config. Imports go one way: options <- swarmfile <- config.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sapo_node import swarmfile
from sapo_node.options import *  # noqa: F403  (the tree's names, importable from here)
from sapo_node.options import ENV_PREFIX, Config, ConfigError, _deep_merge, _describe
from sapo_node.options import __all__ as _tree

__all__ = [*_tree, "env_overrides", "load_config"]


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """Nested overrides from ``SAPO_SECTION__FIELD=<toml value>`` variables."""
    out: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw  # a bare string
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


def load_config(
    path: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Build the config from a TOML file, environment and CLI overrides, validated, with
    the swarm file that they name (``net.swarm_file``) laid under them.

    Raises ConfigError with a one-line message naming the problem.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    data = _deep_merge(data, env_overrides(os.environ if environ is None else environ))
    data = _deep_merge(data, overrides or {})
    net = data.get("net")
    swarm_file = net.get("swarm_file") if isinstance(net, Mapping) else None
    if isinstance(swarm_file, str | Path):
        data = swarmfile.merge_as_defaults(
            swarmfile.load_swarm_file(Path(swarm_file)), data, swarm_file
        )
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        source = f" (in {path})" if path else ""
        raise ConfigError(f"invalid config{source}: {_describe(exc)}") from None
