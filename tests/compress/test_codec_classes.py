"""Codecs are classes (issue 26): every registered codec has its encoder, its decoder, its
NumPy reference and its spec text; nothing outside the codecs and their encoders branches
on a codec's name; and a new codec is one class plus its encoder.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gradstore
from gradstore.cli._compress_args import SPEC_HELP
from gradstore.compress import compress, compress_array, parse_spec
from gradstore.compress.encoders import ENCODERS, Encoder, encoder_for
from gradstore.errors import CompressionError
from gradstore.format import (
    CODECS,
    Codec,
    CompressedGradient,
    Gradient,
    decode_any,
    encode,
    read_header,
)
from gradstore.format.codecs import MAX_TEXT, REGISTRY

Array = np.ndarray[Any, Any]
SRC = Path(gradstore.__file__).parent
# Where codec names may be looked at: the codecs themselves and their encoders.
OWN = ("format/codecs/", "compress/encoders/")


def _sample(n: int = 70_000) -> Array:
    """Over numba's threshold, with a short last block or chunk."""
    return np.random.default_rng(26).standard_normal(n).astype(np.float32)


def test_the_registry_is_the_codecs_in_the_order_the_design_lists_them() -> None:
    assert CODECS == ("bf16", "fp16", "int8", "topk")
    assert tuple(REGISTRY) == CODECS
    assert all(REGISTRY[name].name == name for name in CODECS)


@pytest.mark.parametrize("name", CODECS)
def test_every_codec_has_its_encoder_decoder_reference_and_spec_text(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls = REGISTRY[name]
    # its own layout, payload checks and decompression (not the base's NotImplementedError)
    for method in ("from_spec", "record_nbytes", "validate", "finite", "read"):
        assert getattr(cls, method) is not getattr(Codec, method), (name, method)
    assert cls.group is not Codec.group
    if cls.sparse:
        assert cls.entries is not Codec.entries
    # its spec text: in the command line's help, and a spec that builds it
    assert cls.spec_help.split(":")[0].split("[")[0] == name
    assert cls.spec_help in SPEC_HELP, f"--compress help does not show {cls.spec_help}"
    codec = parse_spec(cls.spec_example)
    assert type(codec) is cls and len(name) <= MAX_TEXT
    assert parse_spec(str(codec)) == codec  # its text is a spec of itself
    assert Codec.from_fields(codec.fields()) == codec == Codec(**codec.fields())
    # its encoder, with its NumPy reference: the same bytes, compiled or not
    encoder = ENCODERS[cls]
    assert encoder_for(codec) is encoder and encoder.codec is cls
    assert type(encoder).reference is not Encoder.reference
    x = _sample()
    monkeypatch.setenv("GRADSTORE_NUMBA", "1")
    fast = encoder.encode(codec, x, "x")
    assert fast.tobytes() == encoder.reference(codec, x, "x").tobytes()
    # its decoder: the payload passes its own checks and reads back, range by range
    t = compress_array(x, codec, "x")
    assert t.payload.tobytes() == fast.tobytes()
    t.check()
    whole = t.decompress()
    assert t.is_finite() and np.isfinite(whole).all()
    assert np.abs(whole - x).max() <= np.abs(x).max()
    assert np.array_equal(t.read(1000, 5000), whole[1000:5000])
    if cls.sparse:
        positions, values = t.sparse(1000, 5000)
        dense = np.zeros(4000)
        dense[positions] = values
        assert np.array_equal(dense, whole[1000:5000])
    else:
        with pytest.raises(ValueError, match="not a sparse codec"):
            t.sparse(0, 10)


def _name_lookups(tree: ast.AST, names: set[str]) -> Iterator[tuple[int, str]]:
    """Where a codec name is compared, matched, or used as a key: the ``if name ==`` ladder."""
    for node in ast.walk(tree):
        found: list[ast.expr] = []
        if isinstance(node, ast.Compare):
            found = [node.left, *node.comparators]
            for side in list(found):
                if isinstance(side, ast.Tuple | ast.List | ast.Set):
                    found += side.elts
        elif isinstance(node, ast.Dict):
            found = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Subscript):
            found = [node.slice]
        elif isinstance(node, ast.MatchValue):
            found = [node.value]
        for expr in found:
            if isinstance(expr, ast.Constant) and expr.value in names:
                yield expr.lineno, expr.value


