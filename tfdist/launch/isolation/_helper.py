"""Linux helpers the launcher runs as ``python -I -S _helper.py MODE ...`` (stdlib only).

``hold --ppid=P [--net]``: creates the namespaces that one launch's tasks share and
holds them until its stdin closes (the launcher closes it, or dies):

* a private network namespace (with ``--net``) with only ``lo``, brought up: the
  tasks' gRPC servers listen on every interface *of that namespace*, which has no
  interface other hosts can reach;
* a PID namespace whose init (PID 1) is this helper's child. When that init dies,
  the kernel SIGKILLs every process in the namespace, grandchildren included.

It prints one JSON line, ``{"net": ERROR_OR_NULL, "pid": ERROR_OR_NULL}``, once ready.

``run --ppid=P [--netns=PATH] [--pidns=PATH] [--cpus=0,1] -- COMMAND...``: one task. Joins the
namespaces, sets its CPU affinity to ``--cpus`` (which the task, and everything it starts,
inherits), forks ``COMMAND`` and relays its exit status (or the signal that killed
it) as its own. The launcher signals the task's whole process group (this helper
and the task); this helper ignores SIGTERM/SIGINT/SIGHUP itself, so the task alone
decides how to react (e.g. save a backup and exit 75).

``run --ppid=P --zygote=SOCKET [--netns=PATH] [--pidns=PATH] [--cpus=...] -- PYTHON ...``: the
task is forked by the preloaded interpreter of ``tfdist launch --preload``
(``tfdist/launch/_zygote.py``) instead: this helper sends it the command, its environment,
directory, CPUs and standard streams, and the namespaces named (for an interpreter outside
them, which the forked process then enters; a PID namespace takes only its children); it
passes on the signals the launcher sends (SIGTERM, SIGINT, SIGHUP, SIGUSR1), and relays the
task's exit status as its own. When this helper is killed, the
zygote kills the task.

Lifetimes are tied with ``prctl(PR_SET_PDEATHSIG)``: the helpers die when the
launcher does, the task (and, through the PID namespace, every process it started)
with them. Without a PID namespace (not permitted) the task's process group is
killed instead.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import resource
import signal
import socket
import struct
import sys

CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
PR_SET_PDEATHSIG = 1
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_QUIET = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _die_with_parent(signum: int, parent: int) -> None:
    """Gets ``signum`` when the parent dies; exits now if it already has."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:  # It died before prctl took effect.
        os._exit(1)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def _ignore(
    signum, frame
) -> None:  # A handler, not SIG_IGN: exec resets handlers but keeps SIG_IGN.
    pass


def _reap_forever() -> None:
    """The PID namespace's init: reaps orphans until it is killed."""
    signal.signal(signal.SIGCHLD, _ignore)
    for signum in _QUIET:
        signal.signal(signum, _ignore)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            signal.pause()


def hold(ppid: int, net: bool) -> None:
    _die_with_parent(signal.SIGKILL, ppid)
    report = {"net": None, "pid": None}
    if net:
        try:
            _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
            _loopback_up()
        except OSError as e:
            report["net"] = e.strerror
    else:
        report["net"] = "not requested"
    init = None
    try:
        _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
        init = os.fork()
        if init == 0:
            try:
                _die_with_parent(
                    signal.SIGKILL, 0
                )  # Our parent is outside the namespace: getppid() is 0.
                _reap_forever()
            finally:
                os._exit(0)
    except OSError as e:
        report["pid"] = e.strerror
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    sys.stdin.read()  # Until the launcher closes it or dies.
    if init is not None:
        os.kill(init, signal.SIGKILL)  # The kernel then kills everything in the namespace.
        os.waitpid(init, 0)


def _enter(path: str, nstype: int) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        _check(_libc.setns(fd, nstype), f"setns({path})")
    finally:
        os.close(fd)


def _kill_group(signum, frame) -> None:
    os.killpg(0, signal.SIGKILL)  # The launcher died: the task and everything in its group go too.


