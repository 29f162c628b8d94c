"""``hetero-dp cleanup``: remove what hetero-dp left on a node, and nothing else.

For the way back to another device plugin (docs/deployment.md, "Switching to hetero-dp
and back"). A running daemon leaves its CDI specs in place on purpose (containers that
use them resolve them again at every restart, docs/cdi.md), so removing the plugin
leaves them behind; beside another plugin's spec of the same kind they make the CDI
cache drop every device both define. This removes, on this node:

- in each CDI dir, hetero-dp's own spec files: ``hetero-dp_*.json`` (device-plugin
  mode), ``hetero-dp-dra_*.json`` (DRA claims) and the hidden ``.hetero-dp_*`` /
  ``.hetero-dp-dra_*`` temp files of their atomic writes; with ``--restore-superseded``
  it also renames ``<name>.hetero-dp-superseded`` (another plugin's spec that hetero-dp
  set aside) back to ``<name>`` where that name is free;
- in the kubelet's device-plugin dir, ``<prefix>-*.sock`` sockets nobody answers on;
- in the node-label dir, ``<prefix>-*`` label files (a stopped daemon removes its own;
  one killed leaves it).

Only regular files (sockets in the kubelet dir) with those names are removed: a
symlink, FIFO or directory of the same name is reported and left. While a hetero-dp
instance still answers on its socket in the kubelet dir, it removes nothing (that
instance would write its spec again at its next publish) unless ``--force``;
``--wait`` gives running instances time to stop (a DaemonSet being deleted).
"""

from __future__ import annotations

import os
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from hetero_dp.kits.sockets import remove_stale_sockets, socket_in_use

# hetero-dp's names in a CDI dir (hetero_dp.allocation.cdi.SPEC_FILE_PREFIX and
# SUPERSEDED_SUFFIX, hetero_dp.dra.claimspec.SPEC_PREFIX; a test keeps them equal),
# here so that the command line does not import the allocation and DRA code
SPEC_FILE_PREFIX = "hetero-dp_"
DRA_SPEC_PREFIX = "hetero-dp-dra_"
SUPERSEDED_SUFFIX = ".hetero-dp-superseded"

DEFAULT_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
DEFAULT_KUBELET_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_LABELS_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
POLL = 0.5


@dataclass
class Report:
    removed: list[Path] = field(default_factory=list)
    restored: list[tuple[Path, Path]] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # what was not touched, and why
    failed: list[str] = field(default_factory=list)


def is_our_spec(name: str) -> bool:
    """A spec file or atomic-write temp file that hetero-dp writes in a CDI dir."""
    bare = name[1:] if name.startswith(".") else name
    if not bare.startswith((SPEC_FILE_PREFIX, DRA_SPEC_PREFIX)):
        return False
    return name.startswith(".") or name.endswith(".json")


