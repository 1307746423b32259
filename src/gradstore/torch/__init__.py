"""PyTorch bridge (extra ``torch``): tensors to and from gradients, a training-loop peer, and a
job's steps from a module tree and during backward.

    from gradstore.torch import to_gradient, from_gradient, TorchPeer

``to_gradient(model.state_dict())`` shares the memory of CPU tensors (bfloat16 too) and
copies CUDA tensors to the host; ``from_gradient`` gives CPU tensors back.
:class:`TorchPeer` publishes a model's ``.grad`` (or its delta) for a round and writes
the round's aggregate back, with a synchronous face for loops that do not use asyncio.
:func:`steps_from_module` derives a job's ``[[steps]]`` from a model (one per top-level child,
or buckets by size), :class:`StepStream` hands out each step's gradients while
``loss.backward()`` still runs, and ``TorchPeer.streaming`` (:class:`StreamedRound` for
asyncio) puts and announces each as it comes and applies each step's aggregate as it
arrives.
"""

try:
    import torch as _torch  # noqa: F401  (fail here, with the extra's name, if torch is missing)
except ImportError:
    from ..errors import MissingExtraError

    raise MissingExtraError("torch", "gradstore.torch (PyTorch tensors)") from None

from ._convert import CODES, from_gradient, numpy_to_tensor, tensor_to_numpy, to_gradient
from ._params import named_parameters, snapshot
from ._peer import TorchPeer
from ._steps import steps_from_module, steps_toml
from ._stream import ReadyStep, StepStream, StepStreamError
from ._streamed import StepsFailedError, StreamedRound, SyncStreamedRound

__all__ = [
    "CODES",
    "ReadyStep",
    "StepStream",
    "StepStreamError",
    "StepsFailedError",
    "StreamedRound",
    "SyncStreamedRound",
    "TorchPeer",
    "from_gradient",
    "named_parameters",
    "numpy_to_tensor",
    "snapshot",
    "steps_from_module",
    "steps_toml",
    "tensor_to_numpy",
    "to_gradient",
]
