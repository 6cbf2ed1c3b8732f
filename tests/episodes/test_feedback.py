"""The verdict a model reads next turn: what to fix, never the judge's secrets, logs or paths."""

from __future__ import annotations

import pytest

from kernelrl.episodes.feedback import MAX_ERROR_LINES, feedback, verdict_line
from kernelrl.result import (
    Environment,
    EvalResult,
    Finding,
    RooflineRecord,
    Severity,
    Status,
    TimingStats,
)

TRACEBACK = """Traceback (most recent call last):
  File "/work/x/kernelrl/judge/harness/worker.py", line 600, in main
    answer, reply, payload = handler(state, header, msg.payload)
  File "/tmp/kernelrl-worker-9f/candidate.py", line 12, in forward
    y = self.fc(x).view(3, -1)
  File "/usr/lib/python3/site-packages/torch/nn/functional.py", line 99, in linear
    return torch._C._nn.linear(input, weight, bias)
RuntimeError: shape '[3, -1]' is invalid for input of size 1000"""
LOG = "printed by the program: tensor([0.1234, 0.5678]) seed=987654 error: see inputs"


def test_no_code():
    assert "no complete fenced code block" in feedback(None)


def test_a_compile_error_shows_the_compilers_first_errors_without_paths_or_commands():
    build = ("[1/2] c++ -MMD -c /root/.cache/kernelrl/builds/ab/main.cpp -o main.o\n"
             "/root/.cache/kernelrl/builds/ab/main.cpp:7:12: error: 'flaot' was not declared in this scope\n"
             + "\n".join(f"main.cpp:{i}:1: error: more {i}" for i in range(20))
             + "\nninja: build stopped: subcommand failed.")
    r = EvalResult(task="t", status=Status.COMPILE_ERROR, errors=[build, TRACEBACK, LOG],
                   message="candidate does not build: /root/.cache/kernelrl/builds/ab/main.cpp:7:12: error: 'flaot'")
    text = feedback(r)
    assert "main.cpp:7:12: error: 'flaot' was not declared" in text
    assert "/root" not in text and ".cache" not in text and "c++ -MMD" not in text and "ninja" not in text
    assert text.count("error:") <= MAX_ERROR_LINES + 1
    assert "seed" not in text and "0.1234" not in text  # the worker's log is never shown


def test_a_runtime_error_shows_the_programs_own_frames_and_the_exception():
    r = EvalResult(task="t", status=Status.RUNTIME_ERROR, message="candidate raised: RuntimeError: shape",
                   errors=["RuntimeError: shape", TRACEBACK, LOG])
    text = feedback(r)
    assert 'File "candidate.py", line 12, in forward' in text and "self.fc(x).view(3, -1)" in text
    assert "is invalid for input of size 1000" in text
    assert "worker.py" not in text and "functional.py" not in text and "/tmp" not in text
    assert "0.1234" not in text and "seed" not in text


def test_incorrect_names_the_first_mismatch_and_the_errors():
    r = EvalResult(task="t", status=Status.INCORRECT, max_abs_err=0.75, max_rel_err=2.0,
                   message="incorrect on input set 2 (scaled and shifted): output: 10 of 64 values outside tolerance",
                   errors=["output: 10 of 64 values outside tolerance", LOG])
    text = feedback(r)
    assert "input set 2 (scaled and shifted)" in text and "absolute 0.75" in text and "relative 2" in text
    assert "0.1234" not in text


def test_refused_names_each_rule():
    r = EvalResult(task="t", status=Status.FLAGGED, message="flagged: output_cached_across_calls",
                   findings=[Finding(rule="output_cached_across_calls", message="3 of 5 spot checks wrong"),
                             Finding(rule="rng_seeding", message="seeds the RNG", severity=Severity.WARN)])
    text = feedback(r)
    assert "output_cached_across_calls: " in text and "rng_seeding" not in text
    assert "3 of 5 spot checks" not in text  # what the defence measured is never shown
    assert verdict_line(r) == "refused (output_cached_across_calls)"


