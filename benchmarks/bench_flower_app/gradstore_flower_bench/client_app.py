"""Clients: add a small step to the model; reply plainly to FedAvg, with a CID to gradstore."""

from __future__ import annotations

import numpy as np
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from gradstore.flower import GradstoreClient, arrays_to_tensors, instruction_of, tensors_to_arrays
from gradstore.format import DEFAULT_LIMITS

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    step = np.float32(0.001 * (int(context.node_config["partition-id"]) + 1))
    if instruction_of(msg) is None:  # plain Flower FedAvg: the arrays go back through Flower
        record = msg.content.array_records["arrays"]
        new = {k: v + step for k, v in arrays_to_tensors(record, DEFAULT_LIMITS).items()}
        content = RecordDict(
            {
                "arrays": tensors_to_arrays(new, record.keys()),
                "metrics": MetricRecord({"num-examples": 100}),
            }
        )
        return Message(content, reply_to=msg)
    with GradstoreClient.from_context(context) as client:  # a CID goes back; arrays over IPFS
        new = {k: v + step for k, v in client.model(msg).items()}  # by CID, or in the message
        return client.reply(msg, new, num_examples=100)
