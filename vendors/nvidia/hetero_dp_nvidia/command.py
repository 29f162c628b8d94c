"""``nvidia-device-plugin``: the hetero-dp NVIDIA backend under NVIDIA's command name.

``nvidia-device-plugin [NVIDIA's flags]`` is ``hetero-dp run nvidia [the same
flags]``: the process is replaced by that command (same PID, so signals and exit
codes are the daemon's), and NVIDIA's flags, env vars and config file
(``--config-file`` / ``CONFIG_FILE``) mean what they mean in NVIDIA's plugin
v0.20. One mapping serves both commands: :data:`hetero_dp_nvidia.flags.FLAGS`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from .flags import FLAGS

USAGE = """usage: nvidia-device-plugin [flags]

NVIDIA device plugin for Kubernetes, served by hetero-dp (same as
`hetero-dp run nvidia [flags]`). NVIDIA's flags (env vars in brackets):
"""


def help_text() -> str:
    lines = [USAGE]
    for f in FLAGS:
        if not f.flags:
            continue
        names = ", ".join(f"--{n}" for n in f.flags)
        note = {"warn": "  (accepted, not implemented: warns)", "core": ""}.get(f.status, "")
        lines.append(f"  {names} [{', '.join(f.env)}]{note}")
    lines.append(
        "\nhetero-dp's own flags (--kubelet-dir, --metrics-address ...) work too; "
        "see `hetero-dp run --help`."
    )
    return "\n".join(lines) + "\n"


def argv(args: Sequence[str]) -> list[str]:
    """The ``hetero-dp`` command line that ``nvidia-device-plugin ARGS`` runs."""
    return [sys.executable, "-m", "hetero_dp", "run", "nvidia", *args]


def main(args: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if args is None else args)
    if any(a in ("-h", "--help", "-help") for a in args):
        sys.stdout.write(help_text())
        raise SystemExit(0)
    if any(a in ("-v", "--version") for a in args):  # NVIDIA's CLI library has both
        from importlib.metadata import version

        sys.stdout.write(
            f"nvidia-device-plugin (hetero-dp-nvidia {version('hetero-dp-nvidia')}, "
            f"hetero-dp {version('hetero-dp')})\n"
        )
        raise SystemExit(0)
    command = argv(args)
    sys.stdout.flush()
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
