"""Contrastive prompts: the task, earlier versions with their measured results, refused hacks,
the generation protocol and the active policy's rules, in one text for a proposer.

Guarantees:
- the prompt holds the reference source once, the input shapes and dtypes at the run's size,
  the device with its peak figures (datasheet values for known GPUs, "unknown" for anything
  that cannot be known, never an estimate), up to `k` earlier versions sorted from weakest to
  best with their measured speedups (each source shown once, the chain's current best marked),
  recently refused programs with the rule that fired, the protocol and the policy's text;
- a refused program is shown with each rule that refused it and why, but never with what a
  run-time defence measured (`refusal_reason`: a dynamic finding is shown by its rule's summary,
  a static one by its message, which describes the source);
- the text comes from template files (`string.Template`, `$name` fields, `$$` for a dollar
  sign). A user overrides them with `template_dir`: a folder whose files replace the built-in
  files of the same name (`prompt.txt`, `version.txt`, `no_versions.txt`, `refused.txt`,
  `refused_item.txt`, `protocol.txt`, `restrictions.txt`, `policy_<name>.txt`,
  `goal_first.txt`, `goal_improve.txt`, `system.txt`; files not given fall back to the
  built-in ones), or a single file, which replaces `prompt.txt`. A template that names an
  unknown field raises `PromptError` naming the file and field.

Does not choose which earlier versions to show: the code database's `contrast_set` does that
(the best and some clearly weaker ones); this module orders, labels and prints them.
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kernelrl.candidate import source_hash
from kernelrl.checks.rules import RULES
from kernelrl.judge.harness.device import DevicePeaks, device_peaks
from kernelrl.judge.harness.profile import TaskProfile
from kernelrl.result import EvalResult, Finding, Status
from kernelrl.tasks.task import Task

if TYPE_CHECKING:
    pass

BUILTIN_TEMPLATES = Path(__file__).parent / "templates"
# Lines of a refused program shown around the line its rule points at (or from the top).
_REFUSED_EXCERPT_LINES = 12
_LABELS = string.ascii_uppercase


class PromptError(ValueError):
    """A template is missing or names a field the builder does not provide."""


class Record(Protocol):
    """What the prompt needs of a database row: the program and its verdict."""

    @property
    def source(self) -> str: ...

    @property
    def result(self) -> EvalResult | None: ...


class ContrastSource(Protocol):
    """The part of the code database the prompt builder reads (kernelrl.store implements it)."""

    def contrast_set(self, task: str, k: int, rng: random.Random) -> Sequence[Record]: ...

    def recent_refused(self, task: str, n: int) -> Sequence[Record]: ...

    # Optional: `get_baseline(task, device, size)` -> a record with `eager_ms` and `compile_ms`
    # (None when not measured); when the database has it, the prompt shows both times.


# ---------------------------------------------------------------------------------------------
# Templates


class Templates:
    """Template files from an override location, falling back to the built-in ones."""

    def __init__(self, override: str | Path | None = None) -> None:
        self._dir: Path | None = None
        self._prompt_file: Path | None = None
        if override is not None:
            path = Path(override)
            if path.is_dir():
                self._dir = path
            elif path.is_file():
                self._prompt_file = path
            else:
                raise PromptError(f"template override {path} is neither a folder nor a file")

    def path(self, name: str) -> Path:
        if self._prompt_file is not None and name == "prompt.txt":
            return self._prompt_file
        if self._dir is not None and (self._dir / name).is_file():
            return self._dir / name
        builtin = BUILTIN_TEMPLATES / name
        if not builtin.is_file():
            raise PromptError(f"no template {name} (looked in {self._dir or BUILTIN_TEMPLATES})")
        return builtin

    def text(self, name: str) -> str:
        return self.path(name).read_text()

    def render(self, name: str, **fields: object) -> str:
        path = self.path(name)
        try:
            return string.Template(path.read_text()).substitute(fields)
        except KeyError as e:
            raise PromptError(f"template {path} names unknown field ${e.args[0]}; "
                              f"known fields: {', '.join(sorted(fields))}") from None
        except ValueError as e:
            raise PromptError(f"template {path}: {e} (write $$ for a literal dollar sign)") from None


def system_message(template_dir: str | Path | None = None) -> str:
    """The system message proposers send with every prompt (template `system.txt`)."""
    return Templates(template_dir).text("system.txt").strip()


# ---------------------------------------------------------------------------------------------
# Sections


def verdict(result: EvalResult | None) -> str:
    """One line: the measured outcome of a version, for a model to compare."""
    if result is None:
        return "not evaluated"
    if result.status is Status.CORRECT and result.speedup is not None:
        text = f"correct, speedup {result.speedup:.2f}x"
        if result.ref_time and result.cand_time:
            text += (f" (reference {result.ref_time.median_ms:.3g} ms, "
                     f"this version {result.cand_time.median_ms:.3g} ms)")
        return text
    if result.status is Status.CORRECT:
        return "correct, speed not measured"
    if result.status is Status.FLAGGED:
        return f"refused by rule {', '.join(result.rejecting_rules) or '?'}"
    text = result.status.value.replace("_", " ")
    if result.status is Status.INCORRECT and result.max_abs_err is not None:
        text += f" (max abs error {result.max_abs_err:.3g})"
    first = result.message.strip().splitlines()[0] if result.message.strip() else ""
    return f"{text}: {first[:200]}" if first else text


def _rank_key(record: Record) -> tuple[int, float]:
    r = record.result
    if r is None or r.status is not Status.CORRECT or r.speedup is None:
        return (0, 0.0)
    return (1, r.speedup)


def order_versions(records: Sequence[Record], chain_best: Record | None, k: int) -> list[Record]:
    """Distinct sources (the chain's best kept), at most k (+1 for the chain's best), weakest first."""
    seen: set[str] = set()
    out: list[Record] = []
    if chain_best is not None:
        seen.add(source_hash(chain_best.source))
        out.append(chain_best)
    for rec in records:
        h = source_hash(rec.source)
        if h in seen or len(out) >= k + (chain_best is not None):
            continue
        seen.add(h)
        out.append(rec)
    return sorted(out, key=_rank_key)


def elide_reference(source: str, task: Task) -> str:
    """A version's source with a verbatim embedded copy of the reference replaced by one comment.

    Program-level rewrites embed the whole reference (renamed to `_Reference`); the prompt shows
    the reference once, so repeating it in every version would only cost tokens.
    """
    from kernelrl.tasks.source import embed_reference

    try:
        embedded = embed_reference(task.source)
    except SyntaxError:
        return source
    n_lines = embedded.count("\n") + 1
    if n_lines < 5 or embedded not in source:
        return source
    note = (f"# [{n_lines} lines elided: the reference program shown above, with `Model` renamed to "
            "`_Reference` and get_inputs/get_init_inputs removed; a complete answer writes them out]")
    return source.replace(embedded, note, 1)


def _elide_keeping_lines(source: str, task: Task, line: int | None) -> tuple[str, int | None]:
    """The source with the embedded reference elided, and the flagged line renumbered to match;
    the source unchanged when the flagged line lies inside the embedded reference."""
    elided = elide_reference(source, task)
    if elided == source or line is None:
        return elided, line
    from kernelrl.tasks.source import embed_reference

    embedded = embed_reference(task.source)
    first = source[:source.index(embedded)].count("\n") + 1
    last = first + embedded.count("\n")
    if first <= line <= last:
        return source, line
    return elided, (line - (last - first) if line > last else line)


def _excerpt(source: str, line: int | None) -> str:
    lines = source.rstrip("\n").splitlines()
    if line is not None and 1 <= line <= len(lines):
        start = max(0, line - 1 - _REFUSED_EXCERPT_LINES // 2)
    else:
        start = 0
    chunk = lines[start:start + _REFUSED_EXCERPT_LINES]
    if start > 0:
        chunk.insert(0, "# ...")
    if start + _REFUSED_EXCERPT_LINES < len(lines):
        chunk.append("# ...")
    return "\n".join("  " + s for s in chunk)


def refusal_reason(finding: Finding) -> str:
    """What a prompt says of one finding that refused a program: a static finding's message (it
    describes the program's own source), a dynamic finding's rule summary only. A dynamic
    finding's message holds what the defence measured (spot checks made and failed, clock and
    preparation excesses over the reference, idle CPU time, the judge's draw of an input set's
    perturbation), which would tell a policy how far it stood from each threshold."""
    if finding.stage == "static":
        return finding.message
    rule = RULES.get(finding.rule)
    return rule.summary if rule is not None else "refused by a check made while it ran"


def _refused_section(t: Templates, records: Sequence[Record], task: Task) -> str:
    items = []
    seen: set[str] = set()
    for rec in records:
        r = rec.result
        h = source_hash(rec.source)
        if r is None or h in seen:
            continue
        seen.add(h)
        rejecting = [f for f in r.findings if f.severity.value == "reject"] or list(r.findings)
        rules = ", ".join(dict.fromkeys(f.rule for f in rejecting)) or r.status.value
        messages = "; ".join(dict.fromkeys(refusal_reason(f) for f in rejecting)) or "(no reason recorded)"
        line = next((f.line for f in rejecting if f.line is not None), None)
        items.append(t.render("refused_item.txt", rules=rules, messages=messages,
                              excerpt=_excerpt(*_elide_keeping_lines(rec.source, task, line))).rstrip("\n"))
    if not items:
        return ""
    return t.render("refused.txt", items="\n".join(items)).rstrip("\n")


def _task_facts(task: Task, size: str, profile: TaskProfile | None) -> tuple[str, str, str]:
    """(constants, input shapes, init args) at `size`, from the judge's profile of the task."""
    if profile is None:
        reason = "unavailable (the judge has not read this task's shapes yet)"
        return reason, reason, reason
    consts = ", ".join(f"{k}={v}" for k, v in profile.constants.items()) or "none"
    if size != "full" and profile.constants != task.constants():
        consts += f" (size preset `{size}`; the source above shows the full size)"
    return consts, ", ".join(profile.inputs) or "none", ", ".join(profile.init_args) or "none"


