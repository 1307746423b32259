"""The coordinator's journal (SQLite): accepted announcements and round outcomes, written
before they are acted on, so a restart resumes the open round and re-publishes the same
results.

Writes are queued and committed in batches (``flush``): one transaction, and one fsync,
for every announcement that arrived in the last few milliseconds, instead of one each.
The coordinator acts on an accepted announcement (fetches it, acknowledges it) only once
the batch that holds it is committed. Reads are for recovery and tools; they see only
committed state. Use the journal as a context manager, or call ``close``.

Steps: an input row names its step (``''`` in a job without steps), and a stepped round's
steps each have a row in ``steps`` (closed with their aggregate and step record, or
failed); the round's own row closes with the model-level output and the round/5 record. A
journal written before steps existed (inputs without a step) is migrated when opened: its
inputs become the implicit step's, and it recovers as before.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from base64 import b32encode
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CoordinatorError
from ..messages import announcement_signature
from ..node import Closing

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY,
    opened_at REAL NOT NULL,
    state TEXT NOT NULL,              -- open | closed | failed
    output TEXT, record TEXT, reason TEXT,
    published INTEGER NOT NULL DEFAULT 0,
    stats TEXT                        -- JSON: counts, bytes fetched, seconds per stage
);
CREATE TABLE IF NOT EXISTS steps (
    round INTEGER NOT NULL, step TEXT NOT NULL,
    state TEXT NOT NULL,              -- closed | failed
    output TEXT, record TEXT, reason TEXT,
    published INTEGER NOT NULL DEFAULT 0,
    stats TEXT,
    PRIMARY KEY (round, step)
);
"""

_INPUTS = """
CREATE TABLE IF NOT EXISTS inputs (
    round INTEGER NOT NULL, peer TEXT NOT NULL, cid TEXT NOT NULL,
    num_samples INTEGER NOT NULL, message BLOB NOT NULL,
    state TEXT NOT NULL, reason TEXT, accepted_at REAL NOT NULL,
    step TEXT NOT NULL DEFAULT '',    -- '': the one step of a job without steps
    PRIMARY KEY (round, step, peer)
)
"""

#: The columns of ``inputs`` before steps: a journal written then is migrated when opened.
_INPUTS_V1 = "round, peer, cid, num_samples, message, state, reason, accepted_at"
_INPUT_COLUMNS = f"{_INPUTS_V1.replace('message, ', '')}, step"
#: The journal's schema version (SQLite ``user_version``): 2 has steps.
VERSION = 2


@dataclass(frozen=True)
class InputRow:
    """One accepted announcement and what became of it (``step`` None: a job without steps)."""

    round: int
    peer: str
    cid: str
    num_samples: int
    state: str
    reason: str | None
    accepted_at: float = 0.0
    step: str | None = None


def _input(row: Any) -> InputRow:
    r, peer, cid, num_samples, state, reason, accepted_at, step = row
    return InputRow(r, peer, cid, num_samples, state, reason, accepted_at, step or None)


@dataclass(frozen=True)
class StepRow:
    """How one step of a stepped round ended, as journaled."""

    round: int
    step: str
    state: str  # closed | failed
    output: str | None
    record: str | None
    reason: str | None
    published: bool


@dataclass(frozen=True)
class RoundRow:
    """One round's outcome as journaled."""

    round: int
    opened_at: float
    state: str
    output: str | None
    record: str | None
    reason: str | None
    published: bool


def new_run_id() -> str:
    """A fresh run id: 128 random bits as 26 lowercase base32 characters."""
    return b32encode(secrets.token_bytes(16)).decode("ascii").rstrip("=").lower()


