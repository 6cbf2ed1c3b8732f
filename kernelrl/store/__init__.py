"""The run database: every task, candidate, answer, verdict, refused hack and training step of every run.

This package is the only code that knows the run database's tables and SQL: `schema` (tables and
their versions; connections, transactions and migrations are `kernelrl.sqlite`'s), this module's
`Database` (the writer, and the reads of the search, the trainer and the report: the one entry
point callers use), put together from one part per concept, each on the same connection and lock
(`connection`: the file, its lock, transactions and schema check; `runs`: runs and the training
step log; `tasks`: tasks and baselines; `candidates`: candidates, results, findings, the dedup
lookup; `queries`: the reads of prompts and trainers), `steps` (the training step log's table) and
`snapshot` (the watch pages' read-only reads of a file another process is writing).

Storage is one SQLite file in WAL mode. One `Database` object is the single writer of a file: its
methods serialise on a lock, so threads may share it, and every write is one committed
transaction. A process killed with SIGKILL at any point therefore leaves the file holding every
write that returned, and no half rows: a candidate is first written as `proposed` (source,
prompt, raw answer, token counts), and later its result, its findings and its state change to
`evaluated` land together in one transaction.

Guarantees:
- results are stored in full (`EvalResult.to_dict` JSON), with status, speedup and times also as
  columns for queries; `CandidateRecord.result` is the typed `EvalResult`;
- `find_verdict` is the dedup lookup behind `kernelrl.judge.reuse.judged_before` (its key and its
  rule): a source already evaluated for a task (with the same task source, in the key and in the
  task table) under the same evaluator config (its fingerprint: device, size, policy, tolerances,
  correctness sets, timing, limits) has its stored result reused (`store_reused_result`)
  instead of a second evaluation; a result judged under any other setting is not reused;
- an answer without code is stored with a `no_code` result (`EvalResult.no_code`); rows older
  versions stored for one say `compile_error` in the `status` column and read back as `no_code`
  through `EvalResult.from_dict`;
- every refused (flagged) program is kept in the hack-case table with each rule that refused it,
  whatever refused it (static rule, dynamic defence, degenerate task, LLM judge), so prompts and
  trainers can show what not to do (`hack_cases`, `recent_refused`);
- the schema carries a version (`schema.SCHEMA`, migrated by `kernelrl.sqlite`); a file written
  by a newer schema is refused with a clear error, and an older one is brought up to date when
  opened for writing, step by step (a failed step leaves it whole at the version before); opened
  read-only, an older one is refused too (a reader never writes);
- the training step log (`log_step`, `train_steps`) is written through the same connection and
  lock, one transaction per step.

Does not guarantee: safety with two processes writing one file at once (SQLite serialises them,
but the search loop assumes it is the only writer of its run), nor durability against power loss
beyond what SQLite's `synchronous=NORMAL` in WAL mode gives (committed transactions survive a
process crash, the case that matters here).
"""

from __future__ import annotations

from pathlib import Path

from kernelrl.store.queries import CONTRAST_RATIO as CONTRAST_RATIO
from kernelrl.store.queries import PromptQueries
from kernelrl.store.records import CandidateState as CandidateState
from kernelrl.store.records import NewCandidate as NewCandidate
from kernelrl.store.records import RunStatus as RunStatus
from kernelrl.store.runs import RunRows
from kernelrl.store.schema import SCHEMA_VERSION as SCHEMA_VERSION  # the version a file is brought to
from kernelrl.store.schema import DatabaseError as DatabaseError
from kernelrl.store.tasks import TaskRows


class Database(RunRows, TaskRows, PromptQueries):
    """A kernelrl code database file. Use as a context manager or call `close()`.

    Its methods are its parts' (`RunRows`, `TaskRows`, `CandidateRows` through `PromptQueries`), all
    on one connection and lock (`kernelrl.store.connection.Connection`)."""


def open_database(path: str | Path, *, readonly: bool = False) -> Database:
    return Database(path, readonly=readonly)
