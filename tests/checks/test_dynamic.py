"""The dynamic defences as pure functions: facts in, findings out (no process is started)."""

from __future__ import annotations

import ast
from pathlib import Path

import kernelrl.checks.dynamic as D
from kernelrl.checks import rules as R


def member(times, round_trips, *, idle=0.0, warm=4, peak=4, non_plain=0, prepare=None) -> D.MemberTiming:
    return D.MemberTiming(times_ms=times, round_trips_ms=round_trips, idle_cpu_ms=idle, busy_ms=sum(times),
                          threads_warm=warm, threads_max=peak, non_plain_calls=non_plain,
                          prepare_ms=prepare if prepare is not None else [8.0] * len(times))


HONEST = member([1.0] * 20, [1.2] * 20)


def rules(findings) -> set[str]:
    return {f.rule for f in findings}


def test_every_rule_the_module_emits_is_a_known_dynamic_rule():
    tree = ast.parse(Path(D.__file__).read_text())
    emitted = {node.attr for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "R"}
    assert emitted, "no rule constants found in kernelrl.checks.dynamic"
    names = {getattr(R, a) for a in emitted if isinstance(getattr(R, a), str)}
    assert names <= set(R.DYNAMIC_RULES), names - set(R.DYNAMIC_RULES)


def test_global_state_change_is_reported_but_grad_mode_is_the_harness():
    assert D.global_state_changed("load", {"num_threads": 2, "grad_enabled": True},
                                  {"num_threads": 2, "grad_enabled": False}) == []
    (f,) = D.global_state_changed("run", {"num_threads": 2}, {"num_threads": 8})
    assert f.rule == R.GLOBAL_STATE_CHANGED and "num_threads: 2 -> 8" in f.message


def test_precision_settings_are_judged_apart_from_other_state():
    before = {"num_threads": 2, "cuda_matmul_allow_tf32": False, "float32_matmul_precision": "highest"}
    after = {"num_threads": 4, "cuda_matmul_allow_tf32": True, "float32_matmul_precision": "high"}
    found = {f.rule: f.message for f in D.global_state_changed("load", before, after)}
    assert set(found) == {R.PRECISION_STATE_CHANGED, R.GLOBAL_STATE_CHANGED}
    assert "allow_tf32" in found[R.PRECISION_STATE_CHANGED] and "num_threads" not in found[R.PRECISION_STATE_CHANGED]


def test_backend_settings_are_judged_apart_from_threads_and_the_default_dtype():
    before = {"num_threads": 2, "default_dtype": "torch.float32", "cudnn_benchmark": False, "mkldnn_enabled": True}
    after = {"num_threads": 2, "default_dtype": "torch.float16", "cudnn_benchmark": True, "mkldnn_enabled": False}
    found = {f.rule: f.message for f in D.global_state_changed("load", before, after)}
    assert set(found) == {R.BACKEND_STATE_CHANGED, R.GLOBAL_STATE_CHANGED}
    assert "cudnn_benchmark: False -> True" in found[R.BACKEND_STATE_CHANGED]
    assert "mkldnn_enabled" in found[R.BACKEND_STATE_CHANGED] and "default_dtype" not in found[R.BACKEND_STATE_CHANGED]
    assert "default_dtype" in found[R.GLOBAL_STATE_CHANGED] and "cudnn" not in found[R.GLOBAL_STATE_CHANGED]


def test_side_work_in_calls_ignores_the_first_calls_pool():
    assert D.side_work_in_calls([False, False], [3, 0], [2, 0]) is None
    assert D.side_work_in_calls([False, True], [0, 0], [0, 0]).rule == R.SIDE_WORK_AFTER_RETURN
    assert "new threads" in D.side_work_in_calls([False, False, False], [0, 1, 0], [0, 0, 0]).message


def test_side_work_in_calls_counts_a_process_started_by_a_later_call():
    found = D.side_work_in_calls([False, False, False], [0, 0, 0], [0, 0, 1])
    assert found is not None and "new child processes" in found.message


