"""The ``hetero-dp`` command: thin click wrappers that parse and call."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from hetero_dp.cli.hints import flag_hint
from hetero_dp.cli.settings import overrides as setting_overrides
from hetero_dp.cli.settings import setting_flags
from hetero_dp.engine.config import Config, check_backend_names, load_config, set_option
from hetero_dp.model.errors import BackendError, ConfigError, StartError

EXIT_CONFIG = 2


def _fail_config(e: ConfigError) -> None:
    # A backend that failed to start stops start-up too; its message says what to fix.
    what = "cannot start" if isinstance(e, StartError) else "configuration error"
    click.echo(f"hetero-dp: {what}: {e}", err=True)
    sys.exit(EXIT_CONFIG)


def _config(
    config: str | None,
    options: Sequence[str],
    loaded: Sequence[Any],  # the Backends loaded: the config sections they claim are read
    backend_options: dict[str, dict[str, Any]] | None = None,
    **flags: Any,
) -> Config:
    overrides: dict[str, Any] = {k: v for k, v in flags.items() if v is not None}
    for assignment in options:
        set_option(overrides, assignment)
    for name, opts in (backend_options or {}).items():
        overrides.setdefault("backends", {}).setdefault(name, {}).update(opts)
    claims = {b.name: b.config_sections() for b in loaded}
    return load_config(config, overrides=overrides, sections=claims)


def _checked_config(
    config: str | None,
    options: Sequence[str],
    loaded: Sequence[Any],
    backend_options: dict[str, dict[str, Any]] | None = None,
    **flags: Any,
) -> Config:
    """The config with every check ``run`` makes, for ``run``, ``list`` and ``topo`` alike
    (:func:`_config`), and no options for a backend not among ``loaded`` (a typo)."""
    cfg = _config(config, options, loaded, backend_options, **flags)
    check_backend_names(cfg, [b.name for b in loaded])
    return cfg


def _fail_hook(e: BackendError) -> None:
    """A backend's hook failed (not the configuration): its message, exit 1."""
    click.echo(f"hetero-dp: {e}", err=True)
    sys.exit(1)


def split_backend_args(words: Sequence[str]) -> tuple[tuple[str, ...], list[str]]:
    """``run``'s arguments: backend names, then (from the first ``-``) backend flags."""
    first = next((i for i, w in enumerate(words) if w.startswith("-")), len(words))
    return tuple(words[:first]), list(words[first:])


def backend_flag_options(backends: Sequence[Any], args: list[str]) -> dict[str, dict[str, Any]]:
    """Options from the flags a backend takes itself (its ``parse_args`` hook)."""
    if not args:
        return {}
    takers = [b for b in backends if b.implements("parse_args")]
    if len(takers) != 1:
        why = "no backend takes flags" if not takers else "more than one backend takes flags"
        raise ConfigError(
            f"unknown arguments {' '.join(args)} ({why}){flag_hint(args)}", source="command line"
        )
    return {takers[0].name: takers[0].parse_args(args)}


config_option = click.option(
    "--config",
    "-c",
    "--config-file",
    type=click.Path(dir_okay=False),
    envvar=["HETERO_DP_CONFIG", "CONFIG_FILE"],
    help="YAML config file (env HETERO_DP_CONFIG; also --config-file / CONFIG_FILE).",
)
set_option_flag = click.option(
    "--option",
    "-o",
    "options",
    multiple=True,
    metavar="BACKEND.KEY=VALUE",
    help="A backend option, e.g. -o simulated.count=8 (repeatable).",
)


