"""The public face of gradstore.node."""

from __future__ import annotations

from pathlib import Path

import gradstore.node as node


def test_all_is_complete_and_sorted() -> None:
    public = {name for name in vars(node) if not name.startswith("_")}
    modules = {"base", "capabilities", "cluster", "daemon", "kubo", "kubo_rpc", "local"}
    assert set(node.__all__) == public - modules
    assert node.__all__ == sorted(node.__all__, key=lambda n: (not n.isupper(), n))


def test_both_nodes_satisfy_the_protocol() -> None:
    assert isinstance(node.KuboNode("http://127.0.0.1:1"), node.Node)
    local_methods = {
        "identity", "import_car", "export_car", "put_block", "get_block", "has_block",
        "pin", "unpin", "pins", "publish", "subscribe", "aclose",
    }  # fmt: skip
    for cls in (node.KuboNode, node.LocalNode):
        assert local_methods <= set(dir(cls))


def test_capabilities_are_found_by_protocol_not_by_class(tmp_path: Path) -> None:
    kubo = node.KuboNode("http://127.0.0.1:1")
    local = node.LocalNode(tmp_path)
    assert isinstance(kubo, node.SupportsCatInto)
    assert isinstance(kubo, node.SupportsGuardedImport)
    assert isinstance(kubo.guarded_import(), node.GuardedImport)
    assert not isinstance(local, node.SupportsCatInto)
    assert not isinstance(local, node.SupportsGuardedImport)