class Journal(Closing):
    """Durable state of one coordinator for one job (one SQLite file)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One connection, used by one thread at a time (the lock): the service commits
        # batches from a worker thread so an fsync never stalls its event loop.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db_lock = threading.Lock()  # the connection: one user at a time
        self._queue_lock = threading.Lock()  # the queue: held for an append or a swap only
        self._pending: list[tuple[str, tuple[Any, ...]]] = []
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            self._migrate()
        except BaseException:
            self._db.close()
            raise

    def _migrate(self) -> None:
        """Make the ``inputs`` table, moving a journal's inputs from before steps into it
        (the implicit step's), in one transaction."""
        columns = [row[1] for row in self._db.execute("PRAGMA table_info(inputs)")]
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if columns and "step" not in columns:  # written before steps existed
                self._db.execute("ALTER TABLE inputs RENAME TO inputs_v1")
                self._db.execute(_INPUTS)
                self._db.execute(
                    f"INSERT INTO inputs ({_INPUTS_V1}, step) "
                    f"SELECT {_INPUTS_V1}, '' FROM inputs_v1"
                )
                self._db.execute("DROP TABLE inputs_v1")
            else:
                self._db.execute(_INPUTS)
            self._db.execute(f"PRAGMA user_version = {VERSION}")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def close(self) -> None:
        """Commit what is queued, then close the file."""
        with self._db_lock:
            try:
                self._commit()
            finally:
                self._db.close()

    # -- batching ----------------------------------------------------------------------
    def _queue(self, sql: str, args: tuple[Any, ...]) -> None:
        with self._queue_lock:
            self._pending.append((sql, args))

    @property
    def pending(self) -> int:
        """Writes queued and not yet committed."""
        return len(self._pending)

    def flush(self) -> int:
        """Commit every queued write in one transaction; return how many there were.

        Safe to call from a worker thread while other threads queue writes.
        """
        with self._db_lock:
            return self._commit()

    def _commit(self) -> int:
        with self._queue_lock:
            batch, self._pending = self._pending, []
        if not batch:
            return 0
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for sql, args in batch:
                self._db.execute(sql, args)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        return len(batch)

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        with self._db_lock:
            return self._db.execute(sql, args).fetchall()

    # -- identity ----------------------------------------------------------------------
    def bind(self, job: str, coordinator: str) -> str:
        """Tie the journal to one job and coordinator and return its run id.

        A state folder holds one run of one job: its run id is drawn on first use and
        kept, so a restart resumes the same run. Refuses to mix jobs in one folder.
        """
        for key, value in (("job", job), ("coordinator", coordinator)):
            known = self.get_meta(key)
            if known is None:
                self.set_meta(key, value)
            elif known != value:
                raise CoordinatorError(
                    f"state {self.path} belongs to {key} {known!r}, not {value!r}: use another --state"
                )
        run = self.get_meta("run")
        if not isinstance(run, str):
            run = new_run_id()
            self.set_meta("run", run)
        return run

    def get_meta(self, key: str) -> Any:
        rows = self._read("SELECT value FROM meta WHERE key=?", (key,))
        return None if not rows else json.loads(rows[0][0])

    def set_meta(self, key: str, value: Any) -> None:
        """Write one meta value now (not batched)."""
        self._queue("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))
        self.flush()

    # -- rounds ------------------------------------------------------------------------
    def rounds(self) -> list[RoundRow]:
        rows = self._read(
            "SELECT round, opened_at, state, output, record, reason, published "
            "FROM rounds ORDER BY round"
        )
        return [RoundRow(r, t, s, o, rec, why, bool(p)) for r, t, s, o, rec, why, p in rows]

    def open_round(self, round_: int, opened_at: float | None = None) -> RoundRow:
        """Open ``round_`` now (idempotent: an already open round keeps its opening time)."""
        self._queue(
            "INSERT OR IGNORE INTO rounds (round, opened_at, state) VALUES (?, ?, 'open')",
            (round_, time.time() if opened_at is None else opened_at),
        )
        self.flush()
        return next(r for r in self.rounds() if r.round == round_)

    def close_round(self, round_: int, output: str, record: str) -> None:
        self._queue(
            "UPDATE rounds SET state='closed', output=?, record=? WHERE round=?",
            (output, record, round_),
        )

    def fail_round(self, round_: int, reason: str) -> None:
        self._queue("UPDATE rounds SET state='failed', reason=? WHERE round=?", (reason, round_))

    def set_stats(self, round_: int, stats: dict[str, Any]) -> None:
        self._queue("UPDATE rounds SET stats=? WHERE round=?", (json.dumps(stats), round_))

    def stats(self, round_: int) -> dict[str, Any] | None:
        rows = self._read("SELECT stats FROM rounds WHERE round=?", (round_,))
        return None if not rows or rows[0][0] is None else dict(json.loads(rows[0][0]))

    def mark_published(self, round_: int) -> None:
        self._queue("UPDATE rounds SET published=1 WHERE round=?", (round_,))

    # -- inputs ------------------------------------------------------------------------
    def accept(
        self,
        round_: int,
        peer: str,
        cid: str,
        num_samples: int,
        message: bytes,
        *,
        step: str | None = None,
    ) -> None:
        """Queue an accepted announcement (the first one of a peer for a round, and step,
        wins)."""
        self._queue(
            f"INSERT OR IGNORE INTO inputs ({_INPUTS_V1}, step) "
            "VALUES (?, ?, ?, ?, ?, 'received', NULL, ?, ?)",
            (round_, peer, cid, num_samples, message, time.time(), step or ""),
        )

    def set_input_state(
        self,
        round_: int,
        peer: str,
        state: str,
        reason: str | None = None,
        *,
        step: str | None = None,
    ) -> None:
        self._queue(
            "UPDATE inputs SET state=?, reason=? WHERE round=? AND peer=? AND step=?",
            (state, reason, round_, peer, step or ""),
        )

    def inputs(self, round_: int) -> list[InputRow]:
        """The inputs of ``round_`` (of every step), by peer."""
        rows = self._read(
            f"SELECT {_INPUT_COLUMNS} FROM inputs WHERE round=? ORDER BY peer, step",
            (round_,),
        )
        return [_input(row) for row in rows]

    def inputs_from(self, round_: int) -> list[InputRow]:
        """Inputs of ``round_`` and every later round, in (round, peer, step) order."""
        rows = self._read(
            f"SELECT {_INPUT_COLUMNS} FROM inputs WHERE round>=? ORDER BY round, peer, step",
            (round_,),
        )
        return [_input(row) for row in rows]

    def message(self, round_: int, peer: str, step: str | None = None) -> bytes | None:
        """The signed announcement accepted for ``peer`` in ``round_`` (in ``step``): its
        wire bytes."""
        rows = self._read(
            "SELECT message FROM inputs WHERE round=? AND peer=? AND step=?",
            (round_, peer, step or ""),
        )
        return None if not rows else bytes(rows[0][0])

    def signatures(
        self, round_: int, peers: Iterable[str], step: str | None = None
    ) -> dict[str, tuple[int, bytes]]:
        """Each peer's signed word for ``round_`` (``step``), ``(sent_at, signature)`` of the
        announcement kept here: the record carries it (peers without one are left out)."""
        out = {}
        for peer in peers:
            data = self.message(round_, peer, step)
            if data is not None:
                ann, sig = announcement_signature(data)
                out[peer] = (ann.sent_at, sig)
        return out

    def input(self, round_: int, peer: str, step: str | None = None) -> InputRow | None:
        rows = self._read(
            f"SELECT {_INPUT_COLUMNS} FROM inputs WHERE round=? AND peer=? AND step=?",
            (round_, peer, step or ""),
        )
        return None if not rows else _input(rows[0])

    # -- steps -------------------------------------------------------------------------
    def close_step(self, round_: int, step: str, output: str, record: str) -> None:
        self._queue(
            "INSERT OR REPLACE INTO steps (round, step, state, output, record) "
            "VALUES (?, ?, 'closed', ?, ?)",
            (round_, step, output, record),
        )

    def fail_step(self, round_: int, step: str, reason: str) -> None:
        self._queue(
            "INSERT OR REPLACE INTO steps (round, step, state, reason) VALUES (?, ?, 'failed', ?)",
            (round_, step, reason),
        )

    def mark_step_published(self, round_: int, step: str) -> None:
        self._queue("UPDATE steps SET published=1 WHERE round=? AND step=?", (round_, step))

    def set_step_stats(self, round_: int, step: str, stats: dict[str, Any]) -> None:
        self._queue(
            "UPDATE steps SET stats=? WHERE round=? AND step=?", (json.dumps(stats), round_, step)
        )

    def steps(self, round_: int) -> list[StepRow]:
        """How each step of ``round_`` that is over ended (by step name)."""
        rows = self._read(
            "SELECT round, step, state, output, record, reason, published FROM steps "
            "WHERE round=? ORDER BY step",
            (round_,),
        )
        return [StepRow(r, s, st, o, rec, why, bool(p)) for r, s, st, o, rec, why, p in rows]

    def step_stats(self, round_: int) -> dict[str, dict[str, Any]]:
        """Each step's stats in ``round_`` (steps without stats are left out)."""
        rows = self._read(
            "SELECT step, stats FROM steps WHERE round=? AND stats IS NOT NULL", (round_,)
        )
        return {step: dict(json.loads(stats)) for step, stats in rows}
