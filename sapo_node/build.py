"""``build_node``: a node's parts made from its config, apart from the loop that drives
them (node.py).

The order is the order of what each part needs: the data directory and its lock first
(a second process on the same directory is refused before anything heavy loads), then
the model, the scorer's sandbox, the curriculum, the trainer, the pool, the poisoning
defences and the intake that puts peers' groups into the pool. If any part fails, those
already made are closed again (the lock released, the sandbox stopped, the pool's
database closed) and the error goes to the caller as it was raised.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import structlog
import torch

from sapo_node import swarmfile
from sapo_node.checkpoint import CheckpointStore, made_for, set_aside
from sapo_node.config import Config
from sapo_node.curriculum import Curriculum
from sapo_node.datadir import lock_data_dir, node_seed
from sapo_node.intake import peerstate
from sapo_node.intake.checks import Intake
from sapo_node.intake.defence import Defence
from sapo_node.intake.pool import Pool
from sapo_node.metrics import MetricsLog
from sapo_node.net import Transport
from sapo_node.node import Node, Parts, prepare_completion
from sapo_node.tasks import Scorer
from sapo_node.train.policy import load_policy
from sapo_node.train.trainer import Trainer

log = structlog.get_logger(__name__)


def build_node(
    config: Config,
    *,
    stop: threading.Event | None = None,
    transport: Transport | None = None,
    clock: Callable[[], float] = time.time,
    lock: IO[str] | None = None,
) -> Node:
    """A node of ``config``, its parts made and nothing run yet (``Node.resume`` and
    ``Node.run`` do that). ``clock``: seconds now for the pool's ages, the defence's
    deadlines and the creation time of shared groups (an experiment passes a clock of its
    rounds). ``lock``: the data directory's lock if the caller took it already
    (``lifecycle.run_node``, which starts the network while the model loads); the node
    owns it from here on, and a failure here releases it."""
    node: Node | None = None  # the pool's round clock reads the node's round once it is made
    with contextlib.ExitStack() as undo:
        data_dir = config.node.resolved_data_dir()
        if lock is None:
            data_dir.mkdir(parents=True, exist_ok=True)
            lock = lock_data_dir(data_dir)
        undo.callback(lock.close)
        follow_the_swarms_model(config, data_dir)
        seed = node_seed(data_dir, config.node.seed)  # a broken node.json: said before any load
        if config.node.threads:
            torch.set_num_threads(config.node.threads)
        m, g = config.model, config.generation
        policy = load_policy(
            m.name,
            device=config.node.device,
            dtype=m.dtype,
            lora=m.lora,
            cache_dir=data_dir / "models",
            gradient_checkpointing=m.gradient_checkpointing,
            seed=seed,  # the adapter's initial weights: the node seed's, not the process's
        )
        scorer = Scorer.of(config)
        undo.callback(scorer.close)
        curriculum = Curriculum(config.tasks.families, config.curriculum)
        trainer = None
        if config.train.enabled:
            trainer = Trainer(
                policy, config.train, g.max_new_tokens, g.temperature, top_p=g.top_p, top_k=g.top_k
            )
        else:  # a generating member: its weights are the model's, for good
            policy.model.requires_grad_(False)
        pool = Pool.from_config(
            data_dir / "pool.sqlite3",
            config.pool,
            clock=clock,
            round_clock=lambda: node.round if node is not None else 0,
        )
        undo.callback(pool.close)
        defence = None
        if trainer is not None and config.defence.enabled:
            defence = Defence(
                config.defence,
                trainer.completion_ranks,
                pool.record,
                spans=policy.token_spans,
                state_path=data_dir / peerstate.DEFENCE_FILE,
                clock=clock,
            )
        intake = Intake(
            pool,
            scorer,
            known_configs=curriculum.known_configs(),
            accept_unregenerable=config.pool.accept_unregenerable,
            max_clock_skew_s=config.pool.max_clock_skew_s,
            prepare=lambda text, finished: prepare_completion(config, policy, text, finished).text,
            distrusted=defence.distrusted if defence else None,
        )
        parts = Parts(
            data_dir=data_dir,
            lock=lock,
            seed=seed,
            policy=policy,
            scorer=scorer,
            curriculum=curriculum,
            trainer=trainer,
            pool=pool,
            defence=defence,
            intake=intake,
            metrics=MetricsLog(data_dir / "metrics.jsonl"),
            store=CheckpointStore(data_dir, keep=config.node.keep_checkpoints),
        )
        node = Node(config, parts, stop=stop, transport=transport, clock=clock)
        undo.pop_all()  # the node owns its parts now (Node.close)
    return node


def follow_the_swarms_model(config: Config, data_dir: Path) -> None:
    """A swarm file that changed the model (or LoRA) since the last checkpoint starts a new
    run: the old one is set aside whole, where a resume would fail on the fingerprint."""
    path = CheckpointStore(data_dir).latest()
    if path is None:
        return
    old = made_for(path)
    if not swarmfile.model_change(config, old):
        return
    where = set_aside(data_dir, str(old.get("model", "run")))
    log.warning(
        f"the swarm file ({config.net.swarm_file}) changed the model from {old} to "
        f"{config.fingerprint()}: a new run starts from round 0; the old run's checkpoints "
        f"and metrics are kept in {where} (--data-dir {where} reads them)"
    )
