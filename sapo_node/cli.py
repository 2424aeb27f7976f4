"""The ``sapo-node`` command line.

Usage errors (unknown options, bad values, a missing or invalid config file) print one
line and exit with code 2; runtime failures (a model that cannot be loaded, an unusable
checkpoint, a data directory in use) print one line and exit with code 1. What runs once
``start`` has its config (signals, ports, the node and its cleanup) is ``lifecycle``.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Annotated

import click
import typer

from sapo_node import __version__
from sapo_node.config import ConfigError
from sapo_node.flags import (
    Device,
    NodeOptions,
    UsageProblem,
    load_with_flags,
    takes_node_options,
)

try:  # typer >= 0.20 vendors its own click
    from typer._click import exceptions as _typer_click
except ImportError:  # pragma: no cover
    _typer_click = click.exceptions

_USAGE_ERRORS = (click.UsageError, _typer_click.UsageError)
_CLICK_ERRORS = (click.ClickException, _typer_click.ClickException)
_ABORTS = (click.exceptions.Abort, typer.Abort)

app = typer.Typer(
    name="sapo-node",
    help="A SAPO swarm node: trains a language model with GRPO on verifiable ReasoningGym "
    "tasks, mixing its own rollouts with those its peers share.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
@takes_node_options()
def start(options: NodeOptions) -> None:
    """Start a node: load the model, join the swarm, then run rounds until stopped (Ctrl-C
    saves and exits)."""
    cfg = options.node_config()
    if options.no_train and not cfg.net.enabled:
        what = "a generating member shares" if options.generate else "a relay relays"
        raise UsageProblem(f"--no-train: {what}, which needs the network (drop --offline)")
    from sapo_node.logs import configure_logging
    from sapo_node.ops import lifecycle

    configure_logging(cfg.node.json_logs, models=not options.relay)
    try:
        lifecycle.run(cfg, relay=options.relay)
    except lifecycle.NodeFailed as exc:
        _fail(str(exc))
    except ConfigError as exc:
        raise UsageProblem(str(exc)) from None


@app.command()
def identity(
    config: Annotated[Path | None, typer.Option("--config", help="TOML config file.")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="The node's state directory.")] = None,
    listen: Annotated[
        list[str] | None, typer.Option(help="Listen multiaddr, as given to start (repeatable).")
    ] = None,
    announce: Annotated[
        list[str] | None, typer.Option(help="Announce multiaddr, as given to start.")
    ] = None,
) -> None:
    """Print this node's peer ID and the addresses to give others (--bootstrap); creates
    the identity key on first use."""
    from sapo_node.addresses import count_as_lan, decide
    from sapo_node.intake import wire
    from sapo_node.net import NetError
    from sapo_node.net import identity as ident
    from sapo_node.net.reachability import announced_addresses

    cfg = load_with_flags(config, data_dir=data_dir, listen=listen, announce=announce)
    try:
        key = ident.load_or_create(cfg.node.resolved_data_dir())
    except NetError as exc:
        _fail(str(exc))
    peer = ident.peer_id(key)
    typer.echo(f"peer id: {peer}")
    addrs = announced_addresses(cfg.net.listen, cfg.net.announce)
    for addr in addrs:
        note = "  (port chosen at start: see its log)" if addr.endswith("/tcp/0") else ""
        typer.echo(f"address: {addr}/p2p/{peer}{note}")
    count_as_lan(cfg.net.lan_ranges)
    reachability = decide(cfg.net.reachability, cfg.net.announce, addrs)
    typer.echo(f"reachability: {reachability}  ({REACHABILITY_NOTE[reachability]})")
    if cfg.net.shards > 1:
        shards = wire.shards_of(ident.id_bytes(peer), cfg.net.shards, cfg.net.shards_joined)
        typer.echo(
            f"shards: {', '.join(map(str, shards))} of {cfg.net.shards}  (from the peer ID; "
            "the first is its home shard)"
        )


REACHABILITY_NOTE = {
    "public": "peers anywhere can dial these addresses",
    "private": "only LAN addresses: peers on this LAN can dial them, others cannot; public "
    "at start if the router maps a port (UPnP, net.upnp), or with a forwarded port and "
    "--announce /ip4/<public IP>/tcp/<port>",
    "local": "loopback only: reachable from this machine",
}


@app.command()
def swarm(
    nodes: Annotated[int, typer.Option(min=1, max=64, help="How many nodes to start.")] = 3,
    base_dir: Annotated[
        Path | None,
        typer.Option(
            help="Their data directories: BASE/node-0 ... (default: sapo-node-swarm beside "
            "the default data directory, e.g. ~/.local/share/sapo-node-swarm)."
        ),
    ] = None,
    port: Annotated[
        int, typer.Option(min=1, max=65535, help="Node i listens on 127.0.0.1, port PORT+i.")
    ] = 4150,
    every: Annotated[
        float, typer.Option(min=0.2, help="Seconds between two views of the swarm.")
    ] = 5.0,
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML config file for every node.")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model of every node (as for start).")] = None,
    rounds: Annotated[
        int | None, typer.Option(min=0, help="Each node stops after N rounds in total.")
    ] = None,
    swarm_name: Annotated[
        str | None, typer.Option("--swarm", help="Swarm name (GossipSub topic), as for start.")
    ] = None,
    device: Annotated[Device | None, typer.Option(help="Compute device of every node.")] = None,
    local: Annotated[int | None, typer.Option(min=0, help="I: own tasks per round.")] = None,
    external: Annotated[int | None, typer.Option(min=0, help="J: peers' groups per round.")] = None,
    seed: Annotated[int | None, typer.Option(min=0, help="Base seed; node i gets SEED+i.")] = None,
) -> None:
    """Start N nodes on this machine (loopback only, each with its own data directory and
    port, bootstrapped to each other) and show them in one view; Ctrl-C stops them all."""
    from sapo_node.local_swarm import Passthrough, SwarmError, run_swarm

    load_with_flags(  # a bad option or config file: one usage error here, not N in the logs
        config,
        model=model,
        rounds=rounds,
        swarm=swarm_name,
        device=device,
        local=local,
        external=external,
        seed=seed,
    )
    passthrough = Passthrough(
        config=config,
        model=model,
        rounds=rounds,
        swarm=swarm_name,
        device=device.value if device is not None else None,
        local=local,
        external=external,
        seed=seed,
    )
    try:
        code = run_swarm(nodes, base_dir=base_dir, port=port, every=every, passthrough=passthrough)
    except SwarmError as exc:
        _fail(str(exc))
    if code:
        raise SystemExit(code)


@app.command()
def plot(
    metrics: Annotated[
        Path, typer.Argument(help="A metrics.jsonl file.", exists=True, dir_okay=False)
    ],
    out: Annotated[Path | None, typer.Option(help="Output directory (default: beside it).")] = None,
    window: Annotated[int, typer.Option(min=1, help="Moving-average window in rounds.")] = 10,
) -> None:
    """Turn a metrics file into PNG curves (reward with a moving average, cumulative reward)."""
    from sapo_node.ops.plot import plot_metrics

    try:
        paths = plot_metrics(metrics, out or metrics.parent, window)
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None
    for p in paths:
        typer.echo(str(p))


@app.command("eval")
def evaluate_cmd(
    config: Annotated[Path | None, typer.Option("--config", help="TOML config file.")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="The node's state directory.")] = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option(help="A checkpoint directory (default: the data directory's latest)."),
    ] = None,
    model: Annotated[str | None, typer.Option(help="The node's model (as for start).")] = None,
    device: Annotated[Device | None, typer.Option(help="Compute device.")] = None,
    tasks: Annotated[int | None, typer.Option(min=1, help="Held-out tasks (eval.tasks).")] = None,
    samples: Annotated[
        int | None, typer.Option(min=1, help="Sampled completions per task (eval.samples).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Run the held-out evaluation (pass@1 and greedy accuracy per family, on tasks no node
    trains on) on a node's latest checkpoint, or the one given."""
    cfg = load_with_flags(config, data_dir=data_dir, model=model, device=device)
    extra = {k: v for k, v in (("tasks", tasks), ("samples", samples)) if v is not None}
    if extra:
        try:
            cfg = cfg.model_copy(
                update={"eval": cfg.eval.model_validate(cfg.eval.model_dump() | extra)}
            )
        except ValueError as exc:
            raise UsageProblem(str(exc)) from None
    from sapo_node.checkpoint import CheckpointError
    from sapo_node.evaluate import evaluate_checkpoint
    from sapo_node.logs import configure_logging
    from sapo_node.train.policy import ModelLoadError

    configure_logging(cfg.node.json_logs)
    try:
        report, what = evaluate_checkpoint(cfg, checkpoint)
    except (ModelLoadError, CheckpointError) as exc:
        _fail(str(exc))
    metrics = report.metrics()
    if as_json:
        summary = {k: v for k, v in metrics.items() if not k.startswith("eval/per_task")}
        typer.echo(json.dumps({"evaluated": what, **summary}, indent=2))
        return
    typer.echo(f"held-out evaluation of {what}")
    typer.echo(f"{report.samples} samples per task, {metrics['eval/tasks']} tasks")
    typer.echo(f"{'family':<28} {'tasks':>5} {'pass@1':>7} {'greedy':>7}")
    families = sorted({t.family for t in report.tasks})
    for fam in [*families, None]:
        n = sum(t.family == fam for t in report.tasks) if fam else len(report.tasks)
        suffix = f"/{fam}" if fam else ""
        typer.echo(
            f"{fam or 'all':<28} {n:>5} {metrics['eval/pass1' + suffix]:>7.3f} "
            f"{metrics['eval/greedy' + suffix]:>7.3f}"
        )
    typer.echo(f"answer-tag rate {metrics['eval/answer_tag_rate']:.3f}, {report.seconds:.1f} s")


