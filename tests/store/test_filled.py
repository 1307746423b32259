"""get's reader/hasher hand-off (``_Filled``): the hasher sees every byte it waits for, is
woken when its leaf is complete rather than at every socket read, and stops the reader."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from gradstore.store._fetch import _Aborted, _Filled


class _CountingCondition(threading.Condition):
    def __init__(self) -> None:
        super().__init__()
        self.notified = 0
        self.waiting = threading.Event()

    def notify_all(self) -> None:
        self.notified += 1
        super().notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)


def _hasher(filled: _Filled, want: int, out: list[Any]) -> threading.Thread:
    thread = threading.Thread(target=lambda: out.append(filled.wait_for(want)), daemon=True)
    thread.start()
    return thread


def test_the_hasher_is_woken_when_its_leaf_is_in_not_at_every_read() -> None:
    filled = _Filled()
    cond = _CountingCondition()
    filled._cond = cond
    got: list[Any] = []
    thread = _hasher(filled, 1 << 20, got)
    assert cond.waiting.wait(10)  # the hasher is waiting
    for pos in range(4096, (1 << 20) + 1, 4096):  # 256 socket reads make up the leaf
        filled.advance(pos)
    thread.join(10)
    assert got == [True]
    assert cond.notified == 1  # the read that completed the leaf


def test_a_reader_that_ends_early_or_an_abort_releases_the_hasher() -> None:
    filled = _Filled()
    got: list[Any] = []
    thread = _hasher(filled, 100, got)
    filled.advance(50)
    filled.end()
    thread.join(10)
    assert got == [False]  # the bytes never came

    filled = _Filled()
    thread = _hasher(filled, 100, got)
    filled.abort()
    thread.join(10)
    assert got == [False, False]
    with pytest.raises(_Aborted):  # the reader stops at its next read
        filled.advance(10)


def test_bytes_already_in_need_no_wait() -> None:
    filled = _Filled()
    filled.advance(200)
    assert filled.wait_for(100) and filled.wait_for(200)
