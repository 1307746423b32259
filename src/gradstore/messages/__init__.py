"""Signed messages between peers and coordinators, and the signed round record.

Identities are Ed25519 keys named by ``did:key`` ids; announcements, results
and statuses are canonical msgpack maps with an Ed25519 ``sig``; a round
record is a signed DAG-CBOR node linking a round's inputs, output and the
previous round.
"""

from ..errors import KeyFileError, MessageError
from .didkey import did_from_public_key, public_key_from_did, verify_signature
from .keys import SigningKey
from .record import (
    MAX_RECORD_BYTES,
    RECORD_TYPE,
    RecordExclusion,
    RecordInput,
    RoundRecord,
    aggregate_meta,
    decode_record,
    encode_record,
)
from .schema import Announce, Message, MessageKind, Result, Status
from .signing import MAX_MESSAGE_BYTES, decode_message, encode_message, verify_message

__all__ = [
    "MAX_MESSAGE_BYTES",
    "MAX_RECORD_BYTES",
    "RECORD_TYPE",
    "Announce",
    "KeyFileError",
    "Message",
    "MessageError",
    "MessageKind",
    "RecordExclusion",
    "RecordInput",
    "Result",
    "RoundRecord",
    "SigningKey",
    "Status",
    "aggregate_meta",
    "decode_message",
    "decode_record",
    "did_from_public_key",
    "encode_message",
    "encode_record",
    "public_key_from_did",
    "verify_message",
    "verify_signature",
]
