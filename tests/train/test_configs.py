"""Every shipped training config parses and validates; bad settings are errors naming the key."""

from __future__ import annotations

import json

import pytest

from kernelrl.cli import main
from kernelrl.config import ConfigError, config_names, load_toml
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
    assert main(["train", "grpo", "--config", "tiny-cpu", "grpo.trl.max_steps=5", "--print-config",
                 "model.lora.r=8"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["grpo"]["trl"]["max_steps"] == 5 and printed["model"]["lora"]["r"] == 8
    assert main(["train", "grpo", "--config", "tiny-cpu", "grpo.trl.num_generation=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "grpo.trl.num_generation" in err[0]
    assert main(["train", "sft", "--config", "no-such-config"]) == 2
    assert "tiny-cpu" in capsys.readouterr().err
    assert main(["train", "grpo", "--config", "tiny-cpu", "not-a-pair"]) == 2


def test_a_config_file_outside_the_folder(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('tasks = ["level1/gelu"]\noutput_dir = "out"\n[model]\npath = "some/model"\n'
                    '[grpo.trl]\nmax_steps = 3\n')
    config = load_train_config(path)
    assert config.database == config.output_dir / "code.db" and config.sft_data.name == "sft.jsonl"
    assert load_toml(path)["model"]["path"] == "some/model"
