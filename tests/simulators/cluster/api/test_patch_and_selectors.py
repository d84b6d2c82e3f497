"""The simulator's pure helpers: patch algorithms and selector grammar."""

from __future__ import annotations

import pytest

from simulators.cluster.patch import PatchError, json_patch, merge_patch, strategic_merge_patch
from simulators.cluster.selectors import parse_field_selector, parse_label_selector


def test_it_deletes_keys_with_null_in_a_merge_patch() -> None:
    assert merge_patch({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": None}, "e": [1]}) == {"a": 1, "b": {"d": 3}, "e": [1]}


def test_it_applies_every_json_patch_operation() -> None:
    doc = {"a": [1, 2], "b": {"c": "x"}}
    out = json_patch(doc, [
        {"op": "add", "path": "/a/-", "value": 3},
        {"op": "replace", "path": "/b/c", "value": "y"},
        {"op": "copy", "from": "/b/c", "path": "/d"},
        {"op": "move", "from": "/d", "path": "/e"},
        {"op": "remove", "path": "/a/0"},
        {"op": "test", "path": "/e", "value": "y"},
        {"op": "add", "path": "/k~1v", "value": True},
    ])
    assert out == {"a": [2, 3], "b": {"c": "y"}, "e": "y", "k/v": True}
    assert doc == {"a": [1, 2], "b": {"c": "x"}}, "the input is never mutated"
    with pytest.raises(PatchError):
        json_patch(doc, [{"op": "remove", "path": "/missing"}])
    with pytest.raises(PatchError):
        json_patch(doc, [{"op": "test", "path": "/a/0", "value": 9}])


def test_it_merges_keyed_lists_and_honours_directives_in_a_strategic_patch() -> None:
    pod = {"metadata": {"finalizers": ["a"]},
           "spec": {"containers": [{"name": "main", "image": "v1"}, {"name": "side", "image": "s1"}]}}
    out = strategic_merge_patch(pod, {
        "metadata": {"finalizers": ["b"]},
        "spec": {"containers": [{"name": "side", "$patch": "delete"}, {"name": "new", "image": "n1"}],
                 "$setElementOrder/containers": [{"name": "main"}, {"name": "new"}]},
    })
    assert out["metadata"]["finalizers"] == ["a", "b"]
    assert out["spec"]["containers"] == [{"name": "main", "image": "v1"}, {"name": "new", "image": "n1"}]
    out = strategic_merge_patch(out, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}})
    assert out["metadata"]["finalizers"] == ["b"]
    out = strategic_merge_patch(out, {"spec": {"$patch": "replace", "containers": [{"name": "only", "image": "o"}]}})
    assert out["spec"] == {"containers": [{"name": "only", "image": "o"}]}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("team=a", ["a1", "a2"]),
        ("team==a,tier=gpu", ["a2"]),
        ("team!=a", ["b1", "none"]),
        ("tier", ["a2", "b1"]),
        ("!tier", ["a1", "none"]),
        ("team in (a,b),tier notin (cpu)", ["a1", "a2"]),
        ("rank>1", ["b1"]),
    ],
)
def test_it_understands_every_label_selector_form(selector: str, matches: list[str]) -> None:
    objects = {
        "a1": {"team": "a"},
        "a2": {"team": "a", "tier": "gpu"},
        "b1": {"team": "b", "tier": "cpu", "rank": "2"},
        "none": {},
    }
    match = parse_label_selector(selector)
    assert match is not None
    assert [name for name, labels in objects.items() if match(labels)] == matches


def test_it_rejects_unsupported_field_selectors() -> None:
    match = parse_field_selector("status.phase=Running,metadata.name!=x", ("status.phase",))
    assert match is not None
    assert match({"metadata": {"name": "y"}, "status": {"phase": "Running"}})
    assert not match({"metadata": {"name": "x"}, "status": {"phase": "Running"}})
    with pytest.raises(ValueError, match="field label not supported: spec.foo"):
        parse_field_selector("spec.foo=1", ())
