"""The options a node's commands take (``start``, ``doctor`` and the others' shared
ones), and how the flags given become config overrides over the file (sapo_node/config.py).
Usage errors found after parsing are :class:`UsageProblem` (exit code 2)."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, StrEnum
from pathlib import Path
from typing import Annotated, Any, get_args

import click
import typer

from sapo_node.config import ConfigError, load_config


class Device(StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"
    mps = "mps"


class UsageProblem(click.UsageError):
    """A bad value found after parsing (exit code 2)."""


def overrides(**flags: Any) -> dict[str, Any]:
    """CLI flags that were given, as a nested config override."""
    where = {
        "model": ("model", "name"),
        "data_dir": ("node", "data_dir"),
        "rounds": ("node", "rounds"),
        "device": ("node", "device"),
        "seed": ("node", "seed"),
        "json_logs": ("node", "json_logs"),
        "local": ("train", "local_groups"),
        "external": ("train", "external_groups"),
        "lora": ("model", "lora", "enabled"),
        "swarm": ("net", "swarm"),
        "swarm_file": ("net", "swarm_file"),
        "allow_swarm_code": ("net", "allow_swarm_code"),
        "allow_swarm_scoring": ("net", "allow_swarm_scoring"),
        "listen": ("net", "listen"),
        "announce": ("net", "announce"),
        "bootstrap": ("net", "bootstrap"),
        "offline": ("net", "enabled"),
        "status_listen": ("status", "listen"),
    }
    out: dict[str, Any] = {}
    for name, value in flags.items():
        if value is None or value == []:
            continue
        if name == "offline":
            value = not value
        *path, leaf = where[name]
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value.value if isinstance(value, Enum) else value
    return out


def load_with_flags(config_file: Path | None, **flags: Any):
    try:
        return load_config(config_file, overrides(**flags))
    except ConfigError as exc:
        raise UsageProblem(str(exc)) from None


def node_options(
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML config file (see configs/).")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="'embedded' (default), a local model directory or a Hugging Face id."),
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="State directory: checkpoints, metrics, model cache.")
    ] = None,
    rounds: Annotated[
        int | None, typer.Option(min=0, help="Stop after N rounds in total (0: until stopped).")
    ] = None,
    local: Annotated[int | None, typer.Option(min=0, help="I: own tasks per round.")] = None,
    external: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="J: peers' groups per round (0: none); chosen each round up to "
            "train.external_max unless train.external_by is fixed.",
        ),
    ] = None,
    device: Annotated[
        Device | None, typer.Option(help="Compute device; auto picks CUDA, then MPS, then CPU.")
    ] = None,
    lora: Annotated[
        bool | None, typer.Option("--lora/--no-lora", help="Train LoRA adapters or all weights.")
    ] = None,
    seed: Annotated[
        int | None, typer.Option(min=0, help="Base seed of tasks and sampling.")
    ] = None,
    json_logs: Annotated[
        bool | None, typer.Option("--json-logs", help="Log JSON lines (for machines).")
    ] = None,
    swarm: Annotated[
        str | None, typer.Option(help="Swarm name (its GossipSub topic: sapo/NAME/rollouts/v2).")
    ] = None,
    swarm_file: Annotated[
        Path | None,
        typer.Option(
            help="A swarm's published file (TOML): its name, bootstrap peers, tasks and "
            "recommended config, laid under your own config."
        ),
    ] = None,
    allow_swarm_code: Annotated[
        bool | None,
        typer.Option(
            "--allow-swarm-code",
            help="Let the swarm file name custom task families (module:attr), which the node "
            "imports and runs: only for a file whose source you trust.",
        ),
    ] = None,
    allow_swarm_scoring: Annotated[
        bool | None,
        typer.Option(
            "--allow-swarm-scoring",
            help="Let the swarm file's [tasks] set the system prompt, one_shot, reward and "
            "correct_threshold, which the poisoning defences rely on: only for a file whose "
            "source you trust.",
        ),
    ] = None,
    listen: Annotated[
        list[str] | None,
        typer.Option(help="Multiaddr to listen on, e.g. /ip4/0.0.0.0/tcp/4141 (repeatable)."),
    ] = None,
    announce: Annotated[
        list[str] | None,
        typer.Option(help="Multiaddr to give peers instead of the listen ones (repeatable)."),
    ] = None,
    bootstrap: Annotated[
        list[str] | None,
        typer.Option(
            help="Peer to join through, /ip4/.../tcp/PORT/p2p/ID or /dnsaddr/NAME (repeatable)."
        ),
    ] = None,
    offline: Annotated[
        bool | None, typer.Option("--offline", help="Train alone: no network at all.")
    ] = None,
    no_train: Annotated[
        bool,
        typer.Option(
            "--no-train",
            help="Do not train: relay and bootstrap the swarm with no model loaded, or with "
            "--generate share what the model writes.",
        ),
    ] = False,
    generate: Annotated[
        bool,
        typer.Option(
            "--generate",
            help="With --no-train: a generating member (generates, scores and shares its "
            "own groups; never trains, takes nothing from the pool).",
        ),
    ] = False,
    status_listen: Annotated[
        str | None,
        typer.Option(
            help="HOST:PORT of the status endpoint (/status, /metrics, /healthz); default "
            "127.0.0.1:9141 (a free port when another node holds it); port 0 picks a free one."
        ),
    ] = None,
) -> None:
    """The options of ``start`` and ``doctor``: a signature only (``takes_node_options``)."""


@dataclass(frozen=True)
class NodeOptions:
    """The options ``start`` and ``doctor`` were given."""

    config: Path | None
    no_train: bool
    generate: bool
    flags: dict[str, Any]  # the options that override config fields, by name

    @property
    def relay(self) -> bool:
        """``--no-train`` alone: a relay, no model."""
        return self.no_train and not self.generate

    def node_config(self):
        """The node's config: flags over the file, and ``--generate`` (with ``--no-train``)
        as ``train.enabled = false``."""
        if self.generate and not self.no_train:
            raise UsageProblem("--generate is for a member that does not train: add --no-train")
        cfg = load_with_flags(self.config, **self.flags)
        if self.generate:
            train = cfg.train.model_copy(update={"enabled": False})
            cfg = cfg.model_copy(update={"train": train})
        return cfg


def takes_node_options(**help_for: str) -> Callable[[Callable[[NodeOptions], None]], Any]:
    """Give a command the options of ``node_options`` (``help_for``: its own help text
    for some of them); it is called with them as one ``NodeOptions``."""
    shared = inspect.signature(node_options, eval_str=True)
    params = []
    for p in shared.parameters.values():
        if p.name in help_for:
            kind, option = get_args(p.annotation)
            option = copy.copy(option)
            option.help = help_for[p.name]
            p = p.replace(annotation=Annotated[kind, option])
        params.append(p)

    def decorate(command: Callable[[NodeOptions], None]) -> Any:
        def with_options(**given: Any) -> None:
            config, no_train, generate = (given.pop(k) for k in ("config", "no_train", "generate"))
            command(NodeOptions(config, no_train, generate, given))

        with_options.__name__ = command.__name__
        with_options.__doc__ = command.__doc__
        with_options.__signature__ = shared.replace(parameters=params)  # type: ignore[attr-defined]
        return with_options

    return decorate
