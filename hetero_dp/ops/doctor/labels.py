"""Step 7, the node label file the daemon writes for Node Feature Discovery."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from hetero_dp.engine.backend import Backend
from hetero_dp.engine.config import Config
from hetero_dp.kits.foreign import ForeignFileError, read_foreign
from hetero_dp.ops.doctor.findings import DoctorSettings, Finding
from hetero_dp.ops.labels import file_name, label_problem

MAX_LABEL_BYTES = 1024 * 1024  # the daemon's file holds a few KiB

# --- labels ----------------------------------------------------------------------------------


def check_labels(
    config: Config, settings: DoctorSettings, backends: Sequence[Backend]
) -> list[Finding]:
    step = "labels"
    if not config.labels.enabled:
        return [Finding(step, "label file", "skip", "labels.enabled is false")]
    directory = settings.path(config.labels.dir)
    prefix = config.socket_prefix
    if backends:
        paths = [directory / file_name(prefix, [b.name for b in backends])]
        missing = f"{paths[0]} does not exist"
    else:  # any daemon's file: <prefix>-<backends>
        paths = sorted(directory.glob(f"{prefix}-*")) if directory.is_dir() else []
        missing = f"no {prefix}-* label file in {directory}"
    paths = [p for p in paths if os.path.lexists(p)]  # not a file: said below
    if not paths:
        return [
            Finding(
                step,
                "label file",
                "fail",
                missing,
                "the daemon writes it once it publishes devices: check that it runs with "
                "labels.enabled (or --labels-dir) and that labels.dir is mounted from the "
                "host's /etc/kubernetes/node-feature-discovery/features.d",
            )
        ]
    return [_label_file(step, p) for p in paths]


def _label_file(step: str, path: Path) -> Finding:
    bad = []
    count = 0
    try:  # the dir is shared with other writers: anything may sit there (kits/foreign.py)
        text = read_foreign(path, max_bytes=MAX_LABEL_BYTES).decode("utf-8", "replace")
    except ForeignFileError as e:
        return Finding(step, path.name, "fail", f"{path} is not read: {e}", "remove it")
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        problem = "not key=value" if not sep else label_problem(key, value)
        if problem:
            bad.append(f"line {n}: {problem}")
        count += 1
    if bad:
        return Finding(
            step,
            path.name,
            "fail",
            f"{path}: " + "; ".join(bad[:5]),
            "Node Feature Discovery skips invalid lines; remove the file and let the "
            "daemon rewrite it",
        )
    return Finding(step, path.name, "pass", f"{path}: {count} labels")
