"""`RunMeta`: a candidate's place in its run, typed, and stored in the layout earlier files have."""

from __future__ import annotations

import json

from kernelrl.store.records import RunMeta, RunStage


def test_a_meta_written_and_read_back_is_the_same():
    meta = RunMeta(stage=RunStage.GRPO, step=3, rank=1, group=0, kept=True, raw=0.7, reward=0.5, clipped=True,
                   band=(-0.2, 0.6), within_noise=False, copy=False, turn=2, turns=3, episode=4,
                   proposer={"model": "m", "attempts": 2})
    assert RunMeta.from_dict(json.loads(json.dumps(meta.to_dict()))) == meta


def test_the_stored_layout_is_one_flat_object_with_the_proposers_keys():
    # what rows have always held, so a database written before reads the same
    stored = {"model": "m", "stage": "rft", "round": 1, "rank": 0}
    meta = RunMeta.from_dict(stored)
    assert (meta.stage, meta.round, meta.rank, meta.proposer) == (RunStage.RFT, 1, 0, {"model": "m"})
    assert meta.to_dict() == stored


def test_a_value_of_the_wrong_type_is_read_as_unset_not_trusted():
    meta = RunMeta.from_dict({"turn": "2", "step": True, "kept": 1, "reward": "high", "band": [1], "stage": "nope"})
    assert meta == RunMeta()


def test_merged_takes_the_other_metas_set_fields_and_adds_its_proposer_keys():
    base = RunMeta(stage=RunStage.GRPO, step=1, proposer={"a": 1})
    merged = base.merged(RunMeta(turn=2, episode=5, proposer={"b": 2}))
    assert merged == RunMeta(stage=RunStage.GRPO, step=1, turn=2, episode=5, proposer={"a": 1, "b": 2})
    assert base.merged(RunMeta()) == base
