"""Older records stay auditable under their version, and say which checks they cannot support."""

from __future__ import annotations

import asyncio

import numpy as np

from gradstore.cli import main as gradstore_main
from gradstore.format import Gradient
from gradstore.messages import RECORD_TYPE, RECORD_TYPE_CODECS, RECORD_TYPE_SIGNED
from gradstore.node import LocalNode

from .rounds import COORDINATOR, legacy_round, signed_round


def _grads(n: int) -> list[Gradient]:
    rng = np.random.default_rng(1)
    # float64, so a last-bit difference in the clip factor reaches the output's bits
    return [Gradient({"w": rng.standard_normal((300, 70))}) for _ in range(n)]


def _audit(tmp_path, cid, capsys) -> tuple[int, str]:
    code = gradstore_main(
        ["audit", "round", str(cid), "--local", str(tmp_path), "--coordinator", COORDINATOR.did]
    )
    out, err = capsys.readouterr()
    return code, out + err


def test_old_records_audit_under_their_rules_and_name_the_check_they_lack(tmp_path, capsys):
    grads = _grads(3)
    # input clipping that binds: the norm rule of each version decides the output's bits
    clip = {"clip_input_norm": 100.0}
    round2 = asyncio.run(legacy_round(LocalNode(tmp_path), grads, [3, 4, 5], **clip))
    round3 = asyncio.run(
        legacy_round(LocalNode(tmp_path), grads, [3, 4, 5], codecs=["int8", None, "fp16"], **clip)
    )
    round4 = asyncio.run(signed_round(LocalNode(tmp_path), grads, [3, 4, 5], **clip))
    assert [r.record.type for r in (round2, round3, round4)] == [
        RECORD_TYPE,
        RECORD_TYPE_CODECS,
        RECORD_TYPE_SIGNED,
    ]
    assert round2.record.output != round4.record.output  # the norms were summed differently
    for old in (round2, round3):
        code, text = _audit(tmp_path, old.record_cid, capsys)
        assert code == 0, text
        assert f"a {old.record.type} record: no input-signature check" in text
    code, text = _audit(tmp_path, round4.record_cid, capsys)
    assert code == 0, text
    assert "no input-signature check" not in text and "weights and output" in text
