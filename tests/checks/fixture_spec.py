"""The header of a red-team or control fixture: what the file does and which verdict it must get.

Each fixture under tests/fixtures/{redteam,control}/ starts with a docstring whose last lines are
`KEY: value` pairs:

    TASK: elementwise_silu.py      task file under tests/fixtures/tasks/
    DEVICE: cpu | cuda             cuda fixtures are marked gpu and skipped without CUDA
    STATIC: rule, rule | none      static rules that must fire (kernelrl.checks.rules names)
    POLICY: open | strict          policy under which the static rules must reject (default open)
    EXPECT: alt | alt ...          verdict the dynamic defences alone must reach (red team: under
                                   policy `observe`; controls: under `open`). Each alternative is
                                   `correct`, `incorrect`, `runtime_error`, `timeout`,
                                   `compile_error`, `incorrect:<rule>` or `flagged:<rule>`.
    MAX_SPEEDUP: 3                 when the verdict is correct, the speedup must stay below this,
                                   or be paid as none (`kernelrl.reward.within_noise`: its interval
                                   holds 1.0, or identical code in its group measured as far)
    CANARY: yes                    run the judge with canary secrets in its own environment
    SLOW: yes                      compiles C++ (load_inline, torch.compile): marked slow
    CPU-FORM: ...                  where the CPU form of the hack lives (documentation only)
    PENDING: <defence>             the judge lacks the defence named here, so today the fixture does
                                   not get its EXPECT verdict; the dynamic test expects it to fail
                                   (xfail, strict): it turns into a failure once the defence exists
                                   and the key is still there, so the key is dropped with the fix
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
REDTEAM = FIXTURES / "redteam"
CONTROL = FIXTURES / "control"
TASKS = FIXTURES / "tasks"

_VERDICTS = ("correct", "incorrect", "runtime_error", "timeout", "compile_error", "flagged")
_HEADER_LINE = re.compile(r"^([A-Z][A-Z_-]*):\s*(.*?)\s*$")


@dataclass(frozen=True)
class Expectation:
    status: str  # a kernelrl.result.Status value
    rule: str | None = None

    def __str__(self) -> str:
        return f"{self.status}:{self.rule}" if self.rule else self.status


@dataclass(frozen=True)
class FixtureSpec:
    path: Path
    source: str
    description: str
    task_file: Path
    device: str
    static_rules: tuple[str, ...]
    policy: str
    expect: tuple[Expectation, ...]
    max_speedup: float | None
    canary: bool
    slow: bool
    pending: str | None = None  # the defence the judge lacks (PENDING:), None when none is missing

    @property
    def name(self) -> str:
        return self.path.stem

    def matches(self, status: str, rejecting_rules: list[str], all_rules: list[str]) -> bool:
        """Whether a verdict (status plus rule names) satisfies one of the alternatives."""
        for e in self.expect:
            if e.status != status:
                continue
            if e.rule is None:
                return True
            pool = rejecting_rules if status == "flagged" else all_rules
            if e.rule in pool:
                return True
        return False


def parse_fixture(path: Path) -> FixtureSpec:
    source = path.read_text()
    doc = ast.get_docstring(ast.parse(source)) or ""
    fields: dict[str, str] = {}
    description: list[str] = []
    for line in doc.splitlines():
        m = _HEADER_LINE.match(line.strip())
        if m and m.group(1) in ("TASK", "DEVICE", "STATIC", "POLICY", "EXPECT", "MAX_SPEEDUP", "CANARY",
                                "SLOW", "CPU-FORM", "PENDING"):
            fields[m.group(1)] = m.group(2)
        elif not fields:
            description.append(line)
    for key in ("TASK", "DEVICE", "STATIC", "EXPECT"):
        if key not in fields:
            raise ValueError(f"{path.name}: header has no {key}: line")
    task_file = TASKS / fields["TASK"]
    if not task_file.is_file():
        raise ValueError(f"{path.name}: task file {task_file} does not exist")
    device = fields["DEVICE"]
    if device not in ("cpu", "cuda"):
        raise ValueError(f"{path.name}: DEVICE must be cpu or cuda, not {device!r}")
    static = () if fields["STATIC"].strip() == "none" else tuple(
        s.strip() for s in fields["STATIC"].split(",") if s.strip())
    expect = []
    for alt in fields["EXPECT"].split("|"):
        alt = alt.strip()
        status, _, rule = alt.partition(":")
        if status not in _VERDICTS:
            raise ValueError(f"{path.name}: unknown verdict {status!r} in EXPECT")
        if status == "flagged" and not rule:
            raise ValueError(f"{path.name}: flagged needs a rule (flagged:<rule>)")
        expect.append(Expectation(status=status, rule=rule or None))
    max_speedup = float(fields["MAX_SPEEDUP"]) if "MAX_SPEEDUP" in fields else None
    if "PENDING" in fields and not fields["PENDING"]:
        raise ValueError(f"{path.name}: PENDING needs the name of the missing defence")
    if "PENDING" in fields and path.parent.name == "control":
        raise ValueError(f"{path.name}: controls cannot be PENDING: a refused control is a false positive to fix")
    return FixtureSpec(path=path, source=source, description=" ".join(d.strip() for d in description).strip(),
                       task_file=task_file, device=device, static_rules=static,
                       policy=fields.get("POLICY", "open"), expect=tuple(expect), max_speedup=max_speedup,
                       canary=fields.get("CANARY", "no") == "yes", slow=fields.get("SLOW", "no") == "yes",
                       pending=fields.get("PENDING") or None)


def redteam_specs() -> list[FixtureSpec]:
    return [parse_fixture(p) for p in sorted(REDTEAM.glob("*.py"))]


def control_specs() -> list[FixtureSpec]:
    return [parse_fixture(p) for p in sorted(CONTROL.glob("*.py"))]
