"""Text from the network made safe to print."""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on escaped (``\\x1b``, ``\\u202e``).

    Errors and listings quote what nodes and peers sent (Kubo's messages, meta keys):
    printed raw, an escape sequence in them would drive the user's terminal.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