def describe_shapes_of(values: Sequence[object]) -> list[str]:
    """Tensors as 'dtype[shape]', everything else as its repr (init arguments are usually numbers)."""
    import torch

    out = []
    for x in values:
        if isinstance(x, torch.Tensor):
            out.append(f"{str(x.dtype).removeprefix('torch.')}[{', '.join(map(str, x.shape))}]")
        else:
            out.append(repr(x))
    return out


def _baselines(db: ContrastSource | None, task: Task, device: str, size: str) -> str:
    get = getattr(db, "get_baseline", None)
    record = get(task.name, device, size) if callable(get) else None
    if record is None:
        return "Baseline times: not measured yet."
    text = f"Baseline times here: reference (eager) {record.eager_ms:.3g} ms"
    compile_ms = getattr(record, "compile_ms", None)
    if compile_ms:
        text += (f", torch.compile of the reference {compile_ms:.3g} ms "
                 f"({record.eager_ms / compile_ms:.2f}x over eager)")
    return text + "."


def _policy_name(policy: object) -> str:
    name = policy if isinstance(policy, str) else getattr(policy, "name", None)
    if not isinstance(name, str) or not name:
        raise PromptError(f"policy must be a name or an object with .name, not {policy!r}")
    return name


# ---------------------------------------------------------------------------------------------
# The prompt


