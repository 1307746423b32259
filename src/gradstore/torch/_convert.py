"""torch tensors <-> Gradient, sharing memory wherever the dtype and device allow.

A CPU tensor becomes a NumPy view of the same memory (bfloat16 and float8 included, as
``ml_dtypes`` arrays); a tensor on another device is copied to the host. Back, a
writable array becomes a tensor over the same memory; a read-only one (a document
decoded from ``bytes``) is copied, so writing to the tensor can never change bytes
that were checked against a CID.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import torch

from ..errors import InvalidDocumentError
from ..format import DTYPES, Gradient, dtype_code, numpy_dtype

#: torch dtype -> document dtype (torch's unsigned 16/32/64-bit types exist from torch 2.3).
CODES: Final[dict[torch.dtype, str]] = {
    torch.float16: "<f2",
    torch.float32: "<f4",
    torch.float64: "<f8",
    torch.int8: "|i1",
    torch.uint8: "|u1",
    torch.int16: "<i2",
    torch.int32: "<i4",
    torch.int64: "<i8",
    torch.bool: "|b1",
    torch.bfloat16: "bfloat16",
    torch.float8_e4m3fn: "float8_e4m3fn",
    torch.float8_e5m2: "float8_e5m2",
    **{
        getattr(torch, name): code
        for name, code in (("uint16", "<u2"), ("uint32", "<u4"), ("uint64", "<u8"))
        if hasattr(torch, name)
    },
}
_TORCH: Final = {code: dt for dt, code in CODES.items()}

#: Element size -> a torch integer dtype that NumPy shares memory with (for the reinterpreting views).
_CARRIER: Final = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NUMPY_CARRIER: Final = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int16),
    4: np.dtype(np.int32),
    8: np.dtype(np.int64),
}
#: The tensor types whose data is the memory of their storage (a Parameter holds a plain
#: Tensor's; one made from a subclass has the subclass's type).
_PLAIN: Final = (torch.Tensor, torch.nn.Parameter)
#: dtypes for which ``Tensor.numpy()`` / ``torch.from_numpy`` work directly.
_DIRECT: Final = frozenset(
    (torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16,
     torch.int32, torch.int64, torch.bool)
)  # fmt: skip


def tensor_to_numpy(tensor: torch.Tensor, name: str = "tensor") -> np.ndarray[Any, Any]:
    """The tensor's data as a C-contiguous NumPy array of the document's dtype.

    Shares memory with a contiguous CPU tensor (``.grad`` and parameters included); copies
    only what it must: a tensor on another device, a non-contiguous one, a negated view.
    """
    if not isinstance(tensor, torch.Tensor):
        raise InvalidDocumentError(
            f"tensor {name!r} must be a torch.Tensor, got {type(tensor).__name__}"
        )
    if tensor.is_nested:
        raise InvalidDocumentError(
            f"tensor {name!r} is a nested tensor; pass its components as separate tensors"
        )
    if type(tensor) not in _PLAIN:
        raise InvalidDocumentError(
            f"tensor {name!r} is a {type(tensor).__module__}.{type(tensor).__qualname__}, "
            "a tensor subclass whose data may not be its own memory; pass a plain "
            "torch.Tensor (a DTensor: .full_tensor())"
        )
    code = CODES.get(tensor.dtype)
    if code is None:
        raise InvalidDocumentError(
            f"tensor {name!r} has dtype {tensor.dtype}, which gradstore/1 cannot hold; "
            f"allowed: {', '.join(str(d) for d in CODES)}"
        )
    if tensor.layout != torch.strided:
        raise InvalidDocumentError(f"tensor {name!r} is {tensor.layout}; make it dense first")
    if tensor.is_meta:
        raise InvalidDocumentError(f"tensor {name!r} is on the meta device: it holds no data")
    _check_extent(tensor, name)
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")  # a CUDA (or other device) tensor: one copy to host memory
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype in _DIRECT:
        return t.numpy()
    target = numpy_dtype(code)
    assert target is not None
    return t.view(_CARRIER[t.element_size()]).numpy().view(target)


def _check_extent(tensor: torch.Tensor, name: str) -> None:
    """Refuse a tensor whose elements reach past the end of its storage, before any is read.

    FSDP frees a parameter with ``untyped_storage().resize_(0)`` and leaves the tensor's
    shape as it was: reading it would read freed heap memory, or crash.
    """
    try:
        have = tensor.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):  # a functorch (vmap, grad) wrapper
        raise InvalidDocumentError(
            f"tensor {name!r} has no storage of its own (a functorch or other wrapper tensor)"
        ) from None
    if tensor.numel() == 0:
        return
    last = tensor.storage_offset() + sum(
        (size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
    )
    need = (last + 1) * tensor.element_size()
    if need > have:
        raise InvalidDocumentError(
            f"tensor {name!r} reaches {need} bytes into a storage of {have} bytes (a "
            "parameter freed with untyped_storage().resize_(0), as FSDP does?): its data "
            "is gone"
        )


def numpy_to_tensor(
    array: np.ndarray[Any, Any], name: str = "tensor", *, copy: bool | None = None
) -> torch.Tensor:
    """A CPU tensor of ``array``'s values and dtype; shares memory unless it must copy.

    ``copy=None`` shares a writable array and copies a read-only one; ``True`` always
    copies; ``False`` refuses a read-only array rather than copying it.
    """
    code = dtype_code(np.asarray(array).dtype)
    if code is None:
        raise InvalidDocumentError(
            f"tensor {name!r} has dtype {np.asarray(array).dtype}; allowed: {' '.join(DTYPES)}"
        )
    target = numpy_dtype(code)
    assert target is not None
    arr = np.asarray(array, dtype=target)  # little-endian, as torch expects on this host
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")
    if not arr.flags.writeable:
        if copy is False:
            raise ValueError(f"tensor {name!r}: the array is read-only and copy=False")
        arr = arr.copy()
    elif copy:
        arr = arr.copy()
    dt = _TORCH[code]
    if dt in _DIRECT:
        return torch.from_numpy(arr)
    carrier = _NUMPY_CARRIER[arr.dtype.itemsize]
    return torch.from_numpy(arr.view(carrier)).view(dt)


def to_gradient(
    tensors: Mapping[str, torch.Tensor], meta: dict[str, Any] | None = None
) -> Gradient:
    """A Gradient of ``tensors`` (a ``state_dict`` or any mapping of names to tensors).

    CPU tensors are shared, not copied (bfloat16 and float8 included): keep them
    unchanged until the gradient is stored. CUDA tensors are copied to host memory.
    """
    if not isinstance(tensors, Mapping):
        raise TypeError(
            f"to_gradient() takes a mapping of names to tensors, got {type(tensors).__name__}"
        )
    return Gradient(
        {name: tensor_to_numpy(value, name) for name, value in tensors.items()}, dict(meta or {})
    )


def from_gradient(gradient: Gradient, *, copy: bool | None = None) -> dict[str, torch.Tensor]:
    """The gradient's tensors as CPU torch tensors, in the gradient's order.

    Writable arrays (those of a fetched gradient) are shared; read-only ones copied. See
    :func:`numpy_to_tensor` for ``copy``.
    """
    if not isinstance(gradient, Gradient):
        raise TypeError(f"from_gradient() takes a Gradient, got {type(gradient).__name__}")
    return {
        name: numpy_to_tensor(array, name, copy=copy) for name, array in gradient.tensors.items()
    }