def live_instances(kubelet_dir: Path, prefix: str) -> list[Path]:
    """The ``<prefix>-*.sock`` sockets in ``kubelet_dir`` that a process answers on."""
    try:
        entries = sorted(kubelet_dir.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [
        p
        for p in entries
        if p.name.startswith(f"{prefix}-") and p.name.endswith(".sock") and socket_in_use(p)
    ]


def _regular(path: Path, report: Report) -> bool:
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(mode):
        report.left.append(f"{path}: not a regular file, left alone")
        return False
    return True


def _remove(path: Path, report: Report, dry_run: bool) -> None:
    if not _regular(path, report):
        return
    try:
        if not dry_run:
            path.unlink()
        report.removed.append(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        report.failed.append(f"{path}: {e.strerror or e}")


def _restore(path: Path, report: Report, dry_run: bool) -> None:
    original = path.with_name(path.name[: -len(SUPERSEDED_SUFFIX)])
    if not _regular(path, report):
        return
    if os.path.lexists(original):
        report.left.append(f"{path}: {original.name} exists, left as it is")
        return
    try:
        if not dry_run:
            os.link(path, original)  # fails if the name was taken meanwhile
            path.unlink()
        report.restored.append((path, original))
    except OSError as e:
        report.failed.append(f"{path}: {e.strerror or e}")


def clean(
    cdi_dirs: list[Path],
    kubelet_dir: Path | None,
    labels_dir: Path | None,
    prefix: str,
    *,
    restore_superseded: bool = False,
    dry_run: bool = False,
) -> Report:
    """Remove hetero-dp's files in these dirs (see the module's doc); touch no other."""
    report = Report()
    for d in cdi_dirs:
        try:
            entries = sorted(d.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            report.failed.append(f"{d}: {e.strerror or e}")
            continue
        for p in entries:
            if is_our_spec(p.name):
                _remove(p, report, dry_run)
            elif restore_superseded and p.name.endswith(SUPERSEDED_SUFFIX):
                _restore(p, report, dry_run)
    if kubelet_dir is not None and not dry_run:
        try:
            report.removed += remove_stale_sockets(kubelet_dir, prefix)
        except OSError as e:  # not a dir, unreadable
            report.failed.append(f"{kubelet_dir}: {e.strerror or e}")
    if labels_dir is not None:
        try:
            entries = sorted(labels_dir.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            entries = []
        for p in entries:
            if p.name.startswith(f"{prefix}-") and not p.name.startswith("."):
                _remove(p, report, dry_run)
    return report


@click.command("cleanup")
@click.option(
    "--cdi-dir",
    "cdi_dirs",
    multiple=True,
    help="A CDI spec dir (repeatable) [/etc/cdi, /var/run/cdi].",
)
@click.option(
    "--kubelet-dir",
    default=DEFAULT_KUBELET_DIR,
    show_default=True,
    help="The device-plugin dir: running instances, stale sockets ('' skips it).",
)
@click.option(
    "--labels-dir",
    default=DEFAULT_LABELS_DIR,
    show_default=True,
    help="The node-label dir (NFD features.d; '' skips it).",
)
@click.option("--prefix", default="hetero-dp", show_default=True, help="socketPrefix.")
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=0.0,
    help="Seconds to wait for running instances to stop [0].",
)
@click.option("--force", is_flag=True, help="Remove even while an instance runs.")
@click.option(
    "--restore-superseded",
    is_flag=True,
    help="Rename specs hetero-dp set aside (*.hetero-dp-superseded) back.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
def cleanup_command(
    cdi_dirs: tuple[str, ...],
    kubelet_dir: str,
    labels_dir: str,
    prefix: str,
    wait: float,
    force: bool,
    restore_superseded: bool,
    dry_run: bool,
) -> None:
    """Remove hetero-dp's CDI specs, stale sockets and label files from this node,
    and nothing else (docs/deployment.md, "Switching to hetero-dp and back")."""
    kdir = Path(kubelet_dir) if kubelet_dir else None
    if kdir is not None and not force:
        deadline = time.monotonic() + wait
        live = live_instances(kdir, prefix)
        while live and time.monotonic() < deadline:
            time.sleep(POLL)
            live = live_instances(kdir, prefix)
        if live:
            names = ", ".join(str(p) for p in live)
            click.echo(
                f"hetero-dp is still running on this node (answering on {names}): it would "
                "write its CDI specs again; stop it first (or --wait SECONDS, or --force)",
                err=True,
            )
            sys.exit(1)
    report = clean(
        [Path(d) for d in (cdi_dirs or DEFAULT_CDI_DIRS)],
        kdir,
        Path(labels_dir) if labels_dir else None,
        prefix,
        restore_superseded=restore_superseded,
        dry_run=dry_run,
    )
    verb = "would remove" if dry_run else "removed"
    for p in report.removed:
        click.echo(f"{verb} {p}")
    for old, new in report.restored:
        click.echo(f"{'would restore' if dry_run else 'restored'} {new} (from {old.name})")
    for line in report.left:
        click.echo(f"left {line}")
    for line in report.failed:
        click.echo(f"failed {line}", err=True)
    if not (report.removed or report.restored):
        click.echo("nothing of hetero-dp's to remove")
    sys.exit(1 if report.failed else 0)
