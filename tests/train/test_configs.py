"""Every shipped training config parses and validates; bad settings are errors naming the key."""

from __future__ import annotations

import json

import pytest

from kernelrl.cli import main
from kernelrl.config import ConfigError, config_names, load_toml, to_dict
from kernelrl.train.grpo import DEFAULTS, FORCED
from kernelrl.train.recipe import TRAIN_CONFIG_DIR, load_train_config
from kernelrl.train.trl_args import build_args, trl_class

NAMES = sorted(p.stem for p in TRAIN_CONFIG_DIR.glob("*.toml"))
# What only a GPU machine accepts; everything else in the TRL tables is checked here.
CPU = {"bf16": False, "fp16": False, "use_cpu": True}


def test_the_three_configs_are_shipped():
    assert {"tiny-cpu", "qwen7b-lora-1gpu", "qwen7b-full-8gpu-vllm"} <= set(NAMES)
    assert "tiny-cpu" not in config_names()  # `optimize --config` lists its own folder only


@pytest.mark.parametrize("name", NAMES)
def test_each_config_builds_and_trl_accepts_its_tables(name, tmp_path):
    config = load_train_config(name)
    assert config.tasks and config.grpo.trl["max_steps"] >= 1
    for where, values in (("sft.trl", config.sft.trl), ("rft.trl", config.rft.trl)):
        build_args(trl_class("SFTConfig"), {**values, **CPU}, output_dir=tmp_path, where=where)
    args = build_args(trl_class("GRPOConfig"), {**DEFAULTS, **config.grpo.trl, **CPU}, output_dir=tmp_path,
                      where="grpo.trl", forced=FORCED)
    assert args.beta == 0.0 and not args.shuffle_dataset and args.ignore_data_skip
    assert args.generation_batch_size % args.num_generations == 0


def test_the_gpu_configs_say_what_the_issue_asks():
    lora = load_train_config("qwen7b-lora-1gpu")
    assert lora.model.lora is not None and lora.grpo.trl["use_vllm"] and lora.grpo.trl["vllm_mode"] == "colocate"
    full = load_train_config("qwen7b-full-8gpu-vllm")
    assert full.model.lora is None and full.grpo.trl["vllm_mode"] == "server" and full.backend.url
    for c in (lora, full):
        assert c.grpo.roc.enabled and c.grpo.trl["epsilon_high"] > c.grpo.trl["epsilon"]
        assert c.eval.device == "cuda"


def test_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"grpo\.trl\.num_generation: not a GRPOConfig setting; similar: .*"
                                          r"num_generations"):
        load_train_config("tiny-cpu", {"grpo.trl.num_generation": 4})
    with pytest.raises(ConfigError, match=r"grpo\.trl\.output_dir: set by kernelrl"):
        load_train_config("tiny-cpu", {"grpo.trl.output_dir": "x"})
    with pytest.raises(ConfigError, match="max_steps must be set"):
        load_train_config("tiny-cpu", {"grpo.trl.max_steps": 0})
    with pytest.raises(ConfigError, match="shuffle_dataset must stay false"):
        load_train_config("tiny-cpu", {"grpo.trl.shuffle_dataset": True})
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) model\.lora\.rank"):
        load_train_config("tiny-cpu", {"model.lora.rank": 8})
    with pytest.raises(ConfigError, match="fewer than 2 rollouts"):
        load_train_config("tiny-cpu", {"grpo.roc.enabled": True, "grpo.trl.num_generations": 2})


