"""Rollout groups from outside a model: a file, a program or a person (``sapo-node share``).

A member of the swarm need not be a model (the paper: "including humans or other
non-traditional generators"). ``sapo-node share FILE`` publishes rollout groups read
from JSON Lines, one group per line (docs/share.md has the format with examples)::

    {"task": {"family": "basic_arithmetic", "config": {...}, "seed": 7, "index": 3},
     "completions": ["3 + 4 = 7\\n<answer>7</answer>", "<answer>8</answer>"],
     "finished": [true, true],        # optional: default all true
     "model": "my-solver",            # optional: default "external"
     "question": "..."}               # optional: if given, must be the task's question

Every line is checked exactly as a receiver checks a peer's message: it is encoded as
the wire message it will be (wire.py), then decoded and put through the receiver's
intake (intake/checks.py) on a private pool: form and sizes, time, a family and config this
node's curriculum sets, the task regenerated from its reference and its question
compared, every completion scored by the verifier in the sandbox. A line that fails is
refused with its line number and the receiver's reason; a line that passes is sent as
the message that was checked, stamped with the time it is sent (receivers refuse groups
older than their ``pool.max_age_s``, and a long file takes a while at the rate they allow).

Nothing is half-sent: a FILE is checked whole before anything is sent, and if any line
is refused nothing is sent (``--skip-refused`` sends the lines that passed). Standard
input (``-``) is for a program that makes groups as it goes: each line is checked and
sent as it arrives, and refused lines are reported and skipped.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from sapo_node.config import Config
from sapo_node.curriculum import Curriculum
from sapo_node.intake import wire
from sapo_node.intake.checks import (
    CANNOT_REGENERATE,
    QUESTION_MISMATCH,
    UNKNOWN_CONFIG,
    UNKNOWN_FAMILY,
    Intake,
)
from sapo_node.intake.pool import Pool
from sapo_node.tasks import Scorer, TaskRef, canonical_json, generator_of, make_task

LINE_FIELDS = {"task", "completions", "finished", "model", "question"}
TASK_FIELDS = {"family", "config", "seed", "index"}
DEFAULT_MODEL = "external"
MAX_LINE_BYTES = wire.MAX_MESSAGE_BYTES  # a longer line cannot become a valid message
WRITE_S = 10.0  # at most this long after the last publish for it to be written to peers
# then this long before closing: a peer's py-libp2p drops what it has not yet read from a
# connection when the connection ends
LINGER_S = 2.0
SKIP_CHUNK = 64 * 1024  # the rest of a line too long is read and dropped this much at a time

# Reasons found before the message exists (the rest are wire.py's and intake/checks.py's).
BAD_JSON = "bad_json"
BAD_LINE = "bad_line"
BAD_TASK = "bad_task"
LINE_TOO_LONG = "line_too_long"


@dataclass(frozen=True)
class Checked:
    """One line's outcome: the message's bytes to send, or the reason it is refused."""

    line: int
    group: wire.RolloutGroup | None = None
    data: bytes | None = None
    reason: str = ""
    detail: str = ""
    rewards: tuple[float, ...] = ()

    @property
    def ok(self) -> bool:
        return self.data is not None

    @property
    def family(self) -> str:
        return self.group.ref.family if self.group else ""

    def fresh(self) -> bytes:
        """The checked message stamped with the time now (what is sent)."""
        assert self.group is not None
        now = int(time.time() * 1000)
        return wire.encode(dataclasses.replace(self.group, created_ms=now))

    def describe(self) -> str:
        if self.ok:
            shown = " ".join(f"{r:g}" for r in self.rewards)
            return f"line {self.line}: ok ({self.family}, rewards {shown})"
        return f"line {self.line}: refused: {self.reason}" + (
            f" ({self.detail})" if self.detail else ""
        )


class _Refused(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason, self.detail = reason, detail


class Checker:
    """Turns lines into checked wire messages, with a receiver's own checks.

    ``author`` is the peer ID the messages will be signed with: duplicates are found
    per author, as receivers find them. The private pool has no rate limit (the
    network process paces publishing at the rate receivers allow).
    """

    def __init__(
        self,
        config: Config,
        author: str,
        scorer: Scorer | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``clock``: seconds now, for the messages' creation time and the checks' ages
        (an experiment's members pass the clock of its rounds)."""
        self.config = config
        self.author = author
        self.clock = clock
        self._own_scorer = scorer is None
        self.scorer = scorer or Scorer.of(config)
        p = config.pool
        self.pool = Pool(
            None,
            max_groups=10**7,
            max_bytes=2**40,
            max_per_author=10**7,
            rate_per_author=1e6,
            burst_per_author=10**6,
            max_age_s=p.max_age_s,
            clock=clock,
        )
        curriculum = Curriculum(config.tasks.families, config.curriculum)
        self.intake = Intake(
            self.pool,
            self.scorer,
            known_configs=curriculum.known_configs(),
            accept_unregenerable=False,
            max_clock_skew_s=p.max_clock_skew_s,
        )

    def check(self, text: str | bytes, line: int) -> Checked:
        """Check one line (a JSON object) and return its outcome; never raises."""
        try:
            message = self._message(text)
            data = wire.encode(message)
        except _Refused as exc:
            return Checked(line, reason=exc.reason, detail=exc.detail)
        except wire.EncodeError as exc:
            return Checked(line, reason=exc.reason, detail=str(exc).removeprefix(f"{exc.reason}: "))
        verdict = self.intake.receive(data, self.author)
        if verdict.outcome != "accepted" or verdict.item is None:
            return Checked(line, reason=verdict.reason, detail=verdict.detail)
        return Checked(line, message, data, rewards=verdict.item.rewards)

    def check_all(self, lines: Iterable[str | bytes | Overlong]) -> Iterator[Checked]:
        """Every non-blank line, numbered from 1, checked in order."""
        for number, text in enumerate(lines, start=1):
            if isinstance(text, Overlong):
                detail = f"{int(text)} bytes, at most {MAX_LINE_BYTES}"
                yield Checked(number, reason=LINE_TOO_LONG, detail=detail)
            elif text.strip():
                yield self.check(text, number)

    def _message(self, text: str | bytes) -> wire.RolloutGroup:
        if len(text) > MAX_LINE_BYTES:
            raise _Refused(LINE_TOO_LONG, f"{len(text)} bytes, at most {MAX_LINE_BYTES}")
        try:
            obj = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise _Refused(BAD_JSON, str(exc)[:200]) from None
        if not isinstance(obj, dict):
            raise _Refused(BAD_LINE, f"a line is a JSON object, not {type(obj).__name__}")
        unknown = sorted(set(obj) - LINE_FIELDS)
        if unknown:
            raise _Refused(wire.UNKNOWN_FIELD, ", ".join(unknown)[:200])
        for name in ("task", "completions"):
            if name not in obj:
                raise _Refused(wire.MISSING_FIELD, name)
        ref = _task_ref(obj["task"])
        completions = obj["completions"]
        if not isinstance(completions, list) or not all(isinstance(c, str) for c in completions):
            raise _Refused(wire.WRONG_TYPE, "completions must be a list of strings")
        finished = obj.get("finished", [True] * len(completions))
        if not isinstance(finished, list) or not all(isinstance(f, bool) for f in finished):
            raise _Refused(wire.WRONG_TYPE, "finished must be a list of true/false")
        if len(finished) != len(completions):
            raise _Refused(
                wire.BAD_COUNT, f"{len(finished)} finished flags for {len(completions)} completions"
            )
        model = obj.get("model", DEFAULT_MODEL)
        if not isinstance(model, str):
            raise _Refused(wire.WRONG_TYPE, "model must be a string")
        # The receiver's own order: a task this node's curriculum does not set is never
        # made (a custom family's name imports a module), whatever the file says.
        configs = self.intake.known_configs.get(ref.family)
        if configs is None:
            raise _Refused(UNKNOWN_FAMILY, ref.family[:200])
        if ref.config_json not in configs:
            raise _Refused(UNKNOWN_CONFIG, ref.config_json[:200])
        try:
            task = make_task(ref)
        except Exception as exc:  # e.g. a custom family's data missing here
            raise _Refused(CANNOT_REGENERATE, f"{type(exc).__name__}: {exc}"[:200]) from None
        question = obj.get("question", task.question)
        if question != task.question:
            raise _Refused(QUESTION_MISMATCH, "the question is not the task's own")
        return wire.RolloutGroup(
            ref=ref,
            generator=generator_of(ref.family),
            question=task.question,
            completions=tuple(completions),
            unfinished=frozenset(i for i, f in enumerate(finished) if not f),
            model=model,
            round=0,
            created_ms=int(self.clock() * 1000),
        )

    def close(self) -> None:
        self.pool.close()
        if self._own_scorer:
            self.scorer.close()


