"""A federated job: who coordinates, who may contribute, how rounds run and aggregate."""

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

__all__ = [
    "InputsConfig",
    "JobConfig",
    "MessagesConfig",
    "RoundsConfig",
    "TensorSpec",
    "load_job",
    "parse_job",
    "topics",
]
