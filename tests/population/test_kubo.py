"""One interval on real Kubo daemons: a controller on one, members on another; absent,
unavailable and malformed checkpoints are failed with their reasons and refilled by exploit,
and a copying member fetches the chosen checkpoint by CID, every block verified."""

from __future__ import annotations

import asyncio

import numpy as np

from gradstore.audit import verify_population
from gradstore.dag.cid import CID, RAW
from gradstore.format import Gradient
from gradstore.population.controller import population_topics, run_interval
from gradstore.population.member import fetch_checkpoint, next_state, read_decision
from gradstore.population.next import verify_next
from gradstore.population.report import MemberReport, encode_report
from gradstore.store import GradientStore

from .helpers import CONTROLLER, MEMBER_KEYS, RUN, job


def test_an_interval_fails_lost_and_lying_members_and_refills_them(kubo_factory) -> None:  # type: ignore[no-untyped-def]
    ctrl_daemon, member_daemon = kubo_factory(2, connect=True)
    config = job(6, deadline_s=4.0)
    pop = config.population
    assert pop is not None
    first = pop.first_hparams()
    keys = {k.did: k for k in MEMBER_KEYS[:6]}
    members = list(pop.members)
    reports_topic, next_topic = population_topics(config.job)

    async def go() -> None:
        async with ctrl_daemon.node() as ctrl, member_daemon.node() as carrier:
            store = GradientStore(carrier)
            rng = np.random.default_rng(1)
            weights = {
                m: Gradient({"w": rng.standard_normal((32, 8)).astype(np.float32)}) for m in members
            }
            cids = {m: await store.put(weights[m]) for m in members[:3]}
            cids[members[4]] = CID.hash(RAW, b"a block nobody has")  # unavailable
            cids[members[5]] = await carrier.put_block(
                b"not a gradstore document", RAW
            )  # malformed
            scores = {
                members[0]: 0.9,
                members[1]: 0.5,
                members[2]: 0.1,
                members[4]: 0.95,
                members[5]: 0.99,
            }
            async with ctrl.subscribe(reports_topic) as sub, carrier.subscribe(next_topic) as nexts:
                await carrier.wait_for_topic_peers(reports_topic, 1)
                await ctrl.wait_for_topic_peers(next_topic, 1)
                sent = [
                    encode_report(
                        MemberReport(config.job, RUN, 0, m, cids[m], scores[m], first[m], 1),
                        keys[m],
                    )
                    for m in (members[0], members[1], members[2], members[4], members[5])
                ]  # 3: absent

                async def rebroadcast() -> None:  # as members do until the decision: a busy
                    while True:  # machine's pubsub may drop or delay one publish past 4 s
                        for data in sent:
                            await carrier.publish(reports_topic, data)
                        await asyncio.sleep(1.0)

                repeating = asyncio.create_task(rebroadcast())
                # a replay from another run and a stranger's report are refused on the way
                stale = MemberReport(
                    config.job,
                    "otherrun01",
                    0,
                    members[0],
                    cids[members[0]],
                    1.0,
                    first[members[0]],
                    1,
                )
                await carrier.publish(reports_topic, encode_report(stale, keys[members[0]]))
                result = await run_interval(
                    ctrl,
                    sub,
                    pop,
                    CONTROLLER,
                    job=config.job,
                    run=RUN,
                    interval=0,
                    prev=None,
                    hparams=first,
                    fetch_timeout_s=3.0,
                )
                repeating.cancel()
                announced = verify_next(
                    (await nexts.get(timeout=10)).data, job=config.job, controller=CONTROLLER.did
                )
            rec = result.record
            assert [m.report.member for m in rec.members] == members[:3]
            reasons = {f.member: f.reason.split(":")[0] for f in rec.failed}
            assert reasons == {
                members[3]: "absent",
                members[4]: "unavailable",
                members[5]: "malformed",
            }
            assert any(r.startswith("wrong-run") for r in result.refused)
            # the bottom member and the three failed ones copy the top member's checkpoint
            assert {c.member for c in rec.copies} == {
                members[2],
                members[3],
                members[4],
                members[5],
            }
            assert {c.source for c in rec.copies} == {members[0]}
            assert (announced.interval, announced.record) == (1, result.record_cid)
            # a member reads the decision and fetches the copied checkpoint by CID
            decided = await read_decision(carrier, result.record_cid, controller=CONTROLLER.did)
            state = next_state(decided, members[3])
            assert state.checkpoint == cids[members[0]] and state.source == members[0]
            got = await fetch_checkpoint(store, state.checkpoint)
            np.testing.assert_array_equal(got.tensors["w"], weights[members[0]].tensors["w"])
            # and the record passes the audit
            reports = await verify_population(ctrl, result.record_cid, controller=CONTROLLER.did)
            assert len(reports) == 1

    asyncio.run(go())
