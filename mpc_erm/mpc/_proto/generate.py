"""Regenerate the protobuf/gRPC Python modules in this package from ``proto/*.proto``.

The generated modules are committed (so installing the package needs no protoc), and
tests/mpc/test_transport.py regenerates them into a temporary directory and requires
byte-identical output, so they never go stale. Run after editing a .proto:

    .venv/bin/python -m mpc_erm.mpc._proto.generate
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_DIR = HERE.parents[2] / "proto"
# The .proto files compiled into this package (add the dealer/control protos here).
PROTOS = ("transport.proto", "party.proto", "owner.proto")

# protoc writes ``import transport_pb2 as transport__pb2``: a top-level import that only works
# with the output directory on sys.path. Rewrite it as a package-relative import.
_ABSOLUTE_IMPORT = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)
# Generated code is not ours to lint.
_NOQA = "# ruff: noqa\n"


def generate(out_dir: Path = HERE, proto_dir: Path = PROTO_DIR) -> list[Path]:
    """Compile PROTOS into ``out_dir``; return the written files (sorted)."""
    from grpc_tools import protoc  # dev dependency only: the runtime never needs it

    out_dir.mkdir(parents=True, exist_ok=True)
    for name in PROTOS:
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{proto_dir}",
                f"--python_out={out_dir}",
                f"--grpc_python_out={out_dir}",
                str(proto_dir / name),
            ]
        )
        if rc != 0:
            raise RuntimeError(f"protoc failed on {proto_dir / name} (exit {rc})")
    written = []
    for name in PROTOS:
        stem = Path(name).stem
        for path in (out_dir / f"{stem}_pb2.py", out_dir / f"{stem}_pb2_grpc.py"):
            text = _ABSOLUTE_IMPORT.sub(r"from . import \1 as \2", path.read_text())
            path.write_text(_NOQA + text)
            written.append(path)
    return sorted(written)


def main() -> int:
    for path in generate():
        print(path.relative_to(HERE.parents[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
