"""A federated job: who coordinates, who may contribute, how rounds run and aggregate, and
the steps a round is made of."""

from ._aggregation import Aggregation
from ._config import (
    InputsConfig,
    JobConfig,
    MessagesConfig,
    RoundsConfig,
    TensorSpec,
    load_job,
    parse_job,
    topics,
)
from ._groups import EXACT, MAX_GROUPS, GroupConfig
from ._pinning import PinningConfig
from ._pipeline import PipelineConfig, StageConfig
from ._population import PopulationConfig
from ._steps import DEFAULT_STEP, MAX_STEPS, Selector, StepConfig, StepsPlan, refuse_steps

__all__ = [
    "DEFAULT_STEP",
    "EXACT",
    "MAX_GROUPS",
    "MAX_STEPS",
    "Aggregation",
    "GroupConfig",
    "InputsConfig",
    "JobConfig",
    "MessagesConfig",
    "PinningConfig",
    "PipelineConfig",
    "PopulationConfig",
    "RoundsConfig",
    "Selector",
    "StageConfig",
    "StepConfig",
    "StepsPlan",
    "TensorSpec",
    "load_job",
    "parse_job",
    "refuse_steps",
    "topics",
]
