"""Every exception gradstore raises, in one tree so callers can catch by layer.

GradstoreError
├── FormatError (ValueError)          bytes are not a valid gradstore/1 or /2 document
│   ├── MalformedDocumentError        not well formed; carries the byte ``offset``
│   └── InvalidDocumentError          well formed but wrong; carries a ``path``
├── LimitExceededError (ValueError)   a declared size is over a limit; carries the ``limit`` name
├── CompressionError (ValueError)     a tensor or spec that cannot be compressed as asked
├── CIDError (ValueError)             a CID that cannot be parsed or is outside the profile
├── DAGError (ValueError)             a malformed dag-pb/UnixFS node or CAR stream
├── IntegrityError                    a block does not hash to its CID (names the CID)
├── AssemblyError (ValueError)        step outputs that do not make one model-level document
├── NodeError                         talking to an IPFS node failed
│   ├── NodeUnreachableError          connection refused, DNS failure, ...
│   ├── NodeTimeoutError              the node did not answer in time
│   ├── BlockNotFoundError            the node does not have / cannot find a block
│   ├── KuboCommandError              Kubo answered with an error body
│   └── ClusterError                  IPFS Cluster's REST API answered with an error
│       └── ReplicationError          a pin not on replication_min peers in time (retried)
├── MessageError (ValueError)         a signed message was refused; carries ``code``, ``detail``
├── KeyFileError (ValueError)         a key file is missing, too open or not Ed25519
├── AggregationError (ValueError)     inputs an aggregator cannot honestly combine
│   ├── TooManyInputsError            more inputs than a method takes in bounded memory
│   └── PartialSumError               a leaf's partial sum a root cannot combine; names the ``index``
├── CoordinatorError                  a job or round cannot proceed
│   ├── ConfigError (ValueError)      bad configuration: a job file, a key, a strategy's options
│   │   └── StepError                 a step that is not the job's or the peer's, or lacks a tensor
│   ├── RefusedError                  an input refused; carries ``code``, ``detail``, ``reason``
│   ├── RoundFailedError              the coordinator says a round (or a step) ended without an aggregate
│   └── UncoveredTensorError          a tensor name no step of the job covers; names the ``tensor``
├── AuditError                        an independent re-check failed; carries the ``check`` name
└── MissingExtraError (ImportError)   an optional extra is needed and not installed; names it

Refusals carry their reason as fields: ``code``, a ``Reason`` (what code matches on), and
``detail``, a line for people. The text that logs, statuses and records carry is
``"code: detail"``, as it always was.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """Why an input, an announcement or a message was refused: the code its reason text starts
    with (``"too-large: ..."``). Read one from a text with ``Reason.of``."""

    # the input's document (the round kernel; Flower's arrays)
    TOO_LARGE = "too-large"
    MALFORMED = "malformed"
    INTEGRITY = "integrity"
    SCHEMA_MISMATCH = "schema-mismatch"
    NON_FINITE = "non-finite"
    OUT_OF_RANGE = "out-of-range"
    # the document is not the announced one (binding)
    WRONG_KIND = "wrong-kind"
    WRONG_JOB = "wrong-job"
    WRONG_RUN = "wrong-run"
    WRONG_ROUND = "wrong-round"
    WRONG_PEER = "wrong-peer"
    SAMPLES_MISMATCH = "samples-mismatch"
    UNBOUND = "unbound"
    DUPLICATE_CID = "duplicate-cid"
    # the announcement (admission)
    CLOCK_SKEW = "clock-skew"
    STALE_ROUND = "stale-round"
    FUTURE_ROUND = "future-round"
    CONFLICTING_CID = "conflicting-cid"
    UNKNOWN_STEP = "unknown-step"  # the job has no such step (or has steps, and none named)
    NOT_IN_STEP = "not-in-step"  # the peer is not one of the step's peers
    DUPLICATE = "duplicate"  # not a refusal: an announcement already had, counted
    # the signed message (MessageError)
    BAD_SIGNATURE = "bad-signature"
    UNKNOWN_PEER = "unknown-peer"
    UNKNOWN_TYPE = "unknown-type"
    UNEXPECTED_TYPE = "unexpected-type"
    NOT_COORDINATOR = "not-coordinator"
    # the round
    ABSENT = "absent"  # never announced
    UNAVAILABLE = "unavailable"  # announced, not fetched (in time)
    INTERNAL = "internal"  # verifying it crashed (the text reads "internal error: ...")
    REPLICATION = "replication"  # a step or round failed: its outputs short of replication_min
    # Flower's replies
    CLIENT_ERROR = "client-error"
    IDENTITY = "identity"
    UNSIGNED = "unsigned"
    # a peer's own reading of its coordinator's statuses (never in a status)
    ROUND_FAILED = "round-failed"
    ROUND_OVER = "round-over"
    # no code at all (a status without reasons, a reason cut to nothing)
    REFUSED = "refused"
    # a code this version does not know: a newer coordinator's, or a hostile one's
    UNKNOWN = "unknown"

    @classmethod
    def of(cls, text: str) -> Reason:
        """The code ``text`` starts with (its first word before ``:``); ``REFUSED`` for none,
        ``UNKNOWN`` for a word that is no code. Never raises: the text may be anyone's."""
        word = (text.split(":", 1)[0].split() or [cls.REFUSED.value])[0]
        try:
            return cls(word)
        except ValueError:
            return cls.UNKNOWN