@app.command()
def experiment(
    spec_file: Annotated[
        Path, typer.Argument(help="Experiment TOML (see configs/experiments/).", dir_okay=False)
    ],
    out: Annotated[
        Path | None, typer.Option(help="Output directory (default: experiment-<file name>).")
    ] = None,
    only: Annotated[
        list[str] | None,
        typer.Option(help="Run only this configuration, e.g. 2/2 or '2/2 uniform' (repeatable)."),
    ] = None,
    rounds: Annotated[int | None, typer.Option(min=1, help="Rounds per node.")] = None,
    nodes: Annotated[int | None, typer.Option(min=1, help="Nodes per swarm.")] = None,
    threads: Annotated[int | None, typer.Option(min=0, help="torch threads (0: default).")] = None,
    report_only: Annotated[
        bool, typer.Option("--report-only", help="Only rewrite the report from OUT's files.")
    ] = False,
) -> None:
    """The controlled comparison of the paper: N nodes per (I, J) configuration in lockstep
    over the in-memory transport, held-out evaluation at start and end; writes
    results.json, results.md and the reward curves under OUT. Running it again resumes."""
    from sapo_node.experiment import load_spec, report, run_experiment

    overrides = {k: v for k, v in (("rounds", rounds), ("nodes", nodes), ("threads", threads)) if v}
    if threads == 0:
        overrides["threads"] = 0
    try:
        spec = load_spec(spec_file, {"experiment": overrides} if overrides else None)
        for label in only or []:
            from sapo_node.experiment import arm

            arm(spec, label)
    except ConfigError as exc:
        raise UsageProblem(str(exc)) from None
    out_dir = out or Path(f"experiment-{spec_file.stem}")
    from sapo_node.logs import configure_logging

    configure_logging(False)
    import structlog

    log = structlog.get_logger("sapo_node.cli")
    if report_only:
        report(spec, out_dir)
        typer.echo((out_dir / "results.md").read_text(encoding="utf-8"))
        return
    from sapo_node.checkpoint import CheckpointError
    from sapo_node.datadir import DataDirInUse
    from sapo_node.intake.pool import PoolError
    from sapo_node.ops.lifecycle import on_signals
    from sapo_node.tasks import ScorerUnavailable
    from sapo_node.train.policy import ModelLoadError

    stop = threading.Event()
    on_signals(stop)
    try:
        finished = run_experiment(
            spec, out_dir, only=only or (), stop=stop, progress=lambda m: log.info(m)
        )
    except ConfigError as exc:
        _fail(str(exc))
    except (ModelLoadError, DataDirInUse, CheckpointError, PoolError, ScorerUnavailable) as exc:
        _fail(str(exc))
    typer.echo((out_dir / "results.md").read_text(encoding="utf-8"))
    if not finished:
        typer.echo("stopped: run the same command again to continue", err=True)
        raise SystemExit(130)


