#!/usr/bin/env python3
"""How long do round records take to encode and decode, beside the dag_cbor reference?

For each --inputs count, one signed record of that many peers (round/2, about 143 bytes an
input, so 29,000 inputs is a 4 MiB record, ``MAX_RECORD_BYTES``; --kind 4 writes round/4,
as coordinators do, about 250 bytes an input). Timed: ``encode_record`` (what the
coordinator pays to close a round) and ``decode_record`` (what an auditor pays before any
check can refuse the record), then gradstore's DAG-CBOR codec (``gradstore.dag.cbor``)
beside ``dag_cbor`` on the same bytes and the same node, as MB/s and as a ratio. The two
encodings are checked to be the same bytes. dag_cbor is a dev dependency (the tests'
reference), so this script needs the dev extra.

    .venv/bin/python -m benchmarks record [--inputs 1000 29000] [--kind 2] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import time
from collections.abc import Callable
from typing import Any

import dag_cbor
from multiformats import CID as MFCID

from benchmarks._common import dump_json, machine, table
from gradstore.dag import cbor
from gradstore.dag.cid import CID, RAW
from gradstore.messages import RecordInput, RoundRecord, SigningKey, decode_record, encode_record
from gradstore.messages.record import MAX_RECORD_BYTES


def build(n: int, kind: int) -> tuple[RoundRecord, SigningKey]:
    """A record of ``n`` inputs from distinct peers, signed (round/4) or not (round/2)."""
    coord = SigningKey.from_seed(b"\xc0" * 32)
    inputs = []
    for i in range(1, n + 1):
        key = SigningKey.from_seed(i.to_bytes(32, "big"))
        gradient = CID(RAW, hashlib.sha256(key.did.encode()).digest())
        samples = 1 + i % 20
        item = RecordInput(peer=key.did, gradient=gradient, num_samples=samples, weight=1.0 / n)
        if kind == 4:
            item = RecordInput(
                item.peer,
                gradient,
                samples,
                1.0 / n,
                sent_at=1_700_000_000_000 + i,
                peer_sig=bytes(64),
            )
        inputs.append(item)
    record = RoundRecord(
        job="bench-record",
        run="r" * 24,
        round=1,
        method="fedavg",
        params={},
        inputs=tuple(inputs),
        excluded=(),
        output=CID(RAW, bytes(32)),
        prev=None,
        coordinator=coord.did,
    )
    return record, coord


def best(fn: Callable[[], object], repeat: int, budget: float) -> float:
    """The fastest of up to ``repeat`` runs, stopping early once ``budget`` seconds are spent."""
    times: list[float] = []
    spent = 0.0
    while len(times) < repeat and (not times or spent < budget):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        spent += times[-1]
    return min(times)


def to_reference(value: Any) -> Any:
    """A decoded node with dag_cbor's CID type (multiformats) in place of gradstore's."""
    if isinstance(value, CID):
        return MFCID.decode(value.bytes)
    if isinstance(value, list):
        return [to_reference(v) for v in value]
    if isinstance(value, dict):
        return {k: to_reference(v) for k, v in value.items()}
    return value


def measure(n: int, kind: int, repeat: int, budget: float) -> dict[str, Any]:
    record, coord = build(n, kind)
    cid, data = encode_record(record, coord)
    limit = max(len(data), MAX_RECORD_BYTES)  # time a round/4 over the limit all the same
    if decode_record(data, cid=cid, max_bytes=limit) != record:
        raise SystemExit("the record does not decode to itself")
    node = cbor.decode(data)
    reference_node = to_reference(node)
    if cbor.encode(node) != data or dag_cbor.encode(reference_node) != data:
        raise SystemExit("gradstore and dag_cbor encode the record differently")
    mb = len(data) / 1e6
    row: dict[str, Any] = {
        "inputs": n,
        "bytes": len(data),
        "fits": len(data) <= MAX_RECORD_BYTES,
        "encode_record_s": best(lambda: encode_record(record, coord), repeat, budget),
        "decode_record_s": best(
            lambda: decode_record(data, cid=cid, max_bytes=limit),
            repeat,
            budget,
        ),
        "decode_s": best(lambda: cbor.decode(data), repeat, budget),
        "reference_decode_s": best(lambda: dag_cbor.decode(data), repeat, budget),
        "encode_s": best(lambda: cbor.encode(node), repeat, budget),
        "reference_encode_s": best(lambda: dag_cbor.encode(reference_node), repeat, budget),
    }
    for what in ("decode", "encode"):
        row[f"{what}_mb_s"] = mb / row[f"{what}_s"]
        row[f"reference_{what}_mb_s"] = mb / row[f"reference_{what}_s"]
        row[f"{what}_speedup"] = row[f"reference_{what}_s"] / row[f"{what}_s"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, nargs="+", default=[1000, 29000])
    parser.add_argument("--kind", type=int, choices=(2, 4), default=2, help="round/2 or round/4")
    parser.add_argument("--repeat", type=int, default=5, help="best of this many runs")
    parser.add_argument("--budget", type=float, default=10.0, help="seconds per figure, at most")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [measure(n, args.kind, args.repeat, args.budget) for n in args.inputs]
    if args.json:
        dump_json({"machine": machine(), "kind": args.kind, "rows": rows})
        return
    print(
        table(
            [
                "inputs",
                "KB",
                "encode_record s",
                "decode_record s",
                "decode MB/s",
                "dag_cbor MB/s",
                "x",
                "encode MB/s",
                "dag_cbor MB/s",
                "x",
            ],
            [
                [
                    f"{r['inputs']:,}",
                    f"{r['bytes'] / 1e3:,.0f}" + ("" if r["fits"] else " (over the limit)"),
                    f"{r['encode_record_s']:.3f}",
                    f"{r['decode_record_s']:.3f}",
                    f"{r['decode_mb_s']:.1f}",
                    f"{r['reference_decode_mb_s']:.2f}",
                    f"{r['decode_speedup']:.0f}",
                    f"{r['encode_mb_s']:.1f}",
                    f"{r['reference_encode_mb_s']:.2f}",
                    f"{r['encode_speedup']:.0f}",
                ]
                for r in rows
            ],
        )
    )
    print(f"round/{args.kind}; load {machine()['loadavg']}")


if __name__ == "__main__":
    main()
