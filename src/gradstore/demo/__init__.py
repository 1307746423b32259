"""``gradstore demo``: federated training on the digits data set through the real stack.

One in-process coordinator and N peers share one node (a Kubo that answers,
else one the demo starts, else the embedded LocalNode); every gradient or model
state goes through the store, signed announcements, pubsub and the coordinator.
scikit-learn (the data) and matplotlib (``--plot``) are the ``demo`` extra.
"""

from ._data import DigitsSplit, Shard, digits_split, load_digits_data, split
from ._extras import check_demo_extras, demo_extras
from ._models import MLP, MODELS, Model, Params, SoftmaxRegression, accuracy, make_model
from ._node import DemoNode, open_demo_node
from ._report import (
    DemoProgressBar,
    format_row,
    format_step,
    summary,
    table_header,
    write_plot,
    write_summary,
)
from ._run import (
    DEFAULT_LR,
    MODES,
    DemoConfig,
    DemoResult,
    RoundRow,
    job_config,
    plan_steps,
    run_demo,
)
from ._steps import DemoStep, StepRow, demo_steps
from ._train import full_batch_losses, local_sgd, sgd_step

#: The earlier public name of ``DemoProgressBar`` (one name per meaning of progress).
Progress = DemoProgressBar

__all__ = [
    "DEFAULT_LR",
    "MLP",
    "MODELS",
    "MODES",
    "DemoConfig",
    "DemoNode",
    "DemoProgressBar",
    "DemoResult",
    "DemoStep",
    "DigitsSplit",
    "Model",
    "Params",
    "Progress",
    "RoundRow",
    "Shard",
    "SoftmaxRegression",
    "StepRow",
    "accuracy",
    "check_demo_extras",
    "demo_extras",
    "demo_steps",
    "digits_split",
    "format_row",
    "format_step",
    "full_batch_losses",
    "job_config",
    "load_digits_data",
    "local_sgd",
    "make_model",
    "open_demo_node",
    "plan_steps",
    "run_demo",
    "sgd_step",
    "split",
    "summary",
    "table_header",
    "write_plot",
    "write_summary",
]
