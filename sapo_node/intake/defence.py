"""Defences against poisoned completions: peers that tell the truth and add something.

Re-scoring (intake/checks.py) defeats a peer that lies about answers, not one whose right
answers carry extra text: a trigger phrase, a link, a claim ("Hail to the Thief",
Blagoev, Ersoy and Chen, arXiv 2511.09780). This node's own verifier rewards such a
completion like any right one, GRPO gives it a positive advantage, and the node learns
to write the payload. docs/security.md measures the attack and these defences.

Only completions with a positive advantage teach their text (reward above the group's
mean: GRPO raises the probability of exactly those tokens), so only those are checked;
a completion at or below the mean is trained away from, whatever it says. Each round,
after this node has generated its own groups, the peers' groups it took from the pool
go through, in order:

1. reputation: groups of a peer whose recent completions failed the checks below too
   often (more than ``reputation_max_refused`` of its last ``reputation_window``
   checked, once at least ``reputation_min_checked`` were) are dropped, and the intake
   ignores that peer's messages (``distrusted``) for ``distrust_s`` seconds;
2. text outside the answer: the prompts ask for a direct answer between ``<answer>``
   tags, so a completion with more characters (spaces aside) outside its last answer
   than ``max_outside_answer_chars``, or than ``outside_answer_scale`` times the 95%
   quantile of this node's own recent positive-advantage completions if that is more,
   is refused (``completions_outside_answer``);
3. ranks under this node's own policy: each token's rank is how many tokens the policy
   finds likelier (0: its first choice), and a completion's worst window of
   ``rank_window`` tokens (the highest mean of log2(1 + rank) over any such run) must be
   at most ``max_rank_bits`` (6: tokens about the 63rd likeliest, geometric mean), else
   it is refused (``completions_implausible``). The tokens of the answer's tags and a
   final end-of-turn token are left out: the prompt asks for them, and a node that has
   drifted from the format (a small model at a high learning rate can stop writing the
   tags for a while) would otherwise refuse the very completions that could bring it
   back. Text this node's policy could write passes; an injected phrase is a run of
   tokens it would not. Ranks, not log-probabilities: training sharpens a policy until
   a peer's different wording of the same answer is as improbable as a payload, but its
   tokens stay among the policy's first choices; a payload's do not, and the default
   bound sits between the two (docs/security.md has the measured windows of both).

4. only the answer teaches (``answer_only``): of every peer's completion that is left,
   positive advantage or not, the loss counts only the tokens of its last answer with
   the tags, and its end of turn (``answer_tokens``); the text before the answer is
   context, never a target. The checks above judge a payload by its look, and a payload
   can look like anything: a false claim in common words is made of tokens the policy
   ranks highly, and under the outside bound (docs/security.md, the in-style class).
   What a peer can teach this node is what this node's own verifier checked (the answer)
   and what its prompt asks for (the tags). It costs what peers' free text would have
   taught: nothing wanted, with prompts that ask for a direct answer.
   With ``teach_first_choices``, a checked completion (positive advantage, passed 1-3)
   also teaches each token of its other text that is this node's first choice there
   (rank 0 under its policy, from the ranks of check 3, with the head in float32 so
   that near-ties do not share rank 0): text this node would write itself, greedily,
   given what came before. The guarantee is conditional on that text: a token becomes
   likelier only after the peer's preceding tokens, where it already was the likeliest.
   Those tokens are context, untaught, but may be anything check 3 lets through (one
   unlikely token in a window of likely ones), so a first choice after text this node
   would not write is taught in that context too. A payload whose first token is not
   this node's first choice is never started by it (``first_choice_tokens``).
   A group teaches in balance (``balance``): an above-mean completion teaches only if
   this node could write its text before the answer itself, every token of it ranked at
   most ``context_rank`` (``in_context``); the below-mean ones only as far as the
   above-mean ones of their group teach. Without that, a peer whose right answers follow
   a preamble this node never writes, and whose wrong ones are in this node's own
   format, pushes this node only away from what it writes where it begins (its tags,
   its end of turn, its answers) and towards nothing it would reach: the node loses its
   format (docs/security.md, shaped groups). A right answer after a payload this node
   would not write teaches nothing either, so nothing is pushed up after a payload and
   never down (which pulls the payload up with it).

Before any check, text after a peer's last answer is cut (``cut_after_answer``): the
prompts ask for a direct answer, so it teaches nothing wanted, and a payload placed
there is gone without refusing the peer. The intake scores the cut text (node.py
``prepare_completion``), so the reward is of what trains.

A refused completion is removed from its group; the rest of the group trains, its
advantages computed over what is left, and a group with fewer than two completions
left is dropped. Per peer, ``sapo-node pool`` shows the completions checked and those
refused, by reason. A cap on any one peer's share of a round's external groups
(``max_author_share``) is applied where they are drawn (pool.py): one peer, however
prolific, supplies at most that share of what a round learns from others. The peers
whose record so far has more than ``reputation_max_refused`` refused (``suspects``:
judged on any number of checked completions, where distrust waits for
``reputation_min_checked``) share one such cap between them, as if they were one peer:
an attacker with many identities, each too new to be distrusted, gets one peer's share
of the slots, not one per identity (docs/security.md, many identities).

What a node learns here survives restarts: the reputation (each peer's last checked
completions) and the distrusted peers, with when each distrust ends in wall-clock time,
are saved in ``peers-defence.json`` in the data directory (peerstate.py) after each
round's screening and when the node stops, at most MAX_TRACKED of each; a record not
added to for HISTORY_TTL_S is forgotten.

What this does not stop: text inside the answer tags that this node's verifier scores
as right (binary rewards need a score of at least 0.999: a payload there fails the
family's parse, but a lenient custom verifier could pass it); text placed in
completions below the group's mean, which the node learns to avoid (only as far as
the group's right answers teach). With a prompt that
asks for reasoning before the answer, ``answer_only`` would also keep the peers'
reasoning from teaching: turn it off there and rely on checks 1-3, which do not close
the in-style class.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog

from sapo_node.config import DefenceSection
from sapo_node.intake import peerstate
from sapo_node.samples import Sample
from sapo_node.tasks import last_answer

log = structlog.get_logger(__name__)

CHECKED = "completions_checked"
OUTSIDE_ANSWER = "completions_outside_answer"
IMPLAUSIBLE = "completions_implausible"
DISTRUSTED = "distrusted"
MAX_TRACKED = 10_000  # peers whose record is kept (least recently checked go first)
HISTORY_TTL_S = 7 * 86400.0  # a peer's record not added to this long is forgotten


def outside_answer_chars(text: str, tag: str = "answer") -> int:
    """Characters of ``text`` outside its last ``<tag>...</tag>``, whitespace aside (all of
    them if it has none).

    >>> outside_answer_chars("<answer>7</answer>")
    0
    >>> outside_answer_chars(" 3 + 4 = 7\\n<answer>7</answer>")
    5
    >>> outside_answer_chars("<answer>7</answer> visit evil.example")
    17
    """
    found = last_answer(text, tag)
    rest = text if found is None else text[: found[0]] + text[found[1] + len(tag) + 3 :]
    return sum(not c.isspace() for c in rest)


def cut_after_answer(text: str, tag: str = "answer") -> str:
    """``text`` up to the end of its last ``<tag>...</tag>`` (all of it if it has none).

    >>> cut_after_answer("3 + 4 = 7\\n<answer>7</answer> visit evil.example")
    '3 + 4 = 7\\n<answer>7</answer>'
    >>> cut_after_answer("no answer here")
    'no answer here'
    """
    found = last_answer(text, tag)
    return text if found is None else text[: found[1] + len(tag) + 3]


def bare_answer(text: str, tag: str = "answer") -> str:
    """Only the last ``<tag>...</tag>`` of ``text`` (empty if it has none): a peer's
    completion reduced to what this node's verifier checked (``train.external_use =
    "answers"``).

    >>> bare_answer("3 + 4 = 7, so\\n<answer>7</answer> visit evil.example")
    '<answer>7</answer>'
    >>> bare_answer("no answer here")
    ''
    """
    found = last_answer(text, tag)
    return "" if found is None else text[found[0] : found[1] + len(tag) + 3]


def highest_window(values: Sequence[float], window: int) -> float:
    """The highest mean of ``window`` consecutive values (the mean of all if fewer).

    >>> highest_window([0.0, 1.0, 9.0, 8.0, 0.0], 2)
    8.5
    >>> highest_window([1.0, 3.0], 4)
    2.0
    """
    if not values:
        return 0.0
    if len(values) <= window:
        return sum(values) / len(values)
    run = sum(values[:window])
    high = run
    for i in range(window, len(values)):
        run += values[i] - values[i - window]
        high = max(high, run)
    return high / window


def format_tokens(
    text: str, spans: Sequence[tuple[int, int]], n_ids: int, tag: str = "answer"
) -> set[int]:
    """Which of a completion's ``n_ids`` tokens the prompt itself asks for: those that
    overlap the tags of its last answer (``spans``: each token's characters in ``text``),
    and an end-of-turn token after the last span.

    >>> text = "7<answer>7</answer>"
    >>> sorted(format_tokens(text, [(i, i + 1) for i in range(len(text))], len(text) + 1))
    [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    """
    answer = last_answer(text, tag)
    if answer is None:
        return _covering(spans, n_ids, ())
    start, close = answer
    return _covering(spans, n_ids, ((start, start + len(tag) + 2), (close, close + len(tag) + 3)))


def _covering(
    spans: Sequence[tuple[int, int]], n_ids: int, ranges: Sequence[tuple[int, int]]
) -> set[int]:
    """The tokens that overlap any of the character ``ranges``, and those after the last
    span (an end-of-turn token)."""
    inside = {
        k for k, (a, b) in enumerate(spans[:n_ids]) if any(a < e and b > s for s, e in ranges)
    }
    return inside | set(range(len(spans), n_ids))


def answer_tokens(
    text: str, spans: Sequence[tuple[int, int]], n_ids: int, tag: str = "answer"
) -> tuple[bool, ...]:
    """Which of a completion's ``n_ids`` tokens belong to its last answer, tags included
    (``spans``: each token's characters in ``text``), or come after the last span (an
    end-of-turn token): what ``answer_only`` teaches of a peer's completion.

    >>> text = "so 7<answer>7</answer>"
    >>> taught = answer_tokens(text, [(i, i + 1) for i in range(len(text))], len(text) + 1)
    >>> "".join(c for c, t in zip(text, taught) if t), taught[-1]
    ('<answer>7</answer>', True)
    >>> any(answer_tokens("no answer", [(0, 2), (2, 9)], 2))
    False
    """
    answer = last_answer(text, tag)
    ranges = () if answer is None else ((answer[0], answer[1] + len(tag) + 3),)
    covered = _covering(spans, n_ids, ranges)
    return tuple(k in covered for k in range(n_ids))


def first_choice_tokens(answer: Sequence[bool], ranks: Sequence[int]) -> tuple[bool, ...]:
    """``answer_tokens``'s flags widened by ``teach_first_choices``: also each token whose
    rank under this node's policy is 0 (its first choice, given the completion's text
    before it).

    >>> first_choice_tokens([False, False, True, True], [0, 7, 3, 0])
    (True, False, True, True)
    """
    return tuple(a or r == 0 for a, r in zip(answer, ranks, strict=True))


def in_context(answer: Sequence[bool], ranks: Sequence[int] | None, bound: int) -> bool:
    """Whether a completion's text before its answer (the tokens before the first of
    ``answer``, ``answer_tokens``'s flags) is text this node could write itself: every
    token ranked at most ``bound`` under its policy (``ranks``; None: not ranked, so only
    an empty text qualifies). A peer's right answer teaches only there (``balance``).

    >>> in_context([False, False, True], [1, 3, 9], 3)
    True
    >>> in_context([False, True], [84, 0], 3)
    False
    >>> in_context([True, True], None, 3), in_context([False, True], None, 3)
    (True, False)
    """
    before = answer.index(True) if True in answer else len(answer)
    if ranks is None:
        return before == 0
    return all(r <= bound for r in ranks[:before])


def balance(rewards: Sequence[float], contexts: Sequence[bool]) -> list[bool]:
    """Which completions of a peer's group teach anything: each above the group's mean
    whose text before the answer is in context (``in_context``), and those at or below
    it, in order, while their total distance below the mean stays within the total of
    those above it that teach. Advantages sum to zero over a group, so this node is
    pushed away from what the group's wrong answers say no more than it is pushed
    towards what its right ones say, where it could write them: a peer cannot teach it
    only what not to write where it begins (its tags, its end of turn, its answers) by
    writing its right answers after text this node never writes and its wrong ones in
    this node's own style.

    >>> balance([1, 1, 0, 0], [True, True, True, True])
    [True, True, True, True]
    >>> balance([1, 1, 0, 0], [False, False, True, True])
    [False, False, False, False]
    >>> balance([1, 1, 0, 0], [True, False, True, True])
    [True, False, True, False]
    """
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    up = [r > mean and ok for r, ok in zip(rewards, contexts, strict=True)]
    budget = sum(r - mean for r, u in zip(rewards, up, strict=True) if u) + 1e-9
    out = list(up)
    for i, r in enumerate(rewards):
        if r <= mean and mean - r <= budget:
            out[i] = True
            budget -= mean - r
    return out


def rank_bits(ranks: Sequence[int]) -> list[float]:
    """log2(1 + rank) of each token: 0 for a policy's first choice, 1 for its second.

    >>> rank_bits([0, 1, 3, 1023])
    [0.0, 1.0, 2.0, 10.0]
    """
    return [math.log2(1 + r) for r in ranks]


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values``, linear between order statistics.

    >>> quantile([4.0, 1.0, 3.0, 2.0], 0.0), quantile([4.0, 1.0, 3.0, 2.0], 0.5)
    (1.0, 2.5)
    """
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def above_mean(rewards: Sequence[float]) -> list[bool]:
    """Which completions of a group get a positive advantage.

    >>> above_mean([1.0, 0.0, 0.5, 0.0])
    [True, False, True, False]
    """
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    return [r > mean for r in rewards]


class Defence:
    """The checks of peers' completions, with this node's reference and peers' records.

    ``ranks(samples)``: the completion tokens' ranks of each sample under this node's
    current policy (``Trainer.completion_ranks``). ``spans(ids)``: their text and each
    token's characters in it (``Policy.token_spans``), to leave out the tokens of the
    answer's tags, which the prompt asks for (None: every token is judged).
    ``record(author, reason, n)`` counts per peer (``Pool.record``: shown by ``sapo-node pool``).
    ``clock``: wall-clock seconds (deadlines are saved as such). ``state_path``: where the
    reputation and the distrusted peers are kept across restarts (None: in memory only).
    """

    def __init__(
        self,
        settings: DefenceSection,
        ranks: Callable[[list[Sample]], list[list[int]]],
        record: Callable[[str, str, int], None],
        clock: Callable[[], float] = time.time,
        spans: Callable[[Sequence[int]], tuple[str, list[tuple[int, int]]] | None] | None = None,
        state_path: Path | None = None,
    ) -> None:
        self.settings = settings
        self.ranks, self.record, self.clock, self.spans = ranks, record, clock, spans
        self.outside: deque[int] = deque(maxlen=settings.reference_size)
        self._history: OrderedDict[str, deque[bool]] = OrderedDict()
        self._seen: dict[str, float] = {}  # author -> when its record last grew (clock)
        self._distrusted: dict[str, float] = {}  # author -> until (clock seconds)
        # The records above are read from the status endpoint's thread too
        # (distrusted_now): every method that reads or changes them holds this lock.
        self._lock = threading.RLock()
        self.state_path = state_path
        if state_path is not None:
            self._restore(peerstate.load(state_path, "defence"))

    # --- memory across restarts -----------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What is saved: each peer's record (its checks as "1" passed, "0" refused, oldest
        first, and when it last grew) and each distrusted peer's end of distrust."""
        with self._lock:
            return {
                "history": {
                    a: ["".join("1" if ok else "0" for ok in h), self._seen.get(a, 0.0)]
                    for a, h in self._history.items()
                },
                "distrusted": dict(self._distrusted),
            }

    def save(self) -> None:
        """Write the state to ``state_path`` (atomically; nothing without a path)."""
        if self.state_path is not None:
            peerstate.save(self.state_path, "defence", self.state())

    def _restore(self, state: dict[str, Any]) -> None:
        now = self.clock()
        self._distrusted = peerstate.deadlines(state.get("distrusted"), now, MAX_TRACKED)
        history = state.get("history")
        records = []
        for author, entry in history.items() if isinstance(history, dict) else ():
            try:
                bits, seen = entry
                seen = float(seen)
            except (TypeError, ValueError):
                continue
            if isinstance(bits, str) and set(bits) <= {"0", "1"} and now - seen < HISTORY_TTL_S:
                records.append((seen, author, bits))
        for seen, author, bits in sorted(records)[-MAX_TRACKED:]:  # least recent first
            h: deque[bool] = deque(maxlen=self.settings.reputation_window)
            h.extend(b == "1" for b in bits)
            self._history[author], self._seen[author] = h, seen
        if self._distrusted or self._history:
            log.info(
                "peer reputation restored",
                distrusted=len(self._distrusted),
                records=len(self._history),
                path=str(self.state_path),
            )

    def outside_bound(self) -> int:
        """Most characters a checked completion may have outside its answer (0: no bound):
        ``max_outside_answer_chars``, or more if this node's own recent right answers
        (positive advantage) write more there: ``outside_answer_scale`` times their 95%
        quantile. A peer may say as much beside its answer as this node itself does."""
        s = self.settings
        if not s.max_outside_answer_chars:
            return 0
        if not self.outside:
            return s.max_outside_answer_chars
        own = quantile(list(self.outside), 0.95) * s.outside_answer_scale
        return max(s.max_outside_answer_chars, math.ceil(own))

    # --- reputation -----------------------------------------------------------------------

    def distrusted(self, author: str) -> bool:
        """Whether ``author``'s messages are ignored for now; a peer whose distrust has
        ended starts afresh (its record forgotten: probation)."""
        with self._lock:
            until = self._distrusted.get(author)
            if until is None:
                return False
            if self.clock() < until:
                return True
            del self._distrusted[author]
            self._history.pop(author, None)
            self._seen.pop(author, None)
            return False

    def distrusted_authors(self) -> set[str]:
        """The peers distrusted now; those whose distrust has ended start afresh
        (``distrusted``). The round loop asks this; the status endpoint asks
        ``distrusted_now``."""
        with self._lock:
            return {a for a in list(self._distrusted) if self.distrusted(a)}

    def distrusted_now(self) -> set[str]:
        """The peers distrusted now, changing nothing: what the status endpoint shows, from
        its own thread, without making the rounds depend on whether anyone watches."""
        with self._lock:
            now = self.clock()
            return {a for a, until in self._distrusted.items() if now < until}

    def suspects(self) -> set[str]:
        """Peers whose record has more than ``reputation_max_refused`` refused, however
        few were checked: their groups share one peer's cap when a round draws."""
        limit = self.settings.reputation_max_refused
        with self._lock:
            return {a for a, h in self._history.items() if h and h.count(False) > limit * len(h)}

    def _judge(self, author: str, passed: Sequence[bool]) -> None:
        with self._lock:
            s = self.settings
            history = self._history.pop(author, None) or deque(maxlen=s.reputation_window)
            history.extend(passed)
            self._history[author] = history
            self._seen[author] = self.clock()
            while len(self._history) > MAX_TRACKED:
                self._seen.pop(self._history.popitem(last=False)[0], None)
            checked, refused = len(history), history.count(False)
            if checked >= s.reputation_min_checked and refused > s.reputation_max_refused * checked:
                self._distrusted[author] = self.clock() + s.distrust_s
                if len(self._distrusted) > MAX_TRACKED:  # many identities: the nearest ends go
                    del self._distrusted[min(self._distrusted, key=self._distrusted.__getitem__)]
                log.warning(
                    "peer distrusted: too many of its completions failed the poisoning checks",
                    author=author,
                    refused=refused,
                    checked=checked,
                    for_s=s.distrust_s,
                )

    # --- the round's check ----------------------------------------------------------------

    def screen(self, own: Sequence[Any], external: Sequence[Any]) -> tuple[list[Any], Counter[str]]:
        """The peers' groups of a round as they may train, and what was refused, by reason.

        ``own`` and ``external`` are ``groups.Group``s (this node's rewards, its tokens);
        the own groups' right answers feed the outside-the-answer reference first.
        """
        counts: Counter[str] = Counter()
        kept_groups: list[Any] = []
        pending: list[tuple[Any, list[int]]] = []  # (group, indices to check by rank)
        verdicts: dict[int, dict[int, str]] = {}  # id(group) -> {completion: reason}
        self.outside.extend(
            outside_answer_chars(t)
            for g in own
            for t, up in zip(g.texts, above_mean(g.rewards), strict=True)
            if up
        )
        bound = self.outside_bound()
        for g in external:
            if self.distrusted(g.origin):
                self.record(g.origin, DISTRUSTED, 1)
                counts[DISTRUSTED] += 1
                continue
            checked = [i for i, up in enumerate(above_mean(g.rewards)) if up]
            refused: dict[int, str] = {}
            for i in checked:
                if bound and outside_answer_chars(g.texts[i]) > bound:
                    refused[i] = OUTSIDE_ANSWER
            verdicts[id(g)] = refused
            pending.append((g, [i for i in checked if i not in refused]))
            kept_groups.append(g)
        ranks = self._check_ranks(pending, verdicts)
        out = []
        changed = False
        for g in kept_groups:
            refused = verdicts[id(g)]
            checked = [i for i, up in enumerate(above_mean(g.rewards)) if up]
            if checked:
                self.record(g.origin, CHECKED, len(checked))
                counts[CHECKED] += len(checked)
            for reason, n in Counter(refused.values()).items():
                self.record(g.origin, reason, n)
                counts[reason] += n
            if checked:
                self._judge(g.origin, [i not in refused for i in checked])
                changed = True
            keep = [i for i in range(len(g.texts)) if i not in refused]
            if len(keep) < 2:
                continue
            taught = None
            if self.settings.answer_only:
                taught = self._taught(g, keep, ranks)
            g = replace(
                g,
                completion_ids=[g.completion_ids[i] for i in keep],
                texts=[g.texts[i] for i in keep],
                finished=[g.finished[i] for i in keep],
                rewards=[g.rewards[i] for i in keep],
                taught=taught,
            )
            out.append(g)
        if changed:
            self.save()
        return out, counts

    def _taught(self, g: Any, keep: list[int], ranks: dict) -> list[tuple[bool, ...]]:
        """What ``answer_only`` teaches of the completions ``keep`` of ``g``: each one's
        answer, with ``teach_first_choices`` the tokens of its other text ranked 0
        (``ranks``: what check 3 computed, by (id(group), completion), for the
        completions it checked); nothing of those ``balance`` leaves out."""
        s = self.settings
        answers, widened = [], []
        for i in keep:
            ids = g.completion_ids[i]
            found = self.spans(ids) if self.spans is not None else None
            if not found:  # no token spans (no fast tokenizer, or text that re-tokenises apart)
                answers.append((False,) * len(ids))  # nothing of it is taught
                widened.append(answers[-1])
                continue
            answer = answer_tokens(found[0], found[1], len(ids))
            r = ranks.get((id(g), i))
            answers.append(answer)
            first = s.teach_first_choices and r is not None
            widened.append(first_choice_tokens(answer, r) if first else answer)
        contexts = [
            any(a) and in_context(a, ranks.get((id(g), i)), s.context_rank)
            for i, a in zip(keep, answers, strict=True)
        ]
        teach = balance([g.rewards[i] for i in keep], contexts)
        return [
            flags if ok else (False,) * len(flags) for flags, ok in zip(widened, teach, strict=True)
        ]

    def _check_ranks(self, pending, verdicts) -> dict[tuple[int, int], list[int]]:
        """Check 3 on the completions still pending; returns their ranks by (id(group),
        completion) when ``answer_only`` needs them (``teach_first_choices`` and
        ``in_context``), the check on or off."""
        s = self.settings
        todo = [(g, i) for g, idx in pending for i in idx]
        if not (s.rank_check or s.answer_only) or not todo:
            return {}
        samples = [Sample(g.prompt_ids, g.completion_ids[i], 0.0) for g, i in todo]
        found: dict[tuple[int, int], list[int]] = {}
        for (g, i), ranks in zip(todo, self.ranks(samples), strict=True):
            found[(id(g), i)] = ranks
            if not s.rank_check:
                continue
            skip = self._format_tokens(g.completion_ids[i])
            bits = [b for k, b in enumerate(rank_bits(ranks)) if k not in skip]
            if highest_window(bits, s.rank_window) > s.max_rank_bits:
                verdicts[id(g)][i] = IMPLAUSIBLE
        return found if s.answer_only else {}

    def _format_tokens(self, ids: Sequence[int]) -> set[int]:
        found = self.spans(ids) if self.spans is not None else None
        return format_tokens(found[0], found[1], len(ids)) if found else set()