def test_correct_gives_the_speedup_with_intervals_against_eager_and_compile_and_the_roofline():
    r = EvalResult(task="t", status=Status.CORRECT, speedup=2.0, speedup_ci=(1.9, 2.1), roofline_pct=40.0,
                   ref_time=TimingStats(median_ms=2.0, mean_ms=2.0, min_ms=1.9, iqr_ms=0.1, n=20),
                   cand_time=TimingStats(median_ms=1.0, mean_ms=1.0, min_ms=0.9, iqr_ms=0.1, n=20),
                   environment=Environment(roofline=RooflineRecord(memory_floor_ms=0.4)))
    text = feedback(r, compile_speedup=1.25, compile_ci=(1.2, 1.3))
    assert "2.000x (95 % interval 1.900-2.100x)" in text
    assert "torch.compile of the reference: 1.600x (interval 1.462-1.750x)" in text
    assert "40.0 % of this machine's roofline" in text and "0.4 ms" in text
    assert "within the measurement's noise" not in text
    noisy = EvalResult(task="t", status=Status.CORRECT, speedup=1.02, speedup_ci=(0.97, 1.06))
    assert "within the measurement's noise" in feedback(noisy)


def test_timeout():
    r = EvalResult(task="t", status=Status.TIMEOUT, message="candidate did not finish within 20 s", errors=[LOG])
    assert feedback(r).startswith("Timed out: candidate did not finish within 20 s") and "0.1234" not in feedback(r)


# What the judge's messages and findings hold that must never reach a prompt: how far a program
# stood from each defence's threshold, the judge's draw of an input set's perturbation, the value
# a non-tensor output was expected to have, and the judge's own errors.
JUDGE_SECRETS = ("10 of 47", "round 4", "0.731", "0.41 ms", "x1.37", "+0.42", "424242", "Too many open files")


@pytest.mark.parametrize("result", [
    EvalResult(task="t", status=Status.FLAGGED, message="flagged: output_cached_across_calls",
               findings=[Finding(rule="output_cached_across_calls", message=(
                   "10 of 47 spot-checked timed calls returned a wrong output (cached or skipped work): round 4: "
                   "output: 3 of 65536 values outside tolerance (max abs err 101, atol 0.0001, rtol 0.0001)"))]),
    EvalResult(task="t", status=Status.FLAGGED, message="flagged: timer_mismatch, work_before_timed_call",
               findings=[Finding(rule="timer_mismatch", message=(
                   "reported call times disagree with the judge's clock (median excess 0.731 ms over the "
                   "reference's overhead, 0 calls reported longer than they took)")),
                   Finding(rule="work_before_timed_call", message=(
                       "the candidate's worker took 0.41 ms longer than the reference's to prepare each timed "
                       "sample (the reference: 0.50 ms): work done before the timer starts"))]),
    EvalResult(task="t", status=Status.INCORRECT, message=(
        "incorrect on input set 2 (scaled x1.37 and shifted +0.42 mean-abs): output 0 is 7, expected 424242")),
    EvalResult(task="t", status=Status.INCORRECT, message=(
        "incorrect on input set 2 (scaled x1.37 and shifted +0.42 mean-abs): a new format 424242")),
    EvalResult(task="t", status=Status.RUNTIME_ERROR, message=(
        "the judge could not run the candidate: OSError: [Errno 24] Too many open files: '/srv/pool'")),
], ids=["spot_checks", "clock_margins", "expected_value", "unknown_format", "judge_error"])
def test_nothing_a_defence_measured_or_the_judge_drew_reaches_the_text(result):
    for text in (feedback(result), verdict_line(result)):
        assert not [s for s in JUDGE_SECRETS if s in text], text


def test_the_incorrect_verdict_keeps_the_input_set_kind_and_the_mismatch():
    r = EvalResult(task="t", status=Status.INCORRECT, message=(
        "incorrect on input set 3 (scaled x0.61 and shifted -0.20 mean-abs): output 1 has shape (4, 8), expected (4, 16)"))
    assert "on input set 3 (scaled and shifted): output 1 has shape (4, 8), expected (4, 16)" in feedback(r)
