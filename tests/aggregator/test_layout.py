"""The estimation engine (every calmkit_aggregator module outside ``service/``) does not
import gRPC, protobuf, storage or service code, so it runs in-process without the
service. (The client package it uses for plans carries its own gRPC Collector.)"""

from __future__ import annotations

import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import calmkit_aggregator

ENGINE = sorted(
    m.name.removeprefix("calmkit_aggregator.")
    for m in pkgutil.walk_packages(calmkit_aggregator.__path__, "calmkit_aggregator.")
    if not m.ispkg and not m.name.startswith("calmkit_aggregator.service")
)
FORBIDDEN = re.compile(r"^\s*(import|from)\s+(grpc|google\.protobuf|calmkit_proto|sqlite3|"
                       r"psycopg|\.+service|calmkit_aggregator\.service)\b", re.M)  # fmt: skip


def test_engine_modules_import_no_service_code() -> None:
    assert "reconstruction.maxent" in ENGINE and "planning.search" in ENGINE and len(ENGINE) > 10
    root = Path(calmkit_aggregator.__file__).parent
    offending = {m: FORBIDDEN.findall((root / (m.replace(".", "/") + ".py")).read_text())
                 for m in ENGINE}  # fmt: skip
    assert {m: hits for m, hits in offending.items() if hits} == {}
    # and at run time: importing all of the engine loads nothing of the service
    probe = (
        "import sys\n"
        f"for name in {ENGINE!r}: __import__('calmkit_aggregator.' + name)\n"
        "print(','.join(m for m in sys.modules if m.startswith('calmkit_aggregator.service')"
        " or m.split('.')[0] == 'psycopg'))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)  # fmt: skip
    assert out.stdout.strip() == ""
