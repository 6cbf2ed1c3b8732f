"""The reward server's settings: one typed config, built from flags or a TOML file.

Guarantees (checked in `ServeConfig.__post_init__`):
- the server never listens on an address other than loopback without a token file, and never
  accepts any Host header (`allowed_hosts` holding `*`) without one;
- `allowed_hosts` holds host names or addresses only (no scheme, port or path), lower case;
- `devices` parses into lanes of one kind, and the evaluator settings follow them (`eval.device`
  is set from the lanes; a conflicting one is an error, never silently replaced);
- every limit is positive, the HTTP limits (`kernelrl.web.http.HttpLimits`) in their ranges,
  and one job always fits the queue (`max_items_per_job <=
  max_pending_items`), so a client that waits long enough is always served.

Does not read the token file (the server does, at start: `kernelrl.web.tokens`) or check that
a GPU exists.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

from kernelrl.judge.eval_config import EvalConfig
from kernelrl.judge.harness.device import Device
from kernelrl.reward import RewardConfig
from kernelrl.serve.backend import BackendKind
from kernelrl.serve.lanes import LaneSpec, lane_config, parse_devices
from kernelrl.web.guard import is_loopback
from kernelrl.web.http import limits_of

_HOST_ENTRY = re.compile(r"^(?:[a-z0-9.-]+|[0-9a-f:.]*:[0-9a-f:.]*)$")  # a DNS name, an IPv4 or an IPv6 address


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8177  # 0: any free port (printed at start)
    token_file: Path | None = None  # clients' bearer tokens, one `NAME TOKEN` per line (mode 0600); required off loopback
    allowed_hosts: tuple[str, ...] = ()  # Host names served besides loopback's and this machine's; "*": any (needs a token)
    devices: tuple[str, ...] = ("cpu",)  # lanes: cpu, or cuda:0,cuda:1,...
    backend: BackendKind = BackendKind.LOCAL
    ray_address: str | None = None  # ray backend: None starts (or joins) a local Ray; "auto" or an address joins
    ray_pool: str = "kernelrl"  # ray backend: actors are named <pool>-lane-<i>, shared by drivers of one cluster
    db_path: Path = Path("kernelrl-serve.db")
    eval: EvalConfig = field(default_factory=EvalConfig)  # evaluator settings of every lane (device from `devices`)
    max_pending_items: int = 4096  # evaluations queued or running; a job past this gets 429
    max_items_per_job: int | None = None  # None: min(1024, max_pending_items)
    max_body_bytes: int = 32 << 20
    max_source_bytes: int = 256 << 10  # one task or candidate source
    max_attempts: int = 3  # a job interrupted (server killed, backend failed) this often ends as task_error
    job_concurrency: int = 0  # jobs handed to the backend at once; 0: one per lane
    retain_days: float | None = None  # finished jobs older than this are removed; None: kept for ever
    # Judge client code in workers less than fully contained (no bubblewrap here): the operator's risk.
    allow_uncontained: bool = False
    watch_db: Path | None = None  # a run database whose pages are served at /watch/, behind the tokens
    watch_session_hours: float = 12.0  # a /watch sign-in lasts this long (or until sign-out or a restart)
    watch_login_attempts: int = 10  # failed /watch sign-ins per minute before every sign-in gets 429
    max_sessions_per_client: int = 1024  # open refinement sessions per client (kernelrl.serve.sessions)
    reward: RewardConfig = field(default_factory=RewardConfig)  # how session turns are paid
    log_level: str = "warning"
    # HTTP limits (kernelrl.web.http): slow or idle connections are closed, bodies are read in bounded time.
    header_timeout_s: float = 10.0  # a request head must arrive whole within this
    body_timeout_s: float = 120.0  # a body must arrive whole within this once its route reads it (408)
    keep_alive_s: float = 5.0  # an idle kept-alive connection is closed after this
    max_connections: int = 512  # open at once (kept below the open-file limit); more are closed at once
    max_header_bytes: int = 16 << 10  # a request head larger than this is refused

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend", BackendKind(self.backend))
        if isinstance(self.devices, str):
            object.__setattr__(self, "devices", (self.devices,))
        lanes = parse_devices(self.devices)  # raises ValueError with the reason
        object.__setattr__(self, "devices", tuple(str(lane) for lane in lanes))
        kind = lanes[0].device
        if self.eval.device_index is not None:
            raise ValueError("eval.device_index is set per lane by devices (cuda:0,cuda:1,...)")
        if self.eval.device is Device.CUDA and kind is not Device.CUDA:
            raise ValueError("eval.device is cuda but devices names CPU lanes")
        object.__setattr__(self, "eval", dataclasses.replace(self.eval, device=kind))
        if self.token_file is not None:
            object.__setattr__(self, "token_file", Path(self.token_file))
        object.__setattr__(self, "db_path", Path(self.db_path))
        if self.watch_db is not None:
            object.__setattr__(self, "watch_db", Path(self.watch_db))
        if not is_loopback(self.host) and self.token_file is None:
            raise ValueError(f"refusing to listen on {self.host} without a token: give a token file "
                             "(only loopback addresses may go without one)")
        hosts = (self.allowed_hosts,) if isinstance(self.allowed_hosts, str) else self.allowed_hosts
        hosts = tuple(h.strip().lower() for entry in hosts for h in entry.split(",") if h.strip())
        object.__setattr__(self, "allowed_hosts", hosts)
        for entry in hosts:
            if entry != "*" and not _HOST_ENTRY.match(entry):
                raise ValueError(f"allowed_hosts: {entry[:100]!r} is not a host name or address (no scheme, port, "
                                 "path or brackets)")
        if "*" in hosts and self.token_file is None:
            raise ValueError("allowed_hosts '*' needs a token file: without one, any web page could reach the "
                             "server through DNS rebinding")
        if self.retain_days is not None and not self.retain_days > 0:
            raise ValueError("retain_days must be positive (or unset: keep every job)")
        if not 0 <= self.port <= 65535:
            raise ValueError("port must be in 0..65535")
        if self.max_items_per_job is None:
            object.__setattr__(self, "max_items_per_job", min(1024, self.max_pending_items))
        for name in ("max_pending_items", "max_items_per_job", "max_body_bytes", "max_source_bytes", "max_attempts",
                     "max_sessions_per_client", "watch_login_attempts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.item_limit > self.max_pending_items:
            raise ValueError("max_items_per_job must be <= max_pending_items (or a full job could never be queued)")
        if self.job_concurrency < 0:
            raise ValueError("job_concurrency must be >= 0 (0: one per lane)")
        if not 0 < self.watch_session_hours <= 24 * 30:
            raise ValueError("watch_session_hours must be in (0, 720]")
        limits_of(self)  # raises ValueError with the reason
        if self.log_level not in ("critical", "error", "warning", "info", "debug", "trace"):
            raise ValueError("log_level must be one of critical, error, warning, info, debug, trace")

    @property
    def item_limit(self) -> int:
        """Items in one job at most (`max_items_per_job`, resolved)."""
        assert self.max_items_per_job is not None, "set in __post_init__"
        return self.max_items_per_job

    @property
    def lanes(self) -> tuple[LaneSpec, ...]:
        return parse_devices(self.devices)

    def lane_configs(self) -> list[EvalConfig]:
        """One evaluator config per lane. On Ray, GPU lanes leave the index to Ray (it sets
        CUDA_VISIBLE_DEVICES for each actor, so each actor's GPU is its first visible one)."""
        if self.backend is BackendKind.RAY:
            return [dataclasses.replace(lane_config(self.eval, lane), device_index=None) for lane in self.lanes]
        return [lane_config(self.eval, lane) for lane in self.lanes]
