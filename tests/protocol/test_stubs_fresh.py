"""The committed gRPC stubs are exactly what the .proto files generate."""

from __future__ import annotations

from mindmotor.protocol.generate import PACKAGE_DIR, generate, proto_files


def test_every_proto_has_committed_stubs_that_are_fresh(tmp_path):
    written = generate(tmp_path)
    assert {p.stem for p in proto_files()} <= {p.name.split("_pb2")[0] for p in written}
    stale = [p.name for p in written if (PACKAGE_DIR / p.name).read_text() != p.read_text()]
    assert not stale, f"stale stubs {stale}: run `python -m mindmotor.protocol.generate`"
    committed = {p.name for p in PACKAGE_DIR.glob("*_pb2*.py*")}
    orphans = committed - {p.name for p in written}
    assert not orphans, f"stubs without a .proto: {sorted(orphans)}"