@app.command()
def share(
    file: Annotated[
        str, typer.Argument(help="JSON Lines of rollout groups (docs/share.md); - reads stdin.")
    ],
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML config file (tasks, swarm).")
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="State directory of the sharer: its identity key (default: DIR/share "
            "under the node's data directory)."
        ),
    ] = None,
    swarm: Annotated[str | None, typer.Option(help="Swarm name.")] = None,
    listen: Annotated[
        list[str] | None,
        typer.Option(help="Multiaddr to listen on (default /ip4/0.0.0.0/tcp/0: any free port)."),
    ] = None,
    announce: Annotated[list[str] | None, typer.Option(help="Multiaddr to announce.")] = None,
    bootstrap: Annotated[
        list[str] | None, typer.Option(help="Peer to join through (repeatable).")
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Check every line and send nothing (no network).")
    ] = False,
    skip_refused: Annotated[
        bool,
        typer.Option("--skip-refused", help="Send a file's good lines even if some are refused."),
    ] = False,
    wait_peers: Annotated[
        int, typer.Option(min=1, help="Swarm peers to wait for before sending.")
    ] = 1,
    wait_s: Annotated[
        float, typer.Option(min=1.0, help="How long to wait for peers and for the network.")
    ] = 60.0,
) -> None:
    """Publish rollout groups made elsewhere (another model, a program, a person): each
    line is checked exactly as a receiver checks a peer's group (regenerated, compared,
    scored) before it is sent; refused lines are reported with their line number and
    reason, and a file with a refused line sends nothing (--skip-refused sends the rest)."""
    cfg = load_with_flags(
        config,
        swarm=swarm,
        listen=listen or ["/ip4/0.0.0.0/tcp/0"],  # a node may hold the usual port here
        announce=announce,
        bootstrap=bootstrap,
    )
    share_dir = data_dir or cfg.node.resolved_data_dir() / "share"
    from sapo_node.logs import configure_logging
    from sapo_node.ops.lifecycle import NodeFailed, hold_data_dir, join_swarm
    from sapo_node.share import Checker, read_lines
    from sapo_node.share import share as share_lines

    configure_logging(cfg.node.json_logs, models=False)  # it checks and sends: no model
    streaming = file == "-"
    try:  # bytes: a line that is not UTF-8 is refused as such, with its number
        stream = sys.stdin.buffer if streaming else open(file, "rb")  # noqa: SIM115
    except OSError as exc:
        _fail(f"cannot read {file}: {exc.strerror or exc}")
    lock = None
    if not check:
        try:
            lock = hold_data_dir(share_dir)
        except NodeFailed as exc:
            _fail(str(exc))
    connect = None if check else (lambda: join_swarm(cfg, share_dir, wait_peers, wait_s))
    author = "check" if check else _share_identity(share_dir)
    checker = Checker(cfg, author)
    try:
        outcome = share_lines(
            read_lines(stream),
            checker,
            connect,
            streaming=streaming,
            skip_refused=skip_refused,
            say=lambda m: typer.echo(m, err=True),
            wait_s=wait_s,
        )
    except NodeFailed as exc:
        _fail(str(exc))
    except ConfigError as exc:
        raise UsageProblem(str(exc)) from None
    finally:
        checker.close()
        if not streaming:
            stream.close()
        if lock is not None:
            lock.close()
    refused = len(outcome.refused)
    summary = f"{outcome.checked} lines checked, {refused} refused, {outcome.sent} sent"
    if outcome.unsent:
        summary += f", {outcome.unsent} not taken by the network"
    if refused and not streaming and not skip_refused and not check:
        summary += " (a refused line sends nothing: fix it, or pass --skip-refused)"
    typer.echo(summary)
    if refused or outcome.unsent:
        raise SystemExit(1)


