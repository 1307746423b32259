"""The public face of gradstore.messages: the names other layers code against."""

from __future__ import annotations

import gradstore.messages as messages

CONTRACT = {
    "SigningKey", "did_from_public_key", "public_key_from_did", "Announce", "Result", "Status",
    "encode_message", "decode_message", "verify_message", "MessageKind", "RoundRecord",
    "RecordInput", "RecordExclusion", "encode_record", "decode_record", "MAX_MESSAGE_BYTES",
}  # fmt: skip


def test_all_holds_the_contract_and_only_importable_names() -> None:
    assert set(messages.__all__) >= CONTRACT
    assert len(set(messages.__all__)) == len(messages.__all__)
    for name in messages.__all__:
        assert hasattr(messages, name), name


def test_limits() -> None:
    assert messages.MAX_MESSAGE_BYTES == 64 * 1024
