"""The last line of every demo mode: the audit command that re-derives its run, or why
there is none (the node does not outlive the demo)."""

from __future__ import annotations


def audit_line(
    head: object, coordinator: str, reach: str | None, gone: str, *, command: str = "history"
) -> str:
    """``gradstore audit COMMAND HEAD`` pinned to the run's coordinator (or controller) and
    its node; or, when the node goes with the demo, why there is none and how to get one."""
    if reach is not None:
        return f"audit it: gradstore audit {command} {head} --coordinator {coordinator} {reach}"
    return (
        f"audit it: not after the demo exits ({gone}); for a command that works afterwards, "
        "run the demo with --local DIR or against a running Kubo (--api URL)"
    )
