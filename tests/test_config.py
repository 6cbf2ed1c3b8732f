"""Run configs: every shipped config builds, flags override a named config, errors name the key."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kernelrl.checks.policy import PolicyName
from kernelrl.cli import build_parser, search_config
from kernelrl.cli.options import UsageError
from kernelrl.config import (
    CONFIG_DIR,
    ConfigError,
    build,
    config_names,
    load_config,
    with_overrides,
)
from kernelrl.judge.evaluator import EvalConfig
from kernelrl.judge.harness.device import Device
from kernelrl.search.loop import SearchConfig
from kernelrl.tasks.task import Size


@pytest.mark.parametrize("name", config_names())
def test_every_shipped_search_config_builds(name):
    config = load_config(SearchConfig, name, {"db_path": "x.db"})
    assert isinstance(config.eval, EvalConfig) and config.tasks
    assert config.eval.device in set(Device) and config.eval.size in set(Size)


def test_quick_config_sets_the_nested_timing_cap():
    config = load_config(SearchConfig, "quick", {"db_path": "x.db"})
    assert config.eval.timing.max_timing_s == 2.5 and config.proposer == "heuristic"


def _optimize_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["optimize"]


def test_flags_override_the_named_config():
    args = _optimize_parser().parse_args(["--config", "quick", "--db", "r.db", "--policy", "observe", "--size", "full",
                                          "--timing-cap", "3", "--tasks", "a.py", "b.py,c.py",
                                          "--proposer", "openai:m base_url=u temperature=0.5"])
    config = search_config(args)
    assert config.eval.policy is PolicyName.OBSERVE and config.eval.size is Size.FULL
    assert config.eval.timing.max_timing_s == 3.0 and config.tasks == ("a.py", "b.py", "c.py")
    assert config.proposer == "openai:m" and config.proposer_opts == {"base_url": "u", "temperature": 0.5}
    assert config.db_path == Path("r.db")


def test_a_proposers_options_on_the_command_line_go_on_top_of_the_config_files(tmp_path, monkeypatch):
    run = tmp_path / "run.toml"
    run.write_text('proposer = "heuristic"\n[proposer_opts]\ntemperature = 0.2\nmax_tokens = 100\n')
    monkeypatch.setenv("KEY_VAR", "sk-test")
    args = _optimize_parser().parse_args(["--config", str(run), "--db", "r.db", "--tasks", "a.py",
                                          "--proposer", "openai:m temperature=0.9 api_key_env=KEY_VAR"])
    config = search_config(args)
    assert config.proposer_opts == {"temperature": 0.9, "max_tokens": 100, "api_key": "sk-test"}
    for bad in ("openai:m temperature", "openai:m api_key=sk-test", "openai:m api_key_env=UNSET_VAR_X"):
        with pytest.raises(UsageError, match="--proposer"):
            search_config(_optimize_parser().parse_args(["--db", "r.db", "--tasks", "a.py", "--proposer", bad]))


def test_unknown_keys_and_bad_values_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="eval.timing.max_timng_s"):
        build(SearchConfig, {"tasks": ["x"], "db_path": "x.db", "eval": {"timing": {"max_timng_s": 1}}})
    with pytest.raises(ConfigError, match="eval.policy"):
        build(SearchConfig, {"tasks": ["x"], "db_path": "x.db", "eval": {"policy": "lenient"}})
    with pytest.raises(ConfigError, match="budget"):
        build(SearchConfig, {"tasks": ["x"], "db_path": "x.db", "budget": "many"})
    bad = tmp_path / "bad.toml"
    bad.write_text("tasks = [")
    with pytest.raises(ConfigError, match="bad.toml"):
        load_config(SearchConfig, bad)
    with pytest.raises(ConfigError, match="no run config"):
        load_config(SearchConfig, "no-such-config")


def test_overrides_skip_values_not_given():
    assert with_overrides({"a": 1, "eval": {"size": "small"}}, {"eval.size": None, "eval.device": "cpu"}) == {
        "a": 1, "eval": {"size": "small", "device": "cpu"}}
    assert CONFIG_DIR.is_dir()


def test_a_table_override_merges_into_the_table_key_by_key():
    values = {"grpo": {"trl": {"max_steps": 100, "num_generations": 4}}, "eval": {"constants": {"n": 8}}}
    out = with_overrides(values, {"grpo.trl": {"max_steps": 3}, "eval.constants": {"m": 2}})
    assert out == {"grpo": {"trl": {"max_steps": 3, "num_generations": 4}}, "eval": {"constants": {"n": 8, "m": 2}}}
    assert values["grpo"]["trl"]["max_steps"] == 100  # the file's values are copied, never changed
    # a value given for a value is replaced whatever its type; a table where none was is set whole
    assert with_overrides({"a": 1}, {"a": {"x": 1}, "b": {"y": 2}}) == {"a": {"x": 1}, "b": {"y": 2}}
