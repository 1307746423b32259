"""The Flower bridge's node loop: a URL becomes a node through ``gradstore.node.connect``, and
the loop runs store calls for Flower's synchronous callbacks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gradstore.errors import KuboCommandError
from gradstore.flower._loop import NodeLoop
from gradstore.format import Gradient
from gradstore.node import KuboDaemon

SECRET = "gradstore-flower-secret"
AUTH = {"gradstore": {"AuthSecret": f"bearer:{SECRET}", "AllowedPaths": ["/api/v0"]}}


def test_a_url_reaches_a_protected_kubo_with_gradstore_api_auth(
    kubo_binary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gradient = Gradient({"w": np.arange(6, dtype=np.float32)})
    with KuboDaemon(kubo_binary, config={"API.Authorizations": AUTH}) as daemon:
        monkeypatch.delenv("GRADSTORE_API_AUTH", raising=False)
        anonymous = NodeLoop(daemon.api_url, name="test-anonymous")
        try:
            with pytest.raises(KuboCommandError):
                anonymous.run(lambda store: store.put(gradient))
        finally:
            anonymous.close()

        monkeypatch.setenv("GRADSTORE_API_AUTH", f"Bearer {SECRET}")
        loop = NodeLoop(daemon.api_url, name="test-auth")
        try:
            cid = loop.run(lambda store: store.put(gradient))
            back = loop.run(lambda store: store.get(cid))
            assert np.array_equal(back.tensors["w"], gradient.tensors["w"])
        finally:
            loop.close()
        loop.close()  # closing twice is harmless
        again = loop.run(lambda store: store.get(cid))  # a closed loop starts again when used
        loop.close()
        assert np.array_equal(again.tensors["w"], gradient.tensors["w"])