@click.group()
@click.version_option(package_name="hetero-dp")
def main() -> None:
    """Kubernetes device plugins in Python."""


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("backends", nargs=-1, required=True, type=click.UNPROCESSED)
@config_option
@set_option_flag
@setting_flags
@click.option(
    "--mode",
    default="device-plugin",
    show_default=True,
    help="The front end: device-plugin, or dra for DRA drivers (see docs/dra.md); "
    "any front end installed in the entry-point group hetero_dp.front_ends.",
)
@click.option(
    "--fake-kubelet",
    is_flag=True,
    help="Serve to an in-process fake kubelet in a temp dir and print what it sees "
    "(devices, health): try a plugin without a node.",
)
@click.option(
    "--create-kubelet-dir",
    is_flag=True,
    help="Create the device-plugin dir if it does not exist (default: refuse, it is "
    "the kubelet's own dir and a missing one is usually a typo or a missing mount).",
)
def run(
    backends: tuple[str, ...],
    config: str | None,
    options: tuple[str, ...],
    mode: str,
    fake_kubelet: bool,
    create_kubelet_dir: bool,
    **settings: Any,
) -> None:
    """Serve BACKENDS (installed names or .py files) to the kubelet until SIGTERM.

    Flags after the backend names that this command does not know go to the
    backend (the bundled GPU backend takes its vendor plugin's own flags there).
    With --config, SIGHUP or a change of the file reloads it in place."""
    from hetero_dp.kits.signals import hold_signals

    hold_signals()  # first: a signal during start-up must not kill the daemon halfway
    from hetero_dp.kits.limits import check_limits

    try:  # before gRPC starts a thread: under a low ulimit -v it cannot, and aborts
        check_limits()
    except ConfigError as e:
        _fail_config(e)
    from hetero_dp.kits.logs import setup_logging
    from hetero_dp.ops.assembly import assemble

    flags = setting_overrides(settings)  # the settings' own flags (cli/settings.py)
    trial_root = None
    fake_nodes: str | None = None
    if fake_kubelet:
        import tempfile

        from hetero_dp.cli.trial import fake_kubelet_dirs

        # a trial, as under the testing harness: fake nodes in /tmp
        fake_nodes = os.path.realpath(tempfile.gettempdir())
        if mode != "device-plugin":
            _fail_config(ConfigError("--fake-kubelet serves device plugins only", field="mode"))
        trial_root, trial_dp, trial_reg = fake_kubelet_dirs()
        flags["kubeletDir"] = str(trial_dp)
        flags["pluginsRegistryDir"] = str(trial_reg)
        # CDI specs beside the fake kubelet too: in the host's /var/run/cdi they would
        # advertise the trial's devices to the laptop's own container runtime
        flags["cdi"] = {**flags.get("cdi", {}), "dir": str(trial_root / "cdi")}
    try:
        names, backend_args = split_backend_args(backends)
        if not names:
            hint = flag_hint(backend_args)  # a mistyped flag of run's is no backend's
            why = f"unknown flag {backend_args[0]}{hint}" if hint else ""
            raise ConfigError(
                why or "name at least one backend before its flags", source="command line"
            )
        from_flags: dict[str, dict[str, Any]] | None = None

        def read_config(loaded: list[Any]) -> Config:  # at start-up, and for each reload
            nonlocal from_flags
            if from_flags is None:  # the backend's own flags, parsed once
                from_flags = backend_flag_options(loaded, backend_args)
            return _checked_config(config, options, loaded, from_flags, **flags)

        # every mode's own options; the front end registered as ``mode`` reads its own
        # (the DRA front end's settings are the config's dra section, flags included)
        front_end: dict[str, Any] = dict(
            check_kubelet_dir=not fake_kubelet,
            create_kubelet_dir=create_kubelet_dir,
        )
        daemon = assemble(
            names,
            read_config,
            mode=mode,
            front_end=front_end,
            config_file=config,  # with a config file, hot reload (hetero_dp/ops/reload.py)
            fake_nodes=fake_nodes,
            on_config=lambda cfg: setup_logging(cfg.log_level, cfg.log_format),
        )
        if trial_root is not None:
            from hetero_dp.cli.trial import serve_to_fake_kubelet

            dp_dir = daemon.config.kubelet_dir
            asyncio.run(serve_to_fake_kubelet(daemon, dp_dir, trial_reg, click.echo))
        else:
            asyncio.run(daemon.run())
            exit_now(0)  # stopped cleanly: nothing is left for finalization to do
    except ConfigError as e:
        _fail_config(e)
    except PermissionError as e:
        _fail_permission(e)
    finally:
        if trial_root is not None:  # the fake kubelet's temp dir, also after an error
            from hetero_dp.cli.trial import remove_dirs

            remove_dirs(trial_root)


def exit_now(code: int) -> None:
    """End the process without the interpreter's finalization, once the daemon has
    stopped cleanly (streams ended, sockets removed, backends shut down, logs
    flushed here). Finalization (gRPC's core and every module torn down) took
    0.3-0.5 s of a 0.35-0.55 s exit on SIGTERM (benchmarks/bench_upgrade.py), and in
    a rolling update that stops the old pod first, the old pod's exit is part of the
    time the node has no device to offer. Under coverage, which writes its data at
    exit, the ordinary exit is kept."""
    if "coverage" in sys.modules:
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _fail_permission(e: PermissionError) -> None:
    """A permission error as one line naming the path and the fix, not a traceback."""
    path = e.filename or "a file"
    click.echo(
        f"hetero-dp: permission denied: {path}: run as a user who may write there (the "
        "DaemonSets run as root), or point --kubelet-dir / the config at a dir you own",
        err=True,
    )
    sys.exit(EXIT_CONFIG)


