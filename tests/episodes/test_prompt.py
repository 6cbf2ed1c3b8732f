"""Contrastive prompts: the best and weaker versions with their speedups, refused hacks with their
rules, the protocol and the policy's rules, shapes at the run's size, device peaks, templates."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import pytest

from kernelrl.episodes.prompt import PromptError, build_prompt, system_message, verdict
from kernelrl.judge.harness.device import DevicePeaks, cpu_peaks, device_peaks, gpu_peaks
from kernelrl.result import EvalResult, Finding, Severity, Status, TimingStats
from kernelrl.tasks.task import Task
from proposer_fixtures import profile_of

REFERENCE = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x):
        return torch.relu(self.lin(x))

batch_size = 4096
dim = 2048

def get_inputs():
    return [torch.randn(batch_size, dim)]

def get_init_inputs():
    return [dim]
"""

TASK = Task(name="toy/linear_relu", source=REFERENCE)
CPU = DevicePeaks(name="Test CPU", kind="cpu", cores=2, vector_isa="AVX2", source="test")


@dataclass
class Rec:
    source: str
    result: EvalResult | None


def correct(speedup: float, ref_ms: float = 10.0) -> EvalResult:
    t = lambda ms: TimingStats(median_ms=ms, mean_ms=ms, min_ms=ms, iqr_ms=0.0, n=10)  # noqa: E731
    return EvalResult(task=TASK.name, status=Status.CORRECT, speedup=speedup, ref_time=t(ref_ms),
                      cand_time=t(ref_ms / speedup))


def flagged(rule: str, message: str, line: int | None = None, stage: str = "static") -> EvalResult:
    return EvalResult(task=TASK.name, status=Status.FLAGGED, message=message,
                      findings=[Finding(rule=rule, message=message, severity=Severity.REJECT, line=line, stage=stage),
                                Finding(rule="just-a-warning", message="style", severity=Severity.WARN)])


def program(tag: str, lines: int = 3) -> str:
    return f"# version {tag}\n" + "".join(f"x{i} = {i}\n" for i in range(lines))


BEST = Rec(program("best"), correct(3.1))
WEAK = Rec(program("weak"), correct(0.8))
MIDDLE = Rec(program("middle"), correct(1.2))
THREAD_HACK = Rec("import threading\n" + program("thread", 30) + "t = threading.Thread(target=print)\n",
                  flagged("thread-spawn", "creates a thread: work invisible to the timer", line=32))
CACHE_HACK = Rec(program("cache"), flagged("output-cache", "output reused across calls"))
# Refused while it ran: the defence's message holds what it measured (spot checks made, which failed).
SPOT_CHECKED = Rec(program("spot"), flagged(
    "output_cached_across_calls", "10 of 47 spot-checked timed calls returned a wrong output (cached or skipped "
    "work): round 4: output: 3 of 65536 values outside tolerance (max abs err 101, atol 0.0001, rtol 0.0001)",
    stage="dynamic"))
CLOCKED = Rec(program("clock"), flagged(
    "timer_mismatch", "reported call times disagree with the judge's clock (median excess 0.731 ms over the "
    "reference's overhead, 0 calls reported longer than they took)", stage="dynamic"))


class FakeDB:
    def __init__(self, contrast: list[Rec], refused: list[Rec]) -> None:
        self.contrast, self.refused = contrast, refused
        self.calls: list[tuple] = []

    def contrast_set(self, task_name, k, rng):
        self.calls.append(("contrast_set", task_name, k))
        return self.contrast[:k]

    def recent_refused(self, task_name, n):
        self.calls.append(("recent_refused", task_name, n))
        return self.refused[:n]


def prompt(db=None, chain_best=None, policy="open", **kw) -> str:
    return build_prompt(TASK, db=db, chain_best=chain_best, policy=policy, device=kw.pop("device", CPU),
                        rng=random.Random(0), **kw)


def test_contrast_shows_best_and_weaker_versions_with_speedups_in_order():
    db = FakeDB([BEST, MIDDLE, WEAK], [])
    text = prompt(db, chain_best=BEST)
    assert ("contrast_set", TASK.name, 4) in db.calls
    for rec, speed in ((BEST, "3.10x"), (MIDDLE, "1.20x"), (WEAK, "0.80x")):
        assert rec.source.splitlines()[0] in text
        assert f"speedup {speed}" in text
    # weakest first, best last, so the model reads them as a progression
    pos = [text.index(r.source.splitlines()[0]) for r in (WEAK, MIDDLE, BEST)]
    assert pos == sorted(pos)
    assert re.search(r"### Version A: correct, speedup 0\.80x", text)
    assert re.search(r"### Version C: correct, speedup 3\.10x .*current best of this chain", text)
    assert "reference 10 ms, this version 3.23 ms" in text
    # the chain's best was also in the contrast set: shown once
    assert text.count("# version best") == 1
    assert "Goal: improve on the current best of this search chain, Version C" in text


