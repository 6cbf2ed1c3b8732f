"""A verdict as a model should read it: what to fix next, and nothing that helps to cheat.

`feedback(result, ...)` turns an `EvalResult` into a few lines of text for the next turn of a
refinement episode (`kernelrl.episodes.episode`):

- no code: the answer held no complete code block defining `ModelNew`;
- a compile error: the judge's one-line reason and the compiler's first error lines (at most
  `MAX_ERROR_LINES`, each cut to `MAX_LINE_CHARS`);
- incorrect: the first mismatch, re-worded from the judge's message through a whitelist of its
  formats (which output, its shape or dtype against the reference's, how many values lie outside
  the tolerance, the largest error, which input set and of which kind), and the largest absolute
  and relative errors;
- a runtime error: the exception and the last frames of the traceback that are the program's
  own (frames in kernelrl's harness are left out);
- a timeout: the limit it ran past;
- refused: each rule that refused it, with `kernelrl.episodes.prompt.refusal_reason` (a static
  finding's message, which describes the source, and its line; a dynamic finding's rule summary);
- correct: the speedup with its 95 % interval against eager, against torch.compile when the
  task's baseline is known, whether it is within the measurement's noise (the task's A/A band),
  both times, and the share of this machine's roofline.

Guarantees: the text is built from the result's own fields through this one function, never
from the worker's log (a program's prints, which could hold the inputs it was given), never
with seeds, input values or paths of the judge's harness; every line is bounded. What a
defence measured at run time is never shown: a dynamic finding's message (spot checks made and
failed, clock and preparation excesses, idle CPU time) would tell a policy how far it stood from
each threshold, so only its rule's summary is; nor is the judge's draw of an input set's
perturbation, the value a non-tensor output was expected to have, or an error of the judge's
own (a `judge_error`).

Does not decide anything: the verdict is the evaluator's; the reward is `kernelrl.reward`'s.
"""

from __future__ import annotations

import re

from kernelrl.episodes.prompt import refusal_reason
from kernelrl.result import EvalResult, Severity, Status
from kernelrl.reward import within_noise

MAX_ERROR_LINES = 8
MAX_TRACEBACK_LINES = 6
MAX_LINE_CHARS = 300
# The file the worker writes a program to (kernelrl.judge.harness.worker), and a traceback's frame lines.
_PROGRAM_FILE = "candidate.py"
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<fn>.*)$')
_PATH = re.compile(r"(?:/[\w.+-]+)+")
_COMPILER_ERROR = re.compile(r"(\berror\b[:\s]|\bError\b)", re.IGNORECASE)
# Lines of the build tool, not of the compiler's diagnosis: the commands it ran and its own status.
_BUILD_TOOL = re.compile(r"^\s*\[\d+/\d+\]|^\s*(c\+\+|g\+\+|gcc|nvcc|ninja)\b|^\s*ninja:|^\s*FAILED:")
# The judge's incorrect verdict (kernelrl.judge.trial) and the comparison's formats
# (kernelrl.judge.harness.compare.compare_outputs): only what these patterns capture is shown.
_INCORRECT = re.compile(r"^incorrect on input set (?P<set>\d+) \((?P<label>[^)]*)\): (?P<reason>.*)$")
_WHERE = r"(?P<where>output(?: \d+)?)"
_MISMATCHES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^returned (?P<n>\d+) outputs, expected (?P<m>\d+)$"), "returned {n} outputs, expected {m}"),
    (re.compile(rf"^{_WHERE} has shape (?P<got>\([\d, ]*\)), expected (?P<want>\([\d, ]*\))$"),
     "{where} has shape {got}, expected {want}"),
    (re.compile(rf"^{_WHERE} has dtype (?P<got>torch\.\w+), expected (?P<want>torch\.\w+)$"),
     "{where} has dtype {got}, expected {want}"),
    (re.compile(rf"^{_WHERE}: NaN in (?P<n>\d+) places where the reference differs$"),
     "{where}: NaN in {n} places where the reference differs"),
    (re.compile(rf"^{_WHERE}: infinite values differ from the reference$"), "{where}: infinite values differ"),
    (re.compile(rf"^{_WHERE}: (?P<n>\d+) of (?P<total>\d+) values outside tolerance \(max abs err "
                r"(?P<err>[\w.+-]+), atol (?P<atol>[\w.+-]+), rtol (?P<rtol>[\w.+-]+)\)$"),
     "{where}: {n} of {total} values outside tolerance (max abs err {err}, atol {atol}, rtol {rtol})"),
    (re.compile(rf"^{_WHERE} is .*, expected .*$"), "{where} is not the value the reference returns"),
)
# Runtime errors that are the program's own doing; any other message is the judge's trouble.
_PROGRAM_FAILURES = ("candidate raised: ", "candidate crashed: ", "candidate failed to initialise: ",
                     "candidate failed during timing: ")


