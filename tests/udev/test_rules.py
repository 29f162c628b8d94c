"""Rules files: shipped sets load, bad files fail with messages naming file and entry."""

from __future__ import annotations

from pathlib import Path

import pytest
from hetero_dp_udev import UdevBackend, load_rules, shipped_rule_sets
from hetero_dp_udev.backend import options
from hetero_dp_udev.rules import parse_rules

from hetero_dp import ConfigError


def test_every_shipped_rule_set_loads() -> None:
    assert set(shipped_rule_sets()) >= {"amd-gpu", "ascend-npu", "gaudi", "xilinx-fpga", "dev-glob"}
    resources = {r.resource for name in shipped_rule_sets() for r in load_rules([name])}
    assert {"amd.com/gpu", "habana.ai/gaudi", "xilinx.com/fpga-<VBNV>-<timestamp>"} <= {
        r.label for name in shipped_rule_sets() for r in load_rules([name])
    }
    assert {"huawei.com/Ascend910", "huawei.com/Ascend310", "huawei.com/Ascend310P"} <= resources
    assert "hetero-dp.io/serial" in resources
    generic = {r.resource for r in load_rules(shipped_rule_sets(), names="generic")}
    assert "huawei.com/npu" in generic and "huawei.com/Ascend910" not in generic
    assert "xilinx.com/fpga" in generic


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("{attribute:vendor}.com/x", "placeholders may only follow"),
        ("example.com/x-{nope}", "unknown placeholder {nope}"),
        ("example.com/x y-{attribute:model}", "invalid resource name"),
    ],
)
def test_a_templated_resource_name_is_checked_at_load(name: str, words: str) -> None:
    text = f"resources:\n  - name: '{name}'\n    match: {{subsystem: misc}}\n"
    with pytest.raises(ConfigError, match=r"resources\[0\]\.name") as caught:
        parse_rules(text, source="mine.yaml")
    assert words in str(caught.value)


def test_rules_option_forms(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("resources:\n  - name: example.com/thing\n    match: {subsystem: misc}\n")
    assert [r.resource for r in load_rules(str(path))] == ["example.com/thing"]
    both = load_rules(["amd-gpu", str(path)])
    assert [r.resource for r in both] == ["amd.com/gpu", "example.com/thing"]
    assert [r.resource for r in load_rules("amd-gpu,gaudi")] == ["amd.com/gpu", "habana.ai/gaudi"]


def _error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_rules(str(path))
    message = str(info.value)
    assert str(path) in message, message  # every error names the file
    return message


GOOD = "  - name: example.com/good\n    match: {subsystem: pci}\n"


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (
            "  - name: example.com/x\n    match: {subsystem: pci}\n    colour: red\n",
            [
                "resources[1].colour",
                "entry 'example.com/x'",
                "unknown key (known: annotations, companions, drivers,",
            ],
        ),
        (
            "  - name: example.com/x\n    match: {subsytem: pci}\n",
            [
                "resources[1].match.subsytem",
                "unknown key; did you mean 'subsystem'? (known: attributes, ",
            ],
        ),
        (
            "  - name: example.com/x\n    match:\n      attributes: {class: {regex: '0x03(['}}\n",
            ["resources[1].match.attributes.class.regex", "bad regex '0x03(['"],
        ),
        (
            "  - name: example.com/x\n    match: {subsystem: pci}\n"
            "    health: {attribute: state, regex: '*bad'}\n",
            ["resources[1].health.regex", "bad regex"],
        ),
        (
            "  - name: gpu\n    match: {subsystem: pci}\n",
            ["resources[1].name", "has no vendor prefix"],
        ),
        (
            "  - name: Example.com/gpu\n    match: {subsystem: pci}\n",
            ["resources[1].name", "not a lowercase DNS subdomain"],
        ),
        (
            "  - name: example.com/-gpu\n    match: {subsystem: pci}\n",
            ["resources[1].name", "starting and ending with a letter or digit"],
        ),
        (
            "  - name: kubernetes.io/gpu\n    match: {subsystem: pci}\n",
            ["resources[1].name", "reserved"],
        ),
        (
            "  - name: example.com/x\n    match: {subsystem: pci}\n    env: {A: '{idx}'}\n",
            ["resources[1].env.A", "unknown placeholder {idx}"],
        ),
        (
            "  - name: example.com/x\n    match: {subsystem: pci}\n"
            "    nodeTemplates: ['davinci{index}']\n",
            ["resources[1].nodeTemplates[0]", "under /dev/"],
        ),
        (
            "  - name: example.com/x\n    match: {vendor: nvidia}\n",
            ["resources[1].match.vendor", "hex ID"],
        ),
        (
            "  - name: example.com/x\n    match: {subsystem: pci}\n    id: uuid\n",
            ["resources[1].id"],
        ),
        (
            "  - name: example.com/x\n    match: {subsystem: pci}\n    index: [first]\n",
            ["resources[1].index"],
        ),
        (
            "  - name: example.com/x\n    match: {subsystem: pci}\n    limit: 0\n",
            ["resources[1].limit", "positive integer"],
        ),
        (
            "  - name: example.com/x\n    match: {subsystem: pci}\n"
            "    health: {attribute: state, equals: ok, regex: ok}\n",
            ["resources[1].health", "exactly one of equals, regex"],
        ),
        (
            "  - name: example.com/x\n    match: {subsystem: pci}\n"
            "    companions: [{subsystem: drm, scope: board}]\n",
            ["resources[1].companions[0].scope"],
        ),
        (
            "  - name: example.com/x\n    match: {subsystem: pci}\n"
            "    companions: [{sysname: 'accel_controlD*', scope: index}]\n",
            ["resources[1].companions[0]", "scope: index needs subsystem and sysname"],
        ),
        (
            "  - name: example.com/x\n    match: {subsystem: pci}\n    id: 'npu-{slot}'\n",
            ["resources[1].id", "unknown placeholder {slot}"],
        ),
        (
            "  - name: example.com/x\n    match: {subsystem: pci}\n    drivers: [1]\n",
            ["resources[1].drivers", "glob string"],
        ),
        (
            "  - name: example.com/x\n    match: {subsystem: pci}\n    index: 'child:'\n",
            ["resources[1].index", "child:<subsystem>"],
        ),
        ("  - name: example.com/x\n", ["resources[1].match", "is required"]),
        ("  - name: example.com/good\n    match: {subsystem: usb}\n", ["defined twice"]),
    ],
)
def test_bad_entry_names_file_entry_and_field(
    tmp_path: Path, entry: str, expected: list[str]
) -> None:
    message = _error(tmp_path, "resources:\n" + GOOD + entry)
    for part in expected:
        assert part in message, message


