"""The keywords ``GradstoreStrategy`` took before it took a ``JobConfig``: a thin shim that
builds the one they describe."""

from __future__ import annotations

from typing import Any, Final, cast

from ..aggregate import parameter_names
from ..aggregate.methods import MethodName
from ..errors import ConfigError
from ..format import DEFAULT_LIMITS
from ..job import InputsConfig, JobConfig

#: The former keywords that are not a method's parameter (those pass by name: trim_ratio=...).
JOB_KEYWORDS: Final = ("job", "method", "weights", "peers", "limits", "require_bound_meta")


def job_config(coordinator: str, **keywords: Any) -> JobConfig:
    """The ``JobConfig`` that ``GradstoreStrategy``'s former keywords describe, signed by
    ``coordinator``: ``job`` ("flower"), ``method`` ("fedavg") and its parameters by name,
    ``weights`` (per peer), ``clip_input_norm``, ``clip_output_norm``, ``peers`` (None: any
    client), ``limits`` and ``require_bound_meta``. TypeError for any other keyword, ConfigError
    (a ValueError) for no peers."""
    known = {*JOB_KEYWORDS, *parameter_names()}
    unknown = sorted(set(keywords) - known)
    if unknown:
        raise TypeError(f"GradstoreStrategy() got an unexpected keyword argument {unknown[0]!r}")
    given = dict(keywords)
    peers = given.pop("peers", None)
    if peers is not None and not peers:
        raise ConfigError("peers lists no peer (None lets any client contribute)")
    return JobConfig(
        job=given.pop("job", "flower"),
        coordinator=coordinator,
        peers=() if peers is None else tuple(peers),
        method=cast(MethodName, given.pop("method", "fedavg")),
        weights=dict(given.pop("weights", None) or {}),
        clip_input_norm=given.pop("clip_input_norm", None),
        clip_output_norm=given.pop("clip_output_norm", None),
        limits=given.pop("limits", DEFAULT_LIMITS),
        inputs=InputsConfig(require_bound_meta=bool(given.pop("require_bound_meta", False))),
        method_params={name: value for name, value in given.items() if value is not None},
    )
