"""Member reports and next-interval messages: bound to job, run and interval, signed, strict."""

from __future__ import annotations

import pytest

from gradstore.errors import MessageError, Reason
from gradstore.messages.wire import pack_map, unpack_map
from gradstore.population.next import NextInterval, encode_next, verify_next
from gradstore.population.report import MemberReport, encode_report, verify_report

from .helpers import CONTROLLER, MEMBER_KEYS, RUN, ckpt, job, key, report

HP = {"lr": 0.01, "wd": 0.0005}
M0 = MEMBER_KEYS[0].did


def verify(data: bytes, interval: int = 2, **kw: object) -> MemberReport:
    config = job()
    assert config.population is not None
    args: dict[str, object] = {
        "job": "pbt-test",
        "run": RUN,
        "interval": interval,
        "members": config.population.members,
        "params": config.population.params,
        **kw,
    }
    return verify_report(data, **args)[0]  # type: ignore[arg-type]


def test_a_good_report_round_trips() -> None:
    rep = verify(report(M0, 2, 0.75, HP))
    assert (rep.member, rep.interval, rep.score, rep.hparams) == (M0, 2, 0.75, HP)
    assert rep.checkpoint == ckpt(M0, 2)


@pytest.mark.parametrize(
    ("make", "code"),
    [
        (lambda: report(M0, 2, 0.75, HP, run="otherrun99"), Reason.WRONG_RUN),
        (lambda: report(M0, 1, 0.75, HP), Reason.STALE_ROUND),
        (lambda: report(M0, 3, 0.75, HP), Reason.FUTURE_ROUND),
        (lambda: report(M0, 2, 0.75, {"lr": 0.01}), Reason.MALFORMED),
        (lambda: report(M0, 2, 0.75, {"lr": 0.01, "wd": 1}), Reason.MALFORMED),
    ],
    ids=["other-run", "earlier-interval", "later-interval", "missing-hparam", "int-for-range"],
)
def test_replays_and_bad_reports_are_refused(make: object, code: Reason) -> None:
    with pytest.raises(MessageError) as err:
        verify(make())  # type: ignore[operator]
    assert err.value.code is code


def test_a_member_not_on_the_list_is_refused() -> None:
    stranger = key(50)
    rep = MemberReport("pbt-test", RUN, 2, stranger.did, ckpt("x", 2), 0.9, HP, 1)
    with pytest.raises(MessageError) as err:
        verify(encode_report(rep, stranger))
    assert err.value.code is Reason.UNKNOWN_PEER


def test_a_forged_report_is_refused() -> None:
    # another member's key signs a report in M0's name: re-sign the map by hand
    pairs = unpack_map(report(M0, 2, 0.75, HP))[:-1]
    forged = pack_map([*pairs, ("sig", MEMBER_KEYS[1].sign(pack_map(pairs)))])
    with pytest.raises(MessageError) as err:
        verify(forged)
    assert err.value.code is Reason.BAD_SIGNATURE
    # an altered score breaks the member's signature
    good = unpack_map(report(M0, 2, 0.75, HP))
    altered = pack_map([(k, 0.99 if k == "score" else v) for k, v in good])
    with pytest.raises(MessageError) as err:
        verify(altered)
    assert err.value.code is Reason.BAD_SIGNATURE
    with pytest.raises(MessageError) as err:
        encode_report(MemberReport("pbt-test", RUN, 2, M0, ckpt(M0, 2), 0.5, HP, 1), MEMBER_KEYS[1])
    assert err.value.code is Reason.BAD_SIGNATURE


def test_other_job_and_stale_stamp_are_refused() -> None:
    rep = MemberReport("other-job", RUN, 2, M0, ckpt(M0, 2), 0.75, HP, 1_000)
    with pytest.raises(MessageError) as err:
        verify(encode_report(rep, MEMBER_KEYS[0]))
    assert err.value.code is Reason.WRONG_JOB
    with pytest.raises(MessageError) as err:
        verify(report(M0, 2, 0.75, HP), now_ms=1_700_000_500_000, max_skew_ms=120_000)
    assert err.value.code is Reason.CLOCK_SKEW


def test_non_finite_or_integer_scores_are_malformed() -> None:
    for score in (float("nan"), float("inf"), 1):
        with pytest.raises(MessageError) as err:
            MemberReport("pbt-test", RUN, 2, M0, ckpt(M0, 2), score, HP, 1)  # type: ignore[arg-type]
        assert err.value.code is Reason.MALFORMED


def test_next_interval_is_the_controllers() -> None:
    msg = NextInterval("pbt-test", RUN, 1, ckpt("record", 0), 5)
    data = encode_next(msg, CONTROLLER)
    assert verify_next(data, job="pbt-test", controller=CONTROLLER.did) == msg
    with pytest.raises(MessageError) as err:
        verify_next(encode_next(msg, MEMBER_KEYS[0]), job="pbt-test", controller=CONTROLLER.did)
    assert err.value.code is Reason.NOT_COORDINATOR
    with pytest.raises(MessageError) as err:
        verify_next(data, job="other", controller=CONTROLLER.did)
    assert err.value.code is Reason.WRONG_JOB
    with pytest.raises(MessageError, match="exactly after interval 0"):
        NextInterval("pbt-test", RUN, 0, ckpt("record", 0), 5)
