"""Dynamic verdicts: every red-team fixture is refused with the rule its header names, every control
is accepted under `open`.

Three properties, one test each per fixture:
- the dynamic defences alone (policy `observe`: static rules only warn) reach the header's EXPECT
  verdict, and a "correct" verdict never carries more speedup than MAX_SPEEDUP;
- under the fixture's policy (default `open`) a statically detectable hack is FLAGGED with one of
  its STATIC rules;
- each control is CORRECT under `open`, with no rejecting finding.
Fixtures marked `PENDING: <defence>` need a defence the judge does not have yet: their dynamic
test is a strict xfail, so it fails once the defence lands and the key was not dropped.
Fixtures marked `CANARY: yes` are judged in a separate Python process started with canary
secrets (API-key-like variables) in its environment, so a leak of the judge's environment
into the candidate shows up as a wrong answer; a test's canary fixtures of one task share that
process and are judged there as one group.

The other fixtures are judged as a trainer's candidates are: in groups, up to GROUP_SIZE
fixtures of one task (same device, same policy) timed together against one reference, each in
its own worker with its own checks and verdict. A hack therefore has to be refused among other
programs, and a control accepted beside hacks; one group's several candidates share the
reference's and the A/A copy's workers instead of starting them once per fixture, which is most
of what an evaluation costs on a CPU.
The counts are printed at the end of the run (conftest.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from fixture_spec import FixtureSpec, control_specs, redteam_specs

from kernelrl.candidate import Candidate
from kernelrl.checks.policy import get_policy
from kernelrl.checks.static import check_source
from kernelrl.result import EvalResult, Severity
from kernelrl.reward import within_noise
from kernelrl.tasks.task import load_task_file

pytestmark = pytest.mark.xdist_group("cpu_judge")  # see conftest.py

TIMEOUT_S = 180.0
# Timing shorter than a search on this machine runs it (the README's main job: 2.5 s a member), and
# far shorter than the library's default 20 s, which buys a +-1 % interval: no verdict here is a
# speedup to 1 %. The defences' own sampling is the default's (15 rounds at least, 10 spot checks,
# warm-up, A/A copy), and that is what the hacks meet.
TIMING = dict(max_timing_s=1.5, max_rounds=150)
GROUP_SIZE = 12
REDTEAM = redteam_specs()
CONTROLS = control_specs()

_JUDGE_SCRIPT = """
import json, sys
from pathlib import Path
from kernelrl.candidate import Candidate
from kernelrl.judge.evaluator import EvalConfig, Evaluator
from kernelrl.judge.timing.timer import TimingConfig
from kernelrl.tasks.task import load_task_file
task_file, device, policy, timeout, out, timing, *cand_files = sys.argv[1:]
task = load_task_file(Path(task_file))
cfg = EvalConfig(device=device, policy=policy, timeout_s=float(timeout), timing=TimingConfig(**json.loads(timing)))
with Evaluator(cfg) as ev:
    got = ev.evaluate_batch([(task, Candidate(source=Path(f).read_text(), origin=f)) for f in cand_files])
Path(out).write_text(json.dumps([r.to_dict() for r in got]))
"""


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def params(specs: list[FixtureSpec], *, pending_xfail: bool = False) -> list:
    """One pytest param per fixture; with `pending_xfail`, fixtures whose header names a defence the
    judge lacks (PENDING:) must fail (strict xfail), so a fixed judge with the key left in fails."""
    out = []
    for s in specs:
        marks = []
        if pending_xfail and s.pending:
            marks.append(pytest.mark.xfail(strict=True, reason=f"pending defence: {s.pending}"))
        if s.slow:
            marks.append(pytest.mark.slow)
        if s.device == "cuda":
            marks.append(pytest.mark.gpu)
            marks.append(pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device"))
        if s.name.startswith("triton_"):
            marks.append(pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                            reason="needs the triton extra (pip install -e '.[triton]')"))
        out.append(pytest.param(s, id=s.name, marks=marks))
    return out


@pytest.fixture(scope="module")
def evaluators(cache_dir):
    """One long-lived evaluator per (device, policy), as a search or a trainer keeps one: its warm
    workers start while the previous group is judged. Each group draws fresh secret inputs; each
    fixture in it has its own worker and verdict. The session's cache, so the device lock every
    other test's evaluator holds."""
    from kernelrl.judge.evaluator import EvalConfig, Evaluator
    from kernelrl.judge.timing.timer import TimingConfig

    made: dict[tuple[str, str], Evaluator] = {}

    def get(device: str, policy: str) -> Evaluator:
        if (device, policy) not in made:
            made[device, policy] = Evaluator(EvalConfig(device=device, policy=policy, timeout_s=TIMEOUT_S,
                                                        timing=TimingConfig(**TIMING), cache_dir=cache_dir))
        return made[device, policy]

    yield get
    for ev in made.values():
        ev.close()


def _runnable(spec: FixtureSpec) -> bool:
    """Whether this machine runs the fixture (its skip marks in `params` do not apply)."""
    if spec.device == "cuda" and not _cuda_available():
        return False
    return not (spec.name.startswith("triton_") and importlib.util.find_spec("triton") is None)


