"""`WatchConfig`: whether a run serves its own run page while it goes, and where.

Read from a run config's `[watch]` table and the `--watch.port` / `--watch.host` flags of the
commands that run (`optimize`, `collect`, `bench`, `train`); the run's builder
(`kernelrl.run_parts.build_run`) starts the page and stops it when the run ends. Imports no
runtime: a command prints and checks its settings before anything starts.

Does not serve anything: `kernelrl.web.live.LivePage` does.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WatchConfig"]


@dataclass(frozen=True, kw_only=True)
class WatchConfig:
    # serve this run's page (the pages of `kernelrl watch`) on this port while the run goes; 0: any
    # free port; unset: no page (`kernelrl watch --db` serves one from another terminal)
    port: int | None = None
    host: str = "127.0.0.1"  # the address the page listens on; it has no authentication, so loopback is the safe one

    def __post_init__(self) -> None:
        if self.port is not None and not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0-65535 or None, got {self.port}")
        if not self.host.strip():
            raise ValueError("host must not be empty")
