"""Error feedback: what is sent plus what is kept sums to the raw updates, round after round."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gradstore.compress import (
    ErrorFeedback,
    load_residual,
    parse_spec,
    save_residual,
    with_feedback,
)
from gradstore.errors import CompressionError
from gradstore.format import Gradient


@pytest.mark.parametrize(
    "spec", ["topk:0.02,values=int8", "topk:0.05,values=2bit", "int8:64", "bf16", "fp16"]
)
def test_sent_plus_residual_is_the_sum_of_the_updates(spec: str) -> None:
    rng = np.random.default_rng(11)
    shapes = {"w": (40, 50), "b": (7,)}
    feedback = ErrorFeedback(spec)
    raw = {n: np.zeros(s) for n, s in shapes.items()}
    sent = {n: np.zeros(s) for n, s in shapes.items()}
    for _ in range(60):
        g = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
        c = feedback.compress(Gradient(g, {"kind": "gradient"}))
        assert c.meta == {"kind": "gradient"}
        for n in shapes:
            assert c.tensors[n].dtype_code == "<f4"  # it stands for the gradient's dtype
            raw[n] += g[n]
            sent[n] += c.tensors[n].decompress()
    assert feedback.residual is not None
    for n in shapes:
        total = sent[n] + feedback.residual[n]
        np.testing.assert_allclose(total, raw[n], rtol=0, atol=1e-12 * (1 + np.abs(raw[n]).max()))
    if spec.startswith("topk"):  # top-k sends a little each round; the rest waits its turn
        assert np.abs(feedback.residual["w"]).max() > 0


def test_the_input_is_not_modified_and_the_residual_is_what_was_left() -> None:
    g = Gradient({"x": np.array([4.0, -1.0, 0.5, 3.0])})
    before = g.tensors["x"].copy()
    c, left = with_feedback(g, "topk:k=2,chunk=4", {"x": np.array([0.0, 0.0, 0.0, 1.5])})
    np.testing.assert_array_equal(g.tensors["x"], before)
    assert c.tensors["x"].decompress().tolist() == [4.0, 0.0, 0.0, 4.5]
    assert left["x"].tolist() == [0.0, -1.0, 0.5, 0.0]


def test_a_residual_that_does_not_fit_is_refused() -> None:
    g = Gradient({"x": np.ones(4)})
    with pytest.raises(CompressionError, match=r"missing \['x'\], extra \['y'\]"):
        with_feedback(g, "int8", {"y": np.ones(4)})
    with pytest.raises(CompressionError, match="shape"):
        with_feedback(g, "int8", {"x": np.ones(5)})
    with pytest.raises(CompressionError, match="only float"):
        with_feedback(Gradient({"i": np.arange(3)}), "int8", None)


def test_residual_files_round_trip_and_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "peer.residual"
    assert load_residual(path) is None
    residual = {"x": np.array([1.0, -2.5]), "y": np.zeros((2, 2))}
    save_residual(path, residual, parse_spec("topk:0.5"))
    back = load_residual(path)
    assert back is not None and back.keys() == residual.keys()
    for n in residual:
        assert back[n].tobytes() == residual[n].tobytes()
    assert [p.name for p in tmp_path.iterdir()] == ["peer.residual"]  # no temporary left
    path.write_bytes(b"\x80")
    with pytest.raises(CompressionError, match="not a residual file"):
        load_residual(path)
    from gradstore.format import encode

    path.write_bytes(encode(Gradient({"x": np.ones(2)}, {"kind": "gradient"})).tobytes())
    with pytest.raises(CompressionError, match="kind 'gradient'"):
        load_residual(path)
