"""Step 6, the CDI specs in the CDI dirs: each one parses and is a valid spec."""

from __future__ import annotations

from hetero_dp.engine.config import Config
from hetero_dp.kits.foreign import ForeignFileError, load_foreign
from hetero_dp.ops.doctor.cdi_spec import host_paths, spec_problems
from hetero_dp.ops.doctor.findings import DoctorSettings, Finding


def check_cdi_specs(config: Config, settings: DoctorSettings, needs: set[str]) -> list[Finding]:
    step = "cdi"
    dirs = list(dict.fromkeys(settings.cdi_dirs or [config.cdi.dir, "/etc/cdi"]))
    files = [
        p
        for d in dirs
        if settings.path(d).is_dir()
        for p in sorted(settings.path(d).iterdir())
        if p.suffix in (".json", ".yaml", ".yml") and not p.name.startswith(".")
    ]
    where = ", ".join(str(settings.path(d)) for d in dirs)
    if not files:
        if "cdi" in needs:
            return [
                Finding(
                    step,
                    "cdi specs",
                    "fail",
                    f"CDI delivery is configured but there is no spec in {where}",
                    "the daemon writes its spec once it runs: check its log for CDI write "
                    "errors, and that cdi.dir is mounted from the host",
                )
            ]
        return [Finding(step, "cdi specs", "skip", f"no CDI specs in {where}; CDI is not used")]
    out = []
    good = []
    for p in files:
        try:  # whatever sits there: a FIFO, a link loop, 50,000 levels (kits/foreign.py)
            doc = load_foreign(p, follow=True)
        except ForeignFileError as e:
            out.append(
                Finding(
                    step,
                    p.name,
                    "fail",
                    f"{p} does not parse: {e}",
                    "remove or regenerate it (restarting the plugin rewrites its own specs); "
                    "the runtime refuses every device of a broken spec",
                )
            )
            continue
        problems = spec_problems(doc)
        if problems:
            shown = "; ".join(problems[:5]) + (
                f" (+{len(problems) - 5} more)" * (len(problems) > 5)
            )
            out.append(
                Finding(
                    step,
                    p.name,
                    "fail",
                    f"{p} is not a valid CDI spec: {shown}",
                    "remove or regenerate it (restarting the plugin rewrites its own specs); "
                    "the runtime refuses every device of an invalid spec",
                )
            )
            continue
        paths = host_paths(doc)
        missing = [h for h in paths if not settings.path(h).exists()]
        if missing:
            shown = ", ".join(missing[:5]) + (f" (+{len(missing) - 5} more)" * (len(missing) > 5))
            out.append(
                Finding(
                    step,
                    p.name,
                    "fail",
                    f"{p}: {len(missing)} of its {len(paths)} host paths do not exist: {shown}",
                    "the spec is stale (its devices or driver files are gone, or another "
                    "host or a test wrote it): remove it, or restart the plugin that writes "
                    "it; a container given one of its devices fails to start",
                )
            )
            continue
        good.append(f"{p.name} ({doc['kind']}, {len(doc['devices'])} devices)")
    if good:
        out.append(Finding(step, "cdi specs", "pass", "valid: " + ", ".join(good)))
    return out
