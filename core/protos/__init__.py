"""Our internal protobuf messages (``xmc.internal.v1``), compiled on demand.

The ``.proto`` files here are the source; their ``*_pb2.py`` modules are
generated with grpcio-tools (``./dev setup`` runs :func:`ensure_compiled`)
and are not committed. Importing this package compiles any module that is
missing or older than its ``.proto``, so a worker, a test or a management
command never runs against stale generated code.

Use ``from core.protos import task_pb2, artifact_lifecycle_event_pb2, metrics_pb2``.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOS = ("task", "artifact_lifecycle_event", "metrics")


def _stale(name: str) -> bool:
    src, out = HERE / f"{name}.proto", HERE / f"{name}_pb2.py"
    return not out.exists() or out.stat().st_mtime < src.stat().st_mtime


def ensure_compiled() -> None:
    """Generate every stale ``*_pb2.py`` (atomic rename: safe in parallel)."""
    stale = [n for n in PROTOS if _stale(n)]
    if not stale:
        return
    import grpc_tools
    from grpc_tools import protoc

    include = str(Path(grpc_tools.__file__).resolve().parent / "_proto")
    with tempfile.TemporaryDirectory(dir=HERE) as tmp:
        for name in stale:
            # Generated as core/protos/<name>_pb2.py relative to the repo root
            # so imports inside generated code resolve as package imports.
            rc = protoc.main([
                "protoc", f"-I{HERE.parent.parent}", f"-I{include}",
                f"--python_out={tmp}", f"--pyi_out={tmp}",
                str(HERE / f"{name}.proto"),
            ])
            if rc != 0:
                raise RuntimeError(f"protoc failed for core/protos/{name}.proto")
            for suffix in ("_pb2.py", "_pb2.pyi"):
                os.replace(Path(tmp) / "core" / "protos" / f"{name}{suffix}", HERE / f"{name}{suffix}")


ensure_compiled()

from core.protos import artifact_lifecycle_event_pb2, metrics_pb2, task_pb2  # noqa: E402

__all__ = ["artifact_lifecycle_event_pb2", "ensure_compiled", "metrics_pb2", "task_pb2"]
