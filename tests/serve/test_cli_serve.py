"""`kernelrl serve`: flags over a config file, and bad invocations (one line, exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from serve_helpers import TOKEN, FakeBackend

from kernelrl.cli import build_parser, main, serve_config
from kernelrl.judge.harness.device import Device


def test_flags_override_the_config_file(tmp_path: Path) -> None:
    toml = tmp_path / "serve.toml"
    toml.write_text('port = 9000\nmax_pending_items = 64\n[eval]\ntimeout_s = 30.0\nsize = "full"\n')
    args = build_parser().parse_args(["serve", "--config", str(toml), "--port", "0", "--db", str(tmp_path / "x.db"),
                                      "--policy", "strict", "--queue-limit", "128"])
    c = serve_config(args)
    assert (c.port, c.max_pending_items, c.db_path) == (0, 128, tmp_path / "x.db")
    assert (c.eval.timeout_s, str(c.eval.size), str(c.eval.policy), c.eval.device) == (30.0, "full", "strict",
                                                                                         Device.CPU)
    assert (c.allowed_hosts, c.retain_days) == ((), None)


def test_hardening_flags_are_config_fields(tmp_path: Path) -> None:
    toml = tmp_path / "serve.toml"
    toml.write_text('allowed_hosts = ["rewards.internal"]\nretain_days = 30.0\n')
    c = serve_config(build_parser().parse_args(["serve", "--config", str(toml)]))
    assert (c.allowed_hosts, c.retain_days) == (("rewards.internal",), 30.0)
    c = serve_config(build_parser().parse_args(["serve", "--config", str(toml), "--allowed-hosts", "a.lan,b.lan",
                                                "--retain-days", "0.5"]))
    assert (c.allowed_hosts, c.retain_days) == (("a.lan", "b.lan"), 0.5)


@pytest.mark.parametrize(("argv", "message"), [
    (["--host", "0.0.0.0"], "refusing to listen on 0.0.0.0 without a token"),
    (["--devices", "gpu"], "'gpu' is not cpu, cuda or cuda:N"),
    (["--devices", "cpu,cuda:0"], "one kind"),
    (["--token-file", "/nonexistent/token"], "cannot read the token file /nonexistent/token"),
    (["--queue-limit", "0"], "--queue-limit must be at least 1"),
    (["--retain-days", "0"], "--retain-days must be positive"),
    (["--allowed-hosts", "http://a.lan"], "is not a host name"),
    (["--allowed-hosts", "*"], "--allowed-hosts '*' needs a token file"),
])
def test_bad_invocations(argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["serve", "--port", "0", "--db", str(tmp_path / "s.db"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_second_server_on_one_database_is_refused(start_server, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    start_server(FakeBackend(), db_path=tmp_path / "shared.db")
    assert main(["serve", "--port", "0", "--db", str(tmp_path / "shared.db")]) == 2
    assert "another server is using" in capsys.readouterr().err


def test_a_token_file_others_can_read_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    token = tmp_path / "token.txt"
    token.write_text(TOKEN)
    token.chmod(0o644)
    assert main(["serve", "--port", "0", "--db", str(tmp_path / "s.db"), "--token-file", str(token)]) == 2
    err = capsys.readouterr().err
    assert f"chmod 600 {token}" in err and err.count("\n") == 1
    token.write_text("too-short")
    token.chmod(0o600)
    assert main(["serve", "--port", "0", "--db", str(tmp_path / "s.db"), "--token-file", str(token)]) == 2
    assert "at least 32 are needed" in capsys.readouterr().err
