"""Kubo's answers (JSON, NDJSON, DAG-JSON links, multibase fields) as gradstore values.

An answer that is not what the command returns raises ``NodeError``; an error
item inside a 200 stream raises what ``error_map`` makes of it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

from ....dag.cid import CID
from ....errors import CIDError, KuboCommandError, NodeError
from ...base import NodeIdentity, PubsubMessage
from .error_map import error_from_stream_item, is_stream_error
from .multibase import decode_multibase


def _field(obj: object, key: str, command: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise NodeError(f"kubo {command}: unexpected answer without {key!r}: {str(obj)[:200]}")
    return obj[key]


def parse_cid(value: object, command: str) -> CID:
    """A CID in a Kubo answer: a string or a DAG-JSON link ``{"/": "..."}``."""
    if isinstance(value, dict):
        value = value.get("/")
    if not isinstance(value, str):
        raise NodeError(f"kubo {command}: expected a CID, got {value!r}")
    try:
        return CID.parse(value)
    except CIDError as exc:
        raise NodeError(f"kubo {command}: answered an unusable CID {value!r}: {exc}") from exc


def parse_json(command: str, body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError as exc:
        raise NodeError(f"kubo {command}: answer is not JSON: {body[:200]!r}") from exc


def parse_ndjson(command: str, body: bytes) -> list[Any]:
    """Every JSON value of a newline-delimited answer; an error item raises."""
    items = [parse_json(command, line) for line in body.splitlines() if line.strip()]
    for item in items:
        if is_stream_error(item):
            raise error_from_stream_item(command, item)
    return items


def parse_identity(obj: object) -> NodeIdentity:
    addrs = _field(obj, "Addresses", "id") or []
    return NodeIdentity(
        peer_id=str(_field(obj, "ID", "id")),
        addresses=tuple(str(a) for a in addrs),
        agent_version=str(_field(obj, "AgentVersion", "id")),
    )


def parse_version(obj: object) -> str:
    return str(_field(obj, "Version", "version"))


def parse_block_put(obj: object) -> CID:
    return parse_cid(_field(obj, "Key", "block/put"), "block/put")


def parse_block_stat(obj: object) -> int:
    return int(_field(obj, "Size", "block/stat"))


def parse_pin_ls(obj: object) -> set[CID]:
    keys = _field(obj, "Keys", "pin/ls") or {}
    return {parse_cid(k, "pin/ls") for k in keys}


def parse_pinned_stream(body: bytes) -> set[CID]:
    """The CIDs a ``pin/ls --type=recursive --stream`` answer lists as pinned recursively.

    Kubo answers its arguments in order and stops at the first that is not pinned (the
    error goes in a trailer, or a line of its own): what is listed is all this says."""
    pinned: set[CID] = set()
    for line in body.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and item.get("Type") == "recursive":
            with contextlib.suppress(NodeError):  # not a CID: not listed
                pinned.add(parse_cid(item.get("Cid"), "pin/ls"))
    return pinned


def parse_dag_import(items: Sequence[object]) -> list[CID]:
    """Roots from ``dag/import``'s NDJSON; a root Kubo could not pin raises ``KuboCommandError``."""
    roots: list[CID] = []
    for item in items:
        if not isinstance(item, dict) or "Root" not in item:
            continue  # a Stats line
        root = item["Root"]
        cid = parse_cid(_field(root, "Cid", "dag/import"), "dag/import")
        pin_error = root.get("PinErrorMsg") or ""
        if pin_error:
            raise KuboCommandError("dag/import", f"could not pin root {cid}: {pin_error}")
        roots.append(cid)
    return roots


def parse_guarded_import(items: Sequence[object], guard: CID) -> None:
    """Check ``dag/import``'s NDJSON for a guarded import: only ``guard`` may be unpinnable."""
    for item in items:
        if not isinstance(item, dict) or "Root" not in item:
            continue
        cid = parse_cid(_field(item["Root"], "Cid", "dag/import"), "dag/import")
        if cid != guard:
            raise NodeError(f"kubo dag/import: unexpected root {cid} in the answer")


def parse_dag_put(obj: object) -> CID:
    """The CID ``dag/put`` stored."""
    return parse_cid(_field(obj, "Cid", "dag/put"), "dag/put")


def parse_add(items: Sequence[object]) -> CID:
    """The last ``Hash`` of ``add``'s NDJSON (the root of the single file added)."""
    hashes = [item["Hash"] for item in items if isinstance(item, dict) and "Hash" in item]
    if not hashes:
        raise NodeError("kubo add: answer names no CID")
    return parse_cid(hashes[-1], "add")


def parse_strings(obj: object, command: str) -> list[str]:
    return [str(s) for s in (_field(obj, "Strings", command) or [])]


def parse_swarm_peers(obj: object) -> list[str]:
    return [
        str(_field(p, "Peer", "swarm/peers")) for p in (_field(obj, "Peers", "swarm/peers") or [])
    ]


#: ``routing/findprovs``'s event type of a provider found (Kubo's ``routing.Provider``).
PROVIDER_EVENT = 4


def parse_providers(obj: object) -> list[str]:
    """The provider peer ids of one ``routing/findprovs`` NDJSON event (none for the query's
    other events); an error item raises."""
    if is_stream_error(obj):
        raise error_from_stream_item("routing/findprovs", obj)  # type: ignore[arg-type]
    if not isinstance(obj, dict) or obj.get("Type") != PROVIDER_EVENT:
        return []
    return [str(r["ID"]) for r in obj.get("Responses") or [] if isinstance(r, dict) and "ID" in r]


def parse_pubsub_message(obj: object, topic: str) -> PubsubMessage:
    """One ``pubsub/sub`` NDJSON item: multibase ``data`` and ``seqno``, peer id in ``from``."""
    if is_stream_error(obj):
        raise error_from_stream_item("pubsub/sub", obj)  # type: ignore[arg-type]
    if not isinstance(obj, dict):
        raise NodeError(f"kubo pubsub/sub: unexpected item {str(obj)[:200]}")
    data = obj.get("data")
    seqno = obj.get("seqno")
    return PubsubMessage(
        topic=topic,
        data=decode_multibase(data) if data else b"",
        from_peer=str(obj.get("from", "")),
        seqno=decode_multibase(seqno) if seqno else b"",
    )
