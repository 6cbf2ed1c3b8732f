"""Copies: is a generated program a version its prompt showed, up to edits that change nothing?

A contrastive prompt shows the task's versions with their measured speedups, and a policy under
CUDA-L1's absolute-speedup reward earns the best one's speedup by writing it out again. What should
pay is improving on what was shown, so a correct answer that is a shown version up to edits that
change nothing it computes, and that is not faster than that version beyond noise, is a **copy**:
the reward pays it the lower of its own measure and no speedup (`kernelrl.reward`, property 8).

Two programs are compared by their canonical token streams (`kernelrl.train.canonical`), which
erase what a behaviour-preserving edit can change: layout, comments and docstrings, names the
program binds, imports and aliases, dead code, definition order, and equivalent spellings (`@`
and `torch.matmul`, `range(0, n)` and `range(n)`, `x.tanh()` and `torch.tanh(x)`, ...), and cut
inline C++/CUDA sources into tokens with their own names erased.

The **edits** between two streams are the token insertions and deletions that turn one into the
other (a replaced token is two; `edits`, Myers' diff stopped at the limit). A program within
`allowed` edits of a shown version (`CopyRule`: at least `min_edits`, or `share` of the version's
tokens) is that version up to what the canonical form missed (an equivalent spelling it does not
know, a temporary variable, a reordered expression).

The measurement decides the rest (`faster_beyond_noise`): an answer a few tokens from a shown
version that is faster than it beyond noise (its speedup's interval above the version's, by more
than identical code measured apart) is an improvement, not a copy. A near-copy that is slower is
a copy too: it is paid its own lower measure, so the rule only ever takes away what was not earned.

Guarantees: making a canonical form is linear in the text's length, and comparing two is linear
times `allowed` at most (forms whose lengths or windows differ by more are set aside first), so a
hostile answer cannot stall the reward; `copy_of` judges only correct, timed answers (a program
that does not parse is never correct, so never a copy); a `Comparer` makes each shown version's
canonical form once.

`shown_versions` says what a prompt showed: the database rows whose ids the prompt stream recorded
with the prompt (`kernelrl.episodes.prompt.compose_prompt`), in full, never the prompt's text, which
elides the reference a version embeds.

Does not prove equivalence: a policy that makes more edits than `allowed` that the canonical form
does not erase writes a program this module calls new, and it is paid what it measures (which,
for a paraphrase of the shown best, is that version's speedup). The property test
(`tests/train/test_copies.py`) draws random combinations of edits from every class the canonical
form erases and two it does not, checks the PyTorch programs still compute the same, and checks
they stay within `allowed`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from kernelrl.candidate import defines_model_new, fenced_blocks
from kernelrl.result import EvalResult, Status
from kernelrl.train.canonical import canonical_tokens

if TYPE_CHECKING:
    from kernelrl.tasks.task import Task

K = 3  # tokens per window


@dataclass(frozen=True, kw_only=True)
class CopyRule:
    """How close to a shown version an answer must be to count as it: within `allowed` token edits
    of its canonical form, `allowed` = max(min_edits, ceil(share x the version's tokens))."""

    min_edits: int = 10  # token edits from a shown version an answer may be and still be its copy, at least
    share: float = 0.04  # or this share of the version's tokens, when more

    def __post_init__(self) -> None:
        if self.min_edits < 0 or not 0.0 <= self.share < 1.0:
            raise ValueError("copy rule: need min_edits >= 0 and 0 <= share < 1")

    def allowed(self, tokens: int) -> int:
        return max(self.min_edits, math.ceil(self.share * tokens))


@dataclass(frozen=True, kw_only=True)
class ShownVersion:
    """A version a prompt showed: its database id (None: known by its text only), its full source
    and its verdict as stored."""

    id: int | None
    source: str
    result: EvalResult | None = None


@dataclass(frozen=True, kw_only=True)
class Canonical:
    """A program's canonical token stream and its windows (computed once, compared many times)."""

    tokens: tuple[str, ...]
    windows: Counter[tuple[str, ...]] = field(repr=False)

    @classmethod
    def of(cls, code: str) -> Canonical:
        tokens = canonical_tokens(code)
        return cls(tokens=tokens, windows=_windows(tokens))


@dataclass(frozen=True, kw_only=True)
class CopyFinding:
    """An answer found to be a copy of a shown version, and why."""

    version: int | None  # the shown version's database id
    edits: int  # estimated token edits between the canonical forms
    allowed: int
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {"version": self.version, "edits": self.edits, "allowed": self.allowed, "reason": self.reason}


def edits(a: Canonical, b: Canonical, limit: int) -> int | None:
    """Token insertions and deletions that turn one canonical form into the other (a replaced
    token is two), or None when that is more than `limit`: Myers' greedy diff, stopped at `limit`,
    after a bound from the windows (one edit changes at most 2K - 1 of them) and the common ends
    are set aside, so near forms cost about their length and far ones next to nothing."""
    x, y = a.tokens, b.tokens
    if abs(len(x) - len(y)) > limit:
        return None
    diff = (a.windows - b.windows).total() + (b.windows - a.windows).total()
    if diff > limit * (2 * K - 1):
        return None
    start = 0
    while start < len(x) and start < len(y) and x[start] == y[start]:
        start += 1
    end_x, end_y = len(x), len(y)
    while end_x > start and end_y > start and x[end_x - 1] == y[end_y - 1]:
        end_x -= 1
        end_y -= 1
    x, y = x[start:end_x], y[start:end_y]
    n, m = len(x), len(y)
    furthest = {1: 0}
    for d in range(limit + 1):
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and furthest[k - 1] < furthest[k + 1]):
                i = furthest[k + 1]
            else:
                i = furthest[k - 1] + 1
            j = i - k
            while i < n and j < m and x[i] == y[j]:
                i += 1
                j += 1
            furthest[k] = i
            if i >= n and j >= m:
                return d
    return None


def faster_beyond_noise(result: EvalResult, than: EvalResult | None) -> bool:
    """`result`'s speedup is above `than`'s by more than the noise of both: the lower end of its
    95 % interval above the upper end of the other's, by more than the spread identical code
    measured on the task (their A/A bands). False when either has no speedup: nothing shows it
    improved."""
    if result.speedup is None or than is None or than.speedup is None:
        return False
    low = min(result.speedup_ci) if result.speedup_ci else result.speedup
    high = max(than.speedup_ci) if than.speedup_ci else than.speedup
    spread = max((max(band) - 1.0 for band in (result.noise_band, than.noise_band) if band), default=0.0)
    return low > high * (1.0 + max(0.0, spread))


class Comparer:
    """Compares answers with a set of shown versions; each version's canonical form is made once."""

    def __init__(self, shown: Iterable[ShownVersion], rule: CopyRule | None = None) -> None:
        self.rule = rule or CopyRule()
        self.shown = [(v, Canonical.of(v.source)) for v in shown if v.source.strip()]

    def copy_of(self, code: str | None, result: EvalResult | None) -> CopyFinding | None:
        """The shown version this correct, timed answer copies (the nearest one, see the module
        docstring), or None: not a copy, or not a correct timed answer."""
        if code is None or result is None or result.status is not Status.CORRECT or result.speedup is None:
            return None
        if not self.shown:
            return None
        mine = Canonical.of(code)
        best: tuple[int, ShownVersion, int] | None = None
        for version, form in self.shown:
            allowed = self.rule.allowed(len(form.tokens))
            n = edits(mine, form, allowed)
            if n is not None and not faster_beyond_noise(result, version.result) and (best is None or n < best[0]):
                best = (n, version, allowed)
        if best is None:
            return None
        n, version, allowed = best
        name = f"version {version.id}" if version.id is not None else "a version the prompt showed"
        measured = _speedup_text(result)
        theirs = _speedup_text(version.result) if version.result is not None else "no stored measure"
        return CopyFinding(version=version.id, edits=n, allowed=allowed,
                           reason=f"the same program as {name} up to {n} token edit(s) of its canonical form "
                                  f"(allowed {allowed}), and not faster than it beyond noise ({measured} against "
                                  f"{theirs})")


class VersionSource(Protocol):
    """The part of the code database the copy rule reads (`kernelrl.store` implements it)."""

    def get_candidate(self, candidate_id: int) -> ShownRecord | None: ...

    def top_candidates(self, task: str, k: int) -> Sequence[ShownRecord]: ...


class ShownRecord(Protocol):
    @property
    def id(self) -> int: ...

    @property
    def task(self) -> str: ...

    @property
    def source(self) -> str: ...

    @property
    def result(self) -> EvalResult | None: ...


# Correct versions of a task searched for a prompt's blocks when the prompt came without ids.
_MATCHED_VERSIONS = 10000


def shown_versions(db: VersionSource | None, task: Task, *, ids: Sequence[int] | None = None,
                   prompt: str | None = None) -> list[ShownVersion]:
    """The versions a prompt showed, in full: the database rows `ids` (the prompt stream records
    them with every row), else each `ModelNew` block of `prompt` matched to the task's correct
    versions in the database by the text the prompt shows of them (`elide_reference`), else, with
    no database or no match, the block's own text (no stored measure: a near-copy of it is never
    found faster). An id that is not a version of `task` is a `ValueError` naming it."""
    if ids is not None:
        if not ids:
            return []
        if db is None:
            raise ValueError("shown versions given by id need the run's database")
        out = []
        for i in ids:
            rec = db.get_candidate(int(i))
            if rec is None or rec.task != task.name:
                raise ValueError(f"candidate {i} is not a version of task {task.name!r} in this database")
            out.append(ShownVersion(id=rec.id, source=rec.source, result=rec.result))
        return out
    if prompt is None:
        return []
    from kernelrl.episodes.prompt import elide_reference

    blocks = [body for _, body in fenced_blocks(prompt) if defines_model_new(body)]
    if not blocks:
        return []
    by_text: dict[str, ShownRecord] = {}
    if db is not None:
        for rec in db.top_candidates(task.name, _MATCHED_VERSIONS):
            by_text.setdefault(elide_reference(rec.source, task).strip(), rec)
    found = []
    for body in blocks:
        rec = by_text.get(body.strip())
        found.append(ShownVersion(id=rec.id, source=rec.source, result=rec.result) if rec is not None
                     else ShownVersion(id=None, source=body))
    return found


def _speedup_text(result: EvalResult) -> str:
    if result.speedup is None:
        return "no speedup"
    text = f"{result.speedup:.3g}x"
    if result.speedup_ci:
        text += f" [{min(result.speedup_ci):.3g}, {max(result.speedup_ci):.3g}]"
    return text


def _windows(tokens: Sequence[str]) -> Counter[tuple[str, ...]]:
    if len(tokens) < K:
        return Counter([tuple(tokens)])
    return Counter(tuple(tokens[i:i + K]) for i in range(len(tokens) - K + 1))