@pytest.fixture(scope="module")
def verdicts(request, evaluators):
    """judge(test, spec, policy, tmp_path): the fixture's result, judged in a group with the other
    fixtures of the same test, task, device, policy and canary-ness that this run selected
    (`GROUP_SIZE` at most, in the order pytest runs them), so each group is judged once, when its
    first member is asked; canary groups in a process of their own (`judge_with_canaries`)."""
    selected: dict[str, list[FixtureSpec]] = {}
    for item in request.session.items:
        if item.module is request.module and hasattr(item, "callspec") and "spec" in item.callspec.params:
            selected.setdefault(item.originalname, []).append(item.callspec.params["spec"])
    judged: dict[tuple[str, str], EvalResult] = {}

    def get(test: str, spec: FixtureSpec, policy: str, tmp_path: Path) -> EvalResult:
        if (test, spec.name) not in judged:
            mates = [s for s in selected.get(test, [spec])
                     if (s.task_file, s.device, s.canary) == (spec.task_file, spec.device, spec.canary) and _runnable(s)]
            mates = mates if any(s.name == spec.name for s in mates) else [spec]
            at = next(i for i, s in enumerate(mates) if s.name == spec.name)
            group = mates[at - at % GROUP_SIZE:][:GROUP_SIZE]
            if spec.canary:
                results = judge_with_canaries(group, policy, tmp_path)
            else:
                task = load_task_file(spec.task_file)
                results = evaluators(spec.device, policy).evaluate_batch(
                    [(task, Candidate(source=s.source, origin=str(s.path))) for s in group])
            judged.update({(test, s.name): r for s, r in zip(group, results, strict=True)})
        return judged[test, spec.name]

    return get


def judge(spec: FixtureSpec, policy: str, request, tmp_path: Path, verdicts) -> EvalResult:
    return verdicts(request.node.originalname, spec, policy, tmp_path)


def judge_with_canaries(group: list[FixtureSpec], policy: str, tmp_path: Path) -> list[EvalResult]:
    """The group judged in one batch by a judge process whose environment holds canary secrets."""
    canary = f"kernelrl-canary-{uuid.uuid4().hex}"
    env = dict(os.environ)
    env.update({"OPENAI_API_KEY": canary, "ANTHROPIC_API_KEY": canary, "HF_TOKEN": canary,
                "AWS_SECRET_ACCESS_KEY": canary, "KERNELRL_CANARY_SECRET": canary})
    out = tmp_path / "results.json"
    spec = group[0]
    proc = subprocess.run([sys.executable, "-c", _JUDGE_SCRIPT, str(spec.task_file), spec.device, policy, str(TIMEOUT_S),
                           str(out), json.dumps(TIMING), *(str(s.path) for s in group)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=TIMEOUT_S + 120)
    assert proc.returncode == 0 and out.is_file(), f"judge process failed:\n{proc.stderr[-3000:]}"
    return [EvalResult.from_dict(d) for d in json.loads(out.read_text())]


def describe(res: EvalResult) -> str:
    lines = [f"status={res.status.value} message={res.message!r} speedup={res.speedup} interval={res.speedup_ci} "
             f"noise_band={res.noise_band}"]
    lines += [f"  {f.severity.value} {f.stage} {f.rule}: {f.message}" for f in res.findings]
    lines += [e[-800:] for e in res.errors[:2]]
    return "\n".join(lines)


@pytest.mark.parametrize("spec", params(REDTEAM, pending_xfail=True))
def test_redteam_dynamic_defences_alone(spec, request, tmp_path, outcomes, verdicts):
    res = judge(spec, "observe", request, tmp_path, verdicts)
    rejecting = [f.rule for f in res.findings if f.severity is Severity.REJECT]
    rules = [f.rule for f in res.findings]
    ok = spec.matches(res.status.value, rejecting, rules)
    if ok and res.status.value == "correct" and spec.max_speedup is not None and res.speedup is not None:
        # what a forged report could win is a speedup the reward pays: one within noise pays as none
        ok = res.speedup < spec.max_speedup or within_noise(res)
    outcomes.setdefault("redteam-dynamic", {})[spec.name] = (res.status.value, sorted(set(rejecting)), ok)
    if spec.pending:
        outcomes.setdefault("pending", {})[spec.name] = spec.pending
    assert ok, (f"{spec.name}: expected {' | '.join(map(str, spec.expect))}"
                + (f" (speedup < {spec.max_speedup})" if spec.max_speedup else "") + f"\n{describe(res)}")


STATICALLY_REJECTED = [s for s in REDTEAM
                       if {f.rule for f in get_policy(s.policy).rejects(check_source(s.source))} & set(s.static_rules)]


@pytest.mark.parametrize("spec", params(STATICALLY_REJECTED))
def test_redteam_flagged_under_its_policy(spec, request, tmp_path, outcomes, verdicts):
    res = judge(spec, spec.policy, request, tmp_path, verdicts)
    rejecting = {f.rule for f in res.findings if f.severity is Severity.REJECT}
    ok = res.status.value == "flagged" and bool(rejecting & set(spec.static_rules))
    outcomes.setdefault("redteam-policy", {})[spec.name] = (res.status.value, sorted(rejecting), ok)
    assert ok, f"{spec.name}: expected flagged by one of {spec.static_rules} under {spec.policy}\n{describe(res)}"


@pytest.mark.parametrize("spec", params(CONTROLS))
def test_control_accepted_under_open(spec, request, tmp_path, outcomes, verdicts):
    res = judge(spec, "open", request, tmp_path, verdicts)
    rejecting = [f.rule for f in res.findings if f.severity is Severity.REJECT]
    ok = res.status.value == "correct" and not rejecting
    outcomes.setdefault("control", {})[spec.name] = (res.status.value, rejecting, ok)
    assert ok, f"{spec.name}: a legitimate optimisation must be accepted\n{describe(res)}"