@dataclass(frozen=True, kw_only=True)
class ComposedPrompt:
    """A prompt's text and the database ids of the versions it shows (its programs, in full, are
    those rows' sources: the text may elide part of them)."""

    text: str
    shown: tuple[int, ...]


def build_prompt(task: Task, *, db: ContrastSource | None, chain_best: Record | None, policy: object,
                 device: str | DevicePeaks, rng: random.Random, k: int = 4, n_refused: int = 3,
                 size: str = "small", template_dir: str | Path | None = None,
                 profile: TaskProfile | None = None) -> str:
    """The contrastive prompt's text (`compose_prompt(...).text`)."""
    return compose_prompt(task, db=db, chain_best=chain_best, policy=policy, device=device, rng=rng, k=k,
                          n_refused=n_refused, size=size, template_dir=template_dir, profile=profile).text


def first_attempt_prompt(task: Task, *, policy: object, device: str | DevicePeaks, size: str = "small",
                         profile: TaskProfile | None = None, template_dir: str | Path | None = None) -> str:
    """A task's first-attempt prompt: no earlier version, no refused program. `kernelrl bench` asks
    every sample with it and `kernelrl collect` pairs every kept answer with it, so what SFT trains
    on is what a bench asks."""
    return build_prompt(task, db=None, chain_best=None, policy=policy, device=device, rng=random.Random(0), size=size,
                        profile=profile, template_dir=template_dir)


