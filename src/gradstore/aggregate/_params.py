"""A method's name and parameters as a job file and a round record hold them, checked before
any array is touched. The method itself, with its checks, is one class in ``methods``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ..errors import AggregationError
from ._clip import NORM_SUMS, OUTPUT_CLIPS, NormSum, OutputClip
from .methods import REGISTRY, Method, method_of
from .methods.base import number

#: Every method :func:`aggregate` knows, by name.
METHODS: Final[tuple[str, ...]] = tuple(REGISTRY)

#: The parameters a round record may hold, in record order.
PARAMETERS: Final = (
    "weights", "trim_ratio", "byzantine", "select", "clip_input_norm", "clip_output_norm"
)  # fmt: skip


@dataclass(frozen=True)
class AggregationParams:
    """A method and its parameters; the same values a round record stores.

    ``weights`` are per input, in input order. ``trim_ratio`` is the fraction trimmed on each
    side (0 <= r < 0.5). ``byzantine`` is Krum's f; ``select`` is multi-Krum's m (default
    n - f). ``clip_input_norm`` bounds each input's global L2 norm (over all its tensors)
    before aggregating; ``clip_output_norm`` bounds the aggregate's. ``strategy`` is the
    method object (``methods``) that the engines run.
    """

    method: str
    weights: tuple[float, ...] | None = None
    trim_ratio: float | None = None
    byzantine: int | None = None
    select: int | None = None
    clip_input_norm: float | None = None
    clip_output_norm: float | None = None
    #: How norms sum their squares: set by the record's version, never stored in ``params``.
    norm_sum: NormSum = "sequential"
    #: When output clipping rounds: set by the record's version, never stored in ``params``.
    output_clip: OutputClip = "float64"
    strategy: Method = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        strategy = method_of(
            self.method,
            {
                "weights": self.weights,
                "trim_ratio": self.trim_ratio,
                "byzantine": self.byzantine,
                "select": self.select,
            },
        )
        for name, value in strategy.params().items():  # normalised by the method
            object.__setattr__(self, name, tuple(value) if isinstance(value, list) else value)
        object.__setattr__(self, "strategy", strategy)
        for name in ("clip_input_norm", "clip_output_norm"):
            value = getattr(self, name)
            if value is not None:
                bound = number(name, value)
                if not bound > 0:
                    raise AggregationError(f"{name} must be > 0, got {bound}")
                object.__setattr__(self, name, bound)
        if self.norm_sum not in NORM_SUMS:
            raise AggregationError(f"unknown norm summation {self.norm_sum!r}")
        if self.output_clip not in OUTPUT_CLIPS:
            raise AggregationError(f"unknown output clipping rule {self.output_clip!r}")

    def validate(self, n_inputs: int) -> None:
        """Refuse (AggregationError) unless this method can honestly combine ``n_inputs`` inputs."""
        self.strategy.validate(n_inputs)

    def to_record(self) -> dict[str, Any]:
        """The non-None parameters (method excluded), in field order, as plain JSON/CBOR values."""
        record: dict[str, Any] = {}
        for name in PARAMETERS:
            value = getattr(self, name)
            if value is not None:
                record[name] = list(value) if isinstance(value, tuple) else value
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
        unknown = sorted(set(params) - set(PARAMETERS))
        if unknown:
            raise AggregationError(f"unknown aggregation parameter(s): {', '.join(unknown)}")
        values = dict(params)
        if isinstance(values.get("weights"), list):
            values["weights"] = tuple(values["weights"])
        return cls(method, **values, norm_sum=norm_sum, output_clip=output_clip)
