"""`sapo-node share`: every line checked as a receiver checks a peer's group, refusals
reported line by line with the receiver's reason, and nothing half-sent."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import patch

import pytest

from sapo_node.config import load_config
from sapo_node.intake import wire
from sapo_node.intake.checks import Intake
from sapo_node.intake.pool import Pool
from sapo_node.share import MAX_LINE_BYTES, Checker, Overlong, line_of, read_lines, share
from sapo_node.tasks import TaskRef, make_task
from tests.support.cli import run_cli

SEVENS = "tests.support.families:Sevens"
ARITH = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"]}


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "share.toml"
    arith = ", ".join(f"{k} = {json.dumps(v)}" for k, v in ARITH.items())
    path.write_text(
        f"""
[node]
data_dir = "{tmp_path / "data"}"
[tasks]
families = [
  {{ name = "{SEVENS}" }},
  {{ name = "basic_arithmetic", config = {{ {arith} }}, levels = [{{}}] }},
]
"""
    )
    return path


def _arith_ref(index: int) -> TaskRef:
    return TaskRef.make("basic_arithmetic", ARITH, 5, index)


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("share")
    cfg = load_config(_config(tmp))
    c = Checker(cfg, "12D3KooWsharer")
    yield c
    c.close()


def _good(index: int = 0, **extra) -> str:
    task = make_task(_arith_ref(index))
    line = json.loads(line_of(task.ref, [f"<answer>{task.answer}</answer>", "<answer>x</answer>"]))
    return json.dumps({**line, **extra})


def test_a_good_line_becomes_the_message_a_receiver_accepts(checker: Checker) -> None:
    got = checker.check(_good(0, model="my-solver"), 1)
    assert got.ok, got.describe()
    assert got.rewards == (1.0, 0.0) and got.family == "basic_arithmetic"
    # a receiver with its own pool takes the bytes as they are
    receiver = Intake(Pool(None), checker.scorer, known_configs=checker.intake.known_configs)
    verdict = receiver.receive(got.fresh(), "12D3KooWsharer")
    assert verdict.outcome == "accepted" and verdict.item.rewards == (1.0, 0.0)
    group = verdict.item.group
    assert group.model == "my-solver" and group.finished == (True, True)
    assert group.question == make_task(_arith_ref(0)).question


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("not json", "bad_json"),
        (b'{"task": "\xff"}', "bad_json"),  # not UTF-8
        ("[1, 2]", "bad_line"),
        ('{"completions": ["a", "b"]}', "missing_field"),
        (json.dumps({"task": {}, "completions": ["a", "b"], "extra": 1}), "unknown_field"),
        (json.dumps({"task": {"family": "x"}, "completions": ["a", "b"]}), "bad_task"),
        (
            json.dumps(
                {
                    "task": {"family": "os:system", "config": {}, "seed": 1, "index": 0},
                    "completions": ["a", "b"],
                }
            ),
            "unknown_family",
        ),
        (
            json.dumps(
                {
                    "task": {"family": "basic_arithmetic", "config": {}, "seed": 1, "index": 0},
                    "completions": ["a", "b"],
                }
            ),
            "unknown_config",
        ),
        (
            json.dumps(
                {
                    "task": {"family": SEVENS, "config": {}, "seed": -1, "index": 0},
                    "completions": ["a", "b"],
                }
            ),
            "bad_task",
        ),
        (_good(0, completions=["only one"], finished=[True]), "bad_count"),
        (_good(0, completions=["a"] * 65), "bad_count"),
        (_good(0, completions=["a", "b" * (wire.MAX_COMPLETION_BYTES + 1)]), "too_long"),
        (_good(0, completions=["a", 7]), "wrong_type"),
        (_good(0, finished=[True]), "bad_count"),
        (_good(0, finished=[1, 0]), "wrong_type"),
        (_good(0, model=3), "wrong_type"),
        (_good(0, question="Calculate 1 + 1."), "question_mismatch"),
        ("x" * (wire.MAX_MESSAGE_BYTES + 1), "line_too_long"),
    ],
)
def test_each_bad_line_is_refused_with_the_receivers_reason(
    checker: Checker, text, reason: str
) -> None:
    got = checker.check(text, 7)
    assert not got.ok and got.reason == reason, got.describe()
    assert got.describe().startswith(f"line 7: refused: {reason}")


def test_the_same_group_twice_is_a_duplicate(checker: Checker) -> None:
    first, second = checker.check(_good(3), 1), checker.check(_good(3), 2)
    assert first.ok and not second.ok and second.reason == "duplicate"


class Recorder:
    """A transport that keeps what is published (the sending side is tested over real
    libp2p in tests/integration/test_share_swarm.py)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False

    def publish(self, data: bytes, wait_s: float = 0.0) -> bool:
        self.sent.append(data)
        return True

    def flush(self, timeout_s: float, drain_s: float = 0.0) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


