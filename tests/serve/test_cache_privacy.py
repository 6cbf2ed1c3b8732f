"""One client's results are not another's: the evaluator's result cache is keyed per client
(`kernelrl.serve.dispatch.ClientCandidate`), tested with the real evaluator as a second client
would probe it: the same program, sent after the first client's, is judged anew (its own timings,
its own evaluation time), while the first client's own repeat is still answered from the cache."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from serve_helpers import TINY_CORRECT, fast_client

from kernelrl.candidate import source_hash

ALICE = "alice-token-" + "a" * 32
BOB = "bob-token-" + "b" * 32


def test_another_clients_program_is_judged_anew(start_server, tmp_path: Path, tiny_task, cache_dir) -> None:
    from kernelrl.judge.evaluator import EvalConfig
    from kernelrl.judge.timing.timer import TimingConfig

    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    tokens.chmod(0o600)
    timing = TimingConfig(min_rounds=5, max_rounds=40, max_timing_s=2.0, warmup_calls=2, min_spot_checks=2)
    srv = start_server(None, token_file=tokens, eval=EvalConfig(cache_dir=cache_dir, timeout_s=120, timing=timing))
    evaluator = srv.backend.lanes[0].evaluator()
    program = TINY_CORRECT + "\n# privacy probe\n"
    alice = fast_client(srv.url, token=ALICE, wait_s=10.0)
    bob = fast_client(srv.url, token=BOB, wait_s=10.0)
    first = alice.evaluate_batch([(tiny_task, program)])[0]
    judged = evaluator.evaluations
    again = alice.evaluate_batch([(tiny_task, program)])[0]
    assert evaluator.evaluations == judged  # the same client's repeat: from its own cache entry
    assert again.environment.cached and not first.environment.cached  # and it says so
    assert dataclasses.replace(again, environment=first.environment).to_dict() == first.to_dict()
    other = bob.evaluate_batch([(tiny_task, program)])[0]
    assert evaluator.evaluations == judged + 1  # the other client's: judged again
    assert other.status == first.status and other.candidate_hash == first.candidate_hash == source_hash(program)
    assert other.cand_time is not None and first.cand_time is not None
    assert other.cand_time != first.cand_time and other.eval_time_s != first.eval_time_s
