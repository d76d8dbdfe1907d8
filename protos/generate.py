"""Regenerate the committed protobuf/gRPC Python code from protos/calmkit_proto/v1/*.proto.

    python protos/generate.py            # rewrite the generated files
    python protos/generate.py --check    # exit 1 if the committed files are stale

Needs grpcio-tools (in the ``dev`` extra). Generated modules import each other as
``calmkit_proto.v1.<name>_pb2`` (protoc is run from protos/, the package root).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PROTO_DIR = ROOT / "calmkit_proto" / "v1"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    """Run protoc on every .proto into ``out_dir`` (mirroring calmkit_proto/v1)."""
    from grpc_tools import protoc  # the dev extra

    protos = sorted(PROTO_DIR.glob("*.proto"))
    args = [
        "grpc_tools.protoc",
        f"--proto_path={ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(p.relative_to(ROOT)) for p in protos),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    target = out_dir / "calmkit_proto" / "v1"
    return sorted(p for p in target.iterdir() if p.name.endswith(SUFFIXES))


def stale_files() -> list[str]:
    """Generated files whose committed content differs from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p.read_text() for p in generate(Path(tmp))}
    committed = {p.name: p.read_text() for p in PROTO_DIR.iterdir() if p.name.endswith(SUFFIXES)}
    return sorted(n for n in fresh.keys() | committed.keys() if fresh.get(n) != committed.get(n))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args()
    if args.check:
        stale = stale_files()
        for name in stale:
            print(f"stale: {PROTO_DIR / name}", file=sys.stderr)
        return 1 if stale else 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(Path(tmp)):
            (PROTO_DIR / path.name).write_text(path.read_text())
            print(f"wrote {PROTO_DIR / path.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
