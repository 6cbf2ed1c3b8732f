"""Replay proposer: JSONL files and folders of programs."""

from __future__ import annotations

import json

import pytest

from kernelrl.proposers import Exhausted, ProposerError, make_proposer
from kernelrl.proposers.replay import ReplayProposer
from proposer_fixtures import make_task, request

# ---------------------------------------------------------------------------------------------
# replay:PATH


def test_replay_jsonl_yields_rows_per_task_in_order(tmp_path):
    path = tmp_path / "gen.jsonl"
    rows = [
        {"task": "toy/linear", "code": "class ModelNew: pass  # first\n"},
        {"task": "other/task", "code": "class ModelNew: pass  # other\n"},
        {"task": "linear", "answer": "why\n```python\nclass ModelNew: pass  # second\n```\n", "prompt_tokens": 9},
        {"task": "toy/linear", "answer": "no code here"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    proposer = make_proposer(f"replay:{path}")
    assert isinstance(proposer, ReplayProposer)
    assert proposer.task_names == ["toy/linear", "other/task", "linear"]
    task = make_task()
    assert proposer.remaining("toy/linear") == 3
    got = [proposer.propose(request(task)) for _ in range(3)]
    assert "# first" in got[0].code and "```python" in got[0].answer
    assert "# second" in got[1].code and got[1].prompt_tokens == 9
    assert got[2].code is None and got[2].answer == "no code here"
    with pytest.raises(Exhausted):
        proposer.propose(request(task))
    assert "# other" in proposer.propose(request(make_task("other/task"))).code


def test_replay_jsonl_bad_rows_are_clear_errors(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"task": "a", "code": "x"}\n{not json}\n')
    with pytest.raises(ProposerError, match=r"bad.jsonl:2 is not JSON"):
        make_proposer(f"replay:{path}")
    path.write_text('{"code": "x"}\n')
    with pytest.raises(ProposerError, match="task"):
        make_proposer(f"replay:{path}")


def test_replay_folder_names_tasks_by_header_or_path(tmp_path):
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "matmul.py").write_text("class ModelNew: pass  # a\n")
    (tmp_path / "level1" / "matmul__2.py").write_text("class ModelNew: pass  # b\n")
    (tmp_path / "level1" / "matmul__10.py").write_text("class ModelNew: pass  # c\n")
    (tmp_path / "whatever.py").write_text("# generated\n# task: level1/matmul\nclass ModelNew: pass  # d\n")
    (tmp_path / "conv.py").write_text("class ModelNew: pass  # e\n")
    proposer = make_proposer(f"replay:{tmp_path}")
    task = make_task("level1/matmul")
    codes = []
    while True:
        try:
            codes.append(proposer.propose(request(task)).code)
        except Exhausted:
            break
    assert [c.split("# ")[-1].strip() for c in codes] == ["a", "b", "c", "d"]
    assert "# e" in proposer.propose(request(make_task("level2/conv"))).code