def _share_identity(share_dir: Path) -> str:
    from sapo_node.net import NetError
    from sapo_node.net import identity as ident

    try:
        return ident.peer_id(ident.load_or_create(share_dir))
    except NetError as exc:
        _fail(str(exc))
    raise AssertionError  # unreachable: _fail exits


@app.command()
def tasks(
    config: Annotated[Path | None, typer.Option("--config", help="TOML config file.")] = None,
) -> None:
    """Print the tasks a node with this config accepts from peers, as JSON: per family, the
    config of every curriculum level (SPEC.md, "Which tasks a receiver accepts")."""
    from sapo_node.curriculum import Curriculum
    from sapo_node.tasks import generator_of

    cfg = load_with_flags(config)
    known = Curriculum(cfg.tasks.families, cfg.curriculum).known_configs()
    out = {
        name: {
            "generator": generator_of(name),
            "configs": [json.loads(c) for c in sorted(configs)],
        }
        for name, configs in sorted(known.items())
    }
    typer.echo(json.dumps(out, indent=2))


@app.command("pool")
def show_pool(
    config: Annotated[Path | None, typer.Option("--config", help="TOML config file.")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="The node's state directory.")] = None,
) -> None:
    """Print what the node's pool holds and, per peer, groups accepted and refused by reason."""
    from sapo_node.intake.pool import PoolError, summary

    cfg = load_with_flags(config, data_dir=data_dir)
    try:
        typer.echo(json.dumps(summary(cfg.node.resolved_data_dir() / "pool.sqlite3"), indent=2))
    except PoolError as exc:
        _fail(str(exc))


