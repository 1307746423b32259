"""Deterministic NumPy aggregators (docs/design/aggregation.md): pure functions over arrays, no I/O.

Inputs are combined in the order given (the coordinator passes them sorted by peer id),
accumulated in float64 and written in the inputs' dtype, bit-for-bit reproducibly. Memory
stays O(model): every method walks the tensors block by block.

Refusals (AggregationError): no inputs; inputs whose tensor names, shapes or dtypes
differ; non-float tensors (every method, ``sum`` included); NaN/Inf in any input (named by
input index and tensor) or an aggregate that overflows its dtype; fedavg without one
positive sample count per input; weighted without one non-negative weight per input
summing to > 0; median of fewer than 3 inputs; trimmed_mean with a ratio outside [0, 0.5)
or one that trims nothing (0 < r and floor(n * r) = 0); krum/multikrum with n < 2f + 3,
more than MAX_KRUM_INPUTS (1024) inputs (TooManyInputsError) or select outside [1, n - f];
parameters that do not apply to the method.

Linear methods with ``accumulate = "exact"`` sum each element's terms exactly and round
once, so the result does not depend on the inputs' order or grouping: a leaf's
``exact_partial`` and a root's ``exact_combine`` of several give the bits of
``combine_exact`` over all the inputs (``PartialSumError`` for a partial that cannot be
combined).
"""

from ._checks import Layout, Tensors
from ._clip import (
    NORM_SUMS,
    OUTPUT_CLIPS,
    NormSum,
    OutputClip,
    clip_inputs,
    clip_output,
    global_norm,
    input_scales,
)
from ._compressed import (
    CompressedInMemory,
    Decompressing,
    SparseInMemory,
    SparseSource,
    compressed_norm,
    compressed_source,
)
from ._declared import SCRATCH_BYTES as WINDOW_SCRATCH_BYTES
from ._declared import first_beyond_dtype
from ._dispatch import AggregationInfo, aggregate, aggregate_with_info
from ._exact import MAX_COMPONENTS as MAX_PARTIAL_COMPONENTS
from ._exact import check_partial, combine_exact, exact_combine, exact_partial
from ._fused import prepare
from ._methods import fedavg, krum, mean, median, multikrum, sum_, trimmed_mean, weighted
from ._params import CLIP_PARAMETERS, METHODS, AggregationParams, parameter_names
from ._streamed import InMemory, InputSource, aggregate_streamed, exact_partial_streamed
from ._tree import (
    Partial,
    aggregate_partials,
    as_document,
    check_partial_tensors,
    combine_partials,
    linear_terms,
    partial_limits,
    partial_sums,
    splittable,
)

__all__ = [
    "CLIP_PARAMETERS",
    "MAX_PARTIAL_COMPONENTS",
    "METHODS",
    "NORM_SUMS",
    "OUTPUT_CLIPS",
    "WINDOW_SCRATCH_BYTES",
    "AggregationInfo",
    "AggregationParams",
    "CompressedInMemory",
    "Decompressing",
    "InMemory",
    "InputSource",
    "Layout",
    "NormSum",
    "OutputClip",
    "Partial",
    "SparseInMemory",
    "SparseSource",
    "Tensors",
    "aggregate",
    "aggregate_partials",
    "aggregate_streamed",
    "aggregate_with_info",
    "as_document",
    "check_partial",
    "check_partial_tensors",
    "clip_inputs",
    "clip_output",
    "combine_exact",
    "combine_partials",
    "compressed_norm",
    "compressed_source",
    "exact_combine",
    "exact_partial",
    "exact_partial_streamed",
    "fedavg",
    "first_beyond_dtype",
    "global_norm",
    "input_scales",
    "krum",
    "linear_terms",
    "mean",
    "median",
    "multikrum",
    "parameter_names",
    "partial_limits",
    "partial_sums",
    "prepare",
    "splittable",
    "sum_",
    "trimmed_mean",
    "weighted",
]
