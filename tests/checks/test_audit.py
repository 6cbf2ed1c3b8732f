"""Audits over folders, JSON, JSON Lines (whatever the suffix) and a published collection's dict-of-levels
layout: names keep levels, verdicts are typed, missing and unparsable code are counted apart."""

from __future__ import annotations

import io
import json

import pytest
from fixture_spec import CONTROL, REDTEAM, TASKS
from rich.console import Console

from kernelrl import audit as audit_module
from kernelrl.audit import audit
from kernelrl.checks.audit import AuditInputError, AuditOutcome, read_entries
from kernelrl.cli import main
from kernelrl.report.console import render_audit

REF = (TASKS / "elementwise_silu.py").read_text()

HONEST = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)
"""

PATCHER = """
import torch
import torch.nn as nn
torch.allclose = lambda *a, **k: True

class ModelNew(nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)
"""

STREAMER = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        with torch.cuda.stream(torch.cuda.Stream()):
            return x * torch.sigmoid(x)
"""


def test_published_layout_builds_tasks_from_ref_code(tmp_path):
    data = {
        "level1": [
            {"task_id": 19, "ref_code": REF, "custom_code": HONEST, "speedup": 1.1},
            {"task_id": 19, "ref_code": REF, "custom_code": PATCHER},
        ],
        "level2": [{"task_id": 3, "ref_code": REF, "custom_code": STREAMER}],
    }
    path = tmp_path / "collection.json"
    path.write_text(json.dumps(data))
    entries = read_entries(path)
    assert [e.name for e in entries] == ["level1/19", "level1/19#2", "level2/3"]
    assert entries[0].task is not None and entries[0].task.name == "level1/19" and entries[0].task.level == 1
    assert entries[2].task.level == 2
    assert entries[0].meta["speedup"] == 1.1

    report = audit(path, policy="open")
    assert [r.verdict for r in report.records] == [AuditOutcome.OK, AuditOutcome.FLAGGED, AuditOutcome.FLAGGED]
    counts = report.rule_counts()
    assert counts["module_patching"] == (1, 0)
    assert counts["stream_creation"] == (1, 0)
    verdicts = report.verdict_counts()
    assert verdicts["flagged"] == 2 and verdicts["ok"] == 1 and sum(verdicts.values()) == 3


def _jsonl(rows):
    return "\n".join(json.dumps(r) for r in rows) + "\n"


def test_json_lines_with_a_json_suffix_keep_level_ids(tmp_path):
    # CUDA-L1 publishes JSON Lines under .json, one task per line with level_id and task_id
    rows = [{"level_id": 1, "task_id": 80, "ref_code": REF, "custom_code": HONEST},
            {"level_id": 2, "task_id": 80, "ref_code": REF, "custom_code": PATCHER},
            {"level_id": 3, "task_id": 5, "ref_code": REF, "custom_code": "None"}]
    path = tmp_path / "h100.json"
    path.write_text(_jsonl(rows))
    report = audit(path, policy="open")
    assert [r.entry.name for r in report.records] == ["level1/80", "level2/80", "level3/5"]
    assert [r.verdict for r in report.records] == [AuditOutcome.OK, AuditOutcome.FLAGGED, AuditOutcome.NO_CODE]
    assert report.records[1].entry.task.level == 2


@pytest.mark.parametrize("code", [None, "", "   ", "None", "null"])
def test_missing_code_is_no_code_not_ok(tmp_path, code):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"1": [{"task_id": 4, "ref_code": REF, "custom_code": code}]}))
    record = audit(path).records[0]
    assert record.verdict is AuditOutcome.NO_CODE and record.entry.code is None


def test_syntax_errors_are_invalid_and_counted_apart_from_hacks(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"1": [{"task_id": 1, "ref_code": REF, "custom_code": "class ModelNew(:\n  pass\n"},
                                      {"task_id": 2, "ref_code": REF, "custom_code": PATCHER}]}))
    report = audit(path)
    assert [r.verdict for r in report.records] == [AuditOutcome.INVALID, AuditOutcome.FLAGGED]
    assert report.verdict_counts()["invalid"] == 1 and report.verdict_counts()["flagged"] == 1
    assert "syntax_error" not in report.rule_counts()


