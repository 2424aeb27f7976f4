"""The wire format: the rollout-group message, its MessagePack encoding, strict decoding.

This module mirrors protocol/SPEC.md field by field, and protocol/vectors/ holds golden
messages that the tests check in both directions: a change here is a change there.

Decoding is strict and never raises: ``decode(data)`` returns a ``RolloutGroup`` or a
``Rejection`` whose ``reason`` is one of the codes below. It checks form only (types,
sizes, ranges, spelling); what a message *means* (a known family, a question that matches
its regenerated task, the rewards) is checked by the receiver (intake/checks.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import operator
import re
from dataclasses import dataclass, field
from itertools import chain, compress
from typing import Any

import msgpack

from sapo_node.tasks import TaskRef, canonical_json

PROTOCOL_VERSION = 2
MODALITY_TEXT = "text"

# Size limits, in bytes of UTF-8 unless said otherwise (protocol/SPEC.md, "Limits").
MAX_MESSAGE_BYTES = 512 * 1024
MIN_COMPLETIONS = 2
MAX_COMPLETIONS = 64
MAX_COMPLETION_BYTES = 8 * 1024
MAX_QUESTION_BYTES = 16 * 1024
MAX_ANSWER_BYTES = 4 * 1024
MAX_METADATA_BYTES = 16 * 1024
MAX_CONFIG_BYTES = 2 * 1024
MAX_FAMILY_BYTES = 128
MAX_GENERATOR_BYTES = 64
MAX_MODEL_BYTES = 256
MAX_MODALITY_BYTES = 32
MAX_UINT = 2**63 - 1  # seeds, indices, rounds, times: non-negative, fit a signed int64
MAX_JSON_DEPTH = 8
# MessagePack maps and arrays, the message's own map counting 1: a version-2 message
# needs 2 (the task map, the arrays of completions and flags). Any message, of any
# version or modality, stays within it, so that a node reads version and modality of
# whatever reaches it; deeper is malformed.
MAX_MSGPACK_DEPTH = 8
MAX_SHARDS = 4096  # shard topics of a swarm (section 2.2)

FAMILY_PATTERN = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*(:[A-Za-z0-9_]+)?")
GENERATOR_PATTERN = re.compile(r"[A-Za-z0-9_.+-]+ [A-Za-z0-9_.+-]+")
SWARM_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")

# Rejection reasons found by decode (the receiver adds its own in intake/checks.py).
OVERSIZE = "oversize"
MALFORMED = "malformed"
BAD_UTF8 = "bad_utf8"
NOT_A_MAP = "not_a_map"
DUPLICATE_FIELD = "duplicate_field"
UNSUPPORTED_VERSION = "unsupported_version"
UNSUPPORTED_MODALITY = "unsupported_modality"
UNKNOWN_FIELD = "unknown_field"
MISSING_FIELD = "missing_field"
WRONG_TYPE = "wrong_type"
TOO_LONG = "too_long"
BAD_COUNT = "bad_count"
BAD_VALUE = "bad_value"

# Reasons that do not mark the sender as misbehaving: a newer or differently equipped
# peer sends them in good faith. The message is dropped, not forwarded, not penalised.
IGNORED = frozenset({UNSUPPORTED_VERSION, UNSUPPORTED_MODALITY})

# The fields of a version-2 text message and their MessagePack types, in encoding order.
FIELDS: dict[str, tuple[type, ...]] = {
    "version": (int,),
    "modality": (str,),
    "task": (dict,),
    "generator": (str,),
    "question": (str,),
    "answer": (str, type(None)),
    "metadata": (str, type(None)),
    "completions": (list,),
    "finished": (list,),
    "model": (str,),
    "round": (int,),
    "created": (int,),
}
TASK_FIELDS: dict[str, tuple[type, ...]] = {
    "family": (str,),
    "config": (str,),
    "seed": (int,),
    "index": (int,),
}


def topic(swarm: str) -> str:
    """The pubsub topic of a swarm's rollout groups, carrying the protocol's major version.

    >>> topic("demo")
    'sapo/demo/rollouts/v2'
    """
    if not SWARM_PATTERN.fullmatch(swarm):
        raise ValueError(
            f"swarm name {swarm!r} must be 1-63 characters of a-z, 0-9 and '-', "
            "starting with a letter or digit"
        )
    return f"sapo/{swarm}/rollouts/v{PROTOCOL_VERSION}"


def shard_topic(swarm: str, shard: int, shards: int) -> str:
    """The topic of shard ``shard`` of ``shards`` (protocol/SPEC.md, section 2.2); with
    one shard, exactly the swarm's single topic of before shards.

    >>> shard_topic("demo", 0, 1)
    'sapo/demo/rollouts/v2'
    >>> shard_topic("demo", 3, 64)
    'sapo/demo/rollouts/v2/shard-3-of-64'
    """
    if not 1 <= shards <= MAX_SHARDS or not 0 <= shard < shards:
        raise ValueError(f"shard {shard} of {shards}: want 0 <= shard < shards <= {MAX_SHARDS}")
    base = topic(swarm)
    return base if shards == 1 else f"{base}/shard-{shard}-of-{shards}"


_SHARD_SUFFIX = re.compile(r"/shard-(0|[1-9][0-9]{0,3})-of-([1-9][0-9]{0,3})")


def shard_count_of(topic: str, swarm_topic: str) -> int | None:
    """S, if ``topic`` is a topic of the swarm whose topic is ``swarm_topic`` in a swarm
    of S shards (section 2.2): 1 for the swarm's topic itself. None for any other topic.

    >>> shard_count_of("sapo/demo/rollouts/v2/shard-3-of-64", "sapo/demo/rollouts/v2")
    64
    >>> shard_count_of("sapo/demo/rollouts/v2/shard-03-of-64", "sapo/demo/rollouts/v2")
    """
    if topic == swarm_topic:
        return 1
    if not topic.startswith(swarm_topic):
        return None
    found = _SHARD_SUFFIX.fullmatch(topic[len(swarm_topic) :])
    if found is None:
        return None
    shard, shards = int(found[1]), int(found[2])
    return shards if 2 <= shards <= MAX_SHARDS and shard < shards else None


def topics_refusal(topics: list[str], swarm_topic: str, joined: list[str]) -> str | None:
    """Why a message on ``topics`` (its signed topic list) is refused by a node of the
    swarm ``swarm_topic`` that joined ``joined`` (protocol/SPEC.md section 2.2, *A
    message's topics*), or None. Honest topic lists are one topic, or two of different
    shard counts while S changes; the author chooses the list, and the library charges
    a relay once per entry of it.

    >>> topics_refusal(["sapo/x/rollouts/v2"] * 2, "sapo/x/rollouts/v2", ["sapo/x/rollouts/v2"])
    'topic_repeated'
    """
    if not 1 <= len(topics) <= 2:
        return "topic_count"
    if len(set(topics)) != len(topics):
        return "topic_repeated"
    counts = [shard_count_of(t, swarm_topic) for t in topics]
    if None in counts:
        return "topic_foreign"
    if len(set(counts)) != len(counts):
        return "topic_same_count"
    if not any(t in joined for t in topics):
        return "topic_not_joined"
    return None


@functools.lru_cache(maxsize=10_000)
def shards_of(peer: bytes, shards: int, joined: int) -> tuple[int, ...]:
    """The shards a peer joins: of ``shards``, the ``joined`` (all, if that is more)
    whose SHA-256 of the peer ID's bytes followed by the shard's number (4 bytes,
    big-endian) is least, least first (rendezvous hashing: every node computes any
    peer's shards from its ID, and each shard is joined by a share ``joined/shards`` of
    the peers, whoever they are). The first is the peer's home shard. Remembered for
    the last 10,000 asked: the network process asks for each peer it may dial, each pass.

    >>> shards_of(b"any peer", 1, 2)
    (0,)
    >>> sorted(shards_of(b"any peer", 4, 9))
    [0, 1, 2, 3]
    """
    if shards <= 1:
        return (0,)
    weights = sorted(
        (hashlib.sha256(peer + i.to_bytes(4, "big")).digest(), i) for i in range(shards)
    )
    return tuple(i for _, i in weights[: min(joined, shards)])


def shard_topics(swarm: str, peer: bytes, shards: int, joined: int) -> list[str]:
    """The topics a peer subscribes to and publishes on, its home shard's first."""
    return [shard_topic(swarm, i, shards) for i in shards_of(peer, shards, joined)]


@dataclass(frozen=True)
class RolloutGroup:
    """One task and L completions of it, as text: what a node tells its peers.

    ``unfinished`` holds the indices of the completions that were cut at the author's
    token or byte limit instead of ending where its model ended the turn; on the wire
    this is the ``finished`` array, one flag per completion (``finished``, below). A
    receiver closes only finished completions with its own end-of-turn token.
    """

    ref: TaskRef
    generator: str
    question: str
    completions: tuple[str, ...]
    model: str
    round: int
    created_ms: int
    answer: str | None = None
    metadata: str | None = None
    unfinished: frozenset[int] = frozenset()
    modality: str = MODALITY_TEXT
    version: int = PROTOCOL_VERSION

    @property
    def finished(self) -> tuple[bool, ...]:
        """One flag per completion: True if it ended with its model's end of turn."""
        return tuple(i not in self.unfinished for i in range(len(self.completions)))

    def to_wire(self) -> dict[str, Any]:
        """The message as the plain map that is encoded, fields in spec order."""
        return {
            "version": self.version,
            "modality": self.modality,
            "task": {
                "family": self.ref.family,
                "config": self.ref.config_json,
                "seed": self.ref.seed,
                "index": self.ref.index,
            },
            "generator": self.generator,
            "question": self.question,
            "answer": self.answer,
            "metadata": self.metadata,
            "completions": list(self.completions),
            "finished": list(self.finished),
            "model": self.model,
            "round": self.round,
            "created": self.created_ms,
        }


@dataclass(frozen=True)
class Rejection:
    """Why a message was refused: a reason code from the spec and a human detail."""

    reason: str
    detail: str = field(default="", compare=False)

    @property
    def ignored(self) -> bool:
        """Dropped without blame (a newer or different peer), as opposed to refused."""
        return self.reason in IGNORED


class EncodeError(ValueError):
    """This node tried to send something the protocol does not allow; ``reason`` is the
    code a receiver would refuse it with."""

    def __init__(self, message: str, reason: str = MALFORMED) -> None:
        super().__init__(message)
        self.reason = reason


def encode(group: RolloutGroup) -> bytes:
    """The message's bytes; EncodeError if it breaks a rule a receiver would refuse."""
    try:
        if any(not 0 <= i < len(group.completions) for i in group.unfinished):
            raise ValueError(f"unfinished {sorted(group.unfinished)} names no completion")
        data = msgpack.packb(group.to_wire(), use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:  # UnicodeEncodeError is a ValueError
        raise EncodeError(f"cannot encode: {exc}") from None
    checked = decode(data)
    if isinstance(checked, Rejection):
        raise EncodeError(f"{checked.reason}: {checked.detail}", checked.reason)
    return data


class _Map(tuple):
    """A decoded MessagePack map, kept as its (key, value) pairs to see duplicates."""


_is_map = functools.partial(operator.is_, _Map)
_is_list = functools.partial(operator.is_, list)


def decode(data: bytes) -> RolloutGroup | Rejection:
    """Strictly decode one message. Never raises."""
    if not isinstance(data, bytes | bytearray | memoryview):
        return Rejection(MALFORMED, f"expected bytes, got {type(data).__name__}")
    if len(data) > MAX_MESSAGE_BYTES:
        return Rejection(OVERSIZE, f"{len(data)} bytes > {MAX_MESSAGE_BYTES}")
    try:
        raw = msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=False,
            object_pairs_hook=_Map,
            max_str_len=MAX_MESSAGE_BYTES,
            max_bin_len=MAX_MESSAGE_BYTES,
            max_array_len=MAX_MESSAGE_BYTES,
            max_map_len=MAX_MESSAGE_BYTES,
            max_ext_len=MAX_MESSAGE_BYTES,
        )
    except UnicodeDecodeError as exc:
        return Rejection(BAD_UTF8, str(exc))
    except Exception as exc:  # msgpack raises several types for broken input
        return Rejection(MALFORMED, f"{type(exc).__name__}: {exc}".rstrip(": "))
    if _nesting(raw, MAX_MSGPACK_DEPTH + 1) > MAX_MSGPACK_DEPTH:
        return Rejection(MALFORMED, f"maps and arrays nest deeper than {MAX_MSGPACK_DEPTH}")
    try:
        return _from_wire(raw)
    except _Refused as exc:
        return exc.rejection
    except RecursionError:
        return Rejection(MALFORMED, "nested too deeply")


class _Refused(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        self.rejection = Rejection(reason, detail)


def _fields(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, _Map):
        raise _Refused(NOT_A_MAP, f"{where} is not a map but: {_type_name(value)}")
    out: dict[str, Any] = {}
    for key, item in value:
        if not isinstance(key, str):
            raise _Refused(WRONG_TYPE, f"{where} has a key of type {_type_name(key)}")
        if key in out:
            raise _Refused(DUPLICATE_FIELD, f"{where} has {key!r} twice")
        out[key] = item
    return out


def _check_fields(got: dict[str, Any], spec: dict[str, tuple[type, ...]], where: str) -> None:
    for key in got:
        if key not in spec:
            raise _Refused(UNKNOWN_FIELD, f"{where} has unknown field {key[:40]!r}")
    for key, types in spec.items():
        if key not in got:
            raise _Refused(MISSING_FIELD, f"{where} lacks {key!r}")
        value = got[key]
        # bool is an int in Python, not in MessagePack: compare exact types.
        if type(value) not in types and not (dict in types and isinstance(value, _Map)):
            expected = " or ".join(_type_name(t) for t in types)
            raise _Refused(
                WRONG_TYPE, f"{where}.{key} is of type {_type_name(value)}, not {expected}"
            )


def _from_wire(raw: Any) -> RolloutGroup:
    msg = _fields(raw, "message")
    # Version and modality first: a newer or different peer's message stops here,
    # whatever else it carries.
    version = msg.get("version")
    if type(version) is not int:
        raise _Refused(WRONG_TYPE if "version" in msg else MISSING_FIELD, "version")
    if version != PROTOCOL_VERSION:
        raise _Refused(
            UNSUPPORTED_VERSION, f"version {version}, this node speaks {PROTOCOL_VERSION}"
        )
    modality = msg.get("modality")
    if type(modality) is not str:
        raise _Refused(WRONG_TYPE if "modality" in msg else MISSING_FIELD, "modality")
    if modality != MODALITY_TEXT:
        raise _Refused(UNSUPPORTED_MODALITY, f"modality {modality[:MAX_MODALITY_BYTES]!r}")
    _check_fields(msg, FIELDS, "message")
    task = _fields(msg["task"], "task")
    _check_fields(task, TASK_FIELDS, "task")

    family = _text(task["family"], "task.family", MAX_FAMILY_BYTES)
    if not FAMILY_PATTERN.fullmatch(family):
        raise _Refused(BAD_VALUE, f"task.family {family!r} is not a family name")
    config = _text(task["config"], "task.config", MAX_CONFIG_BYTES)
    _json_object(config, "task.config", canonical=True)
    seed = _uint(task["seed"], "task.seed")
    index = _uint(task["index"], "task.index")
    generator = _text(msg["generator"], "generator", MAX_GENERATOR_BYTES)
    if not GENERATOR_PATTERN.fullmatch(generator):
        raise _Refused(BAD_VALUE, f"generator {generator!r} is not 'name version'")
    question = _text(msg["question"], "question", MAX_QUESTION_BYTES)
    answer = msg["answer"]
    if answer is not None:
        _text(answer, "answer", MAX_ANSWER_BYTES)
    metadata = msg["metadata"]
    if metadata is not None:
        _json_object(_text(metadata, "metadata", MAX_METADATA_BYTES), "metadata")
    completions = msg["completions"]
    if not MIN_COMPLETIONS <= len(completions) <= MAX_COMPLETIONS:
        raise _Refused(
            BAD_COUNT,
            f"{len(completions)} completions, need {MIN_COMPLETIONS} to {MAX_COMPLETIONS}",
        )
    for i, c in enumerate(completions):
        if type(c) is not str:
            raise _Refused(WRONG_TYPE, f"completions[{i}] is of type {_type_name(c)}, not str")
        _text(c, f"completions[{i}]", MAX_COMPLETION_BYTES)
    finished = msg["finished"]
    if len(finished) != len(completions):
        raise _Refused(
            BAD_COUNT, f"{len(finished)} finished flags for {len(completions)} completions"
        )
    for i, f in enumerate(finished):
        if type(f) is not bool:
            raise _Refused(WRONG_TYPE, f"finished[{i}] is of type {_type_name(f)}, not bool")
    return RolloutGroup(
        ref=TaskRef(family, config, seed, index),
        generator=generator,
        question=question,
        completions=tuple(completions),
        model=_text(msg["model"], "model", MAX_MODEL_BYTES),
        round=_uint(msg["round"], "round"),
        created_ms=_uint(msg["created"], "created"),
        answer=answer,
        metadata=metadata,
        unfinished=frozenset(i for i, f in enumerate(finished) if not f),
    )


def _text(value: str, where: str, limit: int) -> str:
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise _Refused(TOO_LONG, f"{where} is {size} bytes > {limit}")
    return value


def _uint(value: int, where: str) -> int:
    if not 0 <= value <= MAX_UINT:
        raise _Refused(BAD_VALUE, f"{where} = {value} is outside 0..2^63-1")
    return value


def _json_object(text: str, where: str, canonical: bool = False) -> dict[str, Any]:
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise _Refused(BAD_VALUE, f"{where} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise _Refused(BAD_VALUE, f"{where} is not a JSON object")
    if _depth(value, MAX_JSON_DEPTH + 1) > MAX_JSON_DEPTH:
        raise _Refused(BAD_VALUE, f"{where} nests deeper than {MAX_JSON_DEPTH}")
    if canonical and canonical_json(value) != text:
        raise _Refused(BAD_VALUE, f"{where} is not in canonical form (sorted keys, no spaces)")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _depth(value: Any, limit: int) -> int:
    """The nesting depth of a JSON value, counted no further than ``limit``."""
    if limit <= 0 or not isinstance(value, dict | list):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(v, limit - 1) for v in items), default=0)


def _nesting(value: Any, limit: int) -> int:
    """How deep MessagePack maps and arrays nest in a decoded ``value`` (keys too),
    counted no further than ``limit``. Level by level, with the items of a level gathered
    and sorted out at C speed: a hostile message of half a million containers costs about
    what its unpacking did, not a Python call each."""
    level = [value]
    for depth in range(limit):
        if _Map not in (kinds := set(map(type, level))) and list not in kinds:
            return depth
        maps = list(compress(level, map(_is_map, map(type, level))))
        lists = list(compress(level, map(_is_list, map(type, level))))
        level = [*chain.from_iterable(lists), *chain.from_iterable(chain.from_iterable(maps))]
    return limit


def _type_name(value: Any) -> str:
    t = value if isinstance(value, type) else type(value)
    if t is _Map or t is dict:
        return "map"
    return {
        type(None): "nil",
        bool: "bool",
        int: "int",
        float: "float",
        str: "str",
        bytes: "bin",
        list: "array",
    }.get(t, t.__name__)


def clip_utf8(text: str, limit: int) -> str:
    """The longest prefix of ``text`` whose UTF-8 form fits ``limit`` bytes.

    >>> clip_utf8("añb", 2)
    'a'
    """
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore")
