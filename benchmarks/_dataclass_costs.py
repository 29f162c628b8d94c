"""How much of a start's import time is dataclass creation: CPU time of the imports
``run BACKEND`` needs before it registers, and of the ``@dataclass`` processing in them
(Python 3.11 compiles and runs each generated method, __init__, __repr__, __eq__,
__hash__, a frozen class's __setattr__ and __delattr__, apart).

    python3 benchmarks/_dataclass_costs.py BACKEND   # one JSON line

(a script, not ``-m``: the benchmarks package's own imports stay out of the figures)

``floor`` imports the floor's modules (grpc.aio, the generated messages) instead.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

FLOOR = Path(__file__).resolve().parent / "_floor.py"

RUN = (
    "import hetero_dp.cli, hetero_dp.ops.assembly, hetero_dp.engine.frontend, "
    "hetero_dp.deviceplugin.dirwatch, hetero_dp_{backend}.backend"
)


def measure(backend: str) -> dict[str, Any]:
    original = dataclasses._process_class  # type: ignore[attr-defined]
    seen = {"classes": 0, "cpu_s": 0.0}

    def timed(cls: type, *args: Any, **kwargs: Any) -> Any:
        t = time.process_time()
        try:
            return original(cls, *args, **kwargs)
        finally:
            seen["classes"] += 1
            seen["cpu_s"] += time.process_time() - t

    dataclasses._process_class = timed  # type: ignore[attr-defined]
    spec = importlib.util.spec_from_file_location("floor", FLOOR)
    assert spec is not None and spec.loader is not None
    floor = importlib.util.module_from_spec(spec)
    t = time.process_time()
    if backend == "floor":
        spec.loader.exec_module(floor)
        floor.load_pb()
        import grpc.aio  # noqa: F401
    else:
        exec(RUN.format(backend=backend), {})  # our own fixed statement
    return {"import_cpu_s": time.process_time() - t, **seen}


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1])))
