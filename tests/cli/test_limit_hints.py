"""A limit refusal says which option raises the limit, from the error's ``limit`` field."""

from __future__ import annotations

import argparse

import pytest

from gradstore.cli._documents import named_limits
from gradstore.errors import LimitExceededError


def test_the_max_bytes_hint_follows_the_limit_field_not_the_words() -> None:
    args = argparse.Namespace(max_bytes=1000)
    with pytest.raises(LimitExceededError) as raised, named_limits(args, "put x"):
        raise LimitExceededError("a block of 2000 bytes is too big", "max_bytes")
    assert str(raised.value) == (
        "put x: a block of 2000 bytes is too big (the limit is --max-bytes 1000; "
        "pass a larger --max-bytes N to allow it)"
    )
    assert raised.value.limit == "max_bytes"
    with pytest.raises(LimitExceededError) as raised, named_limits(args, "put x"):
        raise LimitExceededError("rank 40 (max_bytes is not what refused it)", "max_rank")
    assert str(raised.value).endswith(
        "(a limit every reader applies by default, which no option raises)"
    )
    assert raised.value.limit == "max_rank"
