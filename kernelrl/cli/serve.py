"""`kernelrl serve`: the reward server."""

from __future__ import annotations

import argparse
from typing import Any

from kernelrl.checks.policy import PolicyName
from kernelrl.cli.options import (
    BUILD_TIMEOUT_HELP,
    UsageError,
    check_device,
)
from kernelrl.tasks.task import Size

# Every flag of `serve` and the field of `ServeConfig` it sets (dotted: nested configs).
SERVE_FLAGS: dict[str, str] = {
    "host": "host",
    "port": "port",
    "token_file": "token_file",
    "devices": "devices",
    "db": "db_path",
    "backend": "backend",
    "ray_address": "ray_address",
    "size": "eval.size",
    "policy": "eval.policy",
    "timeout": "eval.timeout_s",
    "build_timeout": "eval.build_timeout_s",
    "queue_limit": "max_pending_items",
    "log_level": "log_level",
    "allowed_hosts": "allowed_hosts",
    "retain_days": "retain_days",
}


def serve_config(args: argparse.Namespace) -> Any:
    """The server's `ServeConfig`: the config file, then the flags given on top."""
    from kernelrl.config import ConfigError, build, load_toml, with_overrides
    from kernelrl.serve.config import ServeConfig

    overrides = {field: getattr(args, dest) for dest, field in SERVE_FLAGS.items()}
    try:
        return build(ServeConfig, with_overrides(load_toml(args.config) if args.config else {}, overrides))
    except ConfigError as e:
        raise UsageError(f"bad server configuration: {e}") from e


def cmd_serve(args: argparse.Namespace) -> int:
    from kernelrl.serve.server import StartError, run_server

    config = serve_config(args)
    check_device(config.eval.device)
    try:
        run_server(config, announce=lambda line: print(line, flush=True))
    except StartError as e:
        raise UsageError(str(e)) from e
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register this module's commands."""
    p = sub.add_parser("serve", help="run the reward server (HTTP) for RL frameworks and remote clients")
    p.add_argument("--config", default=None, help="server config (.toml) whose settings the flags override")
    p.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1; others need --token-file)")
    p.add_argument("--port", type=int, default=None, help="port (default 8177; 0: any free port)")
    p.add_argument("--token-file", default=None,
                   help="clients' bearer tokens, one NAME TOKEN per line (mode 0600, tokens of 32+ characters)")
    p.add_argument("--devices", default=None, help="lanes: cpu, or cuda:0,cuda:1,... (one evaluator per device)")
    p.add_argument("--db", default=None, help="SQLite job store (default kernelrl-serve.db)")
    p.add_argument("--backend", choices=("local", "ray"), default=None,
                   help="local: evaluators in this process; ray: one Ray actor per lane")
    p.add_argument("--ray-address", default=None, help="with --backend ray: auto or ray://HOST:PORT (default: local Ray)")
    p.add_argument("--size", choices=tuple(Size), default=None, help="default size of jobs that name none")
    p.add_argument("--policy", choices=tuple(PolicyName), default=None, help="default policy of jobs that name none")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="per-candidate evaluation limit")
    p.add_argument("--build-timeout", type=float, default=None, metavar="SECONDS", help=BUILD_TIMEOUT_HELP)
    p.add_argument("--queue-limit", type=int, default=None, help="evaluations queued or running before 429")
    p.add_argument("--log-level", default=None, choices=("critical", "error", "warning", "info", "debug"))
    p.add_argument("--allowed-hosts", default=None, metavar="NAMES",
                   help="Host names served besides loopback's and this machine's (comma-separated; * any, with a token)")
    p.add_argument("--retain-days", type=float, default=None, metavar="DAYS",
                   help="remove finished jobs older than this (default: keep every job)")
    p.set_defaults(func=cmd_serve)