def feedback(result: EvalResult | None, *, compile_speedup: float | None = None,
             compile_ci: tuple[float, float] | None = None) -> str:
    """The verdict on one answer, for the model's next turn (see the module docstring).

    `compile_speedup` is the task's eager / torch.compile time ratio and `compile_ci` its 95 %
    interval, when the baseline was measured.
    """
    if result is None or result.status is Status.NO_CODE:
        return ("No code was judged: the answer held no complete fenced code block defining `ModelNew`. "
                "Answer with one complete program.")
    status = result.status
    if status is Status.CORRECT:
        return _correct(result, compile_speedup, compile_ci)
    if status is Status.COMPILE_ERROR:
        errors = _compiler_errors(result)
        head = f"Does not build: {_clip(result.message)}"
        return head + ("\nFirst compiler errors:\n" + "\n".join(f"  {e}" for e in errors) if errors else "")
    if status is Status.INCORRECT:
        text = f"Incorrect: {_mismatch(result.message)}"
        if result.max_abs_err is not None and result.max_rel_err is not None:
            text += (f"\nLargest errors on that input set: absolute {result.max_abs_err:.3g}, "
                     f"relative {result.max_rel_err:.3g}.")
        return text + "\nFix the computation before making it faster."
    if status is Status.JUDGE_ERROR or (status is Status.RUNTIME_ERROR
                                        and not result.message.startswith(_PROGRAM_FAILURES)):
        return "The judge could not run the program (not the program's fault); it was not judged."
    if status is Status.RUNTIME_ERROR:
        frames = _traceback_tail(result)
        head = f"Crashed while running: {_clip(result.message)}"
        return head + ("\nEnd of the traceback (your program's frames):\n" + "\n".join(f"  {f}" for f in frames)
                       if frames else "")
    if status is Status.TIMEOUT:
        return f"Timed out: {_clip(result.message)}. The program hung or ran far too long."
    if status is Status.FLAGGED:
        rejecting = [f for f in result.findings if f.severity is Severity.REJECT] or list(result.findings)
        lines = [f"  {f.rule}: {_clip(refusal_reason(f))}"
                 + (f" (line {f.line})" if f.stage == "static" and f.line else "")
                 for f in dict((f.rule, f) for f in rejecting).values()]
        return ("Refused: the program breaks the rules below, so it earns nothing whatever its speed.\n"
                + "\n".join(lines))
    return "The task's own reference failed to run; this answer was not judged."


def verdict_line(result: EvalResult | None) -> str:
    """One line, for summarised older turns."""
    if result is None or result.status is Status.NO_CODE:
        return "no code"
    if result.status is Status.CORRECT and result.speedup is not None:
        return f"correct, {result.speedup:.2f}x against eager"
    if result.status is Status.FLAGGED:
        return f"refused ({', '.join(dict.fromkeys(result.rejecting_rules)) or 'flagged'})"
    if result.status is Status.INCORRECT:
        return f"incorrect: {_clip(_mismatch(result.message), 160)}"
    if result.status is Status.RUNTIME_ERROR and not result.message.startswith(_PROGRAM_FAILURES):
        return "not judged (the judge could not run it)"
    return f"{result.status.value.replace('_', ' ')}: {_clip(result.message, 160)}"


# ---------------------------------------------------------------------------------------------