def test_a_file_with_a_refused_line_sends_nothing_unless_asked(
    checker: Checker, monkeypatch
) -> None:
    monkeypatch.setattr("sapo_node.share.LINGER_S", 0.0)
    lines = [_good(10), "", "oops", _good(11)]
    said: list[str] = []
    transports: list[Recorder] = []

    def connect() -> Recorder:
        transports.append(Recorder())
        return transports[-1]

    out = share(lines, checker, connect, streaming=False, say=said.append)
    assert (out.checked, out.sent, [c.line for c in out.refused]) == (3, 0, [3])
    assert transports == []  # not even connected
    assert said[1] == "line 3: refused: bad_json (Expecting value: line 1 column 1 (char 0))"

    lines = [_good(12), "oops", _good(13)]
    out = share(lines, checker, connect, streaming=False, skip_refused=True, say=said.append)
    assert out.sent == 2 and transports[-1].closed
    sent = [wire.decode(d) for d in transports[-1].sent]
    assert [g.ref.index for g in sent] == [12, 13]


def test_standard_input_sends_each_line_as_it_comes(checker: Checker, monkeypatch) -> None:
    monkeypatch.setattr("sapo_node.share.LINGER_S", 0.0)
    recorder = Recorder()
    seen: list[int] = []

    def lines():
        yield _good(20)
        seen.append(len(recorder.sent))  # the first line was sent before the second came
        yield "{}"
        yield _good(21)

    out = share(lines(), checker, lambda: recorder, streaming=True, say=lambda _: None)
    assert seen == [1] and out.sent == 2 and [c.line for c in out.refused] == [2]


def test_the_command_checks_a_file_line_by_line(tmp_path: Path, capsys) -> None:
    config = _config(tmp_path)
    path = tmp_path / "groups.jsonl"
    path.write_text("\n".join([_good(30), "[]", _good(31), _good(30)]) + "\n")
    code, out, err = run_cli(["share", str(path), "--config", str(config), "--check"], capsys)
    assert code == 1
    assert "4 lines checked, 2 refused, 0 sent" in out
    assert err.splitlines()[:4] == [
        "line 1: ok (basic_arithmetic, rewards 1 0)",
        "line 2: refused: bad_line (a line is a JSON object, not list)",
        "line 3: ok (basic_arithmetic, rewards 1 0)",
        "line 4: refused: duplicate",
    ]
    code, _, err = run_cli(["share", str(tmp_path / "none.jsonl"), "--check"], capsys)
    assert code == 1 and "cannot read" in err
    code, _, err = run_cli(["start", "--generate"], capsys)
    assert code == 2 and "--no-train" in err


class _Stdin(io.RawIOBase):
    """A standard input that produces a line of ``endless`` bytes (no newline in it) and
    then ``after``, and records the most it ever handed over at once."""

    def __init__(self, endless: int, after: bytes) -> None:
        self.left, self.after, self.most = endless, after, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.left > 0:
            n = min(len(buffer), self.left)
            buffer[:n] = b"x" * n
            self.left -= n
        else:
            n = min(len(buffer), len(self.after))
            buffer[:n], self.after = self.after[:n], self.after[n:]
        self.most = max(self.most, n)
        return n


class _Bounded:
    """Standard input's ``buffer`` that takes bounded reads only, and records the largest."""

    def __init__(self, reader: io.BufferedReader) -> None:
        self.reader, self.largest = reader, 0

    def readline(self, size: int = -1) -> bytes:
        assert 0 <= size <= MAX_LINE_BYTES + 2, f"a read of {size} bytes"
        line = self.reader.readline(size)
        self.largest = max(self.largest, len(line))
        return line

    def __iter__(self):
        raise AssertionError("iterated: each line read whole, however long")


def test_share_from_stdin_reads_no_line_whole_past_the_limit(tmp_path: Path, capsys) -> None:
    """``share -`` read each line whole before it checked its length: a program writing
    one endless line grew the reader's memory without bound. Here a 64 MiB line comes
    first: it is refused with its true length, no read held more than the limit, and the
    good line after it is still checked."""
    config = _config(tmp_path)
    big = 64 * 2**20
    raw = _Stdin(big, ("\n" + _good(40) + "\n").encode())
    stdin = _Bounded(io.BufferedReader(raw, buffer_size=8192))
    with patch.object(sys, "stdin", SimpleNamespace(buffer=stdin)):
        code, out, err = run_cli(["share", "-", "--config", str(config), "--check"], capsys)
    assert code == 1 and "2 lines checked, 1 refused, 0 sent" in out, (out, err)
    lines = err.splitlines()
    assert lines[0] == f"line 1: refused: line_too_long ({big} bytes, at most {MAX_LINE_BYTES})"
    assert lines[1].startswith("line 2: ok (basic_arithmetic"), lines
    assert stdin.largest <= MAX_LINE_BYTES + 2


@pytest.mark.parametrize("size", [MAX_LINE_BYTES - 1, MAX_LINE_BYTES, MAX_LINE_BYTES + 1])
def test_read_lines_keeps_lines_up_to_the_limit_and_measures_the_rest(size: int) -> None:
    data = b"a\n" + b"y" * size + b"\n" + b"z" * (size + 5)  # the last one without newline
    got = list(read_lines(io.BytesIO(data)))
    assert got[0] == b"a\n"
    assert got[1] == b"y" * size + b"\n" or (size > MAX_LINE_BYTES and got[1] == size)
    assert isinstance(got[2], Overlong) and got[2] == size + 5
