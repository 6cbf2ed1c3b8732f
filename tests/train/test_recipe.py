"""The recipe on the command line: `kernelrl collect` against a scripted OpenAI-compatible server
on 127.0.0.1 (and a replay file) writes the SFT set, `kernelrl train sft --config tiny-cpu` trains
on it, `kernelrl train rft` runs two rounds with the real evaluator; resumes cost nothing."""

from __future__ import annotations

import json
from pathlib import Path

from judge_fixtures import QUICK_TIMING, QUICK_TIMING_SETTINGS
from kernelrl.cli import main
from kernelrl.store import Database
from kernelrl.train.recipe import load_train_config
from kernelrl.train.sft_set import SFTRow, dataset_dir, read_sft_set, write_sft_set
from kernelrl.train.stage import Stage, finished_model


def wrong_program(source: str) -> str:
    return source.replace("class Model(", "class ModelNew(").replace("* 2.0", "* 3.0")


def right_program(source: str) -> str:
    return source.replace("class Model(", "class ModelNew(")


def train_args(run: Path, task_path: Path, cache_dir: Path, *more: str) -> list[str]:
    return ["--config", "tiny-cpu", "--tasks", str(task_path), "--output-dir", str(run), "--model.path",
            str(run / "base"), "--cache-dir", str(cache_dir), *more]


def test_collect_writes_the_sft_set_and_sft_trains_on_it(tmp_path, tiny_task, cache_dir, openai_server, capsys,
                                                         monkeypatch):
    monkeypatch.setenv("KERNELRL_CACHE", str(cache_dir))
    monkeypatch.setenv("KRL_TEST_KEY", "test-key")
    replay = tmp_path / "replay.jsonl"
    replay.write_text("\n".join(json.dumps({"task": tiny_task.name, "code": code}) for code in (
        wrong_program(tiny_task.source), right_program(tiny_task.source))) + "\n")
    run = tmp_path / "run"
    out = run / "sft.jsonl"  # the training config's sft_data for output_dir=run
    collect = ["collect", "--tasks", str(tiny_task.path), "--proposer",
               f"openai:scripted-model base_url={openai_server.base_url} api_key_env=KRL_TEST_KEY",
               "--proposer", f"replay:{replay}", "--tries", "3", "--out", str(out), *QUICK_TIMING]
    assert main(collect) == 0
    printed = capsys.readouterr().out
    rows = read_sft_set(out)
    # the endpoint's first answer is correct (the scripted server wraps the reference); the replay
    # file's first program is wrong, its second right: two accepted answers, three tries in all;
    # the replay's was asked with the wrong one shown, and is also a row under the first-attempt prompt
    assert sorted(r.proposer.split("@")[0] for r in rows) == sorted([f"replay:{replay}", f"replay:{replay}",
                                                                     "openai:scripted-model"])
    assert all(r.verdict == "correct" and r.speedup and r.prompt.startswith("# Task") for r in rows)
    assert len({r.answer for r in rows}) == 2 and len({r.prompt for r in rows}) == 2
    assert dataset_dir(out).is_dir() and "SFT set: 2 accepted answers, 3 rows" in printed
    # one default database from collect to rft and grpo: code.db next to the SFT set, which is the
    # training config's database for the same output_dir
    config = load_train_config("tiny-cpu", {"output_dir": str(run)})
    assert config.sft_data == out and config.database == run / "code.db"
    with Database(config.database, readonly=True) as db:
        assert [r.status.value for r in db.candidates()].count("incorrect") == 1 and len(db.candidates()) == 3
    asked = len(openai_server.requests)
    assert main(collect) == 0  # resumable: every pair already has what it needs
    assert len(openai_server.requests) == asked and len(read_sft_set(out)) == 3
    capsys.readouterr()

    assert main(["train", "sft", *train_args(run, tiny_task.path, cache_dir, "--sft.trl", "max_steps=2")]) == 0
    printed = capsys.readouterr().out
    assert "trained on 3 rows" in printed and "(changed)" in printed
    assert finished_model(run, Stage.SFT) == run / "sft" / "final"


def test_rft_runs_two_rounds_with_the_evaluator(tmp_path, tiny_task, cache_dir, capsys):
    sft = tmp_path / "sft.jsonl"
    write_sft_set(sft, [SFTRow(task=tiny_task.name, prompt="make it faster", verdict="correct", speedup=1.0,
                               proposer="test", answer=f"```python\n{right_program(tiny_task.source)}```\n")])
    run = tmp_path / "run"
    args = train_args(run, tiny_task.path, cache_dir, "--sft.data", str(sft))
    assert main(["train", "rft", *args]) == 0
    printed = capsys.readouterr().out
    assert "(the base model (no earlier stage has finished))" in printed.replace("\n", "")
    assert "rejection-sampling rounds" in printed
    with Database(run / "code.db", readonly=True) as db:
        by_round = {p: [c for c in db.candidates() if c.proposer == p] for p in ("rft:round-1", "rft:round-2")}
    assert [len(v) for v in by_round.values()] == [3, 3]
    assert all(c.result is not None and c.meta.stage == "rft" for v in by_round.values() for c in v)
    # each round fine-tuned (the SFT set's row at least) and the next sampled from its result
    assert finished_model(run, Stage.RFT) == run / "rft" / "round-2" / "final"
    assert json.loads((run / "rft" / "round-2" / "round.json").read_text())["final"] == str(
        run / "rft" / "round-2" / "final")
    # run again: finished rounds are not sampled again
    assert main(["train", "rft", *args]) == 0
    with Database(run / "code.db", readonly=True) as db:
        assert len([c for c in db.candidates() if c.proposer.startswith("rft:")]) == 6


