"""The job file's ``[[steps]]``: each tensor in one step, each step checked like the job's
``[aggregation]``, and the tensor-name -> step mapping later layers share."""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradstore.aggregate import AggregationParams
from gradstore.errors import CoordinatorError, UncoveredTensorError
from gradstore.job import (
    DEFAULT_STEP,
    MAX_STEPS,
    Aggregation,
    JobConfig,
    RoundsConfig,
    Selector,
    StepConfig,
    StepsPlan,
    parse_job,
)
from gradstore.messages import SigningKey

COORD = SigningKey.from_seed(bytes([200]) * 32).did
P = sorted(SigningKey.from_seed(bytes([i + 1]) * 32).did for i in range(4))
OTHER = SigningKey.from_seed(bytes([99]) * 32).did  # a valid did:key, not a peer of the job
SCHEMA = ["fc.weight", "fc.bias", "conv2.weight", "conv2.bias", "conv1.weight", "conv1.bias"]


def _job(steps: Any = None, **overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {"job": "j", "coordinator": COORD, "peers": list(P)}
    if steps is not None:
        raw["steps"] = steps
    raw.update(overrides)
    return raw


def _schema(names: list[str] = SCHEMA) -> list[dict[str, Any]]:
    return [{"name": n, "dtype": "<f4", "shape": [2]} for n in names]


def _step(name: str = "s", tensors: Any = ("x",), **keys: Any) -> dict[str, Any]:
    return {
        "name": name,
        "tensors": list(tensors) if isinstance(tensors, tuple) else tensors,
        **keys,
    }


LAYERS = [  # backward order: the output layer first
    _step("head", ["fc.*"]),
    _step("conv2", ["conv2.weight", "conv2.bias"], peers=P[:2]),
    _step("conv1", ["conv1.*"], quorum=1, deadline_s=5),
]


def test_a_job_without_steps_is_one_step_of_everything() -> None:
    cfg = parse_job(_job(rounds={"quorum": 3, "deadline_s": 9}, aggregation={"method": "mean"}))
    (step,) = cfg.steps
    assert not cfg.stepped and step.covers_all and step.name == DEFAULT_STEP == "all"
    assert (step.peers, step.quorum, step.deadline_s) == (tuple(P), 3, 9.0)
    assert step.aggregation == cfg.aggregation == Aggregation("mean")
    assert step.params_for(P[:2]) == cfg.params_for(P[:2])
    for name in ("fc.weight", "../../x", "", "*", "a" * 100_000):
        assert cfg.plan.step_of(name) is step
    assert cfg.plan.partition(["b", "a", "b"]) == {"all": ("a", "b")}
    # a JobConfig built by hand is the same, and its implicit step follows the job's fields
    assert cfg == JobConfig(
        job="j",
        coordinator=COORD,
        peers=tuple(P),
        method="mean",
        rounds=RoundsConfig(quorum=3, deadline_s=9.0),
    )
    later = dataclasses.replace(cfg, rounds=RoundsConfig(quorum=2, deadline_s=1.0))
    assert (later.steps[0].quorum, later.steps[0].deadline_s) == (2, 1.0)
    assert not later.stepped


def test_steps_are_read_in_order_with_their_defaults() -> None:
    cfg = parse_job(_job(LAYERS, schema=_schema(), rounds={"quorum": 3, "deadline_s": 30}))
    assert cfg.stepped and [s.name for s in cfg.steps] == ["head", "conv2", "conv1"]
    head, conv2, conv1 = cfg.steps
    assert head.tensors == (Selector("fc.", pattern=True),) and str(head.tensors[0]) == "fc.*"
    assert conv2.tensors == (Selector("conv2.weight"), Selector("conv2.bias"))
    assert (head.peers, head.quorum, head.deadline_s) == (tuple(P), 3, 30.0)
    assert (conv2.peers, conv2.quorum) == (tuple(P[:2]), 2)  # min(rounds.quorum, its peers)
    assert (conv1.quorum, conv1.deadline_s) == (1, 5.0)
    assert all(s.aggregation == cfg.aggregation for s in cfg.steps)
    assert cfg.plan.partition(SCHEMA) == {
        "head": ("fc.bias", "fc.weight"),
        "conv2": ("conv2.bias", "conv2.weight"),
        "conv1": ("conv1.bias", "conv1.weight"),
    }
    assert cfg.plan.step_of("fc.") is head  # `fc.*` is every name starting with "fc."
    assert cfg.plan.step_of("fc") is None and cfg.plan.step_of("fcx.w") is None
    assert cfg.plan.step_of("conv2.weight.x") is None  # an exact name is only itself


def _refused(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(CoordinatorError, match=re.escape(message)) as info:
        parse_job(raw, source="job.toml")
    assert str(info.value).startswith("job.toml: ")


OVERLAPS: list[tuple[str, list[dict[str, Any]], str]] = [
    ("an exact name twice", [_step("a", ["x.w"]), _step("b", ["x.b", "x.w"])],
     "`steps[1].tensors[1]` 'x.w' (step 'b') overlaps 'x.w' of step 'a' (steps[0].tensors[0])"),
    ("an exact name in another step's pattern", [_step("a", ["x.*"]), _step("b", ["x.w"])],
     "`steps[1].tensors[0]` 'x.w' (step 'b') overlaps 'x.*' of step 'a'"),
    ("a pattern over an earlier exact name", [_step("a", ["x.w"]), _step("b", ["x.*"])],
     "`steps[1].tensors[0]` 'x.*' (step 'b') overlaps 'x.w' of step 'a'"),
    ("nested patterns", [_step("a", ["x.*"]), _step("b", ["y.w", "x.y.*"])],
     "`steps[1].tensors[1]` 'x.y.*' (step 'b') overlaps 'x.*' of step 'a'"),
    ("nested patterns, the wider one later", [_step("a", ["x.y.*"]), _step("b", ["x.*"])],
     "`steps[1].tensors[0]` 'x.*' (step 'b') overlaps 'x.y.*' of step 'a'"),
    ("one pattern twice", [_step("a", ["x.*"]), _step("b", ["x.*"])],
     "`steps[1].tensors[0]` 'x.*' (step 'b') overlaps 'x.*' of step 'a'"),
    ("within one step", [_step("a", ["x.*", "x.w"])],
     "`steps[0].tensors[1]` 'x.w' (step 'a') overlaps 'x.*' of step 'a'"),
    ("a name ending in the pattern's dot", [_step("a", ["x."]), _step("b", ["x.*"])],
     "`steps[1].tensors[0]` 'x.*' (step 'b') overlaps 'x.' of step 'a'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("steps", "message"), [o[1:] for o in OVERLAPS], ids=[o[0] for o in OVERLAPS]
)
def test_overlapping_steps_are_refused_naming_both(
    steps: list[dict[str, Any]], message: str
) -> None:
    _refused(_job(steps), message)


def test_patterns_that_only_share_letters_do_not_overlap() -> None:
    cfg = parse_job(_job([_step("a", ["x.*"]), _step("b", ["xy.*", "x"])]))
    assert [cfg.plan.step_of(n) for n in ("x.1", "xy.1", "x", "xy")] == [
        *cfg.steps,
        cfg.steps[1],
        None,
    ]


REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    ("steps not a list", _job({"name": "a"}), "`steps` must be a list of tables"),
    ("no step", _job([]), "`steps` lists no step"),
    ("too many steps", _job([_step(f"s{i}", [f"t{i}"]) for i in range(MAX_STEPS + 1)]),
     f"`steps` lists {MAX_STEPS + 1} steps, more than the {MAX_STEPS} allowed"),
    ("step not a table", _job(["a"]), "`steps[0]` must be a table"),
    ("unknown key", _job([_step(tensor=["x"])]), "`steps[0].tensor` is not a known key"),
    ("misspelt parameter", _job([_step(methd="mean")]), "`steps[0].methd` is not a known key"),
    ("no name", _job([{"tensors": ["x"]}]), "`steps[0].name` is required"),
    ("empty name", _job([_step("")]), "`steps[0].name` must be 1-64 of"),
    ("name with a space", _job([_step("a b")]), "`steps[0].name` must be 1-64 of"),
    ("name with a slash", _job([_step("../x")]), "`steps[0].name` must be 1-64 of"),
    ("name too long", _job([_step("a" * 65)]), "`steps[0].name` must be 1-64 of"),
    ("name not a string", _job([_step(7)]), "`steps[0].name` must be 1-64 of"),
    ("duplicate name", _job([_step("a", ["x"]), _step("a", ["y"])]),
     "`steps[1].name` 'a' is the name of steps[0] too"),
    ("no tensors", _job([{"name": "a"}]), "`steps[0].tensors` must be a non-empty list"),
    ("empty tensors", _job([_step(tensors=[])]), "`steps[0].tensors` must be a non-empty list"),
    ("tensors a string", _job([_step(tensors="x.*")]), "`steps[0].tensors` must be a non-empty"),
    ("empty tensor name", _job([_step(tensors=["x", ""])]),
     "`steps[0].tensors[1]` must be a tensor name or `prefix.*`"),
    ("tensor not a string", _job([_step(tensors=[3])]), "`steps[0].tensors[0]` must be a tensor name"),
    ("a bare star", _job([_step(tensors=["*"])]), "`steps[0].tensors[0]` '*': `*` is only allowed"),
    ("a star without a dot", _job([_step(tensors=["a*"])]), "`*` is only allowed as `prefix.*`"),
    ("an empty prefix", _job([_step(tensors=[".*"])]), "'.*': `*` is only allowed as `prefix.*`"),
    ("two stars", _job([_step(tensors=["a.*.*"])]), "'a.*.*': `*` is only allowed"),
    ("a star inside", _job([_step(tensors=["a*.b"])]), "'a*.b': `*` is only allowed"),
    ("a parent path", _job([_step(tensors=["../../x"])]),
     "`steps[0].tensors[0]` '../../x' has a '..' path segment"),
    ("a parent-path prefix", _job([_step(tensors=["../*"])]), "`*` is only allowed"),
    ("a dot-dot prefix", _job([_step(tensors=["..*"])]), "'..*' has a '..' path segment"),
    ("an absolute name", _job([_step(tensors=["/etc/x"])]), "'/etc/x' is an absolute path"),
    ("a control character", _job([_step(tensors=["a\nb"])]), "contains the control character"),
    ("a name over the limit", _job([_step(tensors=["a" * 1025])]),
     "`steps[0].tensors[0]` is 1025 bytes, over the tensor names' 1024"),
    ("unknown peer", _job([_step(peers=[P[0], OTHER])]),
     f"`steps[0].peers[1]` '{OTHER}' is not one of the job's peers"),
    ("the coordinator as a peer", _job([_step(peers=[COORD])]), "`steps[0].peers[0]`"),
    ("peer not a string", _job([_step(peers=[1])]), "`steps[0].peers[0]` '1' is not one of"),
    ("peers not a list", _job([_step(peers=P[0])]), "`steps[0].peers` must be a list"),
    ("no peers", _job([_step(peers=[])]), "`steps[0].peers` lists no peer"),
    ("a peer twice", _job([_step(peers=[P[0], P[0]])]), "`steps[0].peers` lists a peer twice"),
    ("quorum 0", _job([_step(quorum=0)]), "`steps[0].quorum` must be >= 1"),
    ("quorum over the step's peers", _job([_step(peers=P[:2], quorum=3)]),
     "`steps[0].quorum` 3 is more than the step's 2 peers"),
    ("quorum not an int", _job([_step(quorum=1.5)]), "`steps[0].quorum` must be an integer"),
    ("deadline 0", _job([_step(deadline_s=0)]), "`steps[0].deadline_s` must be > 0"),
    ("deadline negative", _job([_step(deadline_s=-1)]), "`steps[0].deadline_s` must be > 0"),
    ("deadline not a number", _job([_step(deadline_s="5")]),
     "`steps[0].deadline_s` must be a finite number"),
    ("unknown method", _job([_step(method="avg")]), "`steps[0].method` unknown method 'avg'"),
    ("method not a string", _job([_step(method=["mean"])]), "`steps[0].method` unknown method"),
    ("a parameter of another method", _job([_step("a", ["x"]), _step("b", ["y"], trim_ratio=0.1)]),
     "`steps[1].trim_ratio` trim_ratio does not apply to method 'fedavg'"),
    ("a parameter out of range", _job([_step(method="trimmed_mean", trim_ratio=0.5)]),
     "`steps[0].trim_ratio` trim_ratio must be in [0, 0.5)"),
    ("a parameter of the wrong type", _job([_step(method="krum", byzantine=1.5)]),
     "`steps[0].byzantine` must be an integer"),
    ("a negative clip", _job([_step(clip_input_norm=-1)]), "`steps[0].clip_input_norm`"),
    ("weighted without weights", _job([_step(method="weighted")]),
     "`steps[0].weights` method 'weighted' needs a weight for every peer; missing"),
    ("weights for a peer not in the step",
     _job([_step(method="weighted", peers=P[:1], weights={P[0]: 1, P[1]: 1})]),
     f"`steps[0].weights` weight for a peer not in peers: {P[1]}"),
    ("weights for another method", _job([_step(weights={P[0]: 1})]),
     "`steps[0].weights` does not apply to method 'fedavg'"),
    ("a negative weight", _job([_step(method="weighted", peers=P[:1], weights={P[0]: -1})]),
     f"`steps[0].weights.{P[0]}` must be >= 0"),
    ("median at the step's quorum", _job([_step(method="median", quorum=2)]),
     "`steps[0]` cannot work with quorum 2: median"),
    ("krum with too few step peers", _job([_step(method="krum", byzantine=1, peers=P[:3])]),
     "`steps[0]` cannot work with quorum 3: krum"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "message"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_refusals_name_the_step_and_key(raw: dict[str, Any], message: str) -> None:
    _refused(raw, message)


def test_too_many_steps_is_refused_at_the_count_and_accepted_below() -> None:
    steps = [_step(f"s{i}", [f"t{i}"]) for i in range(MAX_STEPS)]
    assert len(parse_job(_job(steps)).steps) == MAX_STEPS == 64


def test_with_a_schema_every_tensor_is_in_one_step_and_every_selector_matches() -> None:
    _refused(
        _job(LAYERS[:2], schema=_schema()),
        "`steps` leave [[schema]] tensor 'conv1.bias' in no step",
    )
    typo = [*LAYERS[:2], _step("conv1", ["conv1.*", "conv.3.*"])]
    _refused(
        _job(typo, schema=_schema()),
        "`steps[2].tensors[1]` 'conv.3.*' matches no [[schema]] tensor",
    )
    exact = [*LAYERS[:2], _step("conv1", ["conv1.*", "conv1.weights"])]
    _refused(_job(exact, schema=_schema()), "'conv1.weights' (step 'conv1') overlaps 'conv1.*'")
    loose = [*LAYERS[:2], _step("conv1", ["conv1.weight", "conv1.bias", "conv1.extra"])]
    _refused(_job(loose, schema=_schema()), "`steps[2].tensors[2]` 'conv1.extra' matches no")
    assert parse_job(_job(loose)).stepped  # without a schema, names are not known in advance


def test_a_step_inherits_the_jobs_aggregation() -> None:
    weights = {P[0]: 1, P[1]: 2, P[2]: 3, P[3]: 4}
    agg = {"method": "weighted", "weights": weights, "clip_input_norm": 3}
    cfg = parse_job(_job([_step("a", ["x"], peers=[P[3], P[1]])], aggregation=agg))
    (step,) = cfg.steps
    assert step.aggregation == Aggregation("weighted", {P[3]: 4.0, P[1]: 2.0}, {}, 3.0, None)
    assert step.params_for([P[1], P[3]]) == AggregationParams(
        "weighted", weights=(2.0, 4.0), clip_input_norm=3.0
    )


def test_a_step_with_the_jobs_method_overrides_only_what_it_names() -> None:
    agg = {"method": "multikrum", "byzantine": 0, "select": 2, "clip_output_norm": 4}
    steps = [_step("a", ["x"], select=3, clip_input_norm=9), _step("b", ["y"], method="multikrum")]
    a, b = parse_job(_job(steps, aggregation=agg)).steps
    assert a.aggregation == Aggregation("multikrum", {}, {"byzantine": 0, "select": 3}, 9.0, 4.0)
    assert b.aggregation == Aggregation("multikrum", {}, {"byzantine": 0, "select": 2}, None, 4.0)


def test_a_step_with_another_method_keeps_only_the_clipping() -> None:
    job_weights = {P[0]: 1, P[1]: 2, P[2]: 3, P[3]: 4}
    agg = {"method": "weighted", "weights": job_weights, "clip_input_norm": 3}
    steps = [
        _step("a", ["x"], method="mean", clip_output_norm=2),
        _step("b", ["y"], method="trimmed_mean", trim_ratio=0.25, clip_input_norm=7),
    ]
    a, b = parse_job(_job(steps, aggregation=agg)).steps
    assert a.aggregation == Aggregation("mean", {}, {}, 3.0, 2.0)  # no weights carried over
    assert b.aggregation == Aggregation("trimmed_mean", {}, {"trim_ratio": 0.25}, 7.0, None)
    tm = {"method": "trimmed_mean", "trim_ratio": 0.25}
    (c,) = parse_job(_job([_step("c", ["x"], method="median")], aggregation=tm)).steps
    assert c.aggregation == Aggregation("median")  # trim_ratio is not median's: not carried


def test_a_krum_step_is_checked_at_all_its_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    from gradstore.aggregate.methods import base

    monkeypatch.setattr(base, "MAX_KRUM_INPUTS", 3)
    step = _step(method="krum", byzantine=0, quorum=3)
    _refused(_job([step]), "`steps[0].peers` lists 4 peers, too many for step 's': krum: 4 inputs")
    assert parse_job(_job([step | {"peers": P[:3]}])).steps[0].quorum == 3


def test_partition_names_an_uncovered_tensor_and_copes_with_hostile_names() -> None:
    cfg = parse_job(_job(LAYERS))
    long = "fc." + "x" * 1_000_000
    started = time.perf_counter()
    parts = cfg.plan.partition(["fc.w", long, "conv1.a"])
    assert time.perf_counter() - started < 1.0  # a long name costs its patterns' length only
    assert parts == {"head": ("fc.w", long), "conv2": (), "conv1": ("conv1.a",)}
    for hostile in ("../../x", "", "*", "a*", ".*", "fc", "conv2.*", "x" * 100_000, "\x00"):
        assert cfg.plan.step_of(hostile) is None
        with pytest.raises(UncoveredTensorError) as info:
            cfg.plan.partition(["fc.w", hostile])
        assert info.value.tensor == hostile and len(str(info.value)) < 300
        assert isinstance(info.value, CoordinatorError)
    with pytest.raises(UncoveredTensorError, match="'a'"):  # the first by UTF-8 bytes
        cfg.plan.partition(["z", "a", "fc.w"])


def test_a_plan_of_overlapping_steps_built_by_hand_is_refused() -> None:
    def step(name: str, *selectors: Selector) -> StepConfig:
        return StepConfig(name, selectors, (P[0],), 1, 1.0, Aggregation())

    good = StepsPlan([step("a", Selector("x.", True)), step("b", Selector("y"))])
    assert good.step_of("x.y") is good.steps[0]
    with pytest.raises(
        CoordinatorError, match=re.escape("steps overlap: 'x.y' of step 'b' and 'x.*'")
    ):
        StepsPlan([step("a", Selector("x.", True)), step("b", Selector("x.y"))])


_SEGMENT = st.sampled_from(["a", "b", "ab"])
_NAME = st.lists(_SEGMENT, min_size=1, max_size=3).map(".".join)
_SELECTOR = st.tuples(_NAME, st.booleans()).map(lambda t: t[0] + (".*" if t[1] else ""))


def _overlap(x: str, y: str) -> bool:
    """Whether some name matches both selectors, by brute force over every name they start."""

    def matches(selector: str, name: str) -> bool:
        if selector.endswith(".*"):
            return name.startswith(selector[:-1])
        return name == selector

    candidates = {x, y, x[:-1] + "z", y[:-1] + "z"}
    return any(matches(x, n) and matches(y, n) for n in candidates)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(st.lists(_SELECTOR, min_size=1, max_size=4), min_size=1, max_size=5),
    names=st.lists(st.tuples(_NAME, st.sampled_from(["", ".", ".z"])).map("".join), max_size=20),
)
def test_any_accepted_step_set_maps_every_name_to_at_most_one_step(
    steps: list[list[str]], names: list[str]
) -> None:
    raw = _job([_step(f"s{i}", selectors) for i, selectors in enumerate(steps)])
    flat = [s for selectors in steps for s in selectors]
    clash = any(_overlap(x, y) for k, x in enumerate(flat) for y in flat[k + 1 :])
    try:
        cfg = parse_job(raw)
    except CoordinatorError as exc:
        assert clash and "overlaps" in str(exc)
        return
    assert not clash
    for name in names + flat:
        owners = [step for step in cfg.steps if step.covers(name)]
        assert len(owners) <= 1
        assert cfg.plan.step_of(name) is (owners[0] if owners else None)
