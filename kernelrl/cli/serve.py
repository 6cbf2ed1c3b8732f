"""`kernelrl serve`: the reward server."""

from __future__ import annotations

import argparse
import dataclasses

from kernelrl.cli.flags import FlagTable, add_flags, given_values, user_words
from kernelrl.cli.options import EVAL_FLAGS, UsageError, check_device
from kernelrl.cli.preflight import check_port, check_run_database, check_writable_parent
from kernelrl.config import ConfigError, build
from kernelrl.serve.config import ServeConfig

# `serve`'s flags: every field of ServeConfig (`kernelrl.cli.flags`), the evaluator's under the same
# names as on every judging command.
SERVE_FLAGS = FlagTable(
    config=ServeConfig,
    names={"db_path": "--db", "max_pending_items": "--queue-limit"},
    helps={
        "host": "address to listen on (others need --token-file)",
        "port": "port (0: any free port)",
        "token_file": "clients' bearer tokens, one NAME TOKEN per line (mode 0600, tokens of 32+ characters)",
        "allowed_hosts": "Host names served besides loopback's and this machine's (comma-separated; * any, with a token)",
        "retain_days": "remove finished jobs older than this many days (default: keep every job)",
        "devices": "cpu, or cuda:0,cuda:1,... (one evaluator per device)",
        "db_path": "SQLite job store",
        "backend": "local: evaluators in this process; ray: one Ray actor per device",
        "ray_address": "with --backend ray: auto or ray://HOST:PORT (default: local Ray)",
        "max_pending_items": "evaluations queued or running before 429",
        "allow_uncontained": "judge client code even where workers cannot be fully contained (bubblewrap missing)",
        "watch_db": "a run database whose live pages are served at /watch/ (sign in with a client token)",
        # Fields whose config declares them without a comment (the help belongs there, then here it goes):
        "max_body_bytes": "the largest request body accepted (413 above it)",
        "log_level": "the server's log level (debug, info, warning, error)",
        "reward.mapping": "how a speedup becomes the reward's speed term: log (log speedup) or speedup (the ratio "
                          "itself, as CUDA-L1)",
        "reward.baseline": "speedups against eager or against torch.compile",
        "reward.penalties.flagged": "reward of a refused (flagged) candidate: the lowest of all",
        "reward.penalties.timeout": "reward of a candidate that timed out",
        "reward.penalties.runtime_error": "reward of a candidate that crashed while running",
        "reward.penalties.incorrect": "reward of a candidate whose outputs do not match",
        "reward.penalties.compile_error": "reward of a candidate that does not load or build",
        "reward.length_soft_tokens": "answers longer than this start paying --reward.length-weight",
        "reward.length_max_tokens": "answers this long pay --reward.length-weight in full",
        "reward.smoothing.enabled": "CUDA-L1's clip of raw rewards to a running window's mean +- k std",
    },
    skip=frozenset({"eval"}))
SERVE_TABLES = (SERVE_FLAGS, dataclasses.replace(EVAL_FLAGS, prefix="eval."))


def serve_config(args: argparse.Namespace) -> ServeConfig:
    """The server's `ServeConfig`: the config file, then the flags given on top."""
    try:
        return build(ServeConfig, given_values(args, *SERVE_TABLES))
    except ConfigError as e:
        raise UsageError(user_words(str(e), *SERVE_TABLES)) from e


def cmd_serve(args: argparse.Namespace) -> int:
    from kernelrl.serve.server import StartError, run_server

    config = serve_config(args)
    check_device(config.eval.device)
    if config.watch_db is not None:
        check_run_database(config.watch_db, flag="--watch-db")
    check_writable_parent(config.db_path, flag="--db")
    check_port(config.host, config.port)
    try:
        run_server(config, announce=lambda line: print(line, flush=True))
    except StartError as e:
        raise UsageError(str(e)) from e
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register this module's commands."""
    p = sub.add_parser("serve", help="run the reward server (HTTP) for RL frameworks and remote clients")
    p.add_argument("--config", default=None, help="server config (.toml) whose settings the flags override")
    add_flags(p, *SERVE_TABLES)
    p.set_defaults(func=cmd_serve)
