"""What every part of the config tree shares: its error, its section base, the values
that more than one section or module needs, and how a refusal reads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
)

ENV_PREFIX = "SAPO_"

# A swarm's name: its topic is sapo/<name>/rollouts/v2 (protocol/SPEC.md, section 2).
SWARM_NAME = r"^[a-z0-9][a-z0-9-]{0,62}$"

# The status endpoint's default, apart from the swarm's ports (4141, and the next ones a
# second node on the machine takes). A node whose default is taken serves on a free port.
DEFAULT_STATUS_LISTEN = "127.0.0.1:9141"

# train.checkpoint_above_tokens unset, full fine-tuning: micro-batches up to this many tokens
# skip gradient checkpointing (about 0.5 GB of activations for the embedded model).
UNCHECKED_TOKENS = 768


class ConfigError(ValueError):
    """A config that cannot be used; the message names the field and the reason."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "config"
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg}")
    return "; ".join(parts)


def parse_host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 in brackets) as (host, port); ValueError says what is wrong.

    >>> parse_host_port("127.0.0.1:9141"), parse_host_port("[::1]:0")
    (('127.0.0.1', 9141), ('::1', 0))
    """
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9141; port 0 picks one)")
    return host, int(port)
