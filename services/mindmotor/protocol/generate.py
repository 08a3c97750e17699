"""Regenerate the gRPC stubs from `proto/mindmotor/v1/*.proto` into this package.

    python -m mindmotor.protocol.generate            # write the stubs next to this file
    python -m mindmotor.protocol.generate --out DIR  # write them elsewhere (the freshness test)

The files import only each other (worker.proto and controller.proto import roles.proto), so the
stubs are generated flat and their imports (`import x_pb2`) are made package-relative.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_PROTO_DIR = PACKAGE_DIR.parents[2] / "proto" / "mindmotor" / "v1"


def proto_files(proto_dir: Path = REPO_PROTO_DIR) -> list[Path]:
    return sorted(proto_dir.glob("*.proto"))


def generate(out_dir: Path, proto_dir: Path = REPO_PROTO_DIR) -> list[Path]:
    from grpc_tools import protoc
    import grpc_tools

    files = proto_files(proto_dir)
    if not files:
        raise FileNotFoundError(f"no .proto files in {proto_dir}")
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    out_dir.mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"-I{proto_dir}", f"-I{well_known}", f"--python_out={out_dir}",
            f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}", *[str(f) for f in files]]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed for {proto_dir}")
    written = []
    for path in sorted(out_dir.glob("*_pb2*.py*")):
        text = path.read_text()
        fixed = re.sub(r"^import (\w+_pb2) as", r"from . import \1 as", text, flags=re.M)
        path.write_text(fixed)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PACKAGE_DIR)
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
