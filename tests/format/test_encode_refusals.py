"""What the encoder refuses, and how meta values are written."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest

from gradstore.errors import InvalidDocumentError
from gradstore.format import Gradient, decode, encode


def _refused(g: Gradient, path: str) -> InvalidDocumentError:
    with pytest.raises(InvalidDocumentError) as info:
        encode(g)
    assert isinstance(info.value, ValueError)
    assert info.value.path == path, info.value
    return info.value


@pytest.mark.parametrize(
    "array",
    [
        np.array([object()], dtype=object),
        np.zeros(2, np.complex64),
        np.zeros(2, np.complex128),
        np.array(["a"]),
        np.array([b"a"]),
        np.zeros(2, "datetime64[s]"),
        np.zeros(2, "timedelta64[s]"),
        np.zeros(2, [("x", "<f4")]),
        np.zeros(2, np.longdouble) if np.dtype(np.longdouble).itemsize > 8 else np.zeros(2, "V8"),
    ],
    ids=lambda a: str(a.dtype),
)
def test_unsupported_dtypes_are_refused(array: np.ndarray) -> None:
    e = _refused(Gradient({"w": array}), "$.tensors[0]")
    assert "not storable" in str(e)


@pytest.mark.parametrize("value", [[1.0, 2.0], 1.5, 3, "x", None, np.ma.masked_array([1.0])])
def test_only_numpy_arrays_and_scalars_are_tensors(value: Any) -> None:
    _refused(Gradient({"a": np.zeros(1), "w": value}), "$.tensors[1]")


@pytest.mark.parametrize("name", ["", 1, b"w", None, "\ud800"])
def test_bad_tensor_names(name: Any) -> None:
    _refused(Gradient({name: np.zeros(1)}), "$.tensors")


def test_tensors_must_be_a_dict() -> None:
    _refused(Gradient([("w", np.zeros(1))]), "$.tensors")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode({"w": np.zeros(1)})  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), np.float32("nan")])
def test_meta_nan_and_infinities_are_refused(value: float) -> None:
    e = _refused(Gradient({}, {"lr": value}), "$.meta.lr")
    assert "finite" in str(e)
    _refused(Gradient({}, {"hist": [1.0, {"x": value}]}), "$.meta.hist[1].x")


@pytest.mark.parametrize(
    ("meta", "path"),
    [
        ({1: "x"}, "$.meta"),
        ({"s": {1, 2}}, "$.meta.s"),
        ({"o": object()}, "$.meta.o"),
        ({"c": 1j}, "$.meta.c"),
        ({"big": 2**64}, "$.meta.big"),
        ({"small": -(2**63) - 1}, "$.meta.small"),
        ({"n": {"k": [np.zeros(2)]}}, "$.meta.n.k[0]"),
        ({"s": "\udc80"}, "$.meta.s"),
        ({"\udc80": 1}, "$.meta"),
    ],
)
def test_meta_values_the_document_cannot_hold(meta: dict[str, Any], path: str) -> None:
    _refused(Gradient({}, meta), path)


def test_meta_must_be_a_dict() -> None:
    _refused(Gradient({}, [1, 2]), "$.meta")  # type: ignore[arg-type]


def test_meta_nesting_is_bounded() -> None:
    deep: Any = 1
    for _ in range(32):  # 32 containers inside meta are allowed, 33 are not
        deep = [deep]
    assert decode(encode(Gradient({}, {"d": deep})).tobytes()).meta == {"d": deep}
    e = _refused(Gradient({}, {"d": [deep]}), "$.meta.d" + "[0]" * 32)
    assert "deeper" in str(e)
    loop: list[Any] = []
    loop.append(loop)
    _refused(Gradient({}, {"loop": loop}), "$.meta.loop" + "[0]" * 32)


def test_meta_is_written_canonically() -> None:
    meta = {
        "z": 1, "a": {"y": [1, 2.5, None, True, b"\x00"], "x": "s"}, "é": -5, "B": 2**64 - 1,
        "f": 0.1, "neg": -(2**63),
    }  # fmt: skip
    raw = encode(Gradient({}, meta)).tobytes()
    expected_meta = msgpack.packb(
        {"B": 2**64 - 1, "a": {"x": "s", "y": [1, 2.5, None, True, b"\x00"]}, "f": 0.1,
         "neg": -(2**63), "z": 1, "é": -5},
        use_bin_type=True,
    )  # fmt: skip
    assert raw[25 : 25 + len(expected_meta)] == expected_meta
    assert decode(raw).meta == meta
    assert list(decode(raw).meta) == ["B", "a", "f", "neg", "z", "é"]


def test_meta_accepts_numpy_scalars_and_tuples_as_their_msgpack_forms() -> None:
    g = Gradient({}, {"n": np.int64(5), "f": np.float32(0.5), "b": np.bool_(True), "t": (1, 2)})
    out = decode(encode(g).tobytes())
    assert out.meta == {"b": True, "f": 0.5, "n": 5, "t": [1, 2]}
    assert type(out.meta["f"]) is float
    assert out == g  # equal: they encode to the same document
    assert encode(out).tobytes() == encode(g).tobytes()


def test_float32_meta_is_written_as_float64() -> None:
    raw = encode(Gradient({}, {"f": np.float32(0.1)})).tobytes()
    assert b"\xca" not in raw[25:]
    assert decode(raw).meta["f"] == float(np.float32(0.1))
