#!/usr/bin/env python3
"""Regenerate hetero_dp/api/ from proto/ (run: python3 scripts/gen_proto.py).

``--check`` regenerates into a temp dir and exits 1 if the checked-in code differs.
The protos are staged under their package path so the generated imports are absolute
(``from hetero_dp.api import ...``).
"""

from __future__ import annotations

import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PACKAGE = Path("hetero_dp/api")


def generate(out_root: Path) -> list[Path]:
    from grpc_tools import protoc  # dev dependency: grpcio-tools

    with tempfile.TemporaryDirectory() as stage:
        staged = Path(stage) / PACKAGE
        staged.mkdir(parents=True)
        protos = sorted(PROTO_DIR.glob("*.proto"))
        for p in protos:
            shutil.copy(p, staged / p.name)
        (out_root / PACKAGE).mkdir(parents=True, exist_ok=True)
        args = [
            "protoc",
            f"-I{stage}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            *(str(PACKAGE / p.name) for p in protos),
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
    return sorted((out_root / PACKAGE).glob("*_pb2*.py*"))


def main() -> int:
    if "--check" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            fresh = generate(Path(tmp))
            stale = [
                f.name
                for f in fresh
                if not (ROOT / PACKAGE / f.name).exists()
                or not filecmp.cmp(f, ROOT / PACKAGE / f.name, shallow=False)
            ]
            if stale:
                print("generated code differs from proto/: " + ", ".join(stale))
                print("run: python3 scripts/gen_proto.py")
                return 1
        print("generated code matches proto/")
        return 0
    for f in generate(ROOT):
        print(f"wrote {f.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
