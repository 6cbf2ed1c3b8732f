"""Flags come from config fields: every field has a flag, every flag a field, on every judging command."""

from __future__ import annotations

import argparse

import pytest

from kernelrl.cli import build_parser
from kernelrl.cli.flags import FlagTable, check_tables, flag_paths
from kernelrl.cli.options import EVAL_FLAGS, eval_config
from kernelrl.cli.search import OPTIMIZE_TABLES
from kernelrl.cli.serve import SERVE_TABLES
from kernelrl.cli.train import BENCH_TABLES, COLLECT_TABLES, TRAIN_TABLES
from kernelrl.judge.eval_config import EvalConfig
from kernelrl.plain import field_paths
from kernelrl.search.loop import SearchConfig
from kernelrl.serve.config import ServeConfig
from kernelrl.train.bench import BenchConfig
from kernelrl.train.collect import CollectConfig

# Commands that judge candidates: each takes --config and every evaluator setting.
JUDGING = ("eval", "baseline", "calibrate", "audit", "optimize", "serve", "collect", "bench")
# Commands whose every flag is a config field or a named action.
GENERATED = ("eval", "baseline", "calibrate", "audit", "optimize", "serve", "collect", "bench")


def _sub(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")}


def _tables_cover(config: type, *tables: FlagTable) -> None:
    fields = {t.prefix + p for t in tables for p in [*t.paths(), *t.inline]}
    assert fields == set(field_paths(config)), fields ^ set(field_paths(config))


def test_every_evaluator_field_has_one_flag_and_every_flag_one_field():
    _tables_cover(EvalConfig, EVAL_FLAGS)
    check_tables([EVAL_FLAGS])
    assert flag_paths(EVAL_FLAGS)["--timeout"] == "timeout_s"
    assert flag_paths(EVAL_FLAGS)["--timing.min-rounds"] == "timing.min_rounds"


def test_every_search_and_server_field_has_one_flag_and_every_flag_one_field():
    _tables_cover(SearchConfig, *OPTIMIZE_TABLES)
    check_tables(OPTIMIZE_TABLES)
    _tables_cover(ServeConfig, *SERVE_TABLES)
    check_tables(SERVE_TABLES)


def test_every_collect_and_bench_field_has_one_flag_and_every_flag_one_field():
    _tables_cover(CollectConfig, *COLLECT_TABLES)
    check_tables(COLLECT_TABLES)
    _tables_cover(BenchConfig, *BENCH_TABLES)
    check_tables(BENCH_TABLES)


@pytest.mark.parametrize("command", JUDGING)
def test_every_judging_command_takes_the_config_and_every_evaluator_flag(command):
    flags = _flags(_sub(command))
    assert "--config" in flags
    missing = set(flag_paths(EVAL_FLAGS)) - flags
    assert not missing, missing


@pytest.mark.parametrize("command", GENERATED)
def test_no_flag_of_a_judging_command_lacks_a_field(command):
    tables = {"optimize": OPTIMIZE_TABLES, "serve": SERVE_TABLES, "collect": COLLECT_TABLES,
              "bench": BENCH_TABLES, "train": TRAIN_TABLES}.get(command, (EVAL_FLAGS,))
    known = set(flag_paths(*tables))
    actions = {"--help", "--config", "--recipe", "--json", "--no-compile", "--runs", "--tolerance", "--dynamic", "--only",
               "--limit", "--degeneracy", "--task", "--report", "--html", "--plot"}
    # BooleanOptionalAction adds --no-X beside --X
    extra = {f for f in _flags(_sub(command)) - known - actions if not (f.startswith("--no-") and
                                                                          "--" + f[5:] in known)}
    assert not extra, extra


def test_eval_reads_the_eval_table_of_a_run_config_and_flags_win(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text('tasks = ["x"]\n[eval]\ntimeout_s = 42.0\nn_correctness = 7\n[eval.timing]\nmin_rounds = 9\n')
    args = _sub("eval").parse_args(["t", "c.py", "--config", str(cfg), "--timeout", "5", "--timing.max-rounds", "99",
                                    "--no-roofline", "--constants", "n=8", "m=2"])
    config = eval_config(args)
    assert config.timeout_s == 5.0 and config.n_correctness == 7 and config.timing.min_rounds == 9
    assert config.timing.max_rounds == 99 and config.roofline is False and config.constants == {"n": 8, "m": 2}


def test_a_bad_value_is_a_usage_error_naming_the_key(tmp_path):
    from kernelrl.cli.options import UsageError

    args = _sub("eval").parse_args(["t", "c.py", "--n-correctness", "1"])
    with pytest.raises(UsageError, match="^--n-correctness must be") as refused:  # the flag, not the field
        eval_config(args)
    assert "EvalConfig" not in str(refused.value)
    with pytest.raises(SystemExit):
        _sub("eval").parse_args(["t", "c.py", "--timeout", "soon"])


COMMANDS = ("tasks", "eval", "baseline", "calibrate", "audit", "optimize", "report", "export", "serve", "collect",
            "train", "bench", "watch")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_a_description_and_every_flag_and_argument_a_help(command):
    parser = _sub(command)
    assert parser.description, f"kernelrl {command} -h says nothing of what it does"
    silent = [a.option_strings[0] if a.option_strings else a.dest for a in parser._actions
              if not isinstance(a, argparse._HelpAction) and not a.help]
    assert silent == [], f"kernelrl {command}: no help for {silent}"
    parser.format_help()  # every help string formats ("%" escaped)


def test_a_flags_help_is_its_fields_own_comment():
    from kernelrl.cli.helps import field_docs

    docs = field_docs(SearchConfig)
    assert docs["chains"] == "parallel chains per task"  # a trailing comment
    assert docs["token_budget"].startswith("prompt + completion tokens over the run")  # lines above
    assert docs["eval.timing.call_limit_s"] == "one sample may not take longer than this (a hang)"  # nested config
    text = " ".join(_sub("optimize").format_help().split())
    assert "--chains N parallel chains per task" in text and "--seed N seeds the prompts' random choices" in text


def test_train_stage_help_names_the_stage():
    from kernelrl.cli.train import train_parser

    assert train_parser("grpo").format_usage().startswith("usage: kernelrl train grpo ")
    assert "contrastive GRPO" in (train_parser("grpo").description or "")


ALL_TABLES = {"eval": (EVAL_FLAGS,), "optimize": OPTIMIZE_TABLES, "serve": SERVE_TABLES, "collect": COLLECT_TABLES,
              "bench": BENCH_TABLES, "train": TRAIN_TABLES}


@pytest.mark.parametrize("command", sorted(ALL_TABLES))
def test_no_help_states_a_default_the_config_already_has(command):
    """Defaults are appended from the config (`with_default`): a help text or field comment that
    states the value by hand would drift from the field (one described in words, computed at run
    time, is allowed)."""
    from kernelrl.cli.flags import shown_default
    from kernelrl.cli.helps import field_docs
    from kernelrl.plain import field_defaults

    by_hand = []
    for table in ALL_TABLES[command]:
        docs, defaults = field_docs(table.config), field_defaults(table.config)
        for path in table.paths():
            text = table.helps.get(path) or docs.get(path, "")
            shown = shown_default(defaults.get(path))
            if shown is not None and (f"default {shown}" in text or f"default: {shown}" in text):
                by_hand.append(f"{table.flag_name(path)}: {text}")
    assert by_hand == []


def test_a_flags_help_ends_with_the_fields_default_read_from_the_config():
    text = " ".join(_sub("optimize").format_help().split())
    assert "--chains N parallel chains per task (default 2)" in text
    assert "--timeout SECONDS wall-clock limit for loading and checking one candidate, build excluded (default 300)" \
        in text
    assert "--policy {strict,strict-pytorch,open,observe}" in text and "(default open)" in text
    assert "--fast VALUE [VALUE ...] fast_p thresholds (default 1 1.5 2)" in " ".join(_sub("bench").format_help().split())


def _every_parser():
    from kernelrl.cli.train import train_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        if name != "train":
            yield name, parser
    for stage in ("sft", "rft", "grpo"):
        yield f"train {stage}", train_parser(stage)


def test_every_flag_of_every_command_has_help_a_user_can_act_on():
    """Help text on every listed flag; no "None:" (a setting left unset cannot be typed as None);
    seconds, milliseconds and sizes named as such."""
    missing, none, units = [], [], []
    for name, parser in _every_parser():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            flag = (action.option_strings or [action.dest])[0]
            text = (action.help or "").strip()
            if not text:
                missing.append(f"{name} {flag}")
            if "None:" in text:
                none.append(f"{name} {flag}")
            if flag.endswith(("-s", "-ms", "-gib")) and action.metavar not in ("SECONDS", "MS", "GIB", None):
                units.append(f"{name} {flag} {action.metavar}")
    assert not missing, missing
    assert not none, none
    assert not units, units


def test_a_training_stage_lists_its_own_settings_and_accepts_the_others(capsys):
    from kernelrl.cli.train import train_parser

    grpo = train_parser("grpo").format_help()
    assert "--grpo.roc.enabled" in grpo and "--rft.rounds" not in grpo and "--sft.trl" not in grpo
    rft = train_parser("rft").format_help()
    assert "--sft.data" in rft and "--rft.rounds" in rft and "--grpo.k-shown" not in rft
    args = train_parser("grpo").parse_args(["--config", "tiny-cpu", "--rft.rounds", "3"])
    assert vars(args)["cfg__rft__rounds"] == 3  # accepted: the config is one file for every stage


def test_help_after_config_shows_that_configs_values(capsys):
    from kernelrl.cli import main

    with pytest.raises(SystemExit):
        main(["optimize", "--config", "quick", "--help"])
    quick = capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["optimize", "--help"])
    plain = capsys.readouterr().out
    assert "(default 2)" in quick.split("\n  --budget N", 1)[1][:160]
    assert "(default 8)" in plain.split("\n  --budget N", 1)[1][:160]
    assert "--wall-time SECONDS" in plain


@pytest.mark.parametrize("command", ["optimize", "collect", "bench"])
def test_a_proposers_options_are_given_with_it_on_every_command(command):
    """One syntax: `--proposer "SPEC key=value ..."`; no command has a second flag for options."""
    flags = _flags(_sub(command))
    assert "--proposer" in flags and not [f for f in flags if f.startswith("--proposer-")], flags