def run(
    ppid: int, netns: str | None, pidns: str | None, cpus: list[int] | None, command: list[str]
) -> None:
    signal.signal(signal.SIGUSR2, _kill_group)
    _die_with_parent(signal.SIGUSR2, ppid)
    for signum in _QUIET:
        signal.signal(signum, _ignore)
    if netns:
        _enter(netns, CLONE_NEWNET)
    if pidns:
        _enter(pidns, CLONE_NEWPID)  # Only our children enter it.
    if cpus:
        os.sched_setaffinity(0, cpus)  # Before the fork: the task starts on them, never elsewhere.
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            # Inside the PID namespace our parent is invisible (getppid() is 0).
            _die_with_parent(signal.SIGKILL, 0 if pidns else me)
            for signum in (*_QUIET, signal.SIGUSR2, signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(signum, signal.SIG_DFL)
            os.execvp(command[0], command)
        except OSError as e:
            sys.stderr.write(f"tfdist: cannot run {command[0]!r}: {e}\n")
        finally:
            os._exit(127)
    _, status = os.waitpid(pid, 0)
    _relay(os.waitstatus_to_exitcode(status))


def run_forked(
    zygote: str, cpus: list[int] | None, command: list[str], namespaces: dict[str, str]
) -> None:
    """Has the preloaded interpreter at ``zygote`` run ``command``; relays its exit status.

    ``namespaces`` (``{"net": PATH, "pid": PATH}``, either may be absent): namespaces the
    forked process enters first, for an interpreter that runs outside them.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(zygote)
    names = sorted(namespaces, key=["net", "pid"].index)  # The network first.
    fds = [os.open(namespaces[name], os.O_RDONLY) for name in names]
    request = {"command": command, "env": dict(os.environ), "cwd": os.getcwd(), "cpus": cpus}
    if names:
        request["namespaces"] = names
    body = json.dumps(request).encode()
    socket.send_fds(sock, [struct.pack("!I", len(body))], [0, 1, 2, *fds])
    for fd in fds:
        os.close(fd)
    sock.sendall(body)

    def forward(signum, frame) -> None:
        try:
            sock.sendall(b"S%d\n" % signum)
        except OSError:
            pass

    for signum in (*_QUIET, signal.SIGUSR1):
        signal.signal(signum, forward)
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = sock.recv(64)
        if not chunk:
            sys.stderr.write("tfdist: the preloaded interpreter ended before this task did\n")
            os._exit(1)
        reply += chunk
    _relay(int(reply[1:]))


def _relay(code: int) -> None:
    """Exits as the task did: with its code, or killed by the same signal."""
    if code >= 0:
        os._exit(code)
    # Die by the same signal, so that the launcher reports "killed by signal SIGKILL".
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if -code not in (signal.SIGKILL, signal.SIGSTOP):  # Those have no handler to reset.
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
    os._exit(128 - code)


def main(argv: list[str]) -> None:
    mode, rest = argv[0], argv[1:]
    options = {}
    while rest and rest[0].startswith("--"):
        option = rest.pop(0)
        if option == "--":
            break
        key, _, value = option[2:].partition("=")
        options[key] = value
    cpus = [int(c) for c in options["cpus"].split(",")] if options.get("cpus") else None
    if mode == "hold":
        hold(int(options["ppid"]), "net" in options)
    elif mode == "run" and options.get("zygote"):
        signal.signal(signal.SIGUSR2, _kill_group)
        _die_with_parent(signal.SIGUSR2, int(options["ppid"]))
        namespaces = {"net": options.get("netns"), "pid": options.get("pidns")}
        run_forked(options["zygote"], cpus, rest, {k: v for k, v in namespaces.items() if v})
    elif mode == "run":
        run(
            int(options["ppid"]),
            options.get("netns") or None,
            options.get("pidns") or None,
            cpus,
            rest,
        )
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