def test_generic_list_is_checked_whichever_names_are_used(tmp_path: Path) -> None:
    text = "resources:\n" + GOOD + "generic:\n  - name: example.com/x\n    match: {colour: red}\n"
    message = _error(tmp_path, text)
    assert "generic[0].match.colour" in message, message
    assert "non-empty list" in _error(tmp_path, "resources:\n" + GOOD + "generic: []\n")


def test_generic_names_and_templates(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(
        "resources:\n"
        "  - name: example.com/Card\n"
        "    match: {subsystem: pci}\n"
        "    id: 'Card-{index}'\n"
        "    env: {MODULES: '{attribute:module_id}', DEV: '{index}'}\n"
        "generic:\n"
        "  - name: example.com/card\n"
        "    match: {subsystem: pci}\n"
    )
    (vendor,) = load_rules(str(path))
    (generic,) = load_rules(str(path), names="generic")
    assert (vendor.resource, vendor.id_kind, vendor.id_template) == (
        "example.com/Card",
        "template",
        "Card-{index}",
    )
    assert vendor.template_attributes == ("module_id",)
    assert (generic.resource, generic.id_kind, generic.where) == (
        "example.com/card",
        "pci",
        f"{path}: generic[0] (example.com/card)",
    )
    with pytest.raises(ConfigError, match=r"names.*vendor, generic"):
        load_rules(str(path), names="both")


def test_bad_documents(tmp_path: Path) -> None:
    assert "not valid YAML" in _error(tmp_path, "resources: [\n")
    assert (
        "field 'resource': unknown key; did you mean 'resources'? "
        "(known: generic, resources, version)"
    ) in _error(tmp_path, "resource: []\n")
    assert "non-empty list" in _error(tmp_path, "resources: []\n")
    with pytest.raises(ConfigError, match="cannot read rules file"):
        load_rules(str(tmp_path / "absent.yaml"))


def test_unknown_shipped_name_lists_the_shipped_ones() -> None:
    with pytest.raises(ConfigError) as info:
        load_rules(["amd-gpu", "nvidia"])
    assert "unknown shipped rule set 'nvidia'" in str(info.value)
    assert "ascend-npu" in str(info.value)


def test_configure_requires_rules_and_rejects_bad_ones(tmp_path: Path) -> None:
    backend = UdevBackend()
    with pytest.raises(ConfigError, match="rules"):
        backend.configure(options({}))
    bad = tmp_path / "bad.yaml"
    bad.write_text("resources:\n  - name: nope\n    match: {subsystem: pci}\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*resources\[0\]\.name"):
        backend.configure(options({"rules": str(bad)}))


def test_doctor_reports_bad_rules_as_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("resources:\n  - name: example.com/x\n    match: {sysname: 3}\n")
    checks = UdevBackend().doctor(options({"rules": str(bad)}))
    assert checks[0].status == "fail"
    assert "bad.yaml" in checks[0].message and "match.sysname" in checks[0].message


def test_unquoted_hex_ids_are_read_as_hex() -> None:
    (rule,) = parse_rules(
        "resources:\n  - name: amd.com/gpu\n"
        "    match: {vendor: 0x1002, device: ['740f', 0x740C]}\n",
        source="inline",
    )
    assert rule.match.vendor == {0x1002}
    assert rule.match.device == {0x740F, 0x740C}


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("amd.com/gpu", True),
        ("habana.ai/gaudi", True),
        ("vendor/device", True),  # a prefix without a dot is accepted
        ("example.com/a.b_c-D9", True),
        ("example.com/" + "a" * 63, True),
        ("example.com/" + "a" * 64, False),
        ("example.com/gpu.", False),
        ("example.com/gp u", False),
        ("EXAMPLE.com/gpu", False),
        ("-example.com/gpu", False),
        ("example.com/a/b", False),
        ("example.com/", False),
        ("/gpu", False),
        ("requests.example.com/gpu", False),
        ("foo.kubernetes.io/gpu", False),
    ],
)
def test_resource_names_follow_the_kubelet(name: str, ok: bool) -> None:
    text = f"resources:\n  - name: {name!r}\n    match: {{subsystem: pci}}\n"
    if ok:
        assert [r.resource for r in parse_rules(text, source="inline")] == [name]
    else:
        with pytest.raises(ConfigError, match=r"inline.*resources\[0\]\.name"):
            parse_rules(text, source="inline")


