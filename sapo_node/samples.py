"""What the trainer trains on: one prompt with one completion and its advantage.

It lives apart from the trainer so that the layers that hand samples over (the
intake's defences ask the policy to rank peers' completions; the round's groups become
a training set) need not import the trainer, and with it torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    """One training sequence: a prompt, a completion and the completion's advantage.

    ``taught``: which completion tokens the loss counts (None: all of them). A token left
    out gets neither loss nor gradient; the others keep their weight (the loss is still
    normalised over whole completions), so leaving text out teaches less, never more.

    ``copies``: how many identical samples this one stands for (``groups.training_set``
    merges a group's identical completions). Identical tokens and advantage give identical
    per-token losses, so one forward and backward weighted ``copies`` times gives the
    gradient of them all, at the cost of one.

    ``weight``: how many of its group's completions this one stands for when only some
    of them train (``train.external_completions``): its loss counts ``weight`` times.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    taught: tuple[bool, ...] | None = None
    copies: int = 1
    weight: float = 1.0
