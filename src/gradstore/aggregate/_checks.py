"""Refusals shared by every aggregator: inputs that disagree, non-float dtypes, NaN/Inf.

Only floating-point tensors of the document's types are aggregated (float16/32/64, bfloat16,
float8_e4m3fn, float8_e5m2), by every method including ``sum``: gradients are floats, and
integer or bool tensors (step counters, masks) cannot be averaged and would not sum exactly
in a float64 accumulator.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import numpy as np

from ..errors import AggregationError
from ..format import all_finite, dtype_code, is_float

_F64: Final = np.dtype(np.float64)

#: One peer's gradient: tensor name -> array.
Tensors: TypeAlias = Mapping[str, np.ndarray[Any, Any]]

#: A flat (1-D) view of each tensor of one input, keyed by name.
Flat: TypeAlias = dict[str, np.ndarray[Any, Any]]


@dataclass(frozen=True)
class Layout:
    """The tensors every input shares: names sorted by UTF-8 bytes, with shape and dtype."""

    names: tuple[str, ...]
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, np.dtype[Any]]

    @classmethod
    def of(cls, specs: Iterable[tuple[str, np.dtype[Any], tuple[int, ...]]]) -> Layout:
        """The layout of tensors given as (name, dtype, shape), put in name order."""
        items = sorted(specs, key=lambda spec: spec[0].encode("utf-8"))
        return cls(
            tuple(name for name, _, _ in items),
            {name: tuple(shape) for name, _, shape in items},
            {name: np.dtype(dtype) for name, dtype, _ in items},
        )

    def size(self, name: str) -> int:
        """Number of elements of tensor ``name``."""
        return int(np.prod(self.shapes[name], dtype=np.int64))

    def widened(self) -> Layout:
        """The same tensors in float64: where a method writes an aggregate still to be clipped."""
        return Layout(self.names, self.shapes, {name: _F64 for name in self.names})

    def empty(self) -> dict[str, np.ndarray[Any, Any]]:
        """Uninitialised output arrays, one per tensor, in name order."""
        return {name: np.empty(self.shapes[name], self.dtypes[name]) for name in self.names}


class NonFiniteResult(Exception):
    """Raised inside a kernel when a block holds NaN/Inf; turned into AggregationError."""

    def __init__(self, name: str | None) -> None:
        self.name = name
        super().__init__(name)


def check_inputs(inputs: Sequence[Tensors], method: str) -> Layout:
    """The common layout of ``inputs``, or AggregationError naming the first disagreement."""
    if len(inputs) == 0:
        raise AggregationError(f"{method}: no inputs to aggregate")
    first = inputs[0]
    names = tuple(sorted(first))
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, np.dtype[Any]] = {}
    for name in names:
        array = first[name]
        if not isinstance(array, np.ndarray | np.generic):
            raise AggregationError(
                f"input 0: tensor {name!r} is a {type(array).__name__}, not a NumPy array or scalar"
            )
        if not is_float(array.dtype):
            raise AggregationError(
                f"input 0: tensor {name!r} has dtype {dtype_name(array.dtype)}; "
                f"{method} aggregates floating-point tensors only"
            )
        shapes[name], dtypes[name] = array.shape, array.dtype
    for index, tensors in enumerate(inputs[1:], start=1):
        if set(tensors) != set(names):
            missing = sorted(set(names) - set(tensors))
            extra = sorted(set(tensors) - set(names))
            raise AggregationError(
                f"input {index}: tensor names differ from input 0 "
                f"(missing {missing}, extra {extra})"
            )
        for name in names:
            array = tensors[name]
            if not isinstance(array, np.ndarray | np.generic):
                raise AggregationError(
                    f"input {index}: tensor {name!r} is a {type(array).__name__}, not a NumPy array or scalar"
                )
            if array.shape != shapes[name]:
                raise AggregationError(
                    f"input {index}: tensor {name!r} has shape {array.shape}, "
                    f"input 0 has {shapes[name]}"
                )
            if array.dtype != dtypes[name]:
                raise AggregationError(
                    f"input {index}: tensor {name!r} has dtype {dtype_name(array.dtype)}, "
                    f"input 0 has {dtype_name(dtypes[name])}"
                )
    return Layout(names, shapes, dtypes)


def dtype_name(dtype: np.dtype[Any]) -> str:
    """How errors name a dtype: the document's type string, else NumPy's name ("<V2" says nothing)."""
    return dtype_code(dtype) or str(dtype)


def flatten(inputs: Sequence[Tensors], layout: Layout) -> list[Flat]:
    """1-D views of every tensor (a copy only for a non-contiguous array)."""
    return [{name: np.ravel(tensors[name]) for name in layout.names} for tensors in inputs]


def non_finite_error(
    inputs: Sequence[Tensors], layout: Layout, method: str, name: str | None
) -> AggregationError:
    """The error for a NaN/Inf found while aggregating: the input that holds one, else overflow."""
    for index, tensors in enumerate(inputs):
        for tensor in layout.names:
            if not all_finite(np.asarray(tensors[tensor])):
                return AggregationError(
                    f"input {index}: tensor {tensor!r} contains NaN or infinity"
                )
    where = f"tensor {name!r}" if name is not None else "the inputs"
    return AggregationError(f"{method}: aggregating {where} overflows its dtype")
