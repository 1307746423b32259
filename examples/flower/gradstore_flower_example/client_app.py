"""The ClientApp: train locally, put the new weights into gradstore, reply with a signed CID."""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from gradstore.flower import GradstoreClient, tensors_to_arrays

from .task import data, train

app = ClientApp()


@app.train()
def train_round(msg: Message, context: Context) -> Message:
    config = context.run_config
    partition = int(context.node_config["partition-id"])
    partitions = int(context.node_config["num-partitions"])
    x, y, _, _ = data(partition, partitions, int(config["seed"]))
    # gradstore-key / gradstore-api / gradstore-send come from this SuperNode's --node-config
    with GradstoreClient.from_context(context) as client:
        model = client.model(msg)  # by CID over IPFS (verified), or from the message
        new = train(model, x, y, int(config["local-epochs"]), float(config["lr"]))
        reply = client.reply(msg, new, num_examples=len(y))
    if context.node_config.get("gradstore-lie") and "arrays" in reply.content:
        # run.py --liar: sign the CID of these weights, then send other ones. The strategy
        # recomputes the CID from the arrays it got and refuses the reply, saying why.
        reply.content["arrays"] = tensors_to_arrays({k: v * 2 for k, v in new.items()})
    return reply
