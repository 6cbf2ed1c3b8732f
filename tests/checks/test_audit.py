"""Audits over folders, JSONL rows and a published collection's dict-of-levels layout (static checks)."""

from __future__ import annotations

import io
import json

import pytest
from fixture_spec import CONTROL, REDTEAM, TASKS
from rich.console import Console

from kernelrl.checks.audit import AuditInputError, audit, read_entries
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
    assert [e.id for e in entries] == ["level1/19#0", "level1/19#1", "level2/3#0"]
    assert entries[0].task is not None and entries[0].task.name == "level1/19" and entries[0].task.level == 1
    assert entries[2].task.level == 2
    assert entries[0].meta["speedup"] == 1.1

    report = audit(path, policy="open")
    assert [r.flagged for r in report.records] == [False, True, True]
    counts = report.rule_counts()
    assert counts["module_patching"] == (1, 0)
    assert counts["stream_creation"] == (1, 0)
    assert report.status_counts() == {"flagged": 2, "static_ok": 1}


def test_jsonl_rows_with_task_specs_and_answers(tmp_path):
    rows = [
        {"task": str(TASKS / "elementwise_silu.py"), "code": HONEST},
        {"task": str(TASKS / "elementwise_silu.py"), "answer": "Here:\n```python\n" + PATCHER + "```\n"},
        {"task": "no/such/task", "code": HONEST},
        {"task_id": 7},
    ]
    path = tmp_path / "gen.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    report = audit(path, policy="open")
    r0, r1, r2, r3 = report.records
    assert not r0.flagged and r0.entry.task.name == "elementwise_silu"
    assert r1.flagged and {f.rule for f in r1.rejecting} == {"module_patching"}
    assert r2.entry.task is None and "not found" in r2.entry.note and not r2.flagged
    assert r3.status == "skipped" and "no code" in r3.entry.note


def test_strict_policy_counts_missing_kernels(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"rows": [{"ref_code": REF, "custom_code": HONEST}]}))
    assert not audit(path, policy="open").records[0].flagged
    strict = audit(path, policy="strict")
    assert strict.records[0].flagged
    assert strict.rule_counts() == {"no_custom_kernel": (1, 0)}


def test_folder_of_fixtures_resolves_task_headers():
    report = audit(REDTEAM, policy="open")
    by_id = {r.entry.id: r for r in report.records}
    assert len(by_id) == len(list(REDTEAM.glob("*.py")))
    assert by_id["patch_allclose.py"].entry.task.name == "elementwise_silu"
    assert by_id["patch_allclose.py"].flagged
    assert not by_id["mutate_inputs.py"].flagged  # only dynamic checks see this one
    controls = audit(CONTROL, policy="open")
    assert not controls.flagged


def test_folder_without_task_lines_uses_the_default_task(tmp_path):
    (tmp_path / "a.py").write_text(HONEST)
    (tmp_path / "_helper.py").write_text("x = 1\n")
    plain = read_entries(tmp_path)
    assert [e.id for e in plain] == ["a.py"] and plain[0].task is None
    report = audit(tmp_path, task_spec=str(TASKS / "elementwise_silu.py"))
    assert report.records[0].entry.task.name == "elementwise_silu"


@pytest.mark.parametrize("content,match", [
    ("{not json", "not valid JSON"),
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
    path.write_text(json.dumps({"level1": [{"task_id": 1, "ref_code": REF, "custom_code": PATCHER}]}))
    buf = io.StringIO()
    console = Console(file=buf, width=200)
    render_audit(audit(path), console)
    text = buf.getvalue()
    assert "module_patching" in text and "level1/1#0" in text and "flagged entries (1 of 1)" in text

    assert main(["audit", str(path), "--json"]) == 0
    saved = json.loads(capsys.readouterr().out)
    assert saved["rule_counts"]["module_patching"] == {"reject": 1, "warn": 0}
    assert main(["audit", str(tmp_path / "missing")]) == 2
    with pytest.raises(SystemExit):
        main(["audit", str(path), "--policy", "lenient"])


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
    assert record.result is not None and record.status == "flagged" and record.flagged
    assert report.rule_counts()["inputs_mutated"] == (1, 0)