def test_idle_census():
    assert D.side_work_when_idle(2.0, 0, window_ms=50) is None
    assert "child process" in D.side_work_when_idle(0.0, 1, window_ms=50).message
    assert "40 ms of CPU" in D.side_work_when_idle(40.0, 0, window_ms=50).message


def test_wrong_on_moved_inputs_tells_a_cache_from_a_near_constant_answer():
    cached = D.wrong_on_moved_inputs(set_label="2", reason="r", plain_sets_right=True, same_as_first=True,
                                     constant=False)
    assert cached.rule == R.OUTPUT_CACHED_ACROSS_CALLS
    near_constant = D.wrong_on_moved_inputs(set_label="2", reason="r", plain_sets_right=True, same_as_first=True,
                                            constant=True)
    assert near_constant.rule == R.DEGENERATE_UNDER_OFFSET_SCALE
    assert D.wrong_on_moved_inputs(set_label="2", reason="r", plain_sets_right=False, same_as_first=False,
                                   constant=False) is None


def test_a_near_miss_on_moved_inputs_is_too_little_precision_not_a_degenerate_answer():
    assert D.wrong_on_moved_inputs(set_label="1", reason="r", plain_sets_right=True, same_as_first=False,
                                   constant=False, near=True) is None
    assert D.wrong_on_moved_inputs(set_label="1", reason="r", plain_sets_right=True, same_as_first=False,
                                   constant=False, near=False).rule == R.DEGENERATE_UNDER_OFFSET_SCALE
    # an output exactly an earlier set's is kept from before, however close it happens to be
    assert D.wrong_on_moved_inputs(set_label="1", reason="r", plain_sets_right=True, same_as_first=True,
                                   constant=False, near=True).rule == R.OUTPUT_CACHED_ACROSS_CALLS


def test_degenerate_task_needs_reasons():
    assert D.degenerate_task([]) is None
    assert D.degenerate_task(["zeros"]).rule == R.DEGENERATE_TASK


def test_honest_timing_raises_nothing():
    found, figures = D.timing_findings(D.TimingFacts(candidate=HONEST, reference=HONEST, spot_checks=3))
    assert found == [] and figures.clock_excess_ms == 0.0


def test_work_while_idle_is_side_work():
    busy = member([1.0] * 20, [1.2] * 20, idle=500.0)
    found, _ = D.timing_findings(D.TimingFacts(candidate=busy, reference=HONEST, spot_checks=3))
    assert rules(found) == {R.SIDE_WORK_AFTER_RETURN}


def test_threads_rising_beyond_the_references():
    grew = member([1.0] * 20, [1.2] * 20, warm=4, peak=9)
    found, _ = D.timing_findings(D.TimingFacts(candidate=grew, reference=HONEST, spot_checks=3))
    assert rules(found) == {R.THREAD_COUNT_CHANGED}


def test_spot_check_mismatches_inputs_and_non_plain_outputs():
    odd = member([1.0] * 20, [1.2] * 20, non_plain=2)
    found, _ = D.timing_findings(D.TimingFacts(candidate=odd, reference=HONEST, spot_checks=4,
                                               spot_mismatches=["round 3: differs"], input_mismatches=1))
    assert rules(found) == {R.OUTPUT_NOT_PLAIN_TENSOR, R.OUTPUT_CACHED_ACROSS_CALLS, R.INPUTS_MUTATED}


def test_reported_times_shorter_than_the_judges_clock():
    # the candidate says 0.1 ms, the judge saw 5 ms go by each time: a patched timer
    liar = member([0.1] * 20, [5.0] * 20)
    found, figures = D.timing_findings(D.TimingFacts(candidate=liar, reference=HONEST, spot_checks=3))
    assert rules(found) == {R.TIMER_MISMATCH} and figures.clock_excess_ms > 4
    # reporting longer than it took is impossible too
    slow_liar = member([2.0] * 20, [1.0] * 20)
    assert rules(D.timing_findings(D.TimingFacts(candidate=slow_liar, reference=HONEST, spot_checks=3))[0]) == {
        R.TIMER_MISMATCH}


