"""The ServerApp: FedAvg wrapped in GradstoreStrategy; one line per round with its record CID."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from gradstore.flower import GradstoreStrategy, arrays_to_tensors, tensors_to_arrays
from gradstore.format import DEFAULT_LIMITS
from gradstore.messages import SigningKey

from .task import accuracy, data, initial_model

app = ServerApp()

#: run.py prints the lines that start with this.
MARK = "gradstore round"


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    api = str(config["gradstore-api"])
    if not api:
        raise SystemExit("set gradstore-api (the Kubo RPC URL) in the run config")
    key_file = str(config["gradstore-coordinator-key"])
    key = SigningKey.load(key_file) if key_file else SigningKey.generate()
    _, _, x_test, y_test = data(0, 1, int(config["seed"]))
    nodes = int(config["min-nodes"])
    inner = FedAvg(fraction_evaluate=0.0, min_train_nodes=nodes, min_available_nodes=nodes)

    model_via = str(config["gradstore-model"])
    assert model_via in ("ipfs", "flower"), model_via
    with GradstoreStrategy(
        inner, node=api, key=key, job="flower-digits", model_via=model_via
    ) as strategy:

        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
            acc = accuracy(arrays_to_tensors(arrays, DEFAULT_LIMITS), x_test, y_test)
            done = strategy.history.get(server_round)
            if server_round > 0 and done is not None:
                print(
                    f"{MARK} {server_round}: {len(done.inputs)} inputs, "
                    f"{len(done.excluded)} refused, held-out accuracy {acc:.2%}, "
                    f"{done.flower_bytes} B of client arrays over Flower, "
                    f"aggregate {done.output}, record {done.record}",
                    flush=True,
                )
                for peer, reason in done.excluded:
                    print(
                        f"gradstore refused in round {server_round}: {peer}: {reason}", flush=True
                    )
            return MetricRecord({"accuracy": acc})

        strategy.start(
            grid=grid,
            initial_arrays=tensors_to_arrays(initial_model()),
            num_rounds=int(config["num-server-rounds"]),
            evaluate_fn=evaluate,
        )
        print(f"gradstore run {strategy.run_id}, coordinator {key.did}", flush=True)