def test_nothing_outside_the_codecs_and_their_encoders_branches_on_a_codec_name() -> None:
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        where = path.relative_to(SRC).as_posix()
        if where.startswith(OWN):
            continue
        for line, name in _name_lookups(ast.parse(path.read_text()), set(CODECS)):
            wrong.append(f"{where}:{line} looks at codec {name!r}")
    assert not wrong, "\n".join(wrong)


def test_the_name_check_sees_a_ladder() -> None:
    ladder = (
        "if codec.name == 'topk':\n    x = {'int8': 1}['int8']\nelif n in ('bf16', 'q'):\n    pass"
    )
    assert sorted(_name_lookups(ast.parse(ladder), set(CODECS))) == [
        (1, "topk"), (2, "int8"), (2, "int8"), (3, "bf16"),
    ]  # fmt: skip


@pytest.fixture
def fp32_codec() -> Iterator[type[Codec]]:
    """A codec that is not gradstore's: float32 values, as a new module would define it."""

    @dataclass(frozen=True)
    class Fp32(Codec):
        name = "fp32"
        spec_help = "fp32"
        spec_example = "fp32"

        @classmethod
        def from_spec(cls, spec: str, argument: str | None, options: Mapping[str, str]) -> Codec:
            return cls()

        @property
        def group(self) -> int:
            return 1

        def record_nbytes(self, length: int) -> int:
            return 4 * length

        def validate(self, payload: Array, count: int, path: str) -> None:
            return

        def finite(self, payload: Array, count: int) -> bool:
            return bool(np.isfinite(payload.view("<f4")).all())

        def read(
            self, buf: Array, count: int, first: int, start: int, stop: int, out: Array
        ) -> Array:
            out[:] = buf[4 * (start - first) : 4 * (stop - first)].view("<f4")
            return out

    class Fp32Encoder(Encoder[Fp32]):
        codec = Fp32

        def reference(self, codec: Fp32, x: Array, what: str) -> Array:
            out: Array = x.astype("<f4").view(np.uint8)
            return out

    registry: Any = REGISTRY
    encoders: Any = ENCODERS
    encoders[Fp32] = Fp32Encoder()
    try:
        yield Fp32
    finally:
        del registry["fp32"], encoders[Fp32]


def test_a_new_codec_is_one_class_and_its_encoder(fp32_codec: type[Codec]) -> None:
    """Nothing else changes: the spec parser, the encoder lookup, the document's writer and
    reader and the header check all find it by its class."""
    g = Gradient({"w": np.arange(5, dtype=np.float32) - 2}, {"r": 1})
    c = compress(g, "fp32")
    assert type(c.codec) is fp32_codec and str(c.codec) == "fp32"
    doc = encode(c).tobytes()
    assert read_header(doc).codec == fp32_codec()
    back = decode_any(doc)
    assert isinstance(back, CompressedGradient) and back == c
    assert back.decompress().tensors["w"].tolist() == [-2.0, -1.0, 0.0, 1.0, 2.0]


def test_a_codec_without_an_encoder_is_refused_by_compress(
    fp32_codec: type[Codec], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(ENCODERS, fp32_codec)  # type: ignore[arg-type]
    with pytest.raises(CompressionError, match="no encoder writes codec fp32"):
        compress({"w": np.ones(3)}, "fp32")


def test_two_codecs_may_not_share_a_name() -> None:
    with pytest.raises(TypeError, match="two codecs are named 'topk'"):

        @dataclass(frozen=True)
        class Other(Codec):
            name = "topk"
