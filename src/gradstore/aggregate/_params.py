"""A method and its parameters as a job file and a round record hold them, checked before
any array is touched. The method itself, with its own parameters and checks, is one class
in ``methods``; what every method takes (clipping, how norms sum) is here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..errors import AggregationError
from ._clip import NORM_SUMS, OUTPUT_CLIPS, NormSum, OutputClip
from .methods import REGISTRY, Method, method_of
from .methods.base import number

#: Every method :func:`aggregate` knows, by name.
METHODS: Final[tuple[str, ...]] = tuple(REGISTRY)

#: The parameters every method takes, after its own in a round record.
CLIP_PARAMETERS: Final = ("clip_input_norm", "clip_output_norm")


def parameter_names() -> tuple[str, ...]:
    """Every parameter a round record may hold: the methods' own (as their classes declare
    them, in registry order), then the clipping bounds."""
    own = dict.fromkeys(name for cls in REGISTRY.values() for name in cls.parameters())
    return (*own, *CLIP_PARAMETERS)


@dataclass(frozen=True, init=False)
class AggregationParams:
    """A method and its parameters; the same values a round record stores.

    ``strategy`` is the method object (``methods``) that the engines run; it holds the
    method's own parameters (``weights``, ``trim_ratio``, ...), which read through, as
    ``params.trim_ratio`` (None for another method's). ``clip_input_norm`` bounds each
    input's global L2 norm (over all its tensors) before aggregating; ``clip_output_norm``
    bounds the aggregate's.
    """

    method: str
    strategy: Method
    clip_input_norm: float | None
    clip_output_norm: float | None
    #: How norms sum their squares: set by the record's version, never stored in ``params``.
    norm_sum: NormSum
    #: When output clipping rounds: set by the record's version, never stored in ``params``.
    output_clip: OutputClip

    def __init__(
        self,
        method: str,
        *,
        strategy: Method | None = None,
        clip_input_norm: float | None = None,
        clip_output_norm: float | None = None,
        norm_sum: NormSum = "sequential",
        output_clip: OutputClip = "float64",
        **params: Any,
    ) -> None:
        """``method`` by name with its own ``params`` (AggregationError for one it does not
        take), or ``strategy``: the method object itself."""
        if strategy is None:
            strategy = method_of(method, params)
        elif strategy.name != method or any(v is not None for v in params.values()):
            raise AggregationError(f"strategy {strategy!r} is not method {method!r} alone")
        object.__setattr__(self, "method", method)
        object.__setattr__(self, "strategy", strategy)
        for name, value in zip(CLIP_PARAMETERS, (clip_input_norm, clip_output_norm), strict=True):
            if value is not None:
                value = number(name, value)
                if not value > 0:
                    raise AggregationError(f"{name} must be > 0, got {value}")
            object.__setattr__(self, name, value)
        if norm_sum not in NORM_SUMS:
            raise AggregationError(f"unknown norm summation {norm_sum!r}")
        object.__setattr__(self, "norm_sum", norm_sum)
        if output_clip not in OUTPUT_CLIPS:
            raise AggregationError(f"unknown output clipping rule {output_clip!r}")
        object.__setattr__(self, "output_clip", output_clip)

    def __getattr__(self, name: str) -> Any:
        """A method parameter: the method's value, None if it is another method's."""
        strategy = self.__dict__.get("strategy")
        if strategy is not None and name in parameter_names():
            return getattr(strategy, name, None)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def validate(self, n_inputs: int) -> None:
        """Refuse (AggregationError) unless this method can honestly combine ``n_inputs`` inputs."""
        self.strategy.validate(n_inputs)

    def to_record(self) -> dict[str, Any]:
        """The non-None parameters (method excluded): the method's own in its field order,
        then the clipping bounds, as plain JSON/CBOR values."""
        record = self.strategy.params()
        for name in CLIP_PARAMETERS:
            value = getattr(self, name)
            if value is not None:
                record[name] = value
        return record

    @classmethod
    def from_record(
        cls,
        method: str,
        params: Mapping[str, Any],
        norm_sum: NormSum = "sequential",
        output_clip: OutputClip = "float64",
    ) -> AggregationParams:
        """Rebuild parameters from :meth:`to_record`'s output; unknown keys are refused.

        ``norm_sum`` and ``output_clip`` come from the record's version (round/2 and round/3
        summed norms blockwise-pairwise and clipped the rounded output)."""
        unknown = sorted(set(params) - set(parameter_names()))
        if unknown:
            raise AggregationError(f"unknown aggregation parameter(s): {', '.join(unknown)}")
        return cls(method, **params, norm_sum=norm_sum, output_clip=output_clip)
