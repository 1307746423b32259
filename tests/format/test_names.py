"""Tensor names that would climb out of a folder or drive a terminal are refused both ways.

A hostile peer's names reach ``.npz`` member names (zip paths: ``../../x.npy`` is a
"zip slip") and terminal output (``inspect``), so the encoder never writes them and the
decoder never accepts them; the rule is the same on both sides.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gradstore.errors import InvalidDocumentError
from gradstore.format import Gradient, decode, encode, name_problem, read_header

BAD = {
    "parent": "../../x",
    "inner-parent": "a/../../b",
    "backslash-parent": "..\\..\\x",
    "absolute": "/etc/passwd",
    "absolute-backslash": "\\x",
    "drive": "C:/Windows/x",
    "esc": "w\x1b]0;pwned\x07",
    "csi-c1": "w\x9b31m",
    "newline": "w\nfake line",
    "nul": "w\x00",
    "del": "w\x7f",
    "bidi-override": "w\u202egnp.",
    "bidi-isolate": "w\u2066",
    "line-separator": "w\u2028",
}
GOOD = [
    "layer1.weight",
    "dense/kernel:0",
    "conv1:0",
    "a/b.npy",
    "..x",
    "x..",
    "a/..b/c",
    ".",
    "./x",
    "é/ü",
    "emoji \U0001f600",
    "tab-free name with spaces",
]


@pytest.mark.parametrize("name", BAD.values(), ids=BAD.keys())
def test_the_encoder_refuses_the_name(name: str) -> None:
    with pytest.raises(InvalidDocumentError) as info:
        encode(Gradient({"ok": np.ones(1, np.float32), name: np.ones(2, np.float32)}))
    assert info.value.path == "$.tensors"
    assert repr(name) in str(info.value)  # named, escaped: the message itself is safe to print


@pytest.mark.parametrize("name", BAD.values(), ids=BAD.keys())
def test_the_decoder_refuses_the_name(docs: Any, name: str) -> None:
    # written by msgpack itself, as a hostile peer would: the encoder is not involved
    doc = docs.build(tensors=[docs.tensor(name=name)])
    for read in (read_header, decode):
        with pytest.raises(InvalidDocumentError) as info:
            read(doc)
        assert info.value.path == "$.tensors[0].name"
        assert name_problem(name) in str(info.value)


@pytest.mark.parametrize("name", GOOD)
def test_ordinary_names_round_trip(name: str) -> None:
    assert name_problem(name) is None
    g = Gradient({name: np.arange(3, dtype=np.float32)})
    back = decode(encode(g).tobytes())
    assert list(back.tensors) == [name]


def test_the_reasons_say_what_is_wrong() -> None:
    assert name_problem("../x") == "has a '..' path segment"
    assert name_problem("/x") == "is an absolute path"
    assert name_problem("w\x1b") == "contains the control character U+001B"
    assert name_problem("w\u202e") == "contains the control character U+202E"