class Overlong(int):
    """A line longer than MAX_LINE_BYTES, in place of its bytes: its length."""


def read_lines(stream: IO[bytes], limit: int = MAX_LINE_BYTES) -> Iterator[bytes | Overlong]:
    """The lines of ``stream`` as they come, none read whole beyond ``limit`` bytes (the
    newline not counted): a longer line is read on and dropped, ``SKIP_CHUNK`` bytes at a
    time, and comes as its :class:`Overlong` length, so that a stream of one endless line
    costs no more memory than a line of the limit."""
    while True:
        line = stream.readline(limit + 2)  # the limit, the newline, and one more
        if not line:
            return
        if line.endswith(b"\n") or len(line) <= limit:
            yield line
            continue
        size = len(line)
        while not line.endswith(b"\n"):
            line = stream.readline(SKIP_CHUNK)
            if not line:
                break
            size += len(line)
        yield Overlong(size - line.endswith(b"\n"))


def _task_ref(task: object) -> TaskRef:
    if not isinstance(task, dict):
        raise _Refused(BAD_TASK, "task must be an object with family, config, seed, index")
    missing = sorted(TASK_FIELDS - set(task))
    unknown = sorted(set(task) - TASK_FIELDS)
    if missing or unknown:
        raise _Refused(BAD_TASK, f"missing {missing}, unknown {unknown}"[:200])
    family, config, seed, index = (task[k] for k in ("family", "config", "seed", "index"))
    if not isinstance(family, str) or not isinstance(config, dict):
        raise _Refused(BAD_TASK, "family is a string and config an object")
    for name, value in (("seed", seed), ("index", index)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= wire.MAX_UINT:
            raise _Refused(BAD_TASK, f"{name} must be an integer in [0, 2^63)")
    return TaskRef(family, canonical_json(config), seed, index)


def line_of(
    ref: TaskRef, completions: Iterable[str], *, model: str = DEFAULT_MODEL, finished=None
) -> str:
    """The JSON line of a group (what a program writes for ``sapo-node share -``)."""
    completions = list(completions)
    obj = {
        "task": {"family": ref.family, "config": ref.config, "seed": ref.seed, "index": ref.index},
        "completions": completions,
        "finished": list(finished) if finished is not None else [True] * len(completions),
        "model": model,
    }
    return json.dumps(obj, ensure_ascii=False)


# --- sending ------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What ``share`` did."""

    checked: int = 0
    sent: int = 0
    refused: list[Checked] = dataclasses.field(default_factory=list)
    unsent: int = 0  # passed, but the network did not take them (it stopped, or no room)


def share(
    lines: Iterable[str | bytes | Overlong],
    checker: Checker,
    connect: Callable[[], Any] | None,
    *,
    streaming: bool,
    skip_refused: bool = False,
    say: Callable[[str], None] = print,
    wait_s: float = 60.0,
) -> Outcome:
    """Check ``lines`` and send those that pass on the transport ``connect()`` opens
    (None: check only, send nothing). Returns the outcome; ``say`` reports each line.

    ``streaming`` (standard input): connect first, then check and send line by line.
    Otherwise (a file): check every line, then connect and send, or send nothing if a
    line was refused and ``skip_refused`` is not set.
    """
    out = Outcome()

    def checked() -> Iterator[Checked]:
        for c in checker.check_all(lines):
            out.checked += 1
            say(c.describe())
            if not c.ok:
                out.refused.append(c)
                continue
            yield c

    if connect is None:
        for _ in checked():
            pass
        return out
    if not streaming:
        passed = list(checked())
        if out.refused and not skip_refused:
            return out
        if not passed:
            return out
        source: Iterable[Checked] = passed
    transport = connect()
    try:
        if streaming:
            source = checked()
        for c in source:
            if transport.publish(c.fresh(), wait_s=wait_s):
                out.sent += 1
            else:
                out.unsent += 1
        # GossipSub writes to its peers' streams after publish returns: the network
        # process confirms they are written, and its peers get LINGER_S to read them.
        if out.sent:
            if not transport.flush(wait_s, drain_s=WRITE_S):
                say(
                    "the network did not confirm every group written to its peers "
                    f"(published within {wait_s:.0f} s, then written within {WRITE_S:g} s)"
                )
            time.sleep(LINGER_S)
    finally:
        transport.close()
    return out
