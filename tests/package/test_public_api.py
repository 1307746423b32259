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
