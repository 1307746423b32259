"""Signed messages between peers and coordinators, and the signed round record.

Identities are Ed25519 keys named by ``did:key`` ids; announcements, results
and statuses are canonical msgpack maps with an Ed25519 ``sig``; a round
record is a signed DAG-CBOR node linking a round's inputs, output and the
previous round. In a stepped job, messages name their step, each step has its
own signed step record, and a round/5 record links the steps' records.
"""

from ..errors import KeyFileError, MessageError
from .didkey import did_from_public_key, public_key_from_did, verify_signature
from .keys import SigningKey
from .lists import (
    INLINE_BYTES,
    LISTS_TYPE,
    PeerLists,
    decode_lists,
    encode_fitted,
    inline_lists,
    shorten,
)
from .record import (
    MAX_RECORD_BYTES,
    RECORD_TYPE,
    RECORD_TYPE_CODECS,
    RECORD_TYPE_SIGNED,
    RECORD_TYPES,
    RecordExclusion,
    RecordInput,
    RoundRecord,
    aggregate_meta,
    decode_record,
    encode_record,
)
from .roster import Roster
from .schema import MAX_REASON_BYTES, Announce, Message, MessageKind, Result, Status
from .signing import (
    MAX_MESSAGE_BYTES,
    announcement_signature,
    announcement_signed,
    check_bitmaps,
    decode_message,
    encode_message,
    verify_message,
)
from .step_record import (
    STEP_RECORD_TYPE,
    StepRecord,
    check_selector,
    decode_step_record,
    encode_step_record,
    step_aggregate_meta,
)
from .stepped_record import (
    MODEL_KIND,
    RECORD_TYPE_STEPPED,
    RoundStep,
    SteppedRoundRecord,
    check_step_of,
    decode_stepped_record,
    encode_stepped_record,
    model_meta,
    record_model_meta,
)
from .tree_record import (
    PARTIAL_KIND,
    PARTIAL_RECORD_TYPE,
    TREE_RECORD_TYPE,
    PartialRecord,
    TreeGroup,
    TreeRecord,
    check_partial_of,
    decode_partial_record,
    decode_tree_record,
    encode_partial_record,
    encode_tree_record,
    partial_meta,
    record_partial_meta,
)

__all__ = [
    "INLINE_BYTES",
    "LISTS_TYPE",
    "MAX_MESSAGE_BYTES",
    "MAX_REASON_BYTES",
    "MAX_RECORD_BYTES",
    "MODEL_KIND",
    "PARTIAL_KIND",
    "PARTIAL_RECORD_TYPE",
    "RECORD_TYPE",
    "RECORD_TYPES",
    "RECORD_TYPE_CODECS",
    "RECORD_TYPE_SIGNED",
    "RECORD_TYPE_STEPPED",
    "STEP_RECORD_TYPE",
    "TREE_RECORD_TYPE",
    "Announce",
    "KeyFileError",
    "Message",
    "MessageError",
    "MessageKind",
    "PartialRecord",
    "PeerLists",
    "RecordExclusion",
    "RecordInput",
    "Result",
    "Roster",
    "RoundRecord",
    "RoundStep",
    "SigningKey",
    "Status",
    "StepRecord",
    "SteppedRoundRecord",
    "TreeGroup",
    "TreeRecord",
    "aggregate_meta",
    "announcement_signature",
    "announcement_signed",
    "check_bitmaps",
    "check_partial_of",
    "check_selector",
    "check_step_of",
    "decode_lists",
    "decode_message",
    "decode_partial_record",
    "decode_record",
    "decode_step_record",
    "decode_stepped_record",
    "decode_tree_record",
    "did_from_public_key",
    "encode_fitted",
    "encode_message",
    "encode_partial_record",
    "encode_record",
    "encode_step_record",
    "encode_stepped_record",
    "encode_tree_record",
    "inline_lists",
    "model_meta",
    "partial_meta",
    "public_key_from_did",
    "record_model_meta",
    "record_partial_meta",
    "shorten",
    "step_aggregate_meta",
    "verify_message",
    "verify_signature",
]
