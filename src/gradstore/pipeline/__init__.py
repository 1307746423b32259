"""Model-parallel (pipeline) training over CIDs: the stages' signed activation messages, the
stage math of the demo's MLP and the runner that moves micro-batches between stages over a
node. Each stage's parameter gradients are one step of the round (``job._pipeline``)."""

from .layers import DenseStage, mlp_stages
from .message import (
    BACKWARD,
    FORWARD,
    StageMessage,
    decode_stage_message,
    encode_stage_message,
    pipeline_topic,
    verify_stage_message,
)

__all__ = [
    "BACKWARD",
    "FORWARD",
    "DenseStage",
    "StageMessage",
    "decode_stage_message",
    "encode_stage_message",
    "mlp_stages",
    "pipeline_topic",
    "verify_stage_message",
]