def test_a_stopped_clock_is_a_timer_mismatch_even_when_the_references_overhead_is_noisy():
    # the reference's overhead spreads over 3 ms (a loaded machine): 3 x IQR hides a 0.3 ms call
    noisy = member([1.0] * 20, [1.0 + 3.0 * (i % 4) / 3 for i in range(20)])
    honest = member([0.3] * 20, [0.6] * 20)
    assert R.TIMER_MISMATCH not in rules(D.timing_findings(D.TimingFacts(candidate=honest, reference=noisy,
                                                                         spot_checks=3))[0])
    stopped = member([0.0] * 20, [0.6] * 20)
    found, _ = D.timing_findings(D.TimingFacts(candidate=stopped, reference=noisy, spot_checks=3))
    assert rules(found) == {R.TIMER_MISMATCH} and "20 reported as taking no time" in found[0].message


def test_a_reference_whose_exchange_runs_fast_flags_no_candidate_its_twin_matches():
    # the reference's worker answers 0.5 ms faster than its twin's and the candidate's, every sample
    fast_ref = member([1.0] * 30, [1.05] * 30)
    twin = member([1.0] * 30, [1.55] * 30)
    honest = member([0.8] * 30, [1.35] * 30)
    assert rules(D.timing_findings(D.TimingFacts(candidate=honest, reference=fast_ref, spot_checks=3))[0]) == {
        R.TIMER_MISMATCH}  # without the twin, the overhead looks forged
    assert D.timing_findings(D.TimingFacts(candidate=honest, reference=fast_ref, twin=twin, spot_checks=3))[0] == []
    # a report shrunk past both trusted copies is still a timer mismatch
    liar = member([0.4] * 30, [1.35] * 30)
    assert rules(D.timing_findings(D.TimingFacts(candidate=liar, reference=fast_ref, twin=twin, spot_checks=3))[0]) == {
        R.TIMER_MISMATCH}


def test_a_shrunk_clock_is_seen_through_overhead_noise_that_hides_the_call_from_the_spread_test():
    # the reference's overhead spreads over 0.7 ms (IQR ~0.4); each call takes 0.3 ms: 3 x IQR hides
    # it whole, but over 80 samples a 0.3 ms excess is over 5 standard errors of a median's difference
    spread = [0.1 * (i % 8) for i in range(80)]
    noisy = member([1.0] * 80, [1.0 + x for x in spread])
    honest = member([0.3] * 80, [0.3 + x for x in spread])
    assert R.TIMER_MISMATCH not in rules(D.timing_findings(D.TimingFacts(candidate=honest, reference=noisy,
                                                                         spot_checks=3))[0])
    divided = member([0.3 / 50] * 80, [0.3 + x for x in spread])
    assert rules(D.timing_findings(D.TimingFacts(candidate=divided, reference=noisy, spot_checks=3))[0]) == {
        R.TIMER_MISMATCH}
    # with 5 samples the same excess is within the noise: not refused on the spread alone
    few = member([0.3 / 50] * 5, [0.3 + x for x in spread[:5]])
    assert D.timing_findings(D.TimingFacts(candidate=few, reference=member([1.0] * 5, [1.0 + x for x in spread[:5]]),
                                           spot_checks=3))[0] == []
    # a call that reports most of what the judge saw is not shrunk, however many samples
    most = member([0.25] * 80, [0.3 + x for x in spread])
    assert D.timing_findings(D.TimingFacts(candidate=most, reference=noisy, spot_checks=3))[0] == []


def test_a_longer_preparation_than_the_references_is_work_before_the_timer():
    # the reference prepares each sample in 8 ms; the candidate takes 14: outputs made ahead
    ahead = member([1.0] * 20, [1.2] * 20, prepare=[14.0] * 20)
    found, figures = D.timing_findings(D.TimingFacts(candidate=ahead, reference=HONEST, spot_checks=3))
    assert rules(found) == {R.WORK_BEFORE_TIMED_CALL} and figures.prepare_excess_ms == 6.0
    # a process a little slower at the same harness work is not refused
    slower = member([1.0] * 20, [1.2] * 20, prepare=[9.5] * 20)
    assert D.timing_findings(D.TimingFacts(candidate=slower, reference=HONEST, spot_checks=3))[0] == []