def test_cli_overrides_and_one_line_errors(capsys):
    file = load_train_config("tiny-cpu")
    assert main(["train", "grpo", "--config", "tiny-cpu", "--grpo.trl", "max_steps=5", "--print-config",
                 "--model.lora.r", "8"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["grpo"]["trl"]["max_steps"] == 5 and printed["model"]["lora"]["r"] == 8
    # a table on the command line merges into the file's: its other TRL arguments stay
    assert {k: v for k, v in printed["grpo"]["trl"].items() if k != "max_steps"} == {
        k: v for k, v in file.grpo.trl.items() if k != "max_steps"} != {}
    assert main(["train", "grpo", "--config", "tiny-cpu", "--grpo.trl", "num_generation=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--grpo.trl num_generation: not a GRPOConfig setting" in err[0]
    assert main(["train", "grpo", "--config", "tiny-cpu", "--grpo.roc.keep", "7"]) == 2
    assert "--grpo.roc.keep must be in (0, 1]" in capsys.readouterr().err
    assert main(["train", "sft", "--config", "no-such-config"]) == 2
    assert "tiny-cpu" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # argparse's refusal, as for every command's flags
        main(["train", "grpo", "--config", "tiny-cpu", "--grpo.trl", "not-a-pair"])
    assert exited.value.code == 2 and "expected KEY=VALUE, got 'not-a-pair'" in capsys.readouterr().err
    # the dotted KEY=VALUE form is refused with the flag that sets it
    assert main(["train", "grpo", "--config", "tiny-cpu", "grpo.trl.max_steps=5", "grpo.roc.enabled=false"]) == 2
    err = capsys.readouterr().err
    assert "`--grpo.trl max_steps=5`" in err and "`--no-grpo.roc.enabled`" in err


def test_a_config_file_outside_the_folder(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('tasks = ["level1/gelu"]\noutput_dir = "out"\n[model]\npath = "some/model"\n'
                    '[grpo.trl]\nmax_steps = 3\n')
    config = load_train_config(path)
    assert config.database == config.output_dir / "code.db" and config.sft_data.name == "sft.jsonl"
    assert load_toml(path)["model"]["path"] == "some/model"


def test_the_8gpu_config_dry_runs_here_and_prints_its_launch(capsys):
    assert main(["train", "grpo", "--config", "qwen7b-full-8gpu-vllm", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert ("launch: CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6 accelerate launch --config_file "
            "kernelrl/configs/accelerate/zero3.yaml --num_processes 7 -m kernelrl train grpo --config "
            "qwen7b-full-8gpu-vllm") in out
    assert "8 per device x 7 processes x 4 steps per generation = 224 rollouts = 14 groups of 16" in out
    assert "DEEPSPEED, 7 process(es) for grpo, ZeRO stage 3" in out
    assert "left out by their split: 6 test, 2 validation" in out and "every check passed" in out


def test_the_launch_a_dry_run_prints_repeats_the_settings_given(capsys):
    assert main(["train", "grpo", "--config", "qwen7b-full-8gpu-vllm", "--grpo.trl", "max_steps=40", "--dry-run",
                 "--backend.url", "http://judge:8177", "--resume"]) == 0
    launch = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("launch: "))
    assert launch.endswith("-m kernelrl train grpo --config qwen7b-full-8gpu-vllm --grpo.trl max_steps=40 "
                           "--backend.url http://judge:8177 --resume"), launch


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("stage", ["rft", "grpo"])
def test_every_shipped_config_dry_runs(name, stage, capsys):
    assert main(["train", stage, "--config", name, "--dry-run"]) == 0, capsys.readouterr()


def test_a_dry_run_names_every_broken_thing(tmp_path, capsys):
    bad = ["--config", "qwen7b-full-8gpu-vllm", "--output-dir", str(tmp_path), "--model.path", str(tmp_path / "nothing"),
           "--template-dir", str(tmp_path / "no-templates"), "--backend.token-file", str(tmp_path / "no-token"),
           "--launch.grpo-processes", "3", "--grpo.trl", "per_device_train_batch_size=2",
           "gradient_accumulation_steps=1", "num_generations=4", "--no-grpo.roc.enabled"]
    assert main(["train", "grpo", *bad, "--dry-run"]) == 2
    out, err = capsys.readouterr()
    for what in ("model.path", "template_dir", "backend.token_file", "grpo batch"):
        assert f"ERROR {what}:" in out and what in err
    assert "2 per device x 3 processes x 1 steps per generation = 6 rollouts = 1.5 groups of 4: not whole groups" in out
    assert main(["train", "sft", "--config", "tiny-cpu", "--output-dir", str(tmp_path), "--dry-run"]) == 2
    assert "ERROR sft.data" in capsys.readouterr().out
    assert main(["train", "grpo", "--config", "tiny-cpu", "--launch.accelerate-config", "nowhere", "--dry-run"]) == 2
    assert "nowhere.yaml: missing" in capsys.readouterr().out
    assert not (tmp_path / "grpo").exists()  # nothing was written


def test_a_kernelbench_checkout_is_a_training_source(tmp_path, capsys):
    source = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x * {k}\n" \
             "def get_inputs():\n    return [torch.randn(4)]\ndef get_init_inputs():\n    return []\n"
    for i in range(1, 31):
        folder = tmp_path / "KernelBench" / "KernelBench" / f"level{1 + i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i}_Scale{i}.py").write_text(source.format(k=i))
    checkout = tmp_path / "KernelBench"
    assert main(["train", "grpo", "--config", "tiny-cpu", "--tasks", str(checkout), "--dry-run"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("ok    tasks:"))
    assert " train)" in line and "left out by their split" in line and "test" in line


def test_the_paper_run_matches_the_shipped_config():
    import importlib.util

    from kernelrl.train.recipe import TRAIN_CONFIG_DIR as folder

    path = folder.parents[2] / "benchmarks" / "paper_run.py"
    spec = importlib.util.spec_from_file_location("paper_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (folder / "paper-run.md").read_text()
    generated = text.split("<!-- generated by benchmarks/paper_run.py: do not edit by hand -->\n", 1)[1]
    assert generated.split("<!-- end of generated part -->", 1)[0].strip() == module.table().strip()
    assert "| grpo, 7 GPUs train, 1 serves vLLM | 800 | 224 (14 prompts x 16; 112 train after RoC) |" in text


@pytest.mark.parametrize("stage", ["sft", "grpo"])
def test_a_dry_run_refuses_a_warmup_that_outlasts_the_run(stage):
    """Each stage's optimizer steps are counted; a warmup as long as the run is an error."""
    from kernelrl.train.launch import dry_run, optimizer_steps, warmup_steps

    config = load_train_config("tiny-cpu", {f"{stage}.trl.warmup_steps": 20})
    report = dry_run(config, stage, name="tiny-cpu")
    steps = [c for c in report.checks if c.what == f"{stage} steps"]
    assert len(steps) == 1 and steps[0].level == "error" and "outlasts" in steps[0].detail
    assert not report.ok
    fine = dry_run(load_train_config("tiny-cpu", {f"{stage}.trl.warmup_steps": 1}), stage, name="tiny-cpu")
    assert [c.level for c in fine.checks if c.what == f"{stage} steps"] == ["ok"]
    # the Trainer's own count: 2 epochs of 100 rows at 1 x 2 processes x 16 accumulated a step
    trl = {"num_train_epochs": 2, "per_device_train_batch_size": 1, "gradient_accumulation_steps": 16}
    assert optimizer_steps(trl, examples=100, processes=2) == 8
    assert warmup_steps({"warmup_steps": 0.05}, 200) == 10 and warmup_steps({"warmup_steps": 20}, 4) == 20


def test_the_shipped_gpu_configs_train_strictly_and_say_when_no_llm_judge_watches():
    from kernelrl.train.recipe import judge_notice

    for name in ("qwen7b-lora-1gpu", "qwen7b-full-8gpu-vllm"):
        config = load_train_config(name)
        assert config.eval.policy == "strict"
        assert "LLM judge is OFF" in judge_notice(config)
        on = load_train_config(name, {"eval.llm_judge.enabled": True, "eval.llm_judge.model": "judge-model"})
        assert "adversarial LLM judge judge-model" in judge_notice(on)


@pytest.mark.parametrize("name", NAMES)
def test_every_shipped_config_refuses_every_hack_strict_refuses(name):
    """A static, dynamic or LLM-judge finding is the lowest reward in every training config: its
    policy rejects every rule `strict` rejects, save the custom-kernel requirement (the CPU smoke
    configs' tiny model writes PyTorch, so they run `strict-pytorch`)."""
    from kernelrl.checks import rules as R
    from kernelrl.checks.policy import get_policy

    policy = get_policy(load_train_config(name).eval.policy)
    assert policy.reject >= get_policy("strict").reject - {R.NO_CUSTOM_KERNEL}
    assert policy.name == "strict" or name.startswith("tiny-cpu")


def test_the_start_notice_names_the_findings_a_softer_policy_pays():
    from kernelrl.train.recipe import judge_notice

    assert "only warns on" not in judge_notice(load_train_config("tiny-cpu"))
    notice = judge_notice(load_train_config("tiny-cpu", {"eval.policy": "open"}))
    assert "findings policy open only warns on, and pays:" in notice
    assert "try_fallback" in notice and "precision_change" in notice and "llm_judge" in notice


def test_naming_a_judge_model_turns_the_llm_judge_on_unless_turned_off():
    from kernelrl.train.recipe import judge_notice

    named = load_train_config("qwen7b-lora-1gpu", {"eval.llm_judge.model": "judge-model"})
    assert named.eval.llm_judge.enabled is True
    assert "adversarial LLM judge judge-model" in judge_notice(named)
    off = load_train_config("qwen7b-lora-1gpu", {"eval.llm_judge.model": "judge-model", "eval.llm_judge.enabled": False})
    assert off.eval.llm_judge.enabled is False
    assert "turned off by eval.llm_judge.enabled=false" in judge_notice(off)
    assert load_train_config("qwen7b-lora-1gpu").eval.llm_judge.enabled is False


def test_the_dry_run_names_every_gpu_of_the_eight_gpu_layout():
    from kernelrl.train.launch import dry_run

    report = dry_run(load_train_config("qwen7b-full-8gpu-vllm"), "grpo", name="qwen7b-full-8gpu-vllm")
    (layout,) = [c for c in report.checks if c.what == "gpu layout"]
    assert layout.level == "ok"
    assert "training on 7 GPU(s) (0,1,2,3,4,5,6)" in layout.detail and "vLLM server's GPU (7)" in layout.detail
    assert "8 GPU(s) on the training node (it has 8) + 5 on the judging machine = 13" in layout.detail
    crowded = load_train_config("qwen7b-full-8gpu-vllm", {"launch.node_gpus": 7})
    (bad,) = [c for c in dry_run(crowded, "grpo", name="x").checks if c.what == "gpu layout"]
    assert bad.level == "error" and "more than the node has" in bad.detail


def test_a_dry_run_checks_the_run_pages_port_here(capsys):
    import socket

    from kernelrl.train.launch import CheckLevel, dry_run

    assert main(["train", "grpo", "--config", "tiny-cpu", "--watch.port", "0", "--dry-run"]) == 0
    assert "watch.port: 127.0.0.1:0: free here now" in capsys.readouterr().out
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        config = load_train_config("tiny-cpu", {"watch.port": port})
        (page,) = [c for c in dry_run(config, "grpo", name="tiny-cpu").checks if c.what == "watch.port"]
    assert page.level is CheckLevel.ERROR and f"127.0.0.1:{port}: cannot listen there" in page.detail


def test_rft_steps_are_counted_per_round_from_the_rows_it_can_keep_over_the_suites_tasks():
    """The 8-GPU config: 16 samples of each of the suite's 21 training tasks a round, on 8 processes
    (1 per device x 8 accumulated a step, one epoch), every round trained on every sample kept so far: before,
    the suite counted as one task and a round of ~336 rows read as 1 optimizer step."""
    from kernelrl.train.launch import dry_run

    config = load_train_config("qwen7b-full-8gpu-vllm")
    (steps,) = [c for c in dry_run(config, "rft", name="qwen7b-full-8gpu-vllm").checks if c.what == "rft steps"]
    assert steps.level == "ok" and "21 training tasks" in steps.detail
    assert "round 1: at most 336 rows -> 6 steps" in steps.detail and "round 3: at most 1008 rows -> 16 steps" in steps.detail
    warm = load_train_config("qwen7b-full-8gpu-vllm", {"rft.trl.warmup_steps": 6})
    (steps,) = [c for c in dry_run(warm, "rft", name="x").checks if c.what == "rft steps"]
    assert steps.level == "error" and "rft.trl warmup_steps" in steps.detail
    some = load_train_config("qwen7b-full-8gpu-vllm", {"rft.trl.warmup_steps": 3})
    (steps,) = [c for c in dry_run(some, "rft", name="x").checks if c.what == "rft steps"]
    assert steps.level == "ok" and "fewer than 193 rows ends inside its warmup of 3 steps" in steps.detail


def test_a_multi_turn_prompt_that_does_not_fit_the_generation_context_is_refused_in_one_line(capsys):
    """Prompt budget + history + completion against the vLLM server's --max-model-len."""
    args = ["train", "grpo", "--config", "qwen7b-full-8gpu-vllm", "--dry-run", "--grpo.episode.turns", "2",
            "--no-grpo.roc.enabled"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "8192 + history 6000 + completion 8192 = 22384 tokens" in err[0]
    assert "grpo.episode.history_tokens" in err[0] and "16384" in err[0]
    assert main([*args, "--grpo.max-prompt-tokens", "2048"]) == 0  # 2048 + 6000 + 8192 fits
    assert "grpo context" in capsys.readouterr().out


def test_checkpoints_are_sized_against_the_free_disk_where_they_go(tmp_path, monkeypatch):
    """A model folder trained in full on this machine (use_cpu): its checkpoints' size is the
    weights plus AdamW's state, times those kept at once; more than the free space is an error here,
    a note where the stage does not train."""
    import kernelrl.train.launch as launch
    from kernelrl.tasks.task import Task
    from kernelrl.train.launch import dry_run
    from kernelrl.train.sizing import lora_parameters, model_parameters
    from kernelrl.train.tiny import TinyModelConfig, build_tiny_model

    base = tmp_path / "model"
    task = Task(name="toy/relu", source="class Model: pass\n", level=1)
    build_tiny_model(base, [task], TinyModelConfig(hidden_size=32, layers=2, heads=2))
    params, how = model_parameters(str(base))
    assert params is not None and params > 1000 and "safetensors" in how
    overrides = {"model.path": str(base), "model.tiny": None, "grpo.trl.save_total_limit": 2,
                 "output_dir": str(tmp_path / "out")}
    config = load_train_config("tiny-cpu", overrides)
    (ok,) = [c for c in dry_run(config, "grpo", name="x").checks if c.what == "checkpoints"]
    assert ok.level == "ok" and "3 checkpoint(s) at once" in ok.detail
    monkeypatch.setattr(launch, "free_bytes", lambda folder: (1000, folder))
    (short,) = [c for c in dry_run(config, "grpo", name="x").checks if c.what == "checkpoints"]
    assert short.level == "error" and "grpo.trl save_total_limit" in short.detail
    # the adapter count is peft's own on that model
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=8, target_modules="all-linear"))
    assert lora_parameters(str(base), 8) == sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert model_parameters("Qwen/Qwen2.5-Coder-7B-Instruct")[0] == 7_000_000_000
    assert model_parameters("org/model-without-a-size")[0] is None


def test_the_learning_recipe_builds_a_policy_that_writes_programs(tmp_path):
    """`tiny-cpu-learn`: a decoder of about a million parameters whose tokenizer holds every byte
    and no program; every stage judged under its one [eval] (collect and bench read it too); its
    GRPO prompts draw the shown versions by score."""
    from kernelrl.tasks.suites import load_tasks
    from kernelrl.train.recipe import recipe_values
    from kernelrl.train.tiny import build_tiny_model

    config = load_train_config("tiny-cpu-learn")
    tiny = config.model.tiny
    assert tiny is not None and tiny.program_variants == 0 and tiny.byte_alphabet
    path = build_tiny_model(tmp_path / "base", load_tasks(list(config.tasks)), tiny)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(path).parameters())
    assert 500_000 < params < 5_000_000
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.unk_token_id not in tok("if a != b: c = {'freezing': True}")["input_ids"]
    for command in ("collect", "bench"):
        assert recipe_values(config, command)["eval"] == to_dict(config.eval)
    assert config.grpo.contrast.draw == "score" and config.eval.policy == "strict-pytorch"