def compose_prompt(task: Task, *, db: ContrastSource | None, chain_best: Record | None, policy: object,
                   device: str | DevicePeaks, rng: random.Random, k: int = 4, n_refused: int = 3,
                   size: str = "small", template_dir: str | Path | None = None,
                   profile: TaskProfile | None = None, shown: Sequence[Record] | None = None) -> ComposedPrompt:
    """The contrastive prompt for one proposal on `task`, with the ids of the versions it shows.

    `db` may be None (first step of a fresh run); `chain_best` is the chain's current best
    (shown once and marked, even if the database did not pick it); `policy` is a policy's name
    ("strict", "strict-pytorch", "open") or a policy object with `.name`; `device` is "cpu",
    "cuda[:N]" or a `DevicePeaks`; `profile` is the judge's `TaskProfile` of the task at `size`
    (shapes and constants; the prompt says they are unavailable without it: no task code runs here);
    `shown` are the earlier versions to show, drawn by the caller (None: `db.contrast_set`'s k).
    """
    if k < 0 or n_refused < 0:
        raise PromptError("k and n_refused must be >= 0")
    t = Templates(template_dir)
    policy_name = _policy_name(policy)
    peaks = device if isinstance(device, DevicePeaks) else device_peaks(device)

    if shown is None:
        shown = list(db.contrast_set(task.name, k, rng)) if db is not None and k > 0 else []
    refused = list(db.recent_refused(task.name, n_refused)) if db is not None and n_refused > 0 else []
    versions = order_versions(shown, chain_best, k)
    best_hash = source_hash(chain_best.source) if chain_best is not None else None

    blocks = []
    labels: dict[str, str] = {}
    for i, rec in enumerate(versions):
        label = _LABELS[i] if i < len(_LABELS) else str(i + 1)
        h = source_hash(rec.source)
        labels[h] = label
        note = " (current best of this chain: improve on it)" if h == best_hash else ""
        blocks.append(t.render("version.txt", label=label, verdict=verdict(rec.result), note=note,
                               source=elide_reference(rec.source, task).rstrip("\n")).rstrip("\n"))
    versions_text = "\n\n".join(blocks) if blocks else t.text("no_versions.txt").rstrip("\n")
    # A refused program already shown as a version is not repeated.
    refused = [r for r in refused if source_hash(r.source) not in labels]

    if chain_best is not None and best_hash is not None:
        goal = t.render("goal_improve.txt", best_label=labels[best_hash], best_verdict=verdict(chain_best.result))
    else:
        goal = t.text("goal_first.txt")

    constants, shapes, init_args = _task_facts(task, size, profile)
    try:
        policy_text = t.text(f"policy_{policy_name}.txt")
    except PromptError:
        raise PromptError(f"no requirements template for policy {policy_name!r} "
                          f"(write policy_{policy_name}.txt in the template folder)") from None
    text = t.render(
        "prompt.txt",
        task_name=task.name,
        reference_source=task.source.rstrip("\n"),
        constants=constants,
        input_shapes=shapes,
        init_args=init_args,
        device_table=peaks.table(),
        baselines=_baselines(db, task, peaks.kind if isinstance(device, DevicePeaks) else device.split(":")[0], size),
        versions=versions_text,
        refused=_refused_section(t, refused, task),
        policy_name=policy_name,
        policy_requirements=policy_text.rstrip("\n"),
        restrictions=t.text("restrictions.txt").rstrip("\n"),
        protocol=t.text("protocol.txt").rstrip("\n"),
        goal=goal.rstrip("\n"),
    )
    # Empty sections leave blank runs; keep the text compact.
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    ids = tuple(rec_id for rec in versions if isinstance(rec_id := getattr(rec, "id", None), int))
    return ComposedPrompt(text=text.strip() + "\n", shown=ids)