def test_work_before_the_timer_is_seen_through_load_that_moves_every_member_alike():
    # the machine's load swings the harness's preparation between 6 and 12 ms from round to round,
    # for every member of a round alike; the candidate adds 2.5 ms of its own every round
    load = [6.0 + 6.0 * ((i * 7) % 10) / 10 for i in range(40)]
    ref = member([1.0] * 40, [1.2] * 40, prepare=load)
    twin = member([1.0] * 40, [1.2] * 40, prepare=[x + 0.1 for x in load])
    ahead = member([1.0] * 40, [1.2] * 40, prepare=[x + 2.5 for x in load])
    found, figures = D.timing_findings(D.TimingFacts(candidate=ahead, reference=ref, twin=twin, spot_checks=3))
    assert rules(found) == {R.WORK_BEFORE_TIMED_CALL} and abs(figures.prepare_excess_ms - 2.4) < 1e-9
    honest = member([1.0] * 40, [1.2] * 40, prepare=[x + 0.3 for x in load])
    assert D.timing_findings(D.TimingFacts(candidate=honest, reference=ref, twin=twin, spot_checks=3))[0] == []


def test_a_reference_process_that_runs_fast_refuses_no_one_its_twin_matches():
    # the reference's process prepares 2 ms faster than its A/A twin and the candidate, for its life
    ref = member([1.0] * 30, [1.2] * 30, prepare=[6.0 + 0.01 * (i % 5) for i in range(30)])
    twin = member([1.0] * 30, [1.2] * 30, prepare=[8.0 + 0.01 * (i % 3) for i in range(30)])
    cand = member([1.0] * 30, [1.2] * 30, prepare=[8.2] * 30)
    assert D.timing_findings(D.TimingFacts(candidate=cand, reference=ref, spot_checks=3))[0] != []  # no twin: refused
    assert D.timing_findings(D.TimingFacts(candidate=cand, reference=ref, twin=twin, spot_checks=3))[0] == []
    # past both trusted copies by more than the slack, it is found
    ahead = member([1.0] * 30, [1.2] * 30, prepare=[10.5] * 30)
    found, figures = D.timing_findings(D.TimingFacts(candidate=ahead, reference=ref, twin=twin, spot_checks=3))
    assert rules(found) == {R.WORK_BEFORE_TIMED_CALL} and 2.4 < figures.prepare_excess_ms < 2.6


def test_floors_and_impossible_speedup_name_both_floors():
    floors = D.Floors(memory_ms=1.0, compute_ms=2.0, bandwidth_gbs=10.0, tflops=0.05)
    assert floors.floor_ms == 2.0
    assert D.impossible_speedup(1.5, floors) is None  # within the slack
    f = D.impossible_speedup(0.4, floors)  # below half of the memory floor: nothing can do that
    assert f.rule == R.IMPOSSIBLE_SPEEDUP
    assert "memory floor 1.0000 ms at 10.0 GB/s" in f.message and "compute floor 2.0000 ms" in f.message
    assert D.impossible_speedup(0.001, D.Floors(memory_ms=None, compute_ms=None)) is None


def test_beating_only_the_compute_floor_is_what_a_cheaper_algorithm_does():
    floors = D.Floors(memory_ms=1.0, compute_ms=4.0)
    f = D.impossible_speedup(0.9, floors)
    assert f.rule == R.COMPUTE_FLOOR_BEATEN and R.DYNAMIC_RULES[f.rule].severity.value == "warn"


def test_sizes_a_candidate_sets_are_reported_not_used():
    assert D.constants_overridden({}) is None
    f = D.constants_overridden({"batch_size": [8, 64]})
    assert f.rule == R.INIT_OR_SHAPE_TAMPERED and "batch_size=8 (the task's: 64)" in f.message
    assert f.severity.value == "warn"


def test_an_output_not_committed_to_at_return_is_deferred_work():
    from kernelrl.checks.dynamic import output_deferred

    assert output_deferred(0, 5) is None
    found = output_deferred(2, 5)
    assert found is not None and found.rule == "output_deferred" and "2 of 5" in found.message
