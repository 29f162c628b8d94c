"""A fake ``nvidia-cuda-mps-control``: the control program and its daemon.

Installed by tests as ``<driver root>/usr/bin/nvidia-cuda-mps-control`` (a shell
wrapper that runs this file). What it answers, and where each fact comes from:

- ``nvidia-cuda-mps-control -d`` starts the control daemon in the background and
  returns once it is up; the daemon uses ``CUDA_MPS_PIPE_DIRECTORY`` (default
  ``/tmp/nvidia-mps``) and writes ``control.log`` to ``CUDA_MPS_LOG_DIRECTORY``
  (default ``/var/log/nvidia-mps``). (NVIDIA's MPS documentation and the
  ``nvidia-cuda-mps-control(1)`` man page.)
- A second ``-d`` on the same pipe directory fails. (Man page: one control daemon
  per pipe directory; the message text is guessed.)
- ``nvidia-cuda-mps-control`` without arguments reads commands from stdin, one per
  line, sends each to the daemon and prints the answer; NVIDIA's device plugin
  writes one command without a newline and reads stdout
  (cmd/mps-control-daemon/mps/daemon.go EchoPipeToControl). Without a daemon it
  fails with a non-zero status (guessed text).
- Commands (man page): ``set_default_active_thread_percentage P``,
  ``get_default_active_thread_percentage`` (prints the value as ``%.1f``; guessed
  format), ``set_default_device_pinned_mem_limit DEV VALUE`` and
  ``get_default_device_pinned_mem_limit DEV`` (VALUE such as ``2048M`` or ``2G``),
  ``get_server_list``, ``quit``. Anything else is answered as unknown (guessed).

Ours, for the tests: the daemon talks to its clients over a unix socket
``<pipe dir>/control`` (the real daemon's socket name is an internal detail), keeps
its pid in ``<pipe dir>/fake-mps.pid`` and appends every command it receives to
``<log dir>/fake-commands.log``, so a test can read what the plugin sent and kill
the daemon to see the plugin notice.
"""

from __future__ import annotations

import os
import re
import socket
import sys

PIPE = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
LOGS = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
SOCK = os.path.join(PIPE, "control")
PIDFILE = os.path.join(PIPE, "fake-mps.pid")
SIZE = re.compile(r"^\d+[KMGT]?$")


def _connect() -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(SOCK)
    except OSError:
        s.close()
        return None
    return s


def _answer(state: dict[str, object], line: str) -> tuple[str, bool]:
    """The daemon's reply to one command, and whether it quits."""
    words = line.split()
    if not words:
        return "", False
    cmd, args = words[0], words[1:]
    limits = state["limits"]
    assert isinstance(limits, dict)
    if cmd == "quit":
        return "", True
    if cmd == "get_default_active_thread_percentage" and not args:
        return f"{float(state['threads']):.1f}", False  # type: ignore[arg-type]
    if cmd == "set_default_active_thread_percentage" and len(args) == 1 and args[0].isdigit():
        value = int(args[0])
        if 1 <= value <= 100:
            state["threads"] = value
            return "", False
    pinned = cmd == "set_default_device_pinned_mem_limit" and len(args) == 2
    if pinned and args[0].isdigit() and SIZE.match(args[1]):
        limits[int(args[0])] = args[1]
        return "", False
    if cmd == "get_default_device_pinned_mem_limit" and len(args) == 1 and args[0].isdigit():
        return str(limits.get(int(args[0]), "0")), False
    if cmd == "get_server_list" and not args:
        return "", False
    return f"Invalid command or arguments: {line}", False


def serve(listener: socket.socket) -> None:
    state: dict[str, object] = {"threads": 100, "limits": {}}
    os.makedirs(LOGS, exist_ok=True)
    record = open(os.path.join(LOGS, "fake-commands.log"), "a", buffering=1)  # noqa: SIM115
    with open(os.path.join(LOGS, "control.log"), "a") as log:
        log.write(f"fake control daemon started, pid {os.getpid()}\n")
    quitting = False
    while not quitting:
        conn, _ = listener.accept()
        with conn, conn.makefile("rw") as f:
            for raw in f:
                line = raw.strip()
                record.write(line + "\n")
                reply, quitting = _answer(state, line)
                f.write(reply + "\n\x00\n")  # the \x00 line ends one reply
                f.flush()
                if quitting:
                    break
    listener.close()
    for path in (SOCK, PIDFILE):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def start_daemon() -> int:
    if _connect() is not None:
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    os.makedirs(PIPE, exist_ok=True)
    try:
        os.remove(SOCK)  # a dead daemon's socket
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(SOCK)
    listener.listen(8)
    if os.fork() == 0:  # the daemon: detach and serve
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        with open(PIDFILE, "w") as f:
            f.write(str(os.getpid()))
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        try:
            serve(listener)
        finally:
            os._exit(0)
    # the caller returns once the socket listens (it already does: bound before fork)
    listener.close()
    os.wait()
    return 0


def client() -> int:
    commands = [c.strip() for c in sys.stdin.read().splitlines() if c.strip()]
    conn = _connect()
    if conn is None:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    with conn, conn.makefile("rw") as f:
        for command in commands:
            f.write(command + "\n")
            f.flush()
            reply = []
            for raw in f:
                if raw == "\x00\n":
                    break
                reply.append(raw)
            else:
                if command.split()[:1] != ["quit"]:
                    print("lost the connection to the control daemon", file=sys.stderr)
                    return 1
            text = "".join(reply).strip()
            if text.startswith("Invalid command"):
                print(text, file=sys.stderr)
                return 1
            if text:
                print(text)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["-d"]:
        sys.exit(start_daemon())
    if sys.argv[1:]:
        print(f"unknown arguments {sys.argv[1:]}", file=sys.stderr)
        sys.exit(2)
    sys.exit(client())