def _correct(result: EvalResult, compile_speedup: float | None, compile_ci: tuple[float, float] | None) -> str:
    s = result.speedup
    if s is None:
        return "Correct, but its speed was not measured here (it ran under an interpreter)."
    text = f"Correct. Speedup against eager PyTorch: {s:.3f}x"
    if result.speedup_ci is not None:
        text += f" (95 % interval {result.speedup_ci[0]:.3f}-{result.speedup_ci[1]:.3f}x)"
    text += "."
    if compile_speedup:
        vs = s / compile_speedup
        text += f"\nAgainst torch.compile of the reference: {vs:.3f}x"
        if result.speedup_ci is not None and compile_ci is not None:
            text += (f" (interval {result.speedup_ci[0] / compile_ci[1]:.3f}-"
                     f"{result.speedup_ci[1] / compile_ci[0]:.3f}x)")
        text += "."
    if within_noise(result):
        text += "\nThis speedup is within the measurement's noise: it counts as no speedup."
    if result.ref_time is not None and result.cand_time is not None:
        text += (f"\nMedian time: reference {result.ref_time.median_ms:.4g} ms, yours "
                 f"{result.cand_time.median_ms:.4g} ms.")
    if result.roofline_pct is not None:
        text += f"\nIt reaches {result.roofline_pct:.1f} % of this machine's roofline for the task"
        roof = result.environment.roofline
        if roof is not None and roof.floor_ms:
            text += f" (the least time physically possible is about {roof.floor_ms:.4g} ms)"
        text += "."
    return text + "\nMake it faster, keeping it correct."


def _mismatch(message: str) -> str:
    """The first mismatch of an incorrect verdict, re-worded through the known formats: the input
    set's kind but not the perturbation the judge drew, no expected value, nothing of an
    unknown format."""
    m = _INCORRECT.match(message)
    if m is None:
        return "the outputs differ from the reference's"
    kind = "plain" if m.group("label") == "plain" else "scaled and shifted"
    where = f"on input set {m.group('set')} ({kind})"
    for pattern, template in _MISMATCHES:
        found = pattern.match(m.group("reason"))
        if found:
            return f"{where}: {template.format(**found.groupdict())}"
    return f"{where}: the outputs differ from the reference's"


def _compiler_errors(result: EvalResult) -> list[str]:
    """Error lines of the build's own report: the first of the result's errors (the worker's
    load failure, which holds the compiler's output); later ones are a traceback and the
    worker's log, which the program writes to and which is never shown."""
    out: list[str] = []
    for block in result.errors[:1]:
        for line in block.splitlines():
            if _COMPILER_ERROR.search(line) and not _BUILD_TOOL.search(line):
                clipped = _clip(line.strip())
                if clipped not in out:
                    out.append(clipped)
            if len(out) >= MAX_ERROR_LINES:
                return out
    return out


def _traceback_tail(result: EvalResult) -> list[str]:
    """The program's own frames (its file is the worker's `candidate.py`) and the exception; the
    harness's and libraries' frames are left out, and no path is shown."""
    for block in result.errors:
        if "Traceback (most recent call last)" not in block:
            continue
        kept: list[str] = []
        own = False
        for line in block.splitlines()[1:]:
            frame = _FRAME.match(line)
            if frame is not None:
                own = frame.group("file").endswith(_PROGRAM_FILE)
                if own:
                    kept.append(f'File "{_PROGRAM_FILE}", line {frame.group("line")}, in {frame.group("fn")}')
            elif line.startswith("    ") or not line.strip():
                if own and line.strip():
                    kept.append(line.rstrip())
            else:
                own = False
                kept.append(line.rstrip())
        return [_clip(line) for line in kept[-MAX_TRACEBACK_LINES:]]
    return []


def _clip(text: str, n: int = MAX_LINE_CHARS) -> str:
    """One line, at most n characters, with every file path cut to its file name (no path of the
    judge's machine, harness or build folders reaches a prompt)."""
    first = _PATH.sub(lambda m: m.group(0).rsplit("/", 1)[-1], " ".join(text.split()))
    return first if len(first) <= n else first[: n - 3] + "..."
