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
├── NodeError                         talking to an IPFS node failed
│   ├── NodeUnreachableError          connection refused, DNS failure, ...
│   ├── NodeTimeoutError              the node did not answer in time
│   ├── BlockNotFoundError            the node does not have / cannot find a block
│   └── KuboCommandError              Kubo answered with an error body
├── MessageError (ValueError)         a signed message was refused; carries ``reason``
├── KeyFileError (ValueError)         a key file is missing, too open or not Ed25519
├── AggregationError (ValueError)     inputs an aggregator cannot honestly combine
│   └── TooManyInputsError            more inputs than a method takes in bounded memory
├── CoordinatorError                  a job or round cannot proceed
│   ├── RoundFailedError              the coordinator says a round ended without an aggregate
│   └── UncoveredTensorError          a tensor name no step of the job covers; names the ``tensor``
├── AuditError                        an independent re-check failed; carries the ``check`` name
└── MissingExtraError (ImportError)   an optional extra is needed and not installed; names it
"""

from __future__ import annotations


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


class MessageError(GradstoreError, ValueError):
    """A signed message was refused; ``reason`` is a short machine-readable word."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {message}")


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


class CoordinatorError(GradstoreError):
    """A job or a round cannot proceed (bad config, failed round, ...)."""


class RoundFailedError(CoordinatorError):
    """The coordinator's signed status says round ``round`` failed, for ``reason``."""

    def __init__(self, job: str, round_: int, reason: str) -> None:
        self.round = round_
        self.reason = reason
        super().__init__(f"round {round_} of job {job} failed: {reason}")


class RefusedError(CoordinatorError):
    """The coordinator's signed status says it refused this peer's input for ``round``."""

    def __init__(self, job: str, round_: int, peer: str, reason: str) -> None:
        self.round = round_
        self.peer = peer
        self.reason = reason
        super().__init__(f"round {round_} of job {job}: the coordinator refused: {reason}")


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
        self.extra = extra
        super().__init__(
            f"{what}: install the optional extra {extra!r} (pip install 'gradstore[{extra}]')"
        )
