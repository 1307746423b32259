"""A leaf's close in a tree round (docs/design/multicoord.md, "The tree by peer groups"):
its group's verified inputs become the group's exact partial sums (``aggregate.partial_sums``),
stored as a partial document, and a signed ``gradstore/partial/1`` record naming them.

The leaf neither divides nor rounds to the inputs' dtype: the root does, once, over every
group's partials (and clips the output). With input clipping each input's coefficient has
its clip factor folded in, from the norm taken when it was verified, as the flat round's
close does; the record's weights stay the method's coefficients. The inputs are read
window by window (``exact_partial_streamed``), from memory, their spill files or the node
as a round's close.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..aggregate import (
    InputSource,
    as_document,
    exact_partial_streamed,
    input_scales,
    linear_terms,
)
from ..dag import CID
from ..errors import CoordinatorError
from ..format import Gradient
from ..job import JobConfig, StepConfig
from ..messages import (
    PartialRecord,
    SigningKey,
    encode_partial_record,
    partial_meta,
)
from ..node import Node
from ..store import GradientStore
from .closing import (
    DEFAULT_CLOSE_RETRY_S,
    Closed,
    announced_in_order,
    close_sources,
    exclusion_entries,
    input_entries,
    input_layout,
    open_sources,
    put_record,
    with_retries,
)
from .inputs import VerifiedInput


async def close_partial(
    config: JobConfig,
    key: SigningKey,
    node: Node,
    store: GradientStore,
    *,
    run: str,
    round_: int,
    inputs: Sequence[VerifiedInput],
    excluded: Sequence[tuple[str, str, str | None]],
    prev: CID | None,
    announcements: Mapping[str, tuple[int, bytes]],
    give_up_after: float = DEFAULT_CLOSE_RETRY_S,
    step: StepConfig | None = None,
) -> Closed:
    """``closing.close_round``'s part at a leaf of a tree job (``config`` its group's view):
    the group's partial document and its signed partial record (``prev`` unused: the
    chain of rounds runs through the root's records)."""
    group = config.group
    if group is None or step is not None:
        raise CoordinatorError("close_partial closes a round of a tree job's group")
    verified = announced_in_order(inputs, announcements)
    params = config.aggregation.params_for([i.peer for i in verified])
    samples = [i.num_samples for i in verified]
    weights, _ = linear_terms(params, samples)  # the record's: the method's c_i
    bound = params.clip_input_norm  # each input clipped by its norm, as the flat round does
    scales = None if bound is None else input_scales([i.norm or 0.0 for i in verified], bound)
    coefs, _ = linear_terms(params, samples, scales)
    t0 = time.perf_counter()
    sources: list[InputSource] = []
    try:
        await open_sources(sources, node, store, verified, give_up_after)
        layout = input_layout(verified)
        rows = await exact_partial_streamed(sources, layout, coefs)  # window by window
    finally:
        close_sources(sources)
        del sources
    partial = as_document(rows, layout)
    stats: dict[str, Any] = {"aggregate_s": round(time.perf_counter() - t0, 3)}

    t0 = time.perf_counter()
    cids = [i.cid for i in verified]
    dtypes = {t.name: t.dtype for t in verified[0].tensors.values()}
    meta = partial_meta(config.job, round_, group, params.method, cids, dtypes, run=run)
    output = await with_retries(
        "storing the partial document",
        lambda: store.put(Gradient(partial, meta)),
        give_up_after=give_up_after,
    )
    record = PartialRecord(
        job=config.job,
        run=run,
        round=round_,
        group=group,
        method=params.method,
        params=params.to_record(),
        inputs=input_entries(verified, weights or [1.0] * len(verified), announcements),
        excluded=exclusion_entries(excluded),
        output=output,
        coordinator=key.did,
    )
    record_cid, data = encode_partial_record(record, key)
    await put_record(node, record_cid, data, "partial record", give_up_after=give_up_after)
    stats["store_s"] = round(time.perf_counter() - t0, 3)
    return Closed(output, record, record_cid, stats)
