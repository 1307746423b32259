"""The coordinator's journal (SQLite): accepted announcements and round outcomes, written
before they are acted on, so a restart resumes the open round and re-publishes the same
results."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CoordinatorError

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
CREATE TABLE IF NOT EXISTS inputs (
    round INTEGER NOT NULL, peer TEXT NOT NULL, cid TEXT NOT NULL,
    num_samples INTEGER NOT NULL, message BLOB NOT NULL,
    state TEXT NOT NULL, reason TEXT, accepted_at REAL NOT NULL,
    PRIMARY KEY (round, peer)
);
"""


@dataclass(frozen=True)
class InputRow:
    """One accepted announcement and what became of it."""

    round: int
    peer: str
    cid: str
    num_samples: int
    state: str
    reason: str | None


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


class Journal:
    """Durable state of one coordinator for one job (one SQLite file)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    # -- identity ----------------------------------------------------------
    def bind(self, job: str, coordinator: str) -> None:
        """Tie the journal to one job and coordinator; refuse to mix jobs in one state dir."""
        for key, value in (("job", job), ("coordinator", coordinator)):
            known = self.get_meta(key)
            if known is None:
                self.set_meta(key, value)
            elif known != value:
                raise CoordinatorError(
                    f"state {self.path} belongs to {key} {known!r}, not {value!r}: use another --state"
                )

    def get_meta(self, key: str) -> Any:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def set_meta(self, key: str, value: Any) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    # -- rounds ------------------------------------------------------------
    def rounds(self) -> list[RoundRow]:
        rows = self._db.execute(
            "SELECT round, opened_at, state, output, record, reason, published FROM rounds ORDER BY round"
        ).fetchall()
        return [RoundRow(r, t, s, o, rec, why, bool(p)) for r, t, s, o, rec, why, p in rows]

    def open_round(self, round_: int, opened_at: float | None = None) -> RoundRow:
        """Open ``round_`` (idempotent: an already open round keeps its opening time)."""
        self._db.execute(
            "INSERT OR IGNORE INTO rounds (round, opened_at, state) VALUES (?, ?, 'open')",
            (round_, time.time() if opened_at is None else opened_at),
        )
        return next(r for r in self.rounds() if r.round == round_)

    def close_round(self, round_: int, output: str, record: str) -> None:
        self._db.execute(
            "UPDATE rounds SET state='closed', output=?, record=? WHERE round=?",
            (output, record, round_),
        )

    def fail_round(self, round_: int, reason: str) -> None:
        self._db.execute(
            "UPDATE rounds SET state='failed', reason=? WHERE round=?", (reason, round_)
        )

    def set_stats(self, round_: int, stats: dict[str, Any]) -> None:
        self._db.execute("UPDATE rounds SET stats=? WHERE round=?", (json.dumps(stats), round_))

    def stats(self, round_: int) -> dict[str, Any] | None:
        row = self._db.execute("SELECT stats FROM rounds WHERE round=?", (round_,)).fetchone()
        return None if row is None or row[0] is None else dict(json.loads(row[0]))

    def mark_published(self, round_: int) -> None:
        self._db.execute("UPDATE rounds SET published=1 WHERE round=?", (round_,))

    # -- inputs ------------------------------------------------------------
    def accept(self, round_: int, peer: str, cid: str, num_samples: int, message: bytes) -> bool:
        """Record an accepted announcement; False if this peer already has one for the round."""
        cur = self._db.execute(
            "INSERT OR IGNORE INTO inputs VALUES (?, ?, ?, ?, ?, 'received', NULL, ?)",
            (round_, peer, cid, num_samples, message, time.time()),
        )
        return cur.rowcount == 1

    def set_input_state(
        self, round_: int, peer: str, state: str, reason: str | None = None
    ) -> None:
        self._db.execute(
            "UPDATE inputs SET state=?, reason=? WHERE round=? AND peer=?",
            (state, reason, round_, peer),
        )

    def inputs(self, round_: int) -> list[InputRow]:
        rows = self._db.execute(
            "SELECT round, peer, cid, num_samples, state, reason FROM inputs WHERE round=? ORDER BY peer",
            (round_,),
        ).fetchall()
        return [InputRow(*row) for row in rows]

    def input(self, round_: int, peer: str) -> InputRow | None:
        row = self._db.execute(
            "SELECT round, peer, cid, num_samples, state, reason FROM inputs WHERE round=? AND peer=?",
            (round_, peer),
        ).fetchone()
        return None if row is None else InputRow(*row)
