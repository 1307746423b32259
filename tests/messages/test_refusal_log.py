"""Which refused messages get a line of their own (issue 23, R8): the decision, pure,
with its clock in hand. The coordinator's and a peer's wiring: tests/coordinator/test_refusal_log.py.
"""

from __future__ import annotations

import pytest

from gradstore.messages.refusal_log import RefusalLog

PEER = "did:key:z6MkpTHR8VNsBxYAAWHut2Geadd9jSwuBV8xRoAnwWsdvktH"


def test_the_first_refusal_per_reason_and_sender_is_logged_the_rest_summed_up() -> None:
    rl = RefusalLog(every_s=60)
    assert rl.refused("malformed", None, 0.0)
    assert rl.refused("bad-signature", None, 0.1)
    assert rl.refused("stale-round", PEER, 0.2)
    assert not any(rl.refused("malformed", None, 1 + i / 100) for i in range(1200))
    assert not rl.refused("stale-round", PEER, 2.0)
    assert not any(rl.refused("bad-signature", None, 3 + i / 100) for i in range(34))
    assert rl.summary(50.0) is None  # not yet: 60 s from the first one it counts
    assert rl.summary(61.0) == (
        "refused 1235 more messages in the last 60 s: malformed 1200, bad-signature 34, "
        "stale-round 1"
    )
    assert rl.summary(200.0) is None  # counted from zero again, and nothing since
    assert not rl.refused("malformed", None, 300.0)
    assert rl.summary(330.0) is None
    assert rl.summary(360.0) == "refused 1 more message in the last 60 s: malformed 1"


def test_nothing_to_sum_up_is_no_line() -> None:
    rl = RefusalLog(every_s=10)
    assert rl.refused("malformed", None, 0.0) and rl.refused("malformed", PEER, 0.0)
    assert rl.summary(1000.0) is None  # each was logged in full


def test_forged_senders_cannot_grow_the_pairs_or_the_lines() -> None:
    rl = RefusalLog(every_s=60, max_pairs=64)
    logged = sum(rl.refused("stale-round", f"did:key:z{i}", i / 1000) for i in range(100_000))
    assert logged == 64 and rl.remembered == 64
    line = rl.summary(100.0)
    assert line is not None and line.startswith("refused 99936 more messages")


def test_a_refusal_that_goes_on_is_logged_in_full_again_after_it_is_forgotten() -> None:
    rl = RefusalLog(every_s=60, max_pairs=2, remember_s=600)
    assert rl.refused("clock-skew", PEER, 0.0)
    assert rl.refused("malformed", None, 10.0)
    assert not rl.refused("wrong-run", PEER, 20.0)  # full: counted, not remembered
    assert not rl.refused("clock-skew", PEER, 599.0)
    assert rl.refused("clock-skew", PEER, 600.0)  # forgotten: logged again, remembered anew
    assert rl.refused("wrong-run", PEER, 611.0)  # the malformed pair expired: room again
    assert rl.remembered == 2


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        RefusalLog(every_s=0)
    with pytest.raises(ValueError):
        RefusalLog(max_pairs=0)