def test_collect_bad_input_is_one_line(tmp_path, capsys):
    assert main(["collect", "--tasks", "no-such-task", "--proposer", "heuristic",
                 "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "no-such-task" in capsys.readouterr().err
    assert main(["collect", "--tasks", "level1/gelu", "--proposer", "openai:m api_key=sk-123",
                 "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "api_key_env" in capsys.readouterr().err
    assert main(["train", "sft", "--config", "tiny-cpu", "--output-dir", str(tmp_path), "--model.path",
                 str(tmp_path / "base"), "--sft.data", str(tmp_path / "none.jsonl")]) == 2
    assert "no SFT set" in capsys.readouterr().err
    assert main(["train", "grpo", "--config", "tiny-cpu", "--output-dir", str(tmp_path), "--resume"]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    # training refuses test tasks: named ones, and the test split itself
    assert main(["train", "grpo", "--config", "tiny-cpu", "--output-dir", str(tmp_path), "--tasks", "level1/softmax"]) == 2
    assert "training refuses test tasks" in capsys.readouterr().err
    assert main(["train", "grpo", "--config", "tiny-cpu", "--splits", "train", "test"]) == 2
    assert "training refuses test tasks" in capsys.readouterr().err
    assert main(["collect", "--tasks", "level1/softmax", "--proposer", "heuristic",
                 "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "training refuses test tasks" in capsys.readouterr().err
    # and bench measures the test split unless told otherwise
    assert main(["bench", "--proposer", "heuristic", "--tasks", "level1/gelu"]) == 2
    assert "no task of the test split" in capsys.readouterr().err


def test_one_run_config_judges_collect_and_bench_alike(tmp_path, tiny_task, cache_dir, capsys):
    """`collect --recipe` and `bench --recipe` read the training config's tasks, [eval], database and
    SFT set: a program collect judged is not judged again by the bench; every kept answer is also a
    row under the first-attempt prompt, the one bench asks."""

    replay = tmp_path / "replay.jsonl"
    programs = [right_program(tiny_task.source), right_program(tiny_task.source).replace("return", "return 1.0 *")]
    replay.write_text("\n".join(json.dumps({"task": tiny_task.name, "code": c}) for c in programs) + "\n")
    run = tmp_path / "run"
    config = tmp_path / "recipe.toml"
    timing = "\n".join(f"{k} = {v}" for k, v in QUICK_TIMING_SETTINGS.items())
    config.write_text(f'tasks = ["{tiny_task.path}"]\noutput_dir = "{run}"\n[model]\npath = "{run / "base"}"\n'
                      f'[eval]\npolicy = "strict-pytorch"\naa_tolerance = 0.0\ncache_dir = "{cache_dir}"\n'
                      f'[eval.timing]\n{timing}\n'
                      f'[collect]\nproposers = ["replay:{replay}"]\ntries = 2\nkeep = 2\nk_shown = 1\n'
                      f'[bench]\nk = 2\nsplit = "all"\ncompile_baseline = false\n')
    assert main(["collect", "--recipe", str(config)]) == 0
    rows = read_sft_set(run / "sft.jsonl")  # the config's SFT set, in its database
    first = [r for r in rows if r.prompt == rows[0].prompt]
    # two programs kept; the second was asked with the first shown, and is also under the first prompt
    assert len(rows) == 3 and len(first) == 2 and {r.answer for r in first} == {r.answer for r in rows}
    assert "Earlier versions" in rows[0].prompt and rows[0].prompt.startswith("# Task")
    with Database(run / "code.db", readonly=True) as db:
        runs = db.runs()
        assert runs[-1].config["config"]["eval"]["policy"] == "strict-pytorch"
        judged = len(db.candidates())
    capsys.readouterr()
    assert main(["bench", "--recipe", str(config), "--proposer", f"replay:{replay}", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["pass_at"]["1"] == 1.0 and isinstance(report["run_id"], int)
    with Database(run / "code.db", readonly=True) as db:
        bench_rows = db.candidates(run_id=report["run_id"])
        assert len(bench_rows) == 2 and len(db.candidates()) == judged + 2
        # the same programs under the same [eval]: the verdicts collect stored, not new ones
        kept = {c.source: c.result.speedup for c in db.candidates() if c.meta.stage == "collect"}
        assert all(c.result.speedup == kept[c.source] for c in bench_rows)
        assert all(c.prompt == first[0].prompt for c in bench_rows)
    # a [collect] key the run owns, or one collect does not know, is refused by name
    bad = config.read_text().replace("k_shown = 1\n", "k_shown = 1\nout = \"x.jsonl\"\n")
    config.write_text(bad)
    assert main(["collect", "--recipe", str(config)]) == 2
    assert "[collect] --out: the run config sets it" in capsys.readouterr().err