def test_jsonl_rows_with_task_specs_and_answers(tmp_path):
    rows = [
        {"task": str(TASKS / "elementwise_silu.py"), "code": HONEST},
        {"task": str(TASKS / "elementwise_silu.py"), "answer": "Here:\n```python\n" + PATCHER + "```\n"},
        {"task": "no/such/task", "code": HONEST},
        {"task_id": 7},
    ]
    path = tmp_path / "gen.jsonl"
    path.write_text(_jsonl(rows) + "\n")
    report = audit(path, policy="open")
    r0, r1, r2, r3 = report.records
    assert r0.verdict is AuditOutcome.OK and r0.entry.task.name == "elementwise_silu"
    assert r1.flagged and {f.rule for f in r1.rejecting} == {"module_patching"}
    assert r2.entry.task is None and "not found" in r2.entry.note and not r2.flagged
    assert r3.verdict is AuditOutcome.NO_CODE and "no code" in r3.entry.note and r3.entry.name == "7"


def test_only_and_limit_select_entries_by_name(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"1": [{"task_id": i, "ref_code": REF, "custom_code": HONEST} for i in range(1, 4)],
                                "2": [{"task_id": i, "ref_code": REF, "custom_code": HONEST} for i in range(1, 4)]}))
    assert [r.entry.name for r in audit(path, only=["level2/*"]).records] == ["level2/1", "level2/2", "level2/3"]
    assert [r.entry.name for r in audit(path, only=["level1/3", "level2/1"]).records] == ["level1/3", "level2/1"]
    assert [r.entry.name for r in audit(path, only=["level2/*"], limit=1).records] == ["level2/1"]


def test_strict_policy_counts_missing_kernels(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"rows": [{"ref_code": REF, "custom_code": HONEST}]}))
    assert not audit(path, policy="open").records[0].flagged
    strict = audit(path, policy="strict")
    assert strict.records[0].flagged
    assert strict.rule_counts() == {"no_custom_kernel": (1, 0)}


def test_folder_of_fixtures_resolves_task_headers():
    report = audit(REDTEAM, policy="open")
    by_name = {r.entry.name: r for r in report.records}
    assert len(by_name) == len(list(REDTEAM.glob("*.py")))
    assert by_name["patch_allclose.py"].entry.task.name == "elementwise_silu"
    assert by_name["patch_allclose.py"].flagged
    assert not by_name["mutate_inputs.py"].flagged  # only dynamic checks see this one
    controls = audit(CONTROL, policy="open")
    assert not controls.flagged


def test_folder_without_task_lines_uses_the_default_task(tmp_path):
    (tmp_path / "a.py").write_text(HONEST)
    (tmp_path / "_helper.py").write_text("x = 1\n")
    plain = read_entries(tmp_path)
    assert [e.name for e in plain] == ["a.py"] and plain[0].task is None
    report = audit(tmp_path, task_spec=str(TASKS / "elementwise_silu.py"))
    assert report.records[0].entry.task.name == "elementwise_silu"