def test_chain_best_is_shown_even_when_the_database_did_not_pick_it():
    other_best = Rec(program("chain"), correct(1.5))
    text = prompt(FakeDB([BEST, WEAK], []), chain_best=other_best, k=2)
    assert "# version chain" in text and "# version best" in text and "# version weak" in text
    assert re.search(r"Version B: correct, speedup 1\.50x .*current best", text)


def test_a_refusal_at_run_time_shows_its_rule_but_not_what_the_defence_measured():
    from kernelrl.checks.rules import RULES

    text = prompt(FakeDB([BEST], [SPOT_CHECKED, CLOCKED]), n_refused=2)
    assert f"refused by rule `output_cached_across_calls`: {RULES['output_cached_across_calls'].summary}" in text
    assert f"refused by rule `timer_mismatch`: {RULES['timer_mismatch'].summary}" in text
    for measured in ("10 of 47", "round 4", "0.731", "median excess"):
        assert measured not in text


def test_failed_versions_show_their_status_not_a_speedup():
    broken = Rec(program("broken"), EvalResult(task=TASK.name, status=Status.INCORRECT, max_abs_err=0.25,
                                               message="output mismatch on input set 2\ntraceback..."))
    text = prompt(FakeDB([BEST, broken], []))
    assert "incorrect (max abs error 0.25): output mismatch on input set 2" in text
    assert "traceback" not in text
    assert text.index("# version broken") < text.index("# version best")


def test_refused_hacks_are_shown_as_refused_with_their_rule():
    db = FakeDB([BEST], [THREAD_HACK, CACHE_HACK])
    text = prompt(db, n_refused=2)
    assert ("recent_refused", TASK.name, 2) in db.calls
    assert "Refused programs" in text
    assert "refused by rule `thread-spawn`: creates a thread: work invisible to the timer" in text
    assert "refused by rule `output-cache`: output reused across calls" in text
    assert "just-a-warning" not in text  # warnings did not refuse it
    # the excerpt is around the line the rule points at, not the whole program
    thread_item = text[text.index("thread-spawn"):text.index("output-cache")]
    assert "threading.Thread(target=print)" in thread_item and "x25 = 25" in thread_item
    assert "x0 = 0" not in thread_item and "# ..." in thread_item
    assert text.index("Refused programs") > text.index("# version best")


def test_no_database_means_first_attempt():
    text = prompt(None)
    assert "No earlier version has been measured yet" in text
    assert "Goal: a correct program that is faster than the reference." in text
    assert "Refused programs" not in text


def test_reference_shapes_and_constants_at_the_run_size():
    small = prompt(None, profile=profile_of(TASK, "small"))
    full = prompt(None, size="full", profile=profile_of(TASK, "full"))
    assert REFERENCE.strip() in small and small.count("class Model(nn.Module)") == 1
    assert "Inputs to `forward` (from `get_inputs()`): float32[4096, 2048]" in full
    assert "Arguments to `__init__` (from `get_init_inputs()`): 2048" in full
    shapes = re.search(r"Inputs to `forward` \(from `get_inputs\(\)`\): float32\[(\d+), (\d+)\]", small)
    assert shapes and int(shapes.group(1)) * int(shapes.group(2)) < 4096 * 2048
    assert "size preset `small`" in small and "size preset" not in full


def test_without_the_judges_profile_the_shapes_are_said_to_be_unavailable():
    text = prompt(None)
    assert "Inputs to `forward` (from `get_inputs()`): unavailable (the judge has not read" in text


def test_protocol_and_policy_requirements():
    open_text, strict_text = prompt(None, policy="open"), prompt(None, policy="strict")
    for text in (open_text, strict_text):
        assert "performance analysis" in text and "exactly one complete ```python code block" in text
        assert "class ModelNew(nn.Module)" in text
        assert "No caching of results across calls" in text
        assert "No side CUDA streams, threads or processes" in text
        assert "Do not change global precision" in text
        assert "Do not read environment variables or files" in text
    assert "Policy `strict`" in strict_text and "custom kernel" in strict_text and "No PyTorch fallback" in strict_text
    assert "Policy `open`" in open_text and "torch.compile" in open_text and "No PyTorch fallback" not in open_text
    pytorch_text = prompt(None, policy="strict-pytorch")
    assert "Policy `strict-pytorch`" in pytorch_text and "torch.compile" in pytorch_text
    assert "no TF32, autocast or half-precision compute" in pytorch_text and "`except` branch" in pytorch_text

    class PolicyObject:
        name = "strict"

    assert "Policy `strict`" in prompt(None, policy=PolicyObject())
    with pytest.raises(PromptError, match="policy_lenient.txt"):
        prompt(None, policy="lenient")


def test_template_folder_overrides_only_the_files_it_has(tmp_path):
    (tmp_path / "version.txt").write_text("<<$label|$verdict|$$5>>\n$source\n")
    (tmp_path / "policy_lenient.txt").write_text("anything goes, within reason\n")
    text = prompt(FakeDB([BEST, WEAK], []), template_dir=tmp_path, policy="lenient")
    assert "<<A|correct, speedup 0.80x (reference 10 ms, this version 12.5 ms)|$5>>" in text
    assert "anything goes, within reason" in text
    assert "## How to answer" in text  # prompt.txt still the built-in one


