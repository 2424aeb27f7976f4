"""The swarm file: what a swarm's organiser publishes so that a node outside any LAN of
the swarm can join it with one option (protocol/SPEC.md, "The swarm file";
configs/swarms/example.toml).

A small TOML file: ``[swarm]`` its name, the wire protocol's major version and bootstrap
addresses; ``[tasks]`` the task set its receivers accept (the node config's ``[tasks]``);
``[recommended]`` a model and how to train it. ``load_config`` lays it under the user's
own config (``net.swarm_file``, ``--swarm-file``):

    defaults < recommended < tasks, name, bootstrap < config file < environment < flags

with two exceptions that a user expects: bootstrap lists are joined (the file's first,
then the user's), not replaced; and a user naming another swarm is an error, not an
override, since a node on another topic would follow nothing of the file. A user's own
``[tasks]`` wins too, but peers that follow the file then refuse its groups:
``tasks_warning`` says so once, at start.

Whoever controls the file's source (a web server, a repository, a DNS name) writes it,
so it may not weaken the node that reads it (docs/operations.md, "What a swarm file can
and cannot do"): ``[recommended]`` takes effect only in the fields of ``RECOMMENDABLE``;
any other field it sets is ignored, and ``ignored_warning`` names each one once, at
start. A node goes on without them: it stays as safe as its user's own config left it.
A custom family (``module:attr``) in the file's ``[tasks]`` would be imported and run:
the file is refused unless the user allows it (``--allow-swarm-code``,
``net.allow_swarm_code``), which a swarm file cannot set.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sapo_node.dialaddr import parse
from sapo_node.intake.wire import MAX_SHARDS, PROTOCOL_VERSION
from sapo_node.options import (
    SWARM_NAME,
    Config,
    ConfigError,
    TasksSection,
    _deep_merge,
    _describe,
)

# What [swarm] and [tasks] say, which [recommended] may not say again, differently.
_NOT_RECOMMENDED = {
    ("tasks",): "the swarm's task set is [tasks], at the top",
    ("net", "swarm"): "[swarm] name gives it",
    ("net", "bootstrap"): "[swarm] bootstrap gives it",
    ("net", "shards"): "[swarm] shards gives it",
    ("net", "shards_before"): "[swarm] shards_before gives it",
    ("net", "swarm_file"): "a swarm file names no other",
}

# What [recommended] may set (protocol/SPEC.md section 2.1): the model and how the swarm
# trains it. Never what guards the node (defence, pool, scoring's sandbox), exposes it
# (net, status), places its files or runs it (node), nor what fits the user's machine
# (memory and speed paths, dtype): the file's author knows none of that. A path names a
# field, or a table whose fields all may be recommended.
RECOMMENDABLE: frozenset[tuple[str, ...]] = frozenset(
    {
        ("model", "name"),
        ("model", "lora"),
        ("generation", "completions_per_task"),
        ("generation", "max_new_tokens"),
        ("generation", "temperature"),
        ("generation", "top_p"),
        ("generation", "top_k"),
        ("curriculum",),
        ("train", "local_groups"),
        ("train", "external_groups"),
        ("train", "external_max"),
        ("train", "external_by"),
        ("train", "optimizer"),
        ("train", "lr"),
        ("train", "weight_decay"),
        ("train", "betas"),
        ("train", "grad_clip"),
        ("train", "ppo_epochs"),
        ("train", "eps_low"),
        ("train", "eps_high"),
        ("train", "kl_coef"),
        ("train", "loss_norm"),
        ("train", "advantage_scale"),
        ("pool", "sampling"),
        ("net", "shards_joined"),
        ("eval",),
    }
)


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SwarmSection(_Table):
    """Which swarm, on which protocol, and where to join it."""

    name: str = Field(pattern=SWARM_NAME, description="The swarm's name (net.swarm).")
    protocol: int = Field(
        strict=True,
        description="Major version of the wire protocol: the v<N> of the topic "
        "sapo/<name>/rollouts/v<N>.",
    )
    bootstrap: list[str] = Field(
        min_length=1,
        max_length=64,
        description="Peers to join through: /ip4|ip6/ADDR/tcp/PORT/p2p/ID, "
        "/dns4|dns6|dns/NAME/tcp/PORT/p2p/ID, or /dnsaddr/NAME[/p2p/ID].",
    )
    shards: int = Field(
        1,
        strict=True,
        ge=1,
        le=MAX_SHARDS,
        description="S: the swarm's shard topics (net.shards; protocol/SPEC.md, section 2.2). "
        "Leave it out while it is 1: nodes older than shards refuse a file with this key.",
    )
    shards_before: int = Field(
        0,  # none: S is not changing
        strict=True,
        ge=1,
        le=MAX_SHARDS,
        description="While S changes: the shard count before (net.shards_before; SPEC.md "
        "section 2.2, changing S). Nodes on this file also join their shards of that count, "
        "so nodes still on the old file keep exchanging with them. Drop it once all have "
        "restarted.",
    )
    description: str = Field("", max_length=2000, description="What the swarm trains, for people.")
    homepage: str = Field("", max_length=2000, description="Where the swarm's organiser says more.")

    @field_validator("bootstrap")
    @classmethod
    def _bootstrap(cls, value: list[str]) -> list[str]:
        for addr in value:
            parse(addr)
        return value

    @model_validator(mode="after")
    def _change(self) -> SwarmSection:
        if self.shards_before == self.shards:
            raise ValueError(f"shards_before is shards ({self.shards}): leave it out")
        return self


class SwarmFile(_Table):
    """A swarm file, validated."""

    swarm: SwarmSection
    tasks: TasksSection
    recommended: Config = Field(
        default_factory=Config,
        description="A recommended model and config, validated as the node config; only "
        "the fields of RECOMMENDABLE take effect.",
    )

    def recommendation(self) -> tuple[dict[str, Any], list[str]]:
        """What ``[recommended]`` sets that a swarm file may set, as config data; and
        the dotted names of the fields it sets that it may not (which are ignored)."""
        return _split(self.recommended.model_dump(exclude_unset=True), ())

    def custom_families(self) -> list[str]:
        """The families of ``[tasks]`` that are Python code to import (``module:attr``)."""
        return [f.name for f in self.tasks.families if ":" in f.name]


def load_swarm_file(path: Path) -> SwarmFile:
    """The swarm file at ``path`` (relative: to the working directory), validated; a
    file for another protocol version is refused before its fields are read, since
    they may be ones this version does not know."""
    path = Path(path).expanduser()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"swarm file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read swarm file {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"swarm file {path} is not valid TOML: {exc}") from None
    swarm = data.get("swarm")
    version = swarm.get("protocol") if isinstance(swarm, dict) else None
    if type(version) is int and version != PROTOCOL_VERSION:
        todo = (
            "upgrade sapo-node"
            if version > PROTOCOL_VERSION
            else "the swarm runs an older protocol: use the sapo-node release that speaks it"
        )
        raise ConfigError(
            f"swarm file {path}: swarm.protocol is {version}, this sapo-node speaks "
            f"{PROTOCOL_VERSION}: {todo}"
        )
    for where, why in _NOT_RECOMMENDED.items():
        if _has(data.get("recommended"), where):
            raise ConfigError(f"swarm file {path}: recommended.{'.'.join(where)}: {why}")
    if isinstance(data.get("tasks"), dict) and "families" not in data["tasks"]:
        raise ConfigError(f"swarm file {path}: tasks.families: required (the swarm's task set)")
    try:
        return SwarmFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"swarm file {path}: {_describe(exc)}") from None


def _split(data: dict[str, Any], where: tuple[str, ...]) -> tuple[dict[str, Any], list[str]]:
    kept: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in data.items():
        path = (*where, key)
        if any(path[: len(p)] == p for p in RECOMMENDABLE):
            kept[key] = value
        elif isinstance(value, dict):  # a table: each field of it named, or kept
            inner, more = _split(value, path)
            if inner:
                kept[key] = inner
            ignored += more
        else:
            ignored.append(".".join(path))
    return kept, ignored


def _has(table: Any, where: tuple[str, ...]) -> bool:
    for key in where:
        if not isinstance(table, dict) or key not in table:
            return False
        table = table[key]
    return True


def under(swarm: SwarmFile, user: dict[str, Any], source: Path | str) -> dict[str, Any]:
    """Config data: ``swarm`` (from file ``source``) laid under ``user``'s (file,
    environment and flags merged), bootstrap lists joined."""
    net = user.get("net") if isinstance(user.get("net"), dict) else {}
    name = net.get("swarm")
    if name is not None and name != swarm.swarm.name:
        raise ConfigError(
            f"net.swarm is {name!r} but swarm file {source} is for {swarm.swarm.name!r}: "
            "drop one of them"
        )
    for key in ("shards", "shards_before"):
        mine, theirs = net.get(key), getattr(swarm.swarm, key)
        if mine is not None and str(mine) != str(theirs):
            raise ConfigError(
                f"net.{key} is {mine!r} but swarm file {source} says {theirs}: a node on "
                f"other shard topics would meet none of the swarm; drop net.{key}"
            )
    user_tasks = user.get("tasks")
    own_families = isinstance(user_tasks, dict) and "families" in user_tasks
    custom = swarm.custom_families()
    if custom and not own_families and net.get("allow_swarm_code") is not True:
        raise ConfigError(
            f"swarm file {source}: tasks.families names custom families {custom}, which "
            "this node would import and run as Python code on the word of whoever "
            "controls the file; pass --allow-swarm-code (net.allow_swarm_code) only if "
            "you trust them and have the modules from a source you trust"
        )
    recommended, _ = swarm.recommendation()
    base = _deep_merge(
        recommended,
        {
            "tasks": swarm.tasks.model_dump(),
            "net": {
                "swarm": swarm.swarm.name,
                "bootstrap": swarm.swarm.bootstrap,
                "shards": swarm.swarm.shards,
                "shards_before": swarm.swarm.shards_before,
            },
        },
    )
    out = _deep_merge(base, user)
    theirs = net.get("bootstrap")
    if isinstance(theirs, list):  # else left to the config's validation
        out["net"]["bootstrap"] = list(dict.fromkeys([*swarm.swarm.bootstrap, *theirs]))
    return out


def ignored_warning(cfg: Config) -> str | None:
    """The line ``start`` logs when ``cfg``'s swarm file recommends fields that a swarm
    file may not set: they were ignored, and the node runs on its user's own values."""
    if cfg.net.swarm_file is None:
        return None
    _, ignored = load_swarm_file(cfg.net.swarm_file).recommendation()
    if not ignored:
        return None
    return (
        f"swarm file {cfg.net.swarm_file} recommends {', '.join(ignored)}: ignored, since a "
        "swarm file may recommend only the model and how to train it, nothing that guards, "
        "exposes or places this node (protocol/SPEC.md section 2.1); set it in your own "
        "config if you want it"
    )


def tasks_warning(cfg: Config) -> str | None:
    """The line ``start`` logs when ``cfg`` follows a swarm file but its own [tasks]
    are not the file's: the node runs, but it and the swarm refuse each other's groups."""
    if cfg.net.swarm_file is None:
        return None
    if cfg.tasks == load_swarm_file(cfg.net.swarm_file).tasks:
        return None
    return (
        f"your [tasks] differ from the swarm file's ({cfg.net.swarm_file}): peers following "
        "it will refuse your groups, and you theirs (sapo-node tasks prints what a config "
        "accepts)"
    )
