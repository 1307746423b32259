"""The top-level package re-exports a complete, sorted public face."""

from __future__ import annotations

import gradstore


def test_all_is_unique_and_importable() -> None:
    assert len(set(gradstore.__all__)) == len(gradstore.__all__)  # ruff (RUF022) keeps it sorted
    for name in gradstore.__all__:
        assert hasattr(gradstore, name), name


def test_every_error_class_is_exported() -> None:
    from gradstore import errors

    exported = set(gradstore.__all__)
    base = {
        n
        for n, v in vars(errors).items()
        if isinstance(v, type)
        and issubclass(v, errors.GradstoreError)
        and v.__bases__[0] is errors.GradstoreError
    }
    assert base <= exported | {"AuditError", "KeyFileError"}, base - exported


def test_the_version_has_one_source() -> None:
    from importlib.metadata import version

    from gradstore._version import __version__

    assert gradstore.__version__ is __version__
    assert version("gradstore") == __version__  # pyproject reads it from _version.py


def test_each_meaning_of_progress_has_a_name_of_its_own() -> None:
    """Bytes moved, a coordinator's open round, the demo's run: one descriptive name each (and
    the command line's bar and lines for two of them); a bare ``Progress`` is only the old
    public name of one of them, kept as an alias where it was public (issue 26)."""
    import ast
    from pathlib import Path

    from gradstore import coordinator, demo, store

    named: dict[str, list[str]] = {}
    aliases: dict[str, str] = {}
    for path in sorted(Path(gradstore.__file__).parent.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                targets, value = [node.name], None
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                raw = node.targets if isinstance(node, ast.Assign) else [node.target]
                targets = [t.id for t in raw if isinstance(t, ast.Name)]
                value = node.value
            else:
                continue
            for name in targets:
                if "Progress" not in name or name.isupper():
                    continue
                where = f"{path.parent.name}/{path.name}"
                if name == "Progress":
                    assert isinstance(value, ast.Name), f"{where}: Progress is not an alias"
                    aliases[where] = value.id
                else:
                    named.setdefault(name, []).append(where)
    assert named == {
        "ByteProgress": ["store/_put.py"],
        "ByteProgressBar": ["cli/_progress.py"],
        "DemoProgressBar": ["demo/_report.py"],
        "RoundProgress": ["coordinator/progress.py"],
        "RoundProgressLines": ["cli/_coordinator_cmd.py"],
    }
    assert aliases == {
        "coordinator/__init__.py": "RoundProgress",
        "demo/__init__.py": "DemoProgressBar",
        "store/_put.py": "ByteProgress",
    }
    assert store.Progress is store.ByteProgress
    assert coordinator.Progress is coordinator.RoundProgress
    assert demo.Progress is demo.DemoProgressBar
