"""`kernelrl watch`: it serves the database it is given, stops on Ctrl-C, and refuses bad flags with exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from kernelrl.cli import main
from watch_fixtures import fill_search_run

ROOT = Path(__file__).resolve().parents[3]


def test_serves_the_database_and_stops_on_sigint(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    fill_search_run(db)
    proc = subprocess.Popen([sys.executable, "-m", "kernelrl", "watch", "--db", str(db), "--port", "0"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            # Ctrl-C as a terminal delivers it: a runner started in the background
                            # (SIGINT ignored, which children inherit) must not change the outcome.
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = proc.stdout.readline()
        assert line.startswith("kernelrl watch: http://127.0.0.1:"), line + proc.stderr.read()
        url = line.split()[2]
        with urllib.request.urlopen(url + "api/runs", timeout=30) as r:
            runs = json.load(r)["runs"]
        assert [(run["id"], run["kind"], run["candidates"]) for run in runs] == [(1, "search", 8)]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    assert proc.returncode == 130  # the CLI's exit status for an interrupt, as for every command


def test_bad_flags_exit_2(tmp_path: Path, capsys) -> None:
    assert main(["watch", "--db", str(tmp_path), "--port", "0"]) == 2
    assert "is not a file" in capsys.readouterr().err
    assert main(["watch", "--db", str(tmp_path / "x.db"), "--port", "70000"]) == 2
    assert "--port must be in 0-65535" in capsys.readouterr().err
    assert main(["watch", "--db", str(tmp_path / "x.db"), "--host", "203.0.113.1", "--port", "0"]) == 2
    assert "cannot listen on 203.0.113.1:0" in capsys.readouterr().err
