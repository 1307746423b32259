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


def _shrunk(tensor: torch.Tensor, nbytes: int) -> torch.Tensor:
    """``tensor`` after its storage is cut to ``nbytes``, as FSDP frees a parameter (views
    taken before keep their shapes and offsets)."""
    tensor.untyped_storage().resize_(nbytes)
    return tensor


def _shrunk_cases() -> dict[str, torch.Tensor]:
    base = torch.arange(64, dtype=torch.float32)
    grid = torch.arange(64.0).view(8, 8)
    rows = torch.zeros(4, 8, dtype=torch.bfloat16)
    views = {"a slice of it": base[8:16], "a transpose of it": grid.t(), "a bfloat16 row": rows[3]}
    _shrunk(base, 40)  # elements 8..15 were bytes 32..64
    _shrunk(grid, 200)
    _shrunk(rows, 62)  # row 3 was bytes 48..64
    freed = torch.nn.Linear(300, 200)
    freed.weight.untyped_storage().resize_(0)  # FSDP's free of an unsharded parameter
    return {
        "to 0 bytes": _shrunk(torch.arange(1 << 16, dtype=torch.float32), 0),
        "to 16 bytes": _shrunk(torch.arange(16, dtype=torch.float32), 16),
        **views,
        "a freed parameter": freed.weight,
    }


@pytest.mark.parametrize(
    "case",
    ["to 0 bytes", "to 16 bytes", "a slice of it", "a transpose of it", "a bfloat16 row",
     "a freed parameter"],
)  # fmt: skip
def test_a_tensor_past_its_shrunk_storage_is_refused_before_it_is_read(case: str) -> None:
    # Reading one would publish freed heap bytes, or crash: the refusal comes first.
    tensor = _shrunk_cases()[case]
    have = tensor.untyped_storage().nbytes()
    with pytest.raises(InvalidDocumentError, match=f"storage of {have} bytes") as info:
        to_gradient({"ok": torch.zeros(2), "bad": tensor})
    assert "'bad'" in str(info.value) and "resize_(0)" in str(info.value)


def test_views_within_their_storage_are_kept_as_before() -> None:
    base = torch.arange(64, dtype=torch.float32)
    square = torch.arange(36, dtype=torch.float64).view(6, 6)
    views = {
        "slice": base[8:16],
        "strided": base[1::3],
        "transpose": square.t(),
        "column": square[:, 5],  # its last element is the storage's last
        "expanded": base[:3].view(3, 1).expand(3, 5),  # stride 0
        "empty at the end": base[64:],  # offset 64 of 64 elements, nothing to read
        "scalar": base[63],
    }
    g = to_gradient(views)
    for name, view in views.items():
        assert g.tensors[name].tolist() == view.tolist(), name
    # a storage shrunk to exactly what a view reaches keeps that view readable
    whole = torch.arange(64, dtype=torch.float32)
    kept = whole[8:16]
    _shrunk(whole, 64)
    assert to_gradient({"kept": kept}).tensors["kept"].tolist() == list(range(8, 16))


def _subclasses() -> dict[str, torch.Tensor]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    class Tagged(torch.Tensor):
        pass

    with FakeTensorMode():
        fake = torch.zeros(3)
    return {
        "FakeTensor": fake,
        "Tagged": torch.zeros(3).as_subclass(Tagged),
        "UninitializedParameter": torch.nn.UninitializedParameter(),
    }


@pytest.mark.parametrize("case", ["FakeTensor", "Tagged", "UninitializedParameter"])
def test_tensor_subclasses_are_refused_by_name(case: str) -> None:
    with pytest.raises(InvalidDocumentError, match=f"is a .*{case}, a tensor subclass") as info:
        to_gradient({"ok": torch.zeros(1), "bad": _subclasses()[case]})
    assert "'bad'" in str(info.value)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype")
@pytest.mark.parametrize("layout", [torch.strided, torch.jagged], ids=str)
def test_nested_tensors_are_refused_by_name(layout: torch.layout) -> None:
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.ones(3)], layout=layout)
    with pytest.raises(InvalidDocumentError, match="'bad' is a nested tensor"):
        to_gradient({"ok": torch.zeros(1), "bad": nested})


def test_a_functorch_wrapper_is_refused_by_name() -> None:
    seen: list[InvalidDocumentError] = []

    def loss(x: torch.Tensor) -> torch.Tensor:
        with pytest.raises(InvalidDocumentError, match="'bad' has no storage of its own") as e:
            to_gradient({"bad": x})  # inside torch.func.grad, x wraps the real tensor
        seen.append(e.value)
        return x.sum()

    torch.func.grad(loss)(torch.zeros(3))
    assert len(seen) == 1


def test_parameters_are_plain_tensors_and_shared() -> None:
    weight = torch.nn.Parameter(torch.arange(6, dtype=torch.float32))
    array = to_gradient({"w": weight}).tensors["w"]
    assert array.ctypes.data == weight.data_ptr() and array.tolist() == list(range(6))


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