@app.command("status")
def show_status(
    config: Annotated[Path | None, typer.Option("--config", help="TOML config file.")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="The node's state directory.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print /status as JSON.")] = False,
) -> None:
    """Ask the node running with this data directory how it is doing (exit 1 if none
    answers or it is unhealthy)."""
    from sapo_node.ops.status import StatusError, read_status, summary

    cfg = load_with_flags(config, data_dir=data_dir)
    try:
        facts = read_status(cfg.node.resolved_data_dir())
    except StatusError as exc:
        _fail(str(exc))
    typer.echo(json.dumps(facts, indent=2) if as_json else "\n".join(summary(facts)))
    if not facts["healthy"]:
        raise SystemExit(1)


@app.command("config")
def show_config(
    config: Annotated[Path | None, typer.Option("--config", help="TOML config file.")] = None,
) -> None:
    """Print the resolved config (file, environment and defaults) as JSON."""
    typer.echo(load_with_flags(config).model_dump_json(indent=2))


@app.command("export")
def export_cmd(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the model into.")],
    config: Annotated[Path | None, typer.Option("--config", help="The node's TOML config.")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="The node's state directory.")] = None,
    checkpoint: Annotated[
        str | None,
        typer.Option(help="A round number or checkpoint directory (default: the latest)."),
    ] = None,
    merge: Annotated[
        bool, typer.Option("--merge", help="LoRA: write the merged full model, not the adapter.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Replace --out if it is not empty.")
    ] = False,
    model: Annotated[
        str | None, typer.Option(help="The node's model, if it moved (default: the checkpoint's).")
    ] = None,
) -> None:
    """Write a checkpoint as a Hugging Face model directory (from_pretrained), or a LoRA
    node's adapter (PeftModel.from_pretrained; --merge for the merged model)."""
    from sapo_node.ops.export import ExportError, export_checkpoint, summary

    cfg = load_with_flags(config, data_dir=data_dir)
    try:
        result = export_checkpoint(
            cfg, out, checkpoint=checkpoint, merge=merge, force=force, model=model
        )
    except ExportError as exc:
        _fail(str(exc))
    for line in summary(result):
        typer.echo(line)
    if merge and result.kind == "model":
        typer.echo("(--merge: a full fine-tune has no adapter to merge; it is the full model)")


@app.command()
@takes_node_options(json_logs="Ignored.")
def doctor(options: NodeOptions) -> None:
    """Check this machine against a node's config (the same options as start): versions,
    torch's build, memory, disk, port, identity key, data directory. One line per check;
    exit 0 when none fails."""
    from sapo_node.ops.doctor import exit_code, run_checks

    checks = run_checks(options.node_config(), no_train=options.relay)
    for check in checks:
        typer.echo(check.line())
    raise SystemExit(exit_code(checks))


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        typer.echo(__version__)
        raise typer.Exit()


def _fail(message: str) -> None:
    typer.echo(f"sapo-node: error: {message}", err=True)
    raise SystemExit(1)


def main(argv: list[str] | None = None) -> None:
    """Entry point: click's usage errors become one line and exit code 2."""
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="sapo-node", standalone_mode=False)
    except _USAGE_ERRORS as exc:
        typer.echo(f"sapo-node: error: {exc.format_message()}", err=True)
        sys.exit(2)
    except _ABORTS:
        sys.exit(130)
    except _CLICK_ERRORS as exc:
        typer.echo(f"sapo-node: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
