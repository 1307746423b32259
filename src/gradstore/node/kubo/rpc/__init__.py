"""Kubo RPC (``/api/v0``) without I/O, one module per concern; ``KuboNode`` only sends.

``address`` (API addresses), ``params`` (query parameters), ``multibase``
(pubsub's encodings), ``multipart`` (streamed request bodies), ``car_roots``
(a CAR's roots as it streams by), ``error_map`` (every failure to gradstore's
``NodeError`` tree, one table for all clients) and ``answers`` (parsing). All
of it is testable with ``httpx.MockTransport`` or plain values; the names are
re-exported here for ``from . import rpc``.
"""

from .address import API_PREFIX, api_url
from .answers import (
    parse_add,
    parse_block_put,
    parse_block_stat,
    parse_cid,
    parse_dag_import,
    parse_dag_put,
    parse_guarded_import,
    parse_identity,
    parse_json,
    parse_ndjson,
    parse_pin_ls,
    parse_pinned_stream,
    parse_providers,
    parse_pubsub_message,
    parse_strings,
    parse_swarm_peers,
    parse_version,
)
from .car_roots import CarRoots
from .error_map import (
    TRANSPORT_ERRORS,
    Fault,
    error_from_response,
    error_from_socket,
    error_from_stream_item,
    error_from_transport,
    is_not_pinned,
    is_stream_error,
    is_transient,
    missing_cid,
    transport_error,
)
from .multibase import decode_multibase, multibase_u
from .multipart import (
    multipart_content_type,
    multipart_head,
    multipart_length,
    multipart_parts,
    multipart_stream,
    multipart_tail,
    new_boundary,
    slices,
)
from .params import (
    Params,
    block_put_params,
    cat_params,
    dag_import_params,
    dag_put_params,
    flag,
    guarded_import_params,
    pubsub_pub_params,
    pubsub_sub_params,
)

__all__ = [
    "API_PREFIX",
    "TRANSPORT_ERRORS",
    "CarRoots",
    "Fault",
    "Params",
    "api_url",
    "block_put_params",
    "cat_params",
    "dag_import_params",
    "dag_put_params",
    "decode_multibase",
    "error_from_response",
    "error_from_socket",
    "error_from_stream_item",
    "error_from_transport",
    "flag",
    "guarded_import_params",
    "is_not_pinned",
    "is_stream_error",
    "is_transient",
    "missing_cid",
    "multibase_u",
    "multipart_content_type",
    "multipart_head",
    "multipart_length",
    "multipart_parts",
    "multipart_stream",
    "multipart_tail",
    "new_boundary",
    "parse_add",
    "parse_block_put",
    "parse_block_stat",
    "parse_cid",
    "parse_dag_import",
    "parse_dag_put",
    "parse_guarded_import",
    "parse_identity",
    "parse_json",
    "parse_ndjson",
    "parse_pin_ls",
    "parse_pinned_stream",
    "parse_providers",
    "parse_pubsub_message",
    "parse_strings",
    "parse_swarm_peers",
    "parse_version",
    "pubsub_pub_params",
    "pubsub_sub_params",
    "slices",
    "transport_error",
]
