"""What the API server refuses in a ResourceSlice, checked the way it checks it.

One implementation, used by the publisher (a device that would be refused is
left out with a line naming the field, never the whole pool) and by the
stand-in API server in :mod:`hetero_dp.testing.dra` (which refuses the same
objects with a 422 naming the same field).

Source of every rule: Kubernetes ``pkg/apis/resource/validation/validation.go``
and the limits in ``staging/src/k8s.io/api/resource/*/types.go`` (1.34-1.36):

- lengths are Go ``len()`` of a string, so **bytes** of its UTF-8 form, not
  characters (a 46-character product name of 81 bytes is "Too long");
- ``int`` attributes are ``int64``; a larger number is not even decoded (HTTP 400);
- a device has at most 32 attributes and capacities together; a slice at most
  128 devices, 64 when any device has taints or consumes counters;
- a driver name (and the domain of a qualified attribute name) is at most 63
  bytes, a lowercase DNS subdomain; an attribute identifier a C identifier of
  at most 32; device and counter names DNS labels;
- ``sharedCounters`` and ``devices`` never share a slice; at most 8 counter
  sets of 32 counters; a device consumes from at most 2 counter sets;
- at most 16 taints per device, effect ``NoSchedule`` or ``NoExecute``;
  ``requestPolicy`` on a capacity only with ``allowMultipleAllocations``.

Quantities: the server stores a quantity in canonical form (``16384Mi`` comes
back as ``16Gi``, ``1000`` as ``1k``); :func:`canonical_quantity` computes
that form (apimachinery ``resource.Quantity.String``) so what the driver sends
is what the server stores, and :func:`quantity_value` compares them by value.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from hetero_dp.model.names import MAX_DNS_LABEL, is_dns_label, is_dns_subdomain, is_qualified_name

GROUP = "resource.k8s.io"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_VALUE_BYTES = 64  # DeviceAttributeMaxValueLength
MAX_ATTRIBUTES_AND_CAPACITIES = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
MAX_DEVICES = 128  # ResourceSliceMaxDevices
MAX_DEVICES_ADVANCED = 64  # ...WithTaintsOrConsumesCounters
MAX_IDENTIFIER = 32  # DeviceMaxIDLength
MAX_DOMAIN = 63  # DeviceMaxDomainLength (= a driver name's limit)
MAX_DRIVER_NAME = 63
MAX_POOL_NAME = 253
MAX_TAINTS = 16  # DeviceTaintsMaxLength
TAINT_EFFECTS = ("NoSchedule", "NoExecute")
MAX_COUNTER_SETS = 8
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMPTIONS_PER_DEVICE = 2
MAX_COUNTERS_PER_CONSUMPTION = 32

_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NUM = r"(0|[1-9]\d*)"
_PRE = r"(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
_BUILD = r"[0-9a-zA-Z-]+"
SEMVER = re.compile(rf"^{_NUM}\.{_NUM}\.{_NUM}(-{_PRE}(\.{_PRE})*)?(\+{_BUILD}(\.{_BUILD})*)?$")


def nbytes(text: str) -> int:
    """Length as the API server counts it: bytes of the UTF-8 form."""
    return len(text.encode("utf-8"))


# --- quantities (apimachinery resource.Quantity) -----------------------------------------

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {v: k for k, v in _DECIMAL.items()}
_QUANTITY = re.compile(
    r"^([+-]?)(\d+\.?\d*|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d+|n|u|m|k|M|G|T|P|E)?$"
)
_NANO = Fraction(1, 10**9)


def _parse(text: str) -> tuple[Fraction, str]:
    """(value, format) where format is ``binary``, ``decimal`` or ``exponent``."""
    if not isinstance(text, str):
        raise ValueError(f"a quantity must be a string, not {type(text).__name__}")
    m = _QUANTITY.match(text.strip())
    if not m:
        raise ValueError(f"quantities must match the regular expression {_QUANTITY.pattern!r}")
    sign, number, suffix = m.group(1), m.group(2), m.group(3) or ""
    value = Fraction(number if not number.endswith(".") else number[:-1])
    if sign == "-":
        value = -value
    if suffix in _BINARY:
        return value * 1024 ** _BINARY[suffix], "binary"
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return value * Fraction(10) ** int(suffix[1:]), "exponent"
    return value * Fraction(10) ** _DECIMAL[suffix], "decimal"


def quantity_value(text: str) -> Fraction:
    """The exact value of a quantity string (ValueError if it is not one)."""
    value, _ = _parse(text)
    return _round_nano(value)


def _round_nano(value: Fraction) -> Fraction:
    # apimachinery keeps at most nano precision and rounds up what is finer
    scaled = value / _NANO
    if scaled.denominator == 1:
        return value
    return Fraction(-((-scaled.numerator) // scaled.denominator)) * _NANO


def canonical_quantity(text: str) -> str:
    """The form the API server stores ``text`` in: ``16384Mi`` -> ``16Gi``, ``1000`` -> ``1k``."""
    value, fmt = _parse(text)
    value = _round_nano(value)
    sign = "-" if value < 0 else ""
    mag = abs(value)
    if fmt == "binary" and mag >= 1024 and mag.denominator == 1:
        n = int(mag)
        exp = 0
        while exp < 6 and n % 1024 == 0:
            n //= 1024
            exp += 1
        suffix = {v: k for k, v in _BINARY.items()}.get(exp, "")
        return f"{sign}{n}{suffix}"
    if mag == 0:
        return "0"
    # decimal: the largest exponent (a multiple of 3, -9..18) leaving an integer mantissa
    exp = -9
    scaled: Fraction = mag / Fraction(10) ** exp
    while exp < 18 and (scaled / 1000).denominator == 1:
        scaled /= 1000
        exp += 3
    mantissa = int(scaled)
    if fmt == "exponent":
        return f"{sign}{mantissa}" + (f"e{exp}" if exp else "")
    return f"{sign}{mantissa}{_DECIMAL_SUFFIX[exp]}"


# --- names ------------------------------------------------------------------------------


def driver_name_problem(name: object) -> str | None:
    """Why ``name`` is no driver name (ValidateCSIDriverName: <= 63 bytes, DNS subdomain)."""
    if not isinstance(name, str) or not name:
        return "Required value"
    if nbytes(name) > MAX_DRIVER_NAME:
        return f"Too long: may not be more than {MAX_DRIVER_NAME} bytes"
    if not is_qualified_name(name) or not is_dns_subdomain(name.lower()):
        return f"Invalid value: {name!r}: must be a DNS subdomain of at most 63 characters"
    return None


def qualified_name_problem(key: object) -> str | None:
    """Why ``key`` is no attribute or capacity name (``[domain/]C_identifier``), or None."""
    if not isinstance(key, str):
        return "must be a string"
    parts = key.split("/")
    if len(parts) > 2:
        return f"Invalid value: {key!r}: must not contain more than one slash"
    ident = parts[-1]
    if len(parts) == 2:
        if not parts[0]:
            return "Invalid value: '': the domain must not be empty"
        problem = driver_name_problem(parts[0])
        if problem:
            return f"domain {parts[0]!r}: {problem}"
    if not ident:
        return "Invalid value: '': the name must not be empty"
    if nbytes(ident) > MAX_IDENTIFIER:
        return f"Too long: may not be more than {MAX_IDENTIFIER} bytes"
    if not _C_IDENTIFIER.match(ident):
        return (
            f"Invalid value: {ident!r}: a valid C identifier must start with a letter or "
            "'_', followed by letters, digits or '_'"
        )
    return None


def _label_name_problem(key: object) -> str | None:
    # a taint key is a label key: [DNS subdomain/]name, name a qualified name of <= 63
    if not isinstance(key, str) or not key:
        return "Required value"
    prefix, slash, name = key.rpartition("/")
    if slash and not is_dns_subdomain(prefix):
        return f"Invalid value: {key!r}: prefix part must be a lowercase DNS subdomain"
    if not is_qualified_name(name):
        return (
            f"Invalid value: {key!r}: name part must be a qualified name of at most 63 characters"
        )
    return None


# --- values -----------------------------------------------------------------------------

_ATTRIBUTE_KINDS = ("bool", "int", "string", "version")


def attribute_problems(value: object, where: str) -> list[str]:
    """What is wrong with one attribute value (``{"int": 3}`` and the like)."""
    if not isinstance(value, dict):
        return [f"{where}: Invalid value: must be an object"]
    kinds = [k for k in value if k in _ATTRIBUTE_KINDS]
    unknown = [k for k in value if k not in _ATTRIBUTE_KINDS]
    out = [f"{where}.{k}: unknown field" for k in unknown]
    if len(kinds) != 1:
        return [*out, f"{where}: Invalid value: exactly one value must be specified"]
    kind = kinds[0]
    v = value[kind]
    if kind == "bool" and not isinstance(v, bool):
        out.append(f"{where}.bool: Invalid value: {v!r}: must be true or false")
    elif kind == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            out.append(f"{where}.int: Invalid value: {v!r}: must be an integer")
        elif not INT64_MIN <= v <= INT64_MAX:
            out.append(
                f"{where}.int: Invalid value: {v}: cannot unmarshal number {v} into int64 "
                f"(range {INT64_MIN}..{INT64_MAX})"
            )
    elif kind in ("string", "version"):
        if not isinstance(v, str):
            out.append(f"{where}.{kind}: Invalid value: {v!r}: must be a string")
        else:
            if kind == "version" and not SEMVER.match(v):
                out.append(
                    f"{where}.version: Invalid value: {v!r}: must be a string compatible "
                    "with semver.org spec 2.0.0"
                )
            if nbytes(v) > MAX_VALUE_BYTES:
                out.append(
                    f"{where}.{kind}: Too long: may not be more than {MAX_VALUE_BYTES} bytes "
                    f"(is {nbytes(v)} bytes, {len(v)} characters)"
                )
    return out


def quantity_problem(value: object) -> str | None:
    try:
        _parse(value)  # type: ignore[arg-type]
    except ValueError as e:
        return f"Invalid value: {value!r}: {e}"
    return None


def _counters_problems(counters: object, where: str, limit: int) -> list[str]:
    if not isinstance(counters, dict) or not counters:
        return [f"{where}: Required value"]
    out = []
    if len(counters) > limit:
        out.append(f"{where}: Too many: {len(counters)}: must have at most {limit} items")
    for key, c in counters.items():
        if not is_dns_label(str(key)):
            out.append(f"{where}[{key}]: Invalid value: {key!r}: must be a DNS label")
        problem = quantity_problem((c or {}).get("value") if isinstance(c, dict) else None)
        if problem:
            out.append(f"{where}[{key}].value: {problem}")
    return out


def device_problems(device: dict[str, Any], where: str = "device") -> list[str]:
    """What the server refuses in one device (``v1`` shape: no ``basic`` wrapper)."""
    out: list[str] = []
    name = device.get("name")
    if not isinstance(name, str) or not is_dns_label(name):
        out.append(f"{where}.name: Invalid value: {name!r}: must be a DNS label")
    attrs = device.get("attributes") or {}
    caps = device.get("capacity") or {}
    if len(attrs) + len(caps) > MAX_ATTRIBUTES_AND_CAPACITIES:
        out.append(
            f"{where}: Invalid value: {len(attrs) + len(caps)}: the total number of "
            f"attributes and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}"
        )
    for key, value in attrs.items():
        problem = qualified_name_problem(key)
        if problem:
            out.append(f"{where}.attributes[{key}]: {problem}")
        out += attribute_problems(value, f"{where}.attributes[{key}]")
    multi = device.get("allowMultipleAllocations") is True
    for key, value in caps.items():
        problem = qualified_name_problem(key)
        if problem:
            out.append(f"{where}.capacity[{key}]: {problem}")
        if not isinstance(value, dict):
            out.append(f"{where}.capacity[{key}]: Invalid value: must be an object")
            continue
        problem = quantity_problem(value.get("value"))
        if problem:
            out.append(f"{where}.capacity[{key}].value: {problem}")
        if "requestPolicy" in value and not multi:
            out.append(
                f"{where}.capacity[{key}].requestPolicy: Forbidden: allowMultipleAllocations "
                "must be true"
            )
    taints = device.get("taints") or []
    if len(taints) > MAX_TAINTS:
        out.append(f"{where}.taints: Too many: {len(taints)}: must have at most {MAX_TAINTS} items")
    for i, taint in enumerate(taints):
        tw = f"{where}.taints[{i}]"
        problem = _label_name_problem(taint.get("key"))
        if problem:
            out.append(f"{tw}.key: {problem}")
        value = str(taint.get("value", ""))
        if value and (len(value) > MAX_DNS_LABEL or not is_qualified_name(value)):
            out.append(f"{tw}.value: Invalid value: {value!r}: must be a valid label value")
        if taint.get("effect") not in TAINT_EFFECTS:
            out.append(
                f"{tw}.effect: Unsupported value: {taint.get('effect')!r}: supported values: "
                + ", ".join(f'"{e}"' for e in TAINT_EFFECTS)
            )
    consumes = device.get("consumesCounters") or []
    if len(consumes) > MAX_CONSUMPTIONS_PER_DEVICE:
        out.append(
            f"{where}.consumesCounters: Too many: {len(consumes)}: must have at most "
            f"{MAX_CONSUMPTIONS_PER_DEVICE} items"
        )
    sets: set[str] = set()
    for i, c in enumerate(consumes):
        cw = f"{where}.consumesCounters[{i}]"
        cs = c.get("counterSet")
        if not isinstance(cs, str) or not is_dns_label(cs):
            out.append(f"{cw}.counterSet: Invalid value: {cs!r}: must be a DNS label")
        elif cs in sets:
            out.append(f"{cw}: Duplicate value: {cs!r}")
        sets.add(str(cs))
        out += _counters_problems(c.get("counters"), f"{cw}.counters", MAX_COUNTERS_PER_CONSUMPTION)
    return out


def prune_empty(value: Any) -> Any:
    """Drop what the server does not keep: empty maps and lists, nulls (``omitempty``)."""
    if isinstance(value, dict):
        out = {k: prune_empty(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [prune_empty(v) for v in value]
    return value


def unwrap(device: dict[str, Any], version: str) -> dict[str, Any]:
    """A device of ``version`` in ``v1`` shape (``v1beta1`` wraps all but the name in ``basic``)."""
    if version != "v1beta1":
        return device
    return {"name": device.get("name"), **(device.get("basic") or {})}


def slice_problems(obj: dict[str, Any], version: str) -> list[str]:
    """``field: reason`` lines for what the API server refuses in a ResourceSlice."""
    out: list[str] = []
    if obj.get("apiVersion") != f"{GROUP}/{version}":
        out.append(f"apiVersion: must be {GROUP}/{version} at this URL")
    name = (obj.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not is_dns_subdomain(name):
        out.append(f"metadata.name: Invalid value: {name!r}: must be a DNS subdomain")
    spec = obj.get("spec") or {}
    problem = driver_name_problem(spec.get("driver"))
    if problem:
        out.append(f"spec.driver: {problem}")
    pool = spec.get("pool") or {}
    pool_name = pool.get("name")
    if not pool_name:
        out.append("spec.pool.name: Required value")
    elif nbytes(pool_name) > MAX_POOL_NAME or not all(
        is_dns_subdomain(p) for p in str(pool_name).split("/")
    ):
        out.append(f"spec.pool.name: Invalid value: {pool_name!r}: must be DNS subdomains")
    for key, low in (("resourceSliceCount", 1), ("generation", 0)):
        v = pool.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not INT64_MIN <= v <= INT64_MAX:
            out.append(f"spec.pool.{key}: Invalid value: {v!r}: must be an int64")
        elif v < low:
            out.append(f"spec.pool.{key}: Invalid value: {v}: must be at least {low}")
    node = spec.get("nodeName")
    if node is not None and (not isinstance(node, str) or not is_dns_subdomain(node)):
        out.append(f"spec.nodeName: Invalid value: {node!r}: must be a DNS subdomain")
    devices = spec.get("devices")
    shared = spec.get("sharedCounters")
    if devices and shared:
        out.append("spec: Invalid value: only one of `sharedCounters` or `devices` is allowed")
    devices = [unwrap(d, version) for d in devices or []]
    advanced = any(d.get("taints") or d.get("consumesCounters") for d in devices)
    limit = MAX_DEVICES_ADVANCED if advanced else MAX_DEVICES
    if len(devices) > limit:
        out.append(f"spec.devices: Too many: {len(devices)}: must have at most {limit} items")
    else:
        seen: set[str] = set()
        for i, d in enumerate(devices):
            out += device_problems(d, f"spec.devices[{i}]")
            if d.get("name") in seen:
                out.append(f"spec.devices[{i}].name: Duplicate value: {d.get('name')!r}")
            seen.add(str(d.get("name")))
    shared = shared or []
    if len(shared) > MAX_COUNTER_SETS:
        out.append(
            f"spec.sharedCounters: Too many: {len(shared)}: must have at most "
            f"{MAX_COUNTER_SETS} items"
        )
    names: set[str] = set()
    for i, cs in enumerate(shared):
        w = f"spec.sharedCounters[{i}]"
        n = cs.get("name")
        if not isinstance(n, str) or not is_dns_label(n):
            out.append(f"{w}.name: Invalid value: {n!r}: must be a DNS label")
        elif n in names:
            out.append(f"{w}.name: Duplicate value: {n!r}")
        names.add(str(n))
        out += _counters_problems(cs.get("counters"), f"{w}.counters", MAX_COUNTERS_PER_SET)
    return out
