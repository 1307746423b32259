"""What ``gradstore round status`` makes of what it heard (issue 24, item 3): ``_job_status`` is
pure, so these run without a network on hand-built, verified messages; the Kubo tests with
a real coordinator are in test_round_watch.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gradstore.cli._job_status import JobStatus, job_status, tree_status
from gradstore.dag import CID
from gradstore.dag.cid import RAW
from gradstore.job import JobConfig, parse_job
from gradstore.messages import Result, Status, inline_lists
from gradstore.peer import CoordinatorView

from ..coordinator.harness import key
from ..peer.scripted import RUN, record_cid

COORD = key(100)
A, B, C = sorted(key(i).did for i in range(3))
SINCE = 1_000


def _job(steps: bool = False) -> JobConfig:
    raw: dict[str, object] = {
        "job": "watched",
        "coordinator": COORD.did,
        "peers": [A, B, C],
        "rounds": {"count": 3, "quorum": 2, "deadline_s": 45},
    }
    if steps:
        raw["steps"] = [
            {"name": "head", "tensors": ["fc.*"], "method": "mean"},
            {"name": "body", "tensors": ["conv.*"], "peers": [A, B], "quorum": 1},
        ]
    return parse_job(raw)


def _view(config: JobConfig) -> CoordinatorView:
    return CoordinatorView(config.roster, [s.name for s in config.steps] if config.stepped else [])


def _status(
    config: JobConfig,
    round_: int,
    at: int,
    step: str | None = None,
    *,
    received: Sequence[str] = (),
    verified: Sequence[str] = (),
    refused: Mapping[str, str] | None = None,
    failed: str | None = None,
) -> Status:
    roster, refused = config.roster, refused or {}
    return Status(config.job, RUN, round_, step=step,
                  received=roster.bitmap([*received, *verified]), verified=roster.bitmap(verified),
                  refused=roster.bitmap(refused),
                  reasons=tuple(refused[p] for p in roster.members(roster.bitmap(refused))),
                  sent_at=at, failed=failed)  # fmt: skip


def _result(config: JobConfig, round_: int, at: int, step: str | None = None,
            peers: Sequence[str] = (A, B)) -> Result:  # fmt: skip
    tag = f"{round_}/{step}"
    return Result(config.job, RUN, round_, step=step, cid=str(CID.hash(RAW, tag.encode())),
                  record=str(record_cid(tag)), method="fedavg", peers=config.roster.bitmap(peers),
                  sent_at=at)  # fmt: skip


def _see(view: CoordinatorView, *messages: Status | Result) -> None:
    for m in messages:
        if isinstance(m, Status):
            view.see_status(m, inline_lists(m))
        else:
            view.see_result(m, inline_lists(m))


def test_the_open_round_shows_each_peers_state_verified_of_quorum_and_the_last_result() -> None:
    config = _job()
    view = _view(config)
    _see(
        view,
        _result(config, 0, SINCE + 1),
        _status(config, 1, SINCE + 2, verified=[A], refused={B: "non-finite: tensor 'w'"}),
    )
    status = job_status(config, view, SINCE)
    assert status.to_json() == {
        "job": "watched",
        "coordinator": COORD.did,
        "topic": "gradstore/v1/watched/results",
        "heard": True,
        "silent": False,
        "run": RUN,
        "rounds": 3,
        "complete": False,
        "open": {
            "round": 1,
            "steps": [
                {
                    "step": None,
                    "state": "open",
                    "verified": 1,
                    "expected": 3,
                    "quorum": 2,
                    "deadline_s": 45.0,
                    "deadline_at_ms": None,
                    "failed": None,
                    "output": None,
                    "record": None,
                    "peers": [
                        {"peer": A, "state": "verified", "reason": None},
                        {"peer": B, "state": "refused", "reason": "non-finite: tensor 'w'"},
                        {"peer": C, "state": "absent", "reason": None},
                    ],
                }
            ],
        },
        "last": {
            "round": 0,
            "state": "closed",
            "output": str(CID.hash(RAW, b"0/None")),
            "record": str(record_cid("0/None")),
            "method": "fedavg",
            "peers": 2,
            "reason": None,
        },
    }
    assert status.lines() == [
        f"job watched, run {RUN}: round 1 of 3 open",
        "  1/3 verified, quorum 2, deadline 45 s from the round's first announcement",
        f"    verified  {A}",
        f"    refused   {B}  non-finite: tensor 'w'",
        f"    absent    {C}",
        f"last: round 0 closed, aggregate {CID.hash(RAW, b'0/None')} "
        f"record {record_cid('0/None')} (fedavg, 2 peer(s))",
    ]


def test_what_was_stamped_before_the_command_started_is_not_shown() -> None:
    """A replay (a genuine message stamped earlier) says nothing about now: the live
    coordinator re-sends what holds with a fresh stamp."""
    config = _job()
    view = _view(config)
    _see(view, _status(config, 1, SINCE - 1, failed="replayed: quorum not met"))
    stale = job_status(config, view, SINCE)
    assert not stale.heard and stale.stale and stale.open_round is None
    assert stale.lines() == [
        "job watched: no coordinator heard on gradstore/v1/watched/results within 3 s (heard "
        "only messages stamped before this command started (replays, or this machine's clock "
        "is ahead of the coordinator's))"
    ]
    _see(view, _status(config, 1, SINCE + 5, received=[A]))
    status = job_status(config, view, SINCE)
    assert status.open_round == 1 and status.last is None
    assert [p.state for p in status.steps[0].peers] == ["received", "absent", "absent"]
    assert "replayed" not in "\n".join(status.lines())
    # the same messages, all stamped in time: the failure would show
    assert job_status(config, view, SINCE - 1).last is not None


def test_nothing_heard_says_so() -> None:
    config = _job()
    status = job_status(config, _view(config), SINCE)
    assert status.to_json()["heard"] is False and status.to_json()["open"] is None
    assert status.lines() == [
        "job watched: no coordinator heard on gradstore/v1/watched/results within 3 s (is "
        "`gradstore coordinator` running, and connected to this node?)"
    ]


def test_a_stepped_round_shows_each_step_closed_open_or_failed() -> None:
    config = _job(steps=True)
    view = _view(config)
    _see(
        view,
        _status(config, 0, SINCE + 1, "head", verified=[A, B], refused={C: "too-large: 9 bytes"}),
        _result(config, 0, SINCE + 2, "head", peers=[A, B]),
        _status(config, 0, SINCE + 3, "body", received=[B]),
    )
    status = job_status(config, view, SINCE)
    assert status.open_round == 0 and status.last is None
    head, body = status.to_json()["open"]["steps"]
    assert (head["step"], head["state"], head["verified"], head["expected"]) == (
        "head",
        "closed",
        2,
        3,
    )
    assert head["output"] == str(CID.hash(RAW, b"0/head")) and head["record"] == str(
        record_cid("0/head")
    )
    assert [(p["state"], p["reason"]) for p in head["peers"]] == [
        ("aggregated", None),
        ("aggregated", None),
        ("excluded", "too-large: 9 bytes"),
    ]
    assert (body["state"], body["verified"], body["expected"], body["quorum"]) == ("open", 0, 2, 1)
    assert [p["peer"] for p in body["peers"]] == [A, B]  # the step's own peers
    lines = status.lines()
    assert lines[1].startswith("  step head: closed, 2/3 aggregated, aggregate ")
    assert lines[5] == (
        "  step body: open, 0/2 verified, quorum 1, deadline 45 s from the round's first "
        "announcement"
    )
    # body fails at its deadline; the round closes with head alone
    _see(view, _status(config, 0, SINCE + 4, "body", received=[B], failed="quorum not met"))
    assert status_step(config, view, "body") == ("failed", "quorum not met")
    _see(view, _result(config, 0, SINCE + 5))
    ended = job_status(config, view, SINCE)
    assert ended.open_round is None and ended.last is not None and ended.last.round == 0
    assert ended.lines()[0] == f"job watched, run {RUN}: no round open"


def status_step(config: JobConfig, view: CoordinatorView, step: str) -> tuple[str, str | None]:
    found = next(s for s in job_status(config, view, SINCE).steps if s.step == step)
    return found.state, found.failed


def test_the_job_is_complete_once_its_last_round_ended() -> None:
    config = _job()
    view = _view(config)
    _see(view, _result(config, 1, SINCE + 1), _status(config, 2, SINCE + 2))
    assert not job_status(config, view, SINCE).complete
    _see(view, _status(config, 2, SINCE + 3, failed="quorum not met: 0 verified of 2 needed"))
    done: JobStatus = job_status(config, view, SINCE)
    assert done.complete and done.open_round is None
    assert done.lines() == [
        f"job watched, run {RUN}: complete (3 round(s))",
        "last: round 2 failed: quorum not met: 0 verified of 2 needed",
    ]


LEAF_A, LEAF_B = key(110), key(111)
D = key(3).did


def _tree() -> JobConfig:
    """A tree job: group a (peers A, B; leaf A) and b (C, D; leaf B), each closing with 2."""
    return parse_job(
        {
            "job": "watched",
            "coordinator": COORD.did,
            "peers": [A, B, C, D],
            "aggregation": {"method": "fedavg", "accumulate": "exact"},
            "rounds": {"count": 1, "quorum": 4, "deadline_s": 45},
            "groups": [
                {"name": "a", "coordinator": LEAF_A.did, "peers": [A, B]},
                {"name": "b", "coordinator": LEAF_B.did, "peers": [C, D]},
            ],
        }
    )


def _tree_views(config: JobConfig) -> tuple[CoordinatorView, dict[str, CoordinatorView]]:
    leaves = {g.name: _view(config.group_view(g.name)) for g in config.groups}
    return _view(config), leaves


def test_a_tree_jobs_open_round_shows_each_group_as_its_leaf_says_it() -> None:
    config = _tree()
    a, b = config.group_view("a"), config.group_view("b")
    root, leaves = _tree_views(config)
    _see(root, _status(config, 0, SINCE + 1))  # the root admits nothing: empty lists
    _see(leaves["a"], _status(a, 0, SINCE + 2, verified=[A, B]), _result(a, 0, SINCE + 3))
    _see(leaves["b"], _status(b, 0, SINCE + 4, verified=[C]))
    status = tree_status(config, root, leaves, SINCE)
    assert status.open_round == 0
    got = [(s.step, s.leaf, s.state, s.verified, s.expected, s.heard_at_ms) for s in status.steps]
    assert got == [
        ("a", LEAF_A.did, "closed", 2, 2, SINCE + 3),
        ("b", LEAF_B.did, "open", 1, 2, SINCE + 4),
    ]
    lines = "\n".join(status.lines())
    assert f"group a (leaf {LEAF_A.did}): closed, 2/2 aggregated, partial " in lines, lines
    assert f"group b (leaf {LEAF_B.did}): open, 1/2 verified, quorum 2" in lines, lines
    groups = status.to_json()["open"]["groups"]
    assert [(g["group"], g["leaf"], g["state"]) for g in groups] == [
        ("a", LEAF_A.did, "closed"),
        ("b", LEAF_B.did, "open"),
    ]
    assert groups[0]["record"] == str(record_cid("0/None"))
    # a leaf that says its group failed: failed, with its reason
    _see(
        leaves["b"], _status(b, 0, SINCE + 5, verified=[C], failed="quorum: 1 of 2 by the deadline")
    )
    failed = tree_status(config, root, leaves, SINCE).steps[1]
    assert (failed.state, failed.failed) == ("failed", "quorum: 1 of 2 by the deadline")


def test_a_tree_jobs_last_round_shows_its_groups_by_the_roots_result() -> None:
    config = _tree()
    a = config.group_view("a")
    root, leaves = _tree_views(config)
    _see(leaves["a"], _status(a, 0, SINCE + 1, verified=[A, B]), _result(a, 0, SINCE + 2))
    # group b's leaf was never heard; the root's result names A and B only
    _see(root, _result(config, 0, SINCE + 3, peers=(A, B)))
    status = tree_status(config, root, leaves, SINCE)
    assert status.open_round is None and status.complete and status.last is not None
    got = [(s.step, s.state, s.verified) for s in status.last.groups]
    assert got == [("a", "closed", 2), ("b", "failed", 0)]
    assert "round's result" in (status.last.groups[1].failed or "")
    assert [g["state"] for g in status.to_json()["last"]["groups"]] == ["closed", "failed"]
    # a group whose peers are in the root's result, its leaf not heard: closed there
    root2, silent = _tree_views(config)
    _see(root2, _result(config, 0, SINCE + 3, peers=(A, C, D)))
    parts = tree_status(config, root2, silent, SINCE).last
    assert parts is not None
    assert [(s.state, s.verified) for s in parts.groups] == [("closed", 1), ("closed", 2)]
    assert [p.state for p in parts.groups[0].peers] == ["aggregated", "excluded"]
    assert "closed, 1/2 aggregated" in "\n".join(tree_status(config, root2, silent, SINCE).lines())
