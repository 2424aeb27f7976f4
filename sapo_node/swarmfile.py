"""The swarm file: what a swarm's organiser publishes so that a node outside any LAN of
the swarm can join it with one option (protocol/SPEC.md, "The swarm file";
configs/swarms/example.toml).

A small TOML file: ``[swarm]`` its name, the wire protocol's major version and bootstrap
addresses; ``[tasks]`` the task set its receivers accept (the node config's ``[tasks]``);
``[recommended]`` a model and how to train it. ``load_config`` lays it under the user's
own config (``net.swarm_file``, ``--swarm-file``; :func:`merge_as_defaults`):

    defaults < recommended < tasks, name, bootstrap < config file < environment < flags

with two exceptions that a user expects: bootstrap lists are joined (the file's first,
then the user's), not replaced; and a user naming another swarm is an error, not an
override, since a node on another topic would follow nothing of the file. A user's own
``[tasks]`` wins too, but peers that follow the file then refuse its groups:
``tasks_warning`` says so once, at start.

Whoever controls the file's source (a web server, a repository, a DNS name) writes it,
so it may not weaken the node that reads it (docs/operations.md, "What a swarm file can
and cannot do"; protocol/SPEC.md section 2.1):

- ``[recommended]`` takes effect only in the fields of ``RECOMMENDABLE``, and only within
  the ranges of ``RECOMMEND_RANGES`` (what a home machine survives); any other field or
  value it sets is ignored, and ``ignored_warning`` names each one once, at start. A node
  goes on without them: it stays as safe as its user's own config left it.
- Of ``[tasks]``, only the families apply unless the user allows more
  (``--allow-swarm-scoring``, ``net.allow_swarm_scoring``): ``SCORING_FIELDS`` decide what
  the node is asked to write and what counts as right, which the poisoning defences rely
  on. ``scoring_warning`` names the ones the file sets otherwise.
- A custom family (``module:attr``) in the file's ``[tasks]`` would be imported and run:
  the file is refused unless the user allows it (``--allow-swarm-code``,
  ``net.allow_swarm_code``).
- A file that changes the model starts a new run (``model_change``; the old run's
  checkpoints are set aside, not lost), where a model the user names must match the
  checkpoint.

No field of the file sets ``net.allow_swarm_code`` or ``net.allow_swarm_scoring``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sapo_node.dialaddr import parse
from sapo_node.intake.wire import MAX_SHARDS, PROTOCOL_VERSION
from sapo_node.options import (
    FINGERPRINT,
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


def _between(low: float, high: float) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: low <= v <= high), f"{low:g} to {high:g}"


# The ranges a file may recommend, where the config's own bounds reach past what a home
# machine survives (its memory, a round's compute) or what leaves a model intact: a value
# outside is ignored, like a field a file may not set. The user's own config is not bound
# by them. Listed in protocol/SPEC.md section 2.1 (a test keeps the two equal).
RECOMMEND_RANGES: dict[tuple[str, ...], tuple[Callable[[Any], bool], str]] = {
    ("model", "lora", "r"): _between(1, 64),  # adapter memory grows with r
    ("generation", "completions_per_task"): _between(2, 16),  # L: a round's sequences
    ("generation", "max_new_tokens"): _between(1, 1024),  # L x this: memory and compute
    ("train", "local_groups"): _between(1, 8),  # at least one own group: never peers' only
    ("train", "external_groups"): _between(0, 8),
    ("train", "external_max"): _between(0, 16),
    ("train", "lr"): _between(0, 1e-4),  # and above 0, as the config bounds it
    ("train", "grad_clip"): _between(0.1, 10),  # 0 would turn clipping off
    ("train", "weight_decay"): _between(0, 0.1),
    ("train", "ppo_epochs"): _between(1, 4),  # optimiser steps a round
    ("eval", "every"): ((lambda v: v == 0 or v >= 10), "0 (off) or at least 10"),
    ("eval", "tasks"): _between(1, 256),
    ("eval", "samples"): _between(1, 8),
    ("net", "shards_joined"): _between(1, 8),  # k: topics, so traffic, a node carries
}

# The [tasks] fields beside the families: what a node is asked (its system prompt, the
# worked example) and what counts as right (reward, threshold). The defences rely on them:
# a low threshold or partial reward counts an answer that carries more as right, and
# answer_only then teaches it; a prompt can ask for anything, and widens the outside-answer
# bound through the node's own completions. They decide nothing of what peers accept, so
# a node with its own still exchanges with the swarm.
SCORING_FIELDS = ("system_prompt", "one_shot", "reward", "correct_threshold")


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
        """What ``[recommended]`` sets that a swarm file may set, within its ranges, as
        config data; and what it sets otherwise (which is ignored): the dotted name of
        each field it may not set, ``name = value (range)`` for each value out of range."""
        kept, ignored = _split_recommendable(self.recommended.model_dump(exclude_unset=True), ())
        return kept, ignored + _out_of_range(kept)

    def scoring(self) -> dict[str, Any]:
        """The ``SCORING_FIELDS`` that the file's ``[tasks]`` sets, by name."""
        given = self.tasks.model_fields_set
        return {k: getattr(self.tasks, k) for k in SCORING_FIELDS if k in given}

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
        if _has_key_path(data.get("recommended"), where):
            raise ConfigError(f"swarm file {path}: recommended.{'.'.join(where)}: {why}")
    if isinstance(data.get("tasks"), dict) and "families" not in data["tasks"]:
        raise ConfigError(f"swarm file {path}: tasks.families: required (the swarm's task set)")
    try:
        return SwarmFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"swarm file {path}: {_describe(exc)}") from None