def reason_text(code: Reason, detail: str) -> str:
    """The text a refusal is carried as: ``"code: detail"`` (the code alone without detail)."""
    return f"{code}: {detail}" if detail else code.value


def reason_detail(text: str) -> str:
    """What follows the code in a reason text (``"too-large: 9 MB"`` -> ``"9 MB"``)."""
    return text.partition(":")[2].strip()


class GradstoreError(Exception):
    """Base class of every error gradstore raises on purpose."""


class FormatError(GradstoreError, ValueError):
    """The bytes are not a valid gradstore/1 (or compressed gradstore/2) document."""


class MalformedDocumentError(FormatError):
    """The bytes are not well formed (or not canonical) at ``offset``."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        self.offset = offset
        super().__init__(message if offset is None else f"{message} - at byte {offset}")


class InvalidDocumentError(FormatError):
    """The document is well formed but its content is wrong at ``path`` (e.g. ``$.tensors[3].shape``)."""

    def __init__(self, message: str, path: str | None = None) -> None:
        self.path = path
        super().__init__(message if path is None else f"{message} - at `{path}`")


class LimitExceededError(GradstoreError, ValueError):
    """A declared size (bytes, tensors, rank, elements) is over a limit; ``limit`` names it.

    ``limit`` is the ``format.Limits`` field that refused (``"max_bytes"``, ``"max_rank"``,
    ...; a caller raises the size ones), or a node's fixed bound (``"max_block_bytes"``,
    ``"max_pubsub_bytes"``), so code can tell them apart without reading the message.
    """

    def __init__(self, message: str, limit: str) -> None:
        self.limit = limit
        super().__init__(message)


class CompressionError(GradstoreError, ValueError):
    """A gradient cannot be compressed as asked: a bad spec, a non-float or non-finite
    tensor, a value out of the codec's range, or a residual that does not fit it."""


class CIDError(GradstoreError, ValueError):
    """A CID string or binary CID that cannot be parsed, or that the profile does not allow."""


class DAGError(GradstoreError, ValueError):
    """A malformed dag-pb / UnixFS node, an unexpected block, or a malformed CAR stream."""


class AssemblyError(GradstoreError, ValueError):
    """Step outputs that cannot be assembled into one model-level document: a tensor in two
    of them, or an output that is not a step's aggregate (another kind, compressed, not float)."""