@pytest.mark.parametrize("content,match", [
    ("{not json", "not valid JSON or JSON Lines"),
    ('"just a string"', "expected a list of rows or a dict"),
    ('{"meta": 1}', "no list of entries"),
])
def test_bad_json_is_one_clear_error(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(AuditInputError, match=match):
        audit(path)


def test_missing_path_and_bad_jsonl_line(tmp_path):
    with pytest.raises(AuditInputError, match="no such file or folder"):
        audit(tmp_path / "nope.json")
    path = tmp_path / "x.jsonl"
    path.write_text('{"code": "x = 1"}\n{oops\n')
    with pytest.raises(AuditInputError, match=r"x.jsonl:2"):
        audit(path)


def test_render_and_cli_audit_show_counts_and_flagged_entries(tmp_path, capsys):
    path = tmp_path / "c.json"
    path.write_text(_jsonl([{"level_id": 2, "task_id": 80, "ref_code": REF, "custom_code": PATCHER},
                            {"level_id": 2, "task_id": 81, "ref_code": REF, "custom_code": "None"},
                            {"level_id": 2, "task_id": 82, "ref_code": REF, "custom_code": "def (:"}]))
    buf = io.StringIO()
    console = Console(file=buf, width=200)
    render_audit(audit(path), console)
    text = buf.getvalue()
    assert "module_patching" in text and "level2/80" in text and "flagged entries (1 of 3)" in text
    assert "no_code: 1" in text and "invalid: 1" in text and "invalid entries (1 of 3)" in text

    assert main(["audit", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"summary", "entries"}
    assert out["summary"]["verdicts"]["flagged"] == 1 and out["summary"]["verdicts"]["no_code"] == 1
    assert out["summary"]["verdicts"]["invalid"] == 1 and out["summary"]["entries"] == 3
    assert out["summary"]["rules"]["module_patching"] == {"reject": 1, "warn": 0}
    first = out["entries"][0]
    assert {k: first[k] for k in ("name", "verdict", "rules")} == {"name": "level2/80", "verdict": "flagged",
                                                                    "rules": ["module_patching"]}
    assert main(["audit", str(path), "--json", "--only", "level2/81"]) == 0
    assert [e["name"] for e in json.loads(capsys.readouterr().out)["entries"]] == ["level2/81"]
    assert main(["audit", str(tmp_path / "missing")]) == 2
    assert main(["audit", str(path), "--limit", "-1"]) == 2
    with pytest.raises(SystemExit):
        main(["audit", str(path), "--policy", "lenient"])


class _FakeDegeneracy:
    """Stands in for kernelrl.judge.degeneracy.check_tasks: records what it was asked."""

    def __init__(self, degenerate_names):
        self.degenerate_names = degenerate_names
        self.calls = []

    def __call__(self, tasks):
        from kernelrl.tasks.degeneracy import DegeneracyReport

        self.calls.append([t.name for t in tasks])
        return [DegeneracyReport(task=t.name, size="small", degenerate=t.name in self.degenerate_names,
                                 reasons=["all zeros"] if t.name in self.degenerate_names else [], n_inputs=4,
                                 output_rel_std=0.0, sensitivity=0.0, perturbed_sensitivity=0.0, zero_passes=False,
                                 constant_passes=False, nonfinite=False, mean_abs_output=0.0) for t in tasks]


def test_degeneracy_filter_runs_once_per_distinct_reference(tmp_path, monkeypatch):
    other = (TASKS / "mean_cubed.py").read_text()
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"1": [{"task_id": 1, "ref_code": REF, "custom_code": HONEST},
                                      {"task_id": 1, "ref_code": REF, "custom_code": PATCHER},
                                      {"task_id": 2, "ref_code": other, "custom_code": HONEST},
                                      {"task_id": 3, "ref_code": other, "custom_code": "None"}]}))
    fake = _FakeDegeneracy({"level1/2"})
    monkeypatch.setattr(audit_module, "_degeneracy_reports", fake)
    report = audit(path, degeneracy=True)
    assert fake.calls == [["level1/1", "level1/2"]]  # two distinct references, each checked once
    assert report.degeneracy_checked == 2
    assert [(d.task, d.entries) for d in report.degenerate] == [("level1/2", ["level1/2", "level1/3"])]
    summary = report.to_dict()["summary"]["degeneracy"]
    assert summary["degenerate_tasks"][0]["entries"] == ["level1/2", "level1/3"]
    assert "degenerate" in report.records[2].note
    assert audit(path).degeneracy_checked is None  # not asked, not run


@pytest.mark.slow
def test_degeneracy_filter_finds_the_mean_centred_task(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"1": [{"task_id": 1, "ref_code": REF, "custom_code": HONEST},
                                      {"task_id": 2, "ref_code": (TASKS / "mean_cubed.py").read_text(),
                                       "custom_code": HONEST}]}))
    report = audit(path, degeneracy=True)
    assert [d.task for d in report.degenerate] == ["level1/2"] and report.degeneracy_checked == 2


MUTATOR = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return x.mul_(torch.sigmoid(x))
"""


@pytest.mark.slow
def test_dynamic_audit_reports_what_only_running_shows(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"level1": [{"task_id": 1, "ref_code": REF, "custom_code": MUTATOR}]}))
    static = audit(path, policy="open")
    assert not static.records[0].flagged
    report = audit(path, policy="open", run_dynamic=True)
    record = report.records[0]
    assert record.result is not None and record.verdict is AuditOutcome.FLAGGED and record.flagged
    assert report.rule_counts()["inputs_mutated"] == (1, 0)