# --- hostile rules (issue #29) -------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "fld"),
    [
        ("    env: {X: '{attribute:../../../../etc/passwd}'}\n", "env.X"),
        ("    annotations: {a.io/x: '{attribute:/etc/passwd}'}\n", "annotations.a.io/x"),
        ("    id: attribute:../../etc/hostname\n", "id"),
        ("    index: [attribute:./../x]\n", "index"),
        ("    health: {attribute: ../../etc/shadow, equals: x}\n", "health.attribute"),
        ("    nodeTemplates: ['/dev/../etc/shadow{index}']\n", "nodeTemplates[0]"),
        ("    nodeTemplates: ['/dev//accel{index}']\n", "nodeTemplates[0]"),
        ("    sharedNodes: ['/dev/../etc/passwd']\n", "sharedNodes[0]"),
        ("    mounts: [{hostPath: /opt/../etc, containerPath: /x}]\n", "mounts[0].hostPath"),
    ],
)
def test_rules_reaching_out_of_sysfs_or_dev_are_refused(entry: str, fld: str) -> None:
    text = "resources:\n  - name: example.com/x\n    match: {subsystem: accel}\n" + entry
    with pytest.raises(ConfigError) as err:
        parse_rules(text, source="hostile.yaml")
    assert fld in str(err.value) and "hostile.yaml" in str(err.value)


def test_match_attribute_names_with_dotdot_are_refused() -> None:
    text = (
        "resources:\n  - name: example.com/x\n    match:\n"
        "      attributes: {../../etc/passwd: root}\n"
    )
    with pytest.raises(ConfigError, match=r"match\.attributes"):
        parse_rules(text, source="hostile.yaml")


def test_catastrophic_regex_matches_in_linear_time() -> None:
    """``(a+)+b`` on 'aaa...c' takes Python's re about 2**n steps (holding the GIL, so
    neither a timeout nor SIGTERM could act); RE2 answers at once. The match runs in
    a thread waited on with a bound, so a backtracking engine fails the test instead
    of hanging it."""
    import threading

    text = (
        "resources:\n  - name: example.com/x\n    match:\n      subsystem: accel\n"
        "      properties: {ID_MODEL: {regex: '(a+)+b'}}\n"
    )
    (rule,) = parse_rules(text, source="hostile.yaml")
    pattern = rule.match.properties["ID_MODEL"]
    result: list[bool] = []
    t = threading.Thread(
        target=lambda: result.append(pattern.matches("a" * 4000 + "c")), daemon=True
    )
    t.start()
    t.join(10)
    assert result == [False]
    assert pattern.matches("aaab")


def test_regex_with_backreference_is_refused_naming_re2() -> None:
    text = (
        "resources:\n  - name: example.com/x\n    match:\n      subsystem: accel\n"
        "      attributes: {class: {regex: '(a)\\1'}}\n"
    )
    with pytest.raises(ConfigError, match="RE2"):
        parse_rules(text, source="hostile.yaml")