class IntegrityError(GradstoreError):
    """A block's bytes do not hash to its CID: the source served wrong data."""

    def __init__(self, cid: object, message: str | None = None) -> None:
        self.cid = str(cid)
        super().__init__(
            message or f"integrity check failed: block {self.cid} does not match its hash"
        )


class NodeError(GradstoreError):
    """Talking to an IPFS node failed."""


class NodeUnreachableError(NodeError):
    """The node's API could not be reached (connection refused, bad address, ...)."""


class NodeTimeoutError(NodeError):
    """The node did not answer within the timeout."""


class BlockNotFoundError(NodeError):
    """The node does not have the block and could not find it."""

    def __init__(self, cid: object, message: str | None = None) -> None:
        self.cid = str(cid)
        super().__init__(message or f"block not found: {self.cid}")


class KuboCommandError(NodeError):
    """Kubo answered an RPC call with an error (``{"Message","Code","Type"}`` or plain text)."""

    def __init__(
        self, command: str, message: str, code: int | None = None, status: int | None = None
    ) -> None:
        self.command = command
        self.message = message
        self.code = code
        self.status = status
        super().__init__(f"kubo {command}: {message}" + (f" (HTTP {status})" if status else ""))


class ClusterError(NodeError):
    """IPFS Cluster's REST API answered with an error (``status``: its HTTP status)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        self.message = message
        self.status = status
        super().__init__(f"cluster: {message}" + (f" (HTTP {status})" if status else ""))


class ReplicationError(ClusterError):
    """The cluster did not pin a CID on as many peers as ``replication_min`` asks, in time
    (too few peers, or pins failing): transient, so a close retries it (HTTP 503)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 503)


class MessageError(GradstoreError, ValueError):
    """A signed message was refused: ``code`` says why in a word (``reason`` is its former
    name), ``detail`` in a line."""

    def __init__(self, code: Reason, detail: str) -> None:
        self.code = code
        self.reason = code
        self.detail = detail
        super().__init__(reason_text(code, detail))


class KeyFileError(GradstoreError, ValueError):
    """A signing-key file cannot be used: missing, not Ed25519 PEM, too open, or exists."""


class AggregationError(GradstoreError, ValueError):
    """The inputs cannot be aggregated honestly with the requested method and parameters."""


class TooManyInputsError(AggregationError):
    """More inputs (``count``) than ``method`` takes within its memory bound (``bound``):
    Krum's pairwise distances grow with the square of the inputs."""

    def __init__(self, method: str, count: int, bound: int) -> None:
        self.method = method
        self.count = count
        self.bound = bound
        super().__init__(
            f"{method}: {count} inputs are more than the {bound} it takes "
            "(its n x n distance matrices are bounded in memory)"
        )


class PartialSumError(AggregationError):
    """A partial sum (``aggregate.exact_partial``) a root cannot combine: not the layout's
    tensors, a wrong shape or dtype, more components than MAX_PARTIAL_COMPONENTS, or a NaN
    or infinity. ``index`` is the partial's position in the list given."""

    def __init__(self, index: int, detail: str) -> None:
        self.index = index
        self.detail = detail
        super().__init__(f"partial {index}: {detail}")


class CoordinatorError(GradstoreError):
    """A job or a round cannot proceed (bad config, failed round, ...)."""


class ConfigError(CoordinatorError, ValueError):
    """The configuration is wrong: a job file (the message names the file and key), a key
    that is not the job's, a strategy's options. Nothing ran; fix it and start again."""


class StepError(ConfigError):
    """A call or a gradient that does not fit the job's steps: a step the job does not have
    or the peer is not in, a stepped job's publish without a step (or a step in a job
    without steps), or a gradient without one of the step's tensors (``tensor``)."""

    def __init__(self, message: str, step: str | None = None, tensor: str | None = None) -> None:
        self.step = step
        self.tensor = tensor
        super().__init__(message)


