"""One CDI spec file per prepared claim, built with :mod:`hetero_dp.allocation.cdi`.

Kind ``<driver>/claim``; one CDI device per allocated device, named
``<claim UID>-<DRA device name>``, carrying that device's edits (nodes,
mounts, env); shared nodes and mounts go in the spec-wide edits. A per-claim
file means a claim's edits never disturb another's, and unprepare is one
unlink.

Env keys that several devices set to different values (``ACME_VISIBLE_DEVICES``
``=0`` and ``=1``) must be joined per container, which CDI env edits cannot do
(the last one wins). For those, each request gets one more CDI device,
``<claim UID>_<request>`` (``_`` never occurs in a DRA device name, so the two
kinds of names cannot clash), holding the joined values of the request's devices;
its ID is answered with every device of that request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hetero_dp.allocation.cdi import (
    SPEC_MODE,
    build_spec,
    check_device_names,
    list_env_keys,
    render_spec,
    required_version,
    validate_kind,
)
from hetero_dp.kits.atomic import write_atomic
from hetero_dp.model.device import Device

SPEC_PREFIX = "hetero-dp-dra_"
CLAIM_CLASS = "claim"


def claim_kind(driver: str) -> str:
    return validate_kind(f"{driver}/{CLAIM_CLASS}", field="driverName")


def spec_path(cdi_dir: Path, driver: str, claim_uid: str) -> Path:
    return Path(cdi_dir) / f"{SPEC_PREFIX}{driver}_{claim_uid}.json"


def build_claim_spec(
    driver: str,
    claim_uid: str,
    devices: Mapping[str, Device],
    requests: Mapping[str, Sequence[str]],
) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The spec for one claim and the CDI IDs for each of its DRA device names.

    ``devices``: DRA device name -> record; ``requests``: request name -> the
    DRA device names allocated for it.
    """
    kind = claim_kind(driver)
    renamed = [dataclasses.replace(d, id=f"{claim_uid}-{name}") for name, d in devices.items()]
    spec = build_spec(kind, renamed)
    ids = {name: [f"{kind}={claim_uid}-{name}"] for name in devices}
    list_keys = list_env_keys(list(devices.values()))
    if list_keys:
        extra = []
        for request, names in requests.items():
            env: dict[str, list[str]] = {}
            for name in names:
                for key, value in devices[name].env.items():
                    if key in list_keys and value not in env.setdefault(key, []):
                        env[key].append(value)
            if not env:
                continue
            cdi_name = f"{claim_uid}_{request}"
            check_device_names([cdi_name], kind)
            extra.append(
                {
                    "name": cdi_name,
                    "containerEdits": {"env": [f"{k}={','.join(v)}" for k, v in env.items()]},
                }
            )
            for name in names:
                ids[name].append(f"{kind}={cdi_name}")
        spec["devices"].extend(extra)
        spec["cdiVersion"] = required_version(spec)
    return spec, ids


def write_claim_spec(path: Path, spec: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, render_spec(spec), SPEC_MODE)
