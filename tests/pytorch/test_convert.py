"""gradstore.torch: tensors <-> Gradient for every dtype, sharing memory where it can."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import torch

from gradstore.errors import InvalidDocumentError
from gradstore.format import Gradient, decode, dtype_code, encode
from gradstore.node import KuboDaemon
from gradstore.store import GradientStore
from gradstore.torch import CODES, from_gradient, to_gradient

SEED = 31
DTYPES = list(CODES)


def _random(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Every bit pattern is fair: random bytes reinterpreted (bool: 0/1)."""
    g = torch.Generator().manual_seed(seed)
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (*shape, size), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        return (raw[..., 0] & 1).bool()
    return raw.view(dtype).reshape(shape)


def _bits(t: torch.Tensor) -> bytes:
    flat = t.contiguous().reshape(-1)
    return (flat if t.dtype == torch.bool else flat.view(torch.uint8)).numpy().tobytes()


def _state(dtype: torch.dtype, seed: int = SEED) -> dict[str, torch.Tensor]:
    return {
        "layer.weight": _random(dtype, (7, 5), seed),
        "scalar": _random(dtype, (), seed + 1),
        "empty": _random(dtype, (0, 3), seed + 2),
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_every_dtype_bit_for_bit(dtype: torch.dtype) -> None:
    state = _state(dtype)
    g = to_gradient(state, {"step": 3})
    assert g.meta == {"step": 3}
    for name, t in state.items():
        assert dtype_code(g.tensors[name].dtype) == CODES[dtype]
        assert g.tensors[name].shape == tuple(t.shape)
    for buffer in (encode(g).tobytes(), bytearray(encode(g).tobytes())):
        back = from_gradient(decode(buffer))
        assert list(back) == sorted(state, key=str.encode)  # the document's order
        for name, t in state.items():
            assert back[name].dtype == dtype and back[name].shape == t.shape
            assert _bits(back[name]) == _bits(t), name


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cpu_tensors_are_shared_not_copied(dtype: torch.dtype) -> None:
    t = _random(dtype, (64, 3), SEED)
    array = to_gradient({"t": t}).tensors["t"]
    assert array.ctypes.data == t.data_ptr() and array.nbytes == t.numel() * t.element_size()
    raw = t.view(torch.uint8)
    raw.reshape(-1)[0] ^= 1  # a write through torch is seen by the gradient
    assert array.reshape(-1).view(np.uint8)[0] == raw.reshape(-1)[0].item()
    # back: a writable array (what a store fetch gives) is shared too
    raw = bytearray(encode(Gradient({"t": array})).tobytes())
    decoded = decode(raw).tensors["t"]
    assert decoded.flags.writeable
    back = from_gradient(Gradient({"t": decoded}))["t"]
    assert back.data_ptr() == decoded.ctypes.data


def test_read_only_arrays_are_copied_never_aliased() -> None:
    doc = encode(to_gradient({"w": torch.arange(6, dtype=torch.float32)})).tobytes()
    decoded = decode(doc)  # views of an immutable bytes object
    assert not decoded.tensors["w"].flags.writeable
    back = from_gradient(decoded)["w"]  # no "non-writable array" warning: it is a copy
    back += 1
    assert decoded.tensors["w"].tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="read-only and copy=False"):
        from_gradient(decoded, copy=False)
    writable = decode(bytearray(doc))
    copied = from_gradient(writable, copy=True)["w"]
    assert copied.data_ptr() != writable.tensors["w"].ctypes.data


def test_a_state_dict_with_parameters_buffers_and_views() -> None:
    torch.manual_seed(SEED)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.Flatten(),
        torch.nn.Linear(36, 3),
    )
    model(torch.randn(2, 1, 5, 5))  # BatchNorm's running stats and its int64 counter move
    state = model.state_dict()
    g = to_gradient(state)
    assert set(g.tensors) == set(state) and g.tensors["1.num_batches_tracked"].dtype == np.int64
    # non-contiguous tensors and negated views are written as their values
    w = state["3.weight"]
    twisted = {"t": w.t(), "n": torch._neg_view(w)}  # a view with the negative bit set
    expected = {"t": w.t().contiguous().numpy(), "n": (-w).numpy()}
    assert encode(to_gradient(twisted)).tobytes() == encode(Gradient(expected)).tobytes()
    params = dict(model.named_parameters())
    assert params["3.weight"].requires_grad
    assert to_gradient(params) == Gradient({k: v.detach().numpy() for k, v in params.items()})


def test_bfloat16_model_gives_the_same_cid_as_its_numpy_twin() -> None:
    import ml_dtypes

    torch.manual_seed(SEED)
    w = torch.randn(40, 30).to(torch.bfloat16)
    twin = np.frombuffer(_bits(w), ml_dtypes.bfloat16).reshape(40, 30)
    assert encode(to_gradient({"w": w})).tobytes() == encode(Gradient({"w": twin})).tobytes()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (torch.zeros(2, dtype=torch.complex64), "torch.complex64, which gradstore/1 cannot hold"),
        (torch.zeros(2, 2).to_sparse(), "make it dense first"),
        (torch.empty(3, device="meta"), "meta device"),
        (np.zeros(2), "must be a torch.Tensor, got ndarray"),
        ([1.0, 2.0], "must be a torch.Tensor, got list"),
    ],
)
def test_what_cannot_be_a_tensor_is_refused_by_name(value: Any, message: str) -> None:
    with pytest.raises(InvalidDocumentError, match=message) as info:
        to_gradient({"ok": torch.zeros(1), "bad": value})
    assert "'bad'" in str(info.value)
    with pytest.raises(TypeError):
        to_gradient([("w", torch.zeros(1))])  # type: ignore[arg-type]


def test_put_and_get_through_kubo_share_the_fetched_buffer(kubo: KuboDaemon) -> None:
    torch.manual_seed(SEED)
    state = {
        "w": torch.randn(600, 1000).to(torch.bfloat16),  # 1.2 MB: two leaves
        "b": torch.randn(1000),
        "f8": _random(torch.float8_e4m3fn, (256,), SEED),
    }

    async def go() -> Gradient:
        async with kubo.node() as node:
            store = GradientStore(node)
            cid = await store.put(to_gradient(state))
            return await store.get(cid)

    fetched = asyncio.run(go())
    back = from_gradient(fetched)
    for name, t in state.items():
        assert back[name].dtype == t.dtype and _bits(back[name]) == _bits(t)
        assert back[name].data_ptr() == fetched.tensors[name].ctypes.data  # zero-copy
