"""Flower arrays in and out, the record CID in metrics, custodial dids: no node needed."""

from __future__ import annotations

import io

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from gradstore.coordinator import tensor_infos
from gradstore.dag import CID
from gradstore.errors import CIDError, Reason, RefusedError
from gradstore.flower import (
    RECORD_METRIC,
    ArraysRefused,
    arrays_to_tensors,
    custodial_did,
    record_cid,
    tensors_to_arrays,
)
from gradstore.flower._protocol import cid_metric
from gradstore.format import DEFAULT_LIMITS, Gradient, Limits, encode, read_header


def _npy(value: np.ndarray, *, allow_pickle: bool = False) -> bytes:
    buf = io.BytesIO()
    np.save(buf, value, allow_pickle=allow_pickle)
    return buf.getvalue()


def test_arrays_round_trip_bit_for_bit_in_the_order_given() -> None:
    tensors = {
        "z": np.arange(6, dtype=np.float32).reshape(2, 3),
        "a": np.array([np.nan, -0.0], np.float64),
        "m": np.arange(4, dtype=np.int16),
    }
    record = tensors_to_arrays(tensors, ["m", "z"])
    assert list(record.keys()) == ["m", "z", "a"]
    back = arrays_to_tensors(record, DEFAULT_LIMITS)
    for name, value in tensors.items():
        assert back[name].dtype == value.dtype and back[name].tobytes() == value.tobytes()


@pytest.mark.parametrize(
    ("array", "code"),
    [
        # a pickled object array: np.load(allow_pickle=False) refuses to run it
        (
            Array(
                "object", (2,), "numpy.ndarray", _npy(np.array([1, "x"], object), allow_pickle=True)
            ),
            "malformed",
        ),
        (Array("float32", (3,), "numpy.ndarray", _npy(np.zeros(4, np.float32))), "malformed"),
        (Array("float64", (4,), "numpy.ndarray", _npy(np.zeros(4, np.float32))), "malformed"),
        (Array("float32", (4,), "torch.Tensor", _npy(np.zeros(4, np.float32))), "malformed"),
        (Array("float32", (4,), "numpy.ndarray", b"\x93NUMPY garbage"), "malformed"),
        (Array("complex64", (2,), "numpy.ndarray", _npy(np.zeros(2, np.complex64))), "malformed"),
        (
            Array("float32", (100_000,), "numpy.ndarray", _npy(np.zeros(100_000, np.float32))),
            "too-large",
        ),
    ],
)
def test_hostile_arrays_are_refused_with_a_reason(array: Array, code: str) -> None:
    with pytest.raises(ArraysRefused) as info:
        arrays_to_tensors(ArrayRecord({"w": array}), Limits(max_bytes=100_000))
    assert info.value.reason.startswith(code + ": "), info.value.reason
    # one refusal family: the code as a field, and still the ValueError it always was
    assert isinstance(info.value, RefusedError) and isinstance(info.value, ValueError)
    assert info.value.code is Reason(code)
    assert info.value.reason == f"{code}: {info.value.detail}"


def _header_only(shape: tuple[int, ...], payload: bytes) -> bytes:
    buf = io.BytesIO()
    header = {"descr": "<f4", "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue() + payload


@pytest.mark.parametrize(
    ("shape", "code"),
    [((2**40,), "too-large"), ((1000,), "malformed"), ((1,), "malformed")],
)
def test_a_npy_header_that_lies_about_its_size_allocates_nothing(
    shape: tuple[int, ...], code: str
) -> None:
    lying = Array("float32", shape, "numpy.ndarray", _header_only(shape, b"\0" * 16))
    with pytest.raises(ArraysRefused) as info:
        arrays_to_tensors(ArrayRecord({"w": lying}), DEFAULT_LIMITS)
    assert info.value.reason.startswith(code + ": "), info.value.reason


def test_fortran_order_and_big_endian_arrays_keep_their_values() -> None:
    value = np.arange(12, dtype=np.float32).reshape(3, 4)
    fortran = np.asfortranarray(value)
    big = value.astype(">f4")
    record = ArrayRecord({"f": Array(fortran), "b": Array(big)})
    got = arrays_to_tensors(record, DEFAULT_LIMITS)
    assert got["f"].flags.c_contiguous and np.array_equal(got["f"], value)
    assert np.array_equal(got["b"], value)
    encode(Gradient(got, {}))  # both are storable


def test_tensor_infos_say_what_read_header_says() -> None:
    rng = np.random.default_rng(1)
    tensors = {
        "b": rng.standard_normal((3, 5)).astype(np.float32),
        "c": np.arange(7, dtype=np.int16),
        "ab": np.ones(3, np.float16),
        "big": rng.standard_normal(300_000).astype(np.float32),
    }
    gradient = Gradient(tensors, {"kind": "gradient"})
    document = encode(gradient)
    header = read_header(document.tobytes())
    assert tensor_infos(gradient, document) == {t.name: t for t in header.tensors}


def test_the_record_cid_travels_in_metrics_as_its_bytes() -> None:
    cid = CID.parse("bafyreigx6ypylu4obrpw3jeynrfjwdd6uebk5px3wsw5eksyftycedesti")
    assert record_cid({RECORD_METRIC: cid_metric(cid)}) == cid
    for bad in ({}, {RECORD_METRIC: 3}, {RECORD_METRIC: [1, 300]}, {RECORD_METRIC: [1.0]}):
        with pytest.raises(CIDError):
            record_cid(bad)


def test_custodial_dids_are_stable_per_secret_and_differ_across_nodes_and_runs() -> None:
    a, b = b"a" * 32, b"b" * 32
    assert custodial_did(a, 5) == custodial_did(a, 5)
    assert len({custodial_did(a, 5), custodial_did(a, 6), custodial_did(b, 5)}) == 3
