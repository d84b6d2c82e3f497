"""Patch algorithms of the simulated API server.

JSON merge patch (RFC 7386), JSON patch (RFC 6902, including ``test``) and a
strategic merge patch for built-in types.  Pure functions over plain JSON
data, called by `simulators.cluster.store.Store.patch` with the lock held; they
never mutate their inputs.  Failures raise `PatchError` (JSON-patch op
failures: the store answers 422 Invalid) or `ValueError` (undecodable: 400).
"""

from __future__ import annotations

import copy
from typing import Any


class PatchError(Exception):
    """A JSON patch operation could not be applied (test failed, bad path...)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: dicts merge recursively, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# ---------------------------------------------------------------------------
# RFC 6902


def _unescape_token(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _split_pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}")
    return [_unescape_token(t) for t in path[1:].split("/")]


def _resolve_parent(doc: Any, tokens: list[str]) -> Any:
    cur = doc
    for tok in tokens[:-1]:
        if isinstance(cur, dict):
            if tok not in cur:
                raise PatchError(f"missing path segment {tok!r}")
            cur = cur[tok]
        elif isinstance(cur, list):
            idx = _list_index(cur, tok, allow_end=False)
            cur = cur[idx]
        else:
            raise PatchError("path traverses a scalar")
    return cur


def _list_index(lst: list[Any], tok: str, allow_end: bool) -> int:
    if tok == "-" and allow_end:
        return len(lst)
    if not tok.isdigit() or (len(tok) > 1 and tok.startswith("0")):
        raise PatchError(f"invalid list index {tok!r}")
    idx = int(tok)
    limit = len(lst) if allow_end else len(lst) - 1
    if idx > limit:
        raise PatchError("list index out of range")
    return idx


def _get(doc: Any, path: str) -> Any:
    tokens = _split_pointer(path)
    if not tokens:
        return doc
    parent = _resolve_parent(doc, tokens)
    tok = tokens[-1]
    if isinstance(parent, dict):
        if tok not in parent:
            raise PatchError(f"path {path!r} not found")
        return parent[tok]
    if isinstance(parent, list):
        return parent[_list_index(parent, tok, allow_end=False)]
    raise PatchError("path traverses a scalar")


def _add(doc: Any, path: str, value: Any) -> Any:
    tokens = _split_pointer(path)
    if not tokens:
        return value
    parent = _resolve_parent(doc, tokens)
    tok = tokens[-1]
    if isinstance(parent, dict):
        parent[tok] = value
    elif isinstance(parent, list):
        parent.insert(_list_index(parent, tok, allow_end=True), value)
    else:
        raise PatchError("cannot add to a scalar")
    return doc


def _remove(doc: Any, path: str) -> Any:
    tokens = _split_pointer(path)
    if not tokens:
        raise PatchError("cannot remove the document root")
    parent = _resolve_parent(doc, tokens)
    tok = tokens[-1]
    if isinstance(parent, dict):
        if tok not in parent:
            raise PatchError(f"path {path!r} not found")
        del parent[tok]
    elif isinstance(parent, list):
        del parent[_list_index(parent, tok, allow_end=False)]
    else:
        raise PatchError("cannot remove from a scalar")
    return doc


def json_patch(target: Any, ops: Any) -> Any:
    """Apply an RFC 6902 operation list to a deep copy of `target`."""
    if not isinstance(ops, list):
        raise ValueError("json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError("malformed operation")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            if _split_pointer(path):
                doc = _remove(doc, path)
                doc = _add(doc, path, copy.deepcopy(op.get("value")))
            else:
                doc = copy.deepcopy(op.get("value"))
        elif kind == "move":
            value = _get(doc, op["from"])
            doc = _remove(doc, op["from"])
            doc = _add(doc, path, value)
        elif kind == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, op["from"])))
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise PatchError(f"test failed at {path!r}")
        else:
            raise PatchError(f"unknown op {kind!r}")
    return doc


# ---------------------------------------------------------------------------
# Strategic merge patch (built-in types only)

# Lists merged by key, by field name (the simulator's types never reuse these
# names with different semantics).  Lists not named here are replaced.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "ephemeralContainerStatuses": "name",
    "conditions": "type",
    "env": "name",
    "ports": "containerPort",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "podIPs": "ip",
    "hostIPs": "ip",
    "resourceClaims": "name",
    "topologySpreadConstraints": "topologyKey",
}
# Primitive lists with patchStrategy "merge" (union).
MERGE_PRIMITIVE_LISTS = {"finalizers"}


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch approximating apimachinery's for core types.

    Dicts merge, null deletes, lists named in `MERGE_KEYS` merge element-wise
    by key, `finalizers` merge as a set; `$patch: replace|delete`,
    `$deleteFromPrimitiveList/<f>` and `$retainKeys` are honoured,
    `$setElementOrder/<f>` is ignored (order is kept as stored, new at end).
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            existing = result.get(field)
            if isinstance(existing, list):
                result[field] = [x for x in existing if x not in (value or [])]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and key in MERGE_KEYS:
            result[key] = _merge_keyed_list(result.get(key), value, MERGE_KEYS[key])
        elif isinstance(value, list) and key in MERGE_PRIMITIVE_LISTS:
            existing = list(result.get(key) or [])
            result[key] = existing + [x for x in value if x not in existing]
        else:
            result[key] = copy.deepcopy(value)
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain or k.startswith("$")}
    return result


def _merge_keyed_list(target: Any, patch: list[Any], key: str) -> list[Any]:
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [copy.deepcopy(p) for p in patch if not (isinstance(p, dict) and p.get("$patch") == "replace")]
    result = [copy.deepcopy(x) for x in (target if isinstance(target, list) else [])]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            result.append(copy.deepcopy(item))
            continue
        idx = next(
            (i for i, x in enumerate(result) if isinstance(x, dict) and x.get(key) == item[key]),
            None,
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                del result[idx]
            continue
        if idx is None:
            result.append(strategic_merge_patch({}, item))
        else:
            result[idx] = strategic_merge_patch(result[idx], item)
    return result