def _split_recommendable(
    data: dict[str, Any], where: tuple[str, ...]
) -> tuple[dict[str, Any], list[str]]:
    """``data`` (the table at ``where`` in ``[recommended]``) split in two: the fields a
    swarm file may set (``RECOMMENDABLE``), as a table of the same shape, and the dotted
    name of every other field it sets."""
    kept: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in data.items():
        path = (*where, key)
        if any(path[: len(p)] == p for p in RECOMMENDABLE):
            kept[key] = value
        elif isinstance(value, dict):  # a table: each field of it named, or kept
            inner, more = _split_recommendable(value, path)
            if inner:
                kept[key] = inner
            ignored += more
        else:
            ignored.append(".".join(path))
    return kept, ignored


def _out_of_range(kept: dict[str, Any]) -> list[str]:
    """Drop from ``kept`` each value outside its ``RECOMMEND_RANGES``; each, described."""
    dropped = []
    for path, (fits, text) in RECOMMEND_RANGES.items():
        *tables, leaf = path
        table: Any = kept
        for key in tables:
            table = table.get(key) if isinstance(table, dict) else None
        if not isinstance(table, dict) or table.get(leaf) is None or fits(table[leaf]):
            continue
        dropped.append(f"{'.'.join(path)} = {table.pop(leaf)!r} (a file may recommend {text})")
    return dropped


def _has_key_path(table: Any, where: tuple[str, ...]) -> bool:
    """Whether the nested tables ``table`` hold the keys ``where``, one inside the other."""
    for key in where:
        if not isinstance(table, dict) or key not in table:
            return False
        table = table[key]
    return True


def merge_as_defaults(swarm: SwarmFile, user: dict[str, Any], source: Path | str) -> dict[str, Any]:
    """Config data: ``swarm`` (from file ``source``) laid under ``user``'s (file,
    environment and flags merged) as defaults that the user's values override, bootstrap
    lists joined; a user's swarm name or shard count that contradicts the file is refused."""
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
    tasks = swarm.tasks.model_dump()
    if net.get("allow_swarm_scoring") is not True:
        tasks = {"families": tasks["families"]}
    base = _deep_merge(
        recommended,
        {
            "tasks": tasks,
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
        "swarm file may recommend only the model and how to train it, within ranges a home "
        "machine survives, nothing that guards, exposes or places this node "
        "(protocol/SPEC.md section 2.1); set it in your own config if you want it"
    )


def scoring_warning(cfg: Config) -> str | None:
    """The line ``start`` logs when ``cfg``'s swarm file sets [tasks] fields that decide
    what the node is asked and counts as right (``SCORING_FIELDS``) to values this node
    does not run, because its user did not allow the file to set them."""
    if cfg.net.swarm_file is None or cfg.net.allow_swarm_scoring:
        return None
    theirs = load_swarm_file(cfg.net.swarm_file).scoring()
    differ = [
        f"tasks.{k}" if k == "system_prompt" else f"tasks.{k} = {v!r}"
        for k, v in theirs.items()
        if getattr(cfg.tasks, k) != v
    ]
    if not differ:
        return None
    return (
        f"swarm file {cfg.net.swarm_file} sets {', '.join(differ)}: not applied, since they "
        "decide what this node is asked to write and what it counts as right, which its "
        "poisoning defences rely on; this node keeps its own (--allow-swarm-scoring, or "
        "net.allow_swarm_scoring, takes the file's)"
    )


def tasks_warning(cfg: Config) -> str | None:
    """The line ``start`` logs when ``cfg`` follows a swarm file but its own task
    families are not the file's: the node runs, but it and the swarm refuse each other's
    groups (the other [tasks] fields are a node's own: peers do not see them)."""
    if cfg.net.swarm_file is None:
        return None
    if cfg.tasks.families == load_swarm_file(cfg.net.swarm_file).tasks.families:
        return None
    return (
        f"your task families differ from the swarm file's ({cfg.net.swarm_file}): peers following "
        "it will refuse your groups, and you theirs (sapo-node tasks prints what a config "
        "accepts)"
    )


def model_change(cfg: Config, made_for: Any) -> bool:
    """Whether a checkpoint made for the fingerprint ``made_for`` differs from ``cfg``'s
    only in fields that ``cfg`` takes from its swarm file's ``[recommended]`` (the model,
    LoRA on or off): the swarm moved to another model, and the node starts a new run
    rather than fail to resume. A model its user names must match the checkpoint."""
    if cfg.net.swarm_file is None or not isinstance(made_for, dict):
        return False
    ours = cfg.fingerprint()
    changed = [key for key, value in ours.items() if made_for.get(key) != value]
    if not changed:
        return False
    recommended, _ = load_swarm_file(cfg.net.swarm_file).recommendation()
    for key in changed:
        value: Any = recommended
        for name in FINGERPRINT[key]:
            value = value.get(name) if isinstance(value, dict) else None
        if value is None or value != ours[key]:
            return False
    return True