@main.command("list")
@click.argument("backend")
@config_option
@set_option_flag
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--options",
    "show_options",
    is_flag=True,
    help="Print the options BACKEND takes (type, default, env var, help) instead.",
)
def list_devices(
    backend: str,
    config: str | None,
    options: tuple[str, ...],
    as_json: bool,
    show_options: bool,
) -> None:
    """Print what BACKEND discovers, without talking to the kubelet.

    The config, the options and the resource names discovered are checked as ``run``
    checks them: what ``run`` refuses, ``list`` refuses with the same message."""
    from hetero_dp.cli.inspect import (
        device_table,
        devices_json,
        discover_once,
        load_one,
        options_table,
        searched,
    )

    try:
        if show_options:
            click.echo(options_table(backend, as_json=as_json))
            return
        loaded = load_one(backend)
        try:
            cfg = _checked_config(config, options, [loaded])
        except ConfigError:
            loaded.close()
            raise
        devices = asyncio.run(discover_once(loaded, cfg))
    except ConfigError as e:
        _fail_config(e)
        return
    except BackendError as e:
        _fail_hook(e)
        return
    if as_json:
        import json  # not at the top: `run` never needs it (start-up, issue 35)

        click.echo(json.dumps(devices_json(devices), indent=2))
    else:
        click.echo(device_table(devices, searched(loaded.options)))


@main.command()
@click.option("--devices", "count", default=4, show_default=True, help="Simulated devices.")
def demo(count: int) -> None:
    """Run a simulated node in one process: fake kubelet, simulated devices, a health
    flip and recovery, one allocation. Exits 0 when every step worked."""
    from hetero_dp.cli.demo import run_demo

    sys.exit(asyncio.run(run_demo(count, echo=click.echo)))


@main.command()
@click.option("--vendor-domain", help="Your DNS domain, the resource prefix (acme.example.com).")
@click.option("--resource", help="Resource name after the domain (npu).")
@click.option("--device-glob", help="Device nodes that are devices (/dev/acme*).")
@click.option("--package", "package_name", help="Python module name [derived].")
@click.option("--project-name", help="Human-readable name [derived].")
@click.option("--image", help="Container image in the DaemonSet [derived].")
@click.option(
    "--output",
    type=click.Path(file_okay=False),
    help="Project directory to create [./<package with dashes>-device-plugin].",
)
@click.option("--force", is_flag=True, help="Write into a non-empty directory.")
@click.option(
    "--wheels",
    type=click.Path(),
    help="Copy this directory's wheels (hetero-dp's at least) into the project's wheels/, "
    "for pip and the Dockerfile where no package index has hetero-dp.",
)
def new(output: str | None, force: bool, wheels: str | None, **values: str | None) -> None:
    """Create a plugin project: module, tests, Dockerfile, DaemonSet, README.

    Without a terminal every value comes from flags (--vendor-domain, --resource and
    --device-glob are required); on a terminal, missing values are asked for.
    """
    from hetero_dp.cli import scaffold

    try:
        if sys.stdin.isatty():
            values = _ask_missing(values)
        project, written = scaffold.generate(values, output, force=force, wheels=wheels)
    except ConfigError as e:
        click.echo(f"hetero-dp new: {e}", err=True)
        sys.exit(EXIT_CONFIG)
    click.echo(f"created {project} ({len(written)} files)")
    has_wheel = any(p.name.startswith("hetero_dp-") for p in (project / "wheels").glob("*.whl"))
    click.echo("next:")
    for step in scaffold.next_steps(project, scaffold.hetero_dp_origin(), has_wheel):
        click.echo(f"  {step}")


def _ask_missing(values: dict[str, str | None]) -> dict[str, str | None]:
    """Prompt for missing values, re-asking until each one is valid."""
    from hetero_dp.cli import scaffold

    defaults = scaffold.template_variables(scaffold.template_dir())
    answers = dict(values)
    for key in ("vendor_domain", "resource", "device_glob", "package_name"):
        if answers.get(key):
            continue
        default = defaults[key]
        domain, resource = answers["vendor_domain"] or "", answers["resource"] or ""
        if key == "package_name":
            default = scaffold.default_package(domain, resource)
        elif key == "device_glob" and domain:  # derived from the answers so far
            default = scaffold.default_device_glob(domain)

        def check(value: str, key: str = key) -> str:
            why = scaffold.problem(key, value, {k: v for k, v in answers.items() if v})
            if why:
                raise click.UsageError(why)
            return value

        label = scaffold.FLAGS[key].lstrip("-").replace("-", " ")
        answers[key] = click.prompt(label, default=default, value_proc=check)
    return answers


