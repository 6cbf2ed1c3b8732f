"""The SFT set on disk: JSONL and a datasets.Dataset, read back, errors naming the line."""

from __future__ import annotations

import pytest

from kernelrl.train.sft_set import (
    SFTRow,
    SFTSetError,
    dataset_dir,
    read_sft_set,
    unique_rows,
    write_sft_set,
)


def test_round_trip_and_dataset(tmp_path):
    from datasets import load_from_disk

    rows = [SFTRow(task="a", prompt="p", answer="x", verdict="correct", speedup=1.5, proposer="heuristic",
                   candidate_id=3),
            SFTRow(task="b", prompt="q", answer="y", verdict="correct", speedup=None, proposer="openai:m")]
    path = write_sft_set(tmp_path / "sft.jsonl", rows)
    assert read_sft_set(path) == rows
    ds = load_from_disk(str(dataset_dir(path)))
    assert ds.column_names == ["task", "prompt", "answer", "verdict", "speedup", "proposer", "candidate_id"]
    assert ds[0]["speedup"] == 1.5 and ds[1]["proposer"] == "openai:m"
    assert unique_rows(rows + rows) == rows
    # the same program after another prompt is another row (collect pairs answers with several prompts)
    other = SFTRow(task="a", prompt="p2", answer="x", verdict="correct", speedup=1.5, proposer="heuristic")
    assert unique_rows([*rows, other, other]) == [*rows, other]


def test_bad_files_name_the_line(tmp_path):
    with pytest.raises(SFTSetError, match="kernelrl collect"):
        read_sft_set(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task": "a", "prompt": "p", "answer": "x"}\n{"task": "a"}\n')
    with pytest.raises(SFTSetError, match=r"bad.jsonl:2: needs string field\(s\) prompt, answer"):
        read_sft_set(bad)
