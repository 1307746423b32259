"""A round shared by coordinators in a two-level tree (``[[groups]]``): each group of peers
has its leaf coordinator, and the job's coordinator (the root) combines the leaves'
partial results (docs/design/multicoord.md, "The tree by peer groups").

Pure: reading the tables and the rules a tree job must keep (every peer in exactly one
group, a linear method accumulated exactly, no steps).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..aggregate.methods import Linear, method_class
from ..messages.schema import JOB_NAME
from ._aggregation import Aggregation, Where

#: At most this many groups per job: the root's record names every group.
MAX_GROUPS: Final = 1024
#: The accumulation a tree job's method must use: partial sums carried exactly.
EXACT: Final = "exact"
_KEYS: Final = {"name", "coordinator", "peers", "quorum"}


@dataclass(frozen=True)
class GroupConfig:
    """One group of a tree job: its name, its leaf coordinator, its peers (job order) and
    how many verified inputs close its round at the deadline."""

    name: str
    coordinator: str
    peers: tuple[str, ...]
    quorum: int


def parse_groups(
    raw: Any,
    where: Where,
    *,
    root: str,
    peers: Sequence[str],
    quorum: int,
) -> tuple[GroupConfig, ...]:
    """Read the ``[[groups]]`` tables: every job peer in exactly one group (an overlap or a
    peer left out is refused, naming it), each group's leaf a did other than the root's and
    other leaves'. ``quorum`` (a group's default: min(rounds.quorum, its peers))."""
    if not isinstance(raw, list) or not raw:
        raise where.err("groups", "must be a non-empty list of tables ([[groups]])")
    if len(raw) > MAX_GROUPS:
        raise where.err("groups", f"lists {len(raw)} groups, more than {MAX_GROUPS}")
    known = set(peers)
    owner: dict[str, str] = {}  # peer -> the group that has it
    groups: list[GroupConfig] = []
    for i, table in enumerate(raw):
        at = f"groups[{i}]."
        where.keys(table, _KEYS, at)
        name = where.req(table, "name", str, at)
        if not JOB_NAME.fullmatch(name):
            raise where.err(at + "name", "must be 1-64 of A-Z a-z 0-9 . _ - (it is in topics)")
        leaf = where.did(where.req(table, "coordinator", str, at), at + "coordinator")
        if leaf == root:
            raise where.err(
                at + "coordinator",
                "is the job's coordinator, the root, which combines the groups: a leaf is "
                "another coordinator",
            )
        listed = where.req(table, "peers", list, at)
        members = tuple(where.did(p, f"{at}peers[{j}]") for j, p in enumerate(listed))
        if not members:
            raise where.err(at + "peers", "lists no peer")
        for peer in members:
            if peer not in known:
                raise where.err(at + "peers", f"{peer} is not one of the job's peers")
            if peer in owner:
                raise where.err(
                    at + "peers", f"{peer} is in group {owner[peer]!r} too: a peer is in one group"
                )
            owner[peer] = name
        g_quorum = where.int_(table.get("quorum", min(quorum, len(members))), at + "quorum", 1)
        if g_quorum > len(members):
            raise where.err(
                at + "quorum", f"{g_quorum} is more than the group's {len(members)} peers"
            )
        for other in groups:
            if other.name == name:
                raise where.err(at + "name", f"{name!r} names another group too")
            if other.coordinator == leaf:
                raise where.err(
                    at + "coordinator", f"{leaf} leads group {other.name!r} too: one group a leaf"
                )
        groups.append(GroupConfig(name, leaf, members, g_quorum))
    missing = [p for p in peers if p not in owner]
    if missing:
        raise where.err("groups", f"puts peer {missing[0]} in no group: every peer is in one")
    return tuple(groups)


def tree_problem(aggregation: Aggregation, raw: Mapping[str, Any]) -> tuple[str, str] | None:
    """Why a job with ``[[groups]]`` cannot run as a tree, as (key, message), or None.

    Only a linear method accumulated exactly gives the flat round's bits from partial sums
    (clipping does not stop it: a leaf clips each of its inputs by its own norm, the root
    the whole output); steps, stages and a population are rounds of another shape."""
    for section in ("steps", "stages", "population"):
        if section in raw:
            return section, (
                "cannot be combined with [[groups]] (a tree by peer groups): not built; "
                "give one or the other"
            )
    if not issubclass(method_class(aggregation.method), Linear):
        return "aggregation.method", (
            f"{aggregation.method!r} cannot be split into exact partial sums: a tree job "
            "([[groups]]) takes a linear method (sum, mean, fedavg, weighted)"
        )
    if aggregation.method_params.get("accumulate") != EXACT:
        return "aggregation.accumulate", (
            'must be "exact" in a tree job ([[groups]]): partial sums are carried exactly, '
            "so the output is the flat round's with the same accumulation, whatever the groups"
        )
    return None