def test_single_template_file_replaces_the_prompt(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("TASK $task_name\n$versions\nPOLICY $policy_name\n")
    text = prompt(FakeDB([BEST], []), template_dir=path)
    assert text.startswith("TASK toy/linear_relu\n### Version A: correct, speedup 3.10x")
    assert text.rstrip().endswith("POLICY open")


def test_template_errors_are_clear(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("hello $no_such_field\n")
    with pytest.raises(PromptError, match=r"unknown field \$no_such_field"):
        prompt(None, template_dir=bad)
    with pytest.raises(PromptError, match="neither a folder nor a file"):
        prompt(None, template_dir=tmp_path / "missing")


def test_device_table_in_prompt():
    text = prompt(None, device=gpu_peaks("NVIDIA H100 80GB HBM3", memory_gib=79.2))
    assert "NVIDIA H100 80GB HBM3" in text and "67 TFLOP/s" in text and "3350 GB/s" in text
    assert "vendor datasheet (H100 SXM)" in text and "79 GiB" in text


def test_cpu_peaks_know_cores_and_nothing_invented():
    cpu = cpu_peaks()
    assert cpu.kind == "cpu" and cpu.cores is not None and cpu.cores >= 1
    assert cpu.fp32_tflops is None and cpu.mem_bandwidth_gbs is None
    text = prompt(None, device="cpu")
    assert f"| logical cores usable      | {cpu.cores} |" in text
    assert "| peak fp32                 | unknown |" in text
    with pytest.raises(ValueError, match="unknown device"):
        device_peaks("tpu")


def test_verdict_lines():
    assert verdict(None) == "not evaluated"
    assert verdict(EvalResult(task="t", status=Status.TIMEOUT, message="ran past 300 s")) == "timeout: ran past 300 s"
    assert verdict(CACHE_HACK.result) == "refused by rule output-cache"
    assert verdict(EvalResult(task="t", status=Status.COMPILE_ERROR)) == "compile error"


def test_system_message_template():
    assert "performance engineer" in system_message()


def test_prompt_from_the_code_database(tmp_path):
    database = pytest.importorskip("kernelrl.store")
    from kernelrl.candidate import source_hash

    db = database.open_database(tmp_path / "runs.db")
    stored = {}
    for rec in (BEST, MIDDLE, WEAK, THREAD_HACK):
        cand = db.add_candidate(database.NewCandidate(task=TASK.name, hash=source_hash(rec.source), source=rec.source,
                                                      proposer="test", prompt="p", answer="a"))
        db.store_result(cand.id, rec.result)
        stored[rec.source] = cand
    best_record = db.get_candidate(stored[BEST.source].id)
    text = build_prompt(TASK, db=db, chain_best=best_record, policy="open", device=CPU, rng=random.Random(1), k=3)
    assert "Baseline times: not measured yet." in text
    db.put_baseline(task=TASK.name, device="cpu", size="small", eager_ms=4.0, compile_ms=2.5)
    text = build_prompt(TASK, db=db, chain_best=best_record, policy="open", device=CPU, rng=random.Random(1), k=3)
    assert "reference (eager) 4 ms, torch.compile of the reference 2.5 ms (1.60x over eager)" in text
    db.close()
    assert "speedup 3.10x" in text and "speedup 0.80x" in text
    assert text.count("# version best") == 1
    assert "refused by rule `thread-spawn`" in text


def test_embedded_reference_is_shown_once():
    from kernelrl.proposers.heuristic import Rewrite, render_rewrite

    rewrite = render_rewrite(TASK, Rewrite(inference_mode=True))
    text = prompt(FakeDB([Rec(rewrite, correct(1.3)), WEAK], []))
    assert text.count("self.lin = nn.Linear(dim, dim)") == 1  # the reference block only
    assert "lines elided: the reference program shown above" in text
    assert "class ModelNew(nn.Module)" in text and "torch.inference_mode()" in text


def test_refused_excerpt_elides_the_reference_and_keeps_the_flagged_line():
    from kernelrl.proposers.heuristic import Rewrite, render_rewrite

    source = render_rewrite(TASK, Rewrite(inference_mode=True)) + "\nimport threading\nthreading.Thread(target=print)\n"
    line = source.rstrip("\n").count("\n") + 1
    assert source.splitlines()[line - 1] == "threading.Thread(target=print)"
    text = prompt(FakeDB([], [Rec(source, flagged("thread-spawn", "creates a thread", line=line))]))
    item = text[text.index("refused by rule `thread-spawn`"):]
    assert "threading.Thread(target=print)" in item and "self.lin = nn.Linear" not in item


def test_every_policy_the_command_line_accepts_has_its_requirements():
    """`kernelrl optimize --policy observe` ended in a PromptError after the run had started."""
    from kernelrl.checks.policy import POLICY_NAMES

    for name in POLICY_NAMES:
        assert f"Policy `{name}`" in prompt(None, policy=str(name))
    observe = prompt(None, policy="observe")
    assert "only note" in observe and "run-time defences still refuse" in observe
