"""The committed generated protobuf/gRPC code matches protos/*.proto."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

GENERATE = Path(__file__).resolve().parents[1] / "protos" / "generate.py"


def test_committed_generated_code_is_fresh() -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) regenerates the code")
    spec = importlib.util.spec_from_file_location("calmkit_generate", GENERATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.stale_files() == [], "run: python protos/generate.py"