class RoundFailedError(CoordinatorError):
    """The coordinator's signed status says round ``round`` (or its ``step``) failed, for
    ``reason``."""

    def __init__(self, job: str, round_: int, reason: str, *, step: str | None = None) -> None:
        self.round = round_
        self.reason = reason
        self.step = step
        what = f"round {round_} of job {job}"
        super().__init__(f"{what if step is None else f'step {step!r} of {what}'} failed: {reason}")


class RefusedError(CoordinatorError):
    """An input that cannot enter its round: ``code`` says why in a word, ``detail`` in a
    line, and ``reason`` is the text logs, statuses and records carry (``"code: detail"``).

    Raised where an input is verified (the round kernel, Flower's strategy), and by a peer
    whose coordinator's signed status refused it: then ``job`` and ``round`` say which, and
    the message says it was the coordinator. ``peer``, ``cid``, ``node_id`` (a Flower
    node) and ``step`` (of a stepped job) are given where they are known.
    """

    def __init__(
        self,
        code: Reason,
        detail: str = "",
        *,
        reason: str | None = None,
        peer: str | None = None,
        round_: int | None = None,
        job: str | None = None,
        cid: object = None,
        node_id: int | None = None,
        step: str | None = None,
    ) -> None:
        self.code = code
        self.detail = detail
        self.reason = reason_text(code, detail) if reason is None else reason
        self.peer = peer
        self.round = round_
        self.job = job
        self.cid = None if cid is None else str(cid)
        self.node_id = node_id
        self.step = step
        if job is not None and round_ is not None:
            where = f"round {round_} of job {job}" + ("" if step is None else f", step {step!r}")
            super().__init__(f"{where}: the coordinator refused: {self.reason}")
        else:
            super().__init__(self.reason)

    @classmethod
    def parse(
        cls,
        reason: str,
        *,
        peer: str | None = None,
        round_: int | None = None,
        job: str | None = None,
        step: str | None = None,
    ) -> RefusedError:
        """The refusal a coordinator's status gives as ``reason``: its code read with
        ``Reason.of`` (``UNKNOWN`` for a code this version does not know), the text kept."""
        return cls(
            Reason.of(reason),
            reason_detail(reason),
            reason=reason,
            peer=peer,
            round_=round_,
            job=job,
            step=step,
        )

    def about(
        self, *, peer: str | None = None, cid: object = None, node_id: int | None = None
    ) -> RefusedError:
        """The same refusal, with what the caller knows of whose input it was."""
        return RefusedError(
            self.code,
            self.detail,
            reason=self.reason,
            peer=peer if peer is not None else self.peer,
            round_=self.round,
            job=self.job,
            cid=cid if cid is not None else self.cid,
            node_id=node_id if node_id is not None else self.node_id,
            step=self.step,
        )


class UncoveredTensorError(CoordinatorError):
    """No step of the job covers the tensor ``tensor``: its gradient cannot be cut into the
    job's steps (``job.StepsPlan.partition``)."""

    def __init__(self, tensor: str) -> None:
        self.tensor = tensor
        super().__init__(f"no step of the job covers tensor {tensor[:200]!r}")


class AuditError(GradstoreError):
    """A verification script's check failed; ``check`` names it (e.g. ``"output-cid"``)."""

    def __init__(self, check: str, message: str) -> None:
        self.check = check
        super().__init__(f"check {check} failed: {message}")


class MissingExtraError(GradstoreError, ImportError):
    """What was asked needs an optional extra that is not installed; ``extra`` names it."""

    def __init__(self, extra: str, what: str) -> None:
        """``extra``: the extra's name, or the names of all that ``what`` needs, joined by commas."""
        self.extra = extra
        names = extra.split(",")
        which = (
            f"extra {extra!r}" if len(names) == 1 else "extras " + " and ".join(map(repr, names))
        )
        super().__init__(f"{what}: install the optional {which} (pip install 'gradstore[{extra}]')")
