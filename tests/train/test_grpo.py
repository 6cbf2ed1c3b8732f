"""Contrastive GRPO on TRL with a tiny model: the tiny-cpu run with the real evaluator (two steps,
then a resumed third), and RoC with chat prompts and the curriculum against a scripted judge."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from kernelrl.cli import main
from kernelrl.judge.eval_config import EvalConfig
from kernelrl.result import EvalResult, Status
from kernelrl.run_parts import build_run
from kernelrl.store import Database
from kernelrl.tasks.task import Task, load_task_file
from train_fixtures import ScriptedBackend


def weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_tiny_cpu_grpo_two_steps_with_the_evaluator_then_resume(tmp_path, cache_dir, capsys, tiny_task):
    task_file = tiny_task.path
    out = tmp_path / "run"
    common = ["--config", "tiny-cpu", "--tasks", str(task_file), "--output-dir", str(out), "--model.path",
              str(out / "base"), "--cache-dir", str(cache_dir)]
    assert main(["train", "grpo", *common]) == 0
    log = capsys.readouterr().out
    # the evaluator's verdicts and the raw and clipped rewards of every batch are in the log
    batches = re.findall(r"reward step (\d+): 3 rollouts \(([^)]*)\); (\d+) judged; (\d+) clipped; \d+ not trained on; "
                         r"raw->clipped: (.*)", log)
    assert [b[0] for b in batches] == ["0", "1"]
    for _, verdicts, _, _, rewards in batches:
        assert re.fullmatch(r"(\d+ (correct|incorrect|compile_error|runtime_error|timeout|flagged|no_code)(, )?)+",
                            verdicts)
        assert len(rewards.split()) == 3
    assert "kernelrl/raw_reward" in log and "kernelrl/clipped_reward" in log
    assert "(changed)" in log
    base, final = weights(out / "base"), weights(out / "grpo" / "final")
    assert any(not torch.equal(base[k], final[k]) for k in base)  # parameters moved
    with Database(out / "code.db", readonly=True) as db:
        rows = db.candidates()
        assert len(rows) == 6 and all(r.result is not None and r.proposer == "grpo" for r in rows)
        assert {r.meta.step for r in rows} == {0, 1} and all(r.meta.raw is not None for r in rows)
        assert {r.status for r in rows} <= set(Status)
    saved = json.loads((out / "grpo" / "checkpoint-2" / "kernelrl_state.rank0.json").read_text())
    assert saved["rank"] == 0 and saved["curriculum"]["draws"] >= 2 and saved["stream"]["built"] >= 2
    assert main(["train", "grpo", *common]) == 2  # a fresh run would overwrite these checkpoints
    assert "--resume continues it" in capsys.readouterr().err

    assert main(["train", "grpo", *common, "--resume", "--grpo.trl", "max_steps=3"]) == 0
    log = capsys.readouterr().out
    assert re.search(r"resumed\s+from\s+\S*checkpoint-2", log)
    assert re.search(r"rank 0: kernelrl state restored from \S*checkpoint-2/kernelrl_state\.rank0\.json", log)
    assert re.findall(r"reward step (\d+):", log) == ["2"]
    state = json.loads((out / "grpo" / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    # the third step started from checkpoint-2's weights and moved them
    resumed, final = weights(out / "grpo" / "checkpoint-2"), weights(out / "grpo" / "final")
    assert any(not torch.equal(resumed[k], final[k]) for k in resumed)
    with Database(out / "code.db", readonly=True) as db:
        assert len(db.candidates()) == 9 and len(db.runs()) == 2


def tiny_judge(task: Task, source: str) -> EvalResult:
    """The tiny model's programs: the reference wrapped (correct), scaled (wrong), unparsable."""
    if "def forward(self, x:" in source:
        return EvalResult(task=task.name, status=Status.COMPILE_ERROR, message="syntax")
    if "* 1.5" in source:
        return EvalResult(task=task.name, status=Status.INCORRECT, message="wrong")
    return EvalResult(task=task.name, status=Status.CORRECT, speedup=1.25, message="correct")


def test_grpo_with_roc_chat_prompts_and_the_curriculum(tmp_path, tiny_task):
    from transformers import AutoTokenizer

    from kernelrl.reward import RewardModel
    from kernelrl.train.curriculum import CurriculumConfig
    from kernelrl.train.grpo import GRPOStageConfig, train_grpo
    from kernelrl.train.model import ModelConfig
    from kernelrl.train.roc import RoCConfig
    from kernelrl.train.rollouts import EvalSettings
    from kernelrl.train.tiny import build_tiny_model

    easy = load_task_file(tiny_task.path, name="toy/easy", level=1)
    hard = Task(name="toy/hard", source=tiny_task.source.replace("* 2.0", "* 3.0"), level=2)
    base = build_tiny_model(tmp_path / "base", [easy, hard])
    tok = AutoTokenizer.from_pretrained(base)
    tok.chat_template = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}[assistant]{% endif %}")
    tok.save_pretrained(base)
    stage = GRPOStageConfig(k_shown=1, roc=RoCConfig(enabled=True, keep=0.5, min_per_side=1),
                            curriculum=CurriculumConfig(promote_after=1000),
                            trl={"max_steps": 2, "num_generations": 4, "per_device_train_batch_size": 4,
                                 "max_completion_length": 12, "learning_rate": 1e-3, "report_to": "none",
                                 "use_cpu": True, "bf16": False, "save_strategy": "no", "logging_steps": 1})
    backend = ScriptedBackend(tiny_judge)
    settings = EvalSettings.of(EvalConfig())
    with build_run(tasks=[easy, hard], eval_config=EvalConfig(size="small"), db_path=tmp_path / "code.db",
                   judge=backend) as run:
        result = train_grpo(stage, run=run, model=ModelConfig(path=str(base), system="be fast"), init_from=str(base),
                            output_dir=tmp_path / "grpo", reward=RewardModel(), eval_settings=settings)
    with Database(tmp_path / "code.db") as db:
        rows = db.candidates()
    assert result.outcome.steps == 2 and result.reward_calls == 2 and len(backend.calls) <= 2
    assert len(rows) == 8 and {r.task for r in rows} == {"toy/easy"}  # level 2 stays closed
    assert sum(r.meta.kept for r in rows) == 4  # RoC: half of each group of 4 trains
    assert all(r.prompt.startswith("# Task: make `toy/easy` faster") for r in rows)  # the user turn, stored
