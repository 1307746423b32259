"""A job's ``[[steps]]`` derived from a module tree: one step per top-level child, or buckets
of a target size (as DDP's 25 MB buckets), in backward order.

Backward order is the reverse of the order the parameters were registered in, the
heuristic DDP's buckets use: a model built input side first (``nn.Sequential``, most
``__init__`` methods) produces its output layer's gradients first. A model whose forward
uses its children in another order still gets valid steps, only ones that become ready out
of turn (``nn.TransformerEncoderLayer`` registers ``norm1`` after ``linear1`` and ``linear2``,
and its forward uses it before them).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal

import torch

from ..format import name_problem
from ..job import MAX_STEPS
from ..messages.schema import JOB_NAME
from ._params import Parameters, named_parameters

#: DDP's default bucket size (``bucket_cap_mb=25``, in MiB).
BUCKET_BYTES: Final = 25 * 2**20
#: The step of the parameters registered on the root module itself (``by="children"``).
ROOT_STEP: Final = "root"
_NOT_IN_NAME: Final = re.compile(r"[^A-Za-z0-9._-]")
_NAME_MAX: Final = 64
_BARE_KEY: Final = re.compile(r"[A-Za-z0-9_-]+")


def steps_from_module(
    model: Parameters,
    *,
    by: Literal["children", "size"] = "children",
    bucket_bytes: int = BUCKET_BYTES,
    names: Iterable[str] | None = None,
) -> list[dict[str, Any]]:
    """``[[steps]]`` tables (``{"name", "tensors"}``) covering every trainable parameter once,
    output side first: ``by="children"`` one step per top-level child (``child.*``, the root's
    own parameters as exact names in step ``root``); ``by="size"`` buckets of at most
    ``bucket_bytes`` (a larger parameter alone), ``prefix.*`` where a whole module fits.

    ``names`` limits the steps to those trainable parameters (default: all, as ``TorchPeer``
    sends them). Past ``MAX_STEPS`` steps, neighbours merge, the largest step as small as it
    can be.
    """
    if by not in ("children", "size"):
        raise ValueError(f"by must be 'children' or 'size', not {by!r}")
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be a positive integer, not {bucket_bytes!r}")
    params = _covered(named_parameters(model), names)
    backward = list(reversed(params))  # the output side first (see the module's docstring)
    sizes = {name: p.numel() * p.element_size() for name, p in params.items()}
    if by == "children":
        groups = _children(backward)
        packed = _pack([sum(sizes[n] for n in g[1]) for g in groups], 0)
        merged = [[groups[i] for i in run] for run in packed]
        titles = ["-".join(dict.fromkeys([run[0][0], run[-1][0]])) for run in merged]
        members = [[n for _, group in run for n in group] for run in merged]
    else:
        packed = _pack([sizes[n] for n in backward], bucket_bytes)
        members = [[backward[i] for i in run] for run in packed]
        titles = [f"bucket{k}" for k in range(len(members))]
    everywhere = Counter(p for name in params for p in _prefixes(name))
    taken: set[str] = set()
    return [
        {"name": _unique(_step_name(title), taken), "tensors": _selectors(group, everywhere)}
        for title, group in zip(titles, members, strict=True)
    ]


def steps_toml(steps: Sequence[Mapping[str, Any]]) -> str:
    """The steps as ``[[steps]]`` TOML tables, to paste into a job file (its other keys, such
    as ``peers`` or ``quorum``, are written too: strings, numbers, booleans, string lists)."""
    lines: list[str] = []
    for step in steps:
        lines += ["", "[[steps]]"]
        for key, value in step.items():
            if not isinstance(key, str) or not _BARE_KEY.fullmatch(key):
                raise ValueError(f"{key!r:.80} is not a [[steps]] key")
            if isinstance(value, (list, tuple)):
                items = [_toml_value(v) for v in value]
                inline = f"{key} = [{', '.join(items)}]"
                if len(inline) <= 100:
                    lines.append(inline)
                else:
                    lines += [f"{key} = [", *(f"  {item}," for item in items), "]"]
            else:
                lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines[1:]) + "\n"


def _covered(
    params: dict[str, torch.Tensor], names: Iterable[str] | None
) -> dict[str, torch.Tensor]:
    """The parameters the steps cover, in registration order; each name a valid tensor name."""
    if isinstance(names, str):
        raise ValueError(
            f"names must be a collection of parameter names, not the string {names!r:.80}"
        )
    if names is not None:
        wanted = set(names)
        unknown = sorted(wanted - params.keys())
        if unknown:
            raise ValueError(f"not trainable parameters of the model: {unknown[:5]}")
        params = {n: p for n, p in params.items() if n in wanted}
        if not params:
            raise ValueError("names lists no parameter")
    for name in params:
        problem = name_problem(name)
        if problem is not None:
            raise ValueError(f"parameter {name[:80]!r} {problem}: it cannot be a tensor name")
    return params


def _children(backward: Sequence[str]) -> list[tuple[str, list[str]]]:
    """(top-level child, or ROOT_STEP for the root's own parameters; its parameter names),
    in the order their first parameter appears in ``backward``."""
    groups: dict[str, list[str]] = {}
    for name in backward:
        child, dot, _ = name.partition(".")
        groups.setdefault(child if dot else "", []).append(name)
    return [(child or ROOT_STEP, group) for child, group in groups.items()]


def _pack(sizes: Sequence[int], cap: int) -> list[list[int]]:
    """Consecutive runs of item indices, each up to ``cap`` bytes (an item over it alone); the
    cap grows, as little as it must, until there are at most MAX_STEPS runs."""
    runs = _greedy(sizes, cap)
    if len(runs) <= MAX_STEPS:
        return runs
    low, high = cap + 1, max(sum(sizes), cap + 1)  # _greedy(sizes, sum) is one run
    while low < high:  # the run count falls as the cap grows: the least cap that fits
        mid = (low + high) // 2
        if len(_greedy(sizes, mid)) <= MAX_STEPS:
            high = mid
        else:
            low = mid + 1
    return _greedy(sizes, low)


def _greedy(sizes: Sequence[int], cap: int) -> list[list[int]]:
    """Fill a run until the next item would take it over ``cap``, then start another."""
    runs: list[list[int]] = []
    total = 0
    for i, size in enumerate(sizes):
        if runs and total + size <= cap:
            runs[-1].append(i)
            total += size
        else:
            runs.append([i])
            total = size
    return runs


def _selectors(group: Sequence[str], everywhere: Counter[str]) -> list[str]:
    """``group``'s names as selectors: ``prefix.*`` for the widest module whose covered
    parameters (``everywhere`` counts them by prefix) are all in the group, exact names for
    the rest; in ``group``'s order."""
    inside = Counter(p for name in group for p in _prefixes(name))
    out: dict[str, None] = {}
    for name in group:
        widest = next((p for p in _prefixes(name) if inside[p] == everywhere[p]), None)
        out[name if widest is None else widest + "*"] = None
    return list(out)


def _prefixes(name: str) -> list[str]:
    """The module paths above a parameter, widest first: ``a.b.w`` -> ``a.``, ``a.b.``."""
    parts = name.split(".")[:-1]
    return [".".join(parts[: k + 1]) + "." for k in range(len(parts))]


def _step_name(text: str) -> str:
    """``text`` as a step name: 1-64 of A-Z a-z 0-9 . _ -, starting with a letter or digit."""
    name = _NOT_IN_NAME.sub("_", text)
    if not name[:1].isalnum():
        name = "s" + name
    return name[:_NAME_MAX]


def _unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name-2``, ``name-3``, ... (cut to fit) if it is taken."""
    found, k = name, 1
    while found in taken:
        k += 1
        suffix = f"-{k}"
        found = name[: _NAME_MAX - len(suffix)] + suffix
    assert JOB_NAME.fullmatch(found), found
    taken.add(found)
    return found


def _toml_value(value: Any) -> str:
    """A TOML string, integer, float or boolean."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{value[:80]!r} is not valid Unicode (a lone surrogate)") from None
        # JSON's escapes are TOML's, but for DEL, which TOML wants escaped too
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    raise TypeError(f"cannot write {type(value).__name__} {value!r:.80} as a TOML value")