@main.command()
@click.argument("source", metavar="BACKEND_OR_FILE")
@config_option
@set_option_flag
@click.option("--size", type=int, help="Also show the set the engine would choose for N devices.")
@click.option(
    "--must",
    multiple=True,
    metavar="ID",
    help="A device (ID or label such as D3) the set must hold.",
)
@click.option("--resource", help="The resource to show when the backend serves several.")
def topo(
    source: str,
    config: str | None,
    options: tuple[str, ...],
    size: int | None,
    must: tuple[str, ...],
    resource: str | None,
) -> None:
    """Print the topology the allocation engine sees: devices, link matrix, NUMA.

    BACKEND_OR_FILE is a backend or a topology file (.yaml, .yml, .json).
    """
    from hetero_dp.cli.inspect import load_one
    from hetero_dp.cli.topo_report import TOPOLOGY_FILE_SUFFIXES, report
    from hetero_dp.engine.backend import Backend
    from hetero_dp.model.errors import AllocationError

    try:
        what: str | Backend = source
        if Path(source).suffix not in TOPOLOGY_FILE_SUFFIXES:
            what = load_one(source)
        try:
            cfg = _checked_config(config, options, [what] if isinstance(what, Backend) else [])
        except ConfigError:
            if isinstance(what, Backend):
                what.close()
            raise
        text = report(what, cfg, size=size, must_include=must, resource=resource)
    except ConfigError as e:
        _fail_config(e)
        return
    except BackendError as e:
        _fail_hook(e)
        return
    except AllocationError as e:
        click.echo(f"hetero-dp: {e}", err=True)
        sys.exit(1)
    click.echo(text, nl=False)


@main.command()
@click.argument("backends", nargs=-1)
@config_option
@set_option_flag
@click.option("--root", default="/", show_default=True, help="Read every path under this dir.")
@click.option("--kubelet-dir", help="Device-plugin dir (default: the config's kubeletDir).")
@click.option("--containerd-config", default="/etc/containerd/config.toml", show_default=True)
@click.option("--docker-config", default="/etc/docker/daemon.json", show_default=True)
@click.option("--cdi-dir", "cdi_dirs", multiple=True, help="CDI spec dirs (repeatable).")
@click.option(
    "--daemon-address",
    envvar="HETERO_DP_METRICS_ADDRESS",
    help="Where to ask /readyz (env HETERO_DP_METRICS_ADDRESS; default: metrics.address).",
)
@click.option(
    "--labels-dir",
    envvar="HETERO_DP_LABELS_DIR",
    help="Check the label file in DIR (env HETERO_DP_LABELS_DIR, as the DaemonSets set it).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def doctor(
    backends: tuple[str, ...],
    config: str | None,
    options: tuple[str, ...],
    root: str,
    kubelet_dir: str | None,
    containerd_config: str,
    docker_config: str,
    cdi_dirs: tuple[str, ...],
    daemon_address: str | None,
    labels_dir: str | None,
    as_json: bool,
) -> None:
    """Walk the node's troubleshooting chain: driver, devices, container runtime,
    kubelet sockets, the running daemon, CDI specs, labels. Exits 1 on any failure."""
    from hetero_dp.engine.loading import load_backends
    from hetero_dp.ops.doctor import DoctorSettings, exit_code, render_json, render_text, run_doctor

    try:
        flags: dict[str, Any] = {"kubeletDir": kubelet_dir}
        if labels_dir:
            flags["labels"] = {"enabled": True, "dir": labels_dir}
        loaded = load_backends(backends)  # first: the config sections they claim are read
        cfg = _config(config, options, loaded, **flags)
        for b in loaded:
            b.timeout = cfg.hook_timeout
    except ConfigError as e:
        _fail_config(e)
        return
    settings = DoctorSettings(
        root=Path(root),
        containerd_config=containerd_config,
        docker_config=docker_config,
        cdi_dirs=cdi_dirs,
        daemon_address=daemon_address or "",
    )
    try:
        findings = asyncio.run(run_doctor(cfg, loaded, settings))
    finally:
        for b in loaded:
            b.close()
    click.echo(render_json(findings) if as_json else render_text(findings))
    sys.exit(exit_code(findings))


if __name__ == "__main__":
    main()
