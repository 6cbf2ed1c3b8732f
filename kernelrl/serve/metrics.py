"""The reward server's metrics in the Prometheus text format (version 0.0.4), written directly.

Series (all prefixed `kernelrl_serve_`):
- `queue_items{state}`, `queue_jobs{state}`: evaluations and jobs queued or running now;
  `queue_limit_items`: the bound past which a job gets 429;
- `evaluations_total{status}`: evaluations recorded in the store, by verdict (all time);
- `evaluations_per_hour`: evaluations recorded over the last hour, or since this process
  started when that is shorter, scaled to an hour;
- `jobs_total{state}`: jobs in the store, by state (queued, running, done, failed);
- `rejected_total{reason}`: requests refused by this process (unauthorized, too_large,
  bad_request, key_conflict, queue_full, forbidden_host, forbidden_origin,
  unsupported_media_type);
- `lanes`, `dispatch_busy`, `job_retries_total`, `backend_failures_total`, `up`.

Does not keep history: every value is read from the store or the dispatcher when scraped.
"""

from __future__ import annotations

from collections.abc import Mapping

from kernelrl.backends.api import JobState
from kernelrl.result import Status
from kernelrl.serve.dispatch import DispatchStats
from kernelrl.serve.jobs import StoreStats

PREFIX = "kernelrl_serve_"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REJECT_REASONS = ("unauthorized", "too_large", "bad_request", "key_conflict", "queue_full", "forbidden_host",
                  "forbidden_origin", "unsupported_media_type", "body_timeout", "header_timeout", "connection_limit",
                  "watch_login_failed", "watch_login_limited")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _series(lines: list[str], name: str, kind: str, help_text: str,
            values: Mapping[tuple[tuple[str, str], ...], float]) -> None:
    lines.append(f"# HELP {PREFIX}{name} {help_text}")
    lines.append(f"# TYPE {PREFIX}{name} {kind}")
    for labels, value in values.items():
        text = ",".join(f'{k}="{_label(v)}"' for k, v in labels)
        lines.append(f"{PREFIX}{name}{{{text}}} {value:g}" if text else f"{PREFIX}{name} {value:g}")


def render_metrics(*, store: StoreStats, dispatch: DispatchStats, rejected: Mapping[str, int], lanes: int,
                   queue_limit: int, window_s: float) -> str:
    lines: list[str] = []
    _series(lines, "up", "gauge", "1 while the server runs.", {(): 1})
    _series(lines, "lanes", "gauge", "Evaluation lanes (devices) behind the server.", {(): lanes})
    _series(lines, "queue_items", "gauge", "Evaluations queued or running.",
            {(("state", str(s)),): v for s, v in store.pending_items.items()})
    _series(lines, "queue_jobs", "gauge", "Jobs queued or running.",
            {(("state", str(s)),): store.jobs[s] for s in (JobState.QUEUED, JobState.RUNNING)})
    _series(lines, "queue_limit_items", "gauge", "Evaluations pending past which a job is refused (429).",
            {(): queue_limit})
    statuses = {s.value: 0 for s in Status} | dict(store.by_status)
    _series(lines, "evaluations_total", "counter", "Evaluations recorded, by verdict.",
            {(("status", s),): v for s, v in sorted(statuses.items())})
    per_hour = store.finished_since * 3600.0 / window_s if window_s > 0 else 0.0
    _series(lines, "evaluations_per_hour", "gauge",
            "Evaluations recorded over the last hour (or since start, when shorter), per hour.", {(): per_hour})
    _series(lines, "jobs_total", "gauge", "Jobs in the store, by state.",
            {(("state", str(s)),): v for s, v in store.jobs.items()})
    _series(lines, "rejected_total", "counter", "Requests refused by this process, by reason.",
            {(("reason", r),): rejected.get(r, 0) for r in REJECT_REASONS})
    _series(lines, "dispatch_busy", "gauge", "Dispatcher workers running a job now.", {(): dispatch.busy})
    _series(lines, "job_retries_total", "counter", "Jobs queued again after a backend failure (this process).",
            {(): dispatch.job_retries})
    _series(lines, "backend_failures_total", "counter", "Batches the backend failed (this process).",
            {(): dispatch.backend_failures})
    return "\n".join(lines) + "\n"
