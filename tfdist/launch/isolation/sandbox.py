"""Keeping a local launch's tasks to themselves: a private network, and no orphans.

TF's gRPC server has no authentication and binds ``0.0.0.0:PORT`` whatever host
TF_CONFIG names (``GrpcServer::Init`` takes only the port from the cluster spec;
no ServerDef or ConfigProto option chooses the address). So "listen on loopback"
cannot be asked of TF. Instead, a single-machine launch runs its tasks in a
private network namespace with only a loopback interface: every interface the
servers listen on is that namespace's ``lo``, which no other host (and no process
of this host outside the launch) can reach.

Every task's lifetime is also tied to the launcher's: each task runs under a
small helper (``_helper.py run``) that dies with the launcher, and in a PID
namespace whose init dies with it, taking every process the task started along.

Both need CAP_SYS_ADMIN (root). Without it the launcher warns, names the ports
to firewall, and ties lifetimes with the process group instead.
"""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
from collections.abc import Sequence

from tfdist.config import invalid_argument

# The package's name, as the launch's log lines have always said: "tfdist.launch.isolation: ...".
logger = logging.getLogger("tfdist.launch.isolation")

# Run by path with ``python -I -S``: the helper imports only the standard library, so that it
# starts fast and nothing from the task's environment (PYTHONPATH, site-packages) runs as it.
_HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_helper.py")
_READY_SECONDS = 30.0
UNAUTHENTICATED = (
    "TF's gRPC servers are unauthenticated (no authentication) and run any graph "
    "sent to them, so anyone who can reach their ports can run code as this user"
)


class Sandbox:
    """The namespaces one launch's tasks share; `wrap` runs a task inside them.

    Args:
        private_network: Give the tasks a private network namespace (only
            loopback). Off for clusters that span machines.

    Attributes:
        private_network: Whether the tasks really run in a private network namespace.
        pid_namespace: Whether they run in a PID namespace that dies with the launcher.
        network_problem: Why the requested private network could not be made, or None.
        pid_problem: Why the PID namespace could not be made, or None.
    """

    def __init__(self, *, private_network: bool):
        self.requested_network = private_network
        self.private_network = False
        self.pid_namespace = False
        self.network_problem: str | None = None
        self.pid_problem: str | None = None
        self._holder: subprocess.Popen | None = None
        self._supported = sys.platform.startswith("linux")

    def start(self) -> None:
        """Starts the namespace holder (Linux); on failure, falls back and records why."""
        if not self._supported:
            self.network_problem = self.pid_problem = "namespaces need Linux"
            return
        command = [sys.executable, "-I", "-S", _HELPER, "hold", f"--ppid={os.getpid()}"]
        if self.requested_network:
            command.append("--net")
        holder = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready, _, _ = select.select([holder.stdout], [], [], _READY_SECONDS)
        line = holder.stdout.readline() if ready else ""
        try:
            report = json.loads(line)
        except ValueError:
            holder.kill()
            holder.wait()
            self.network_problem = self.pid_problem = (
                f"the namespace helper did not start (exit code {holder.returncode})"
            )
            return
        self._holder = holder
        self.private_network = self.requested_network and report["net"] is None
        self.pid_namespace = report["pid"] is None
        self.network_problem = report["net"] if self.requested_network else None
        self.pid_problem = report["pid"]
        if not self.private_network and not self.pid_namespace:
            self.close()

    def wrap(
        self,
        command: Sequence[str],
        *,
        cpus: Sequence[int] | None = None,
        zygote: str | None = None,
        zygote_outside: bool = False,
    ) -> list[str]:
        """Returns the command that runs ``command`` as a task of this sandbox.

        Args:
            command: The task's program and arguments.
            cpus: The CPUs the task (and all it starts) may run on; all by default.
                The helper sets them before it starts the task (Linux).
            zygote: The socket of a preloaded interpreter running in this sandbox
                (`tfdist.launch.preload`), which then forks the task; None to start
                ``command`` afresh.
            zygote_outside: The ``zygote`` runs outside this sandbox (one shared by many
                launches): the helper sends it the sandbox's namespaces, which the forked
                process enters (the processes *it* starts are in the PID namespace).
        """
        if not self._supported:
            if cpus is not None:
                raise invalid_argument("cpus", list(cpus), "None: CPU affinity needs Linux")
            if zygote is not None:
                raise invalid_argument("zygote", zygote, "None: forking tasks needs Linux")
            return list(command)
        wrapped = [sys.executable, "-I", "-S", _HELPER, "run", f"--ppid={os.getpid()}"]
        if cpus is not None:
            wrapped.append("--cpus=" + ",".join(map(str, cpus)))
        if zygote is not None:
            wrapped.append(f"--zygote={zygote}")
        if zygote is None or zygote_outside:  # A zygote in the sandbox forks tasks already in it.
            if self._holder is not None and self.private_network:
                wrapped.append(f"--netns=/proc/{self._holder.pid}/ns/net")
            if self._holder is not None and self.pid_namespace:
                wrapped.append(f"--pidns=/proc/{self._holder.pid}/ns/pid_for_children")
        return [*wrapped, "--", *command]

    def close(self) -> None:
        """Kills every process left in the namespaces and lets them go."""
        holder, self._holder = self._holder, None
        if holder is None:
            return
        # The holder waits on its stdin: at EOF it kills the PID namespace's init, and the kernel
        # then kills everything in the namespace. A launcher that dies closes it too.
        holder.stdin.close()
        try:
            holder.wait(timeout=10)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
        holder.stdout.close()

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def firewall_advice(ports: Sequence[int]) -> str:
    """A firewall rule keeping other hosts off ``ports``, where no private network can be made."""
    listed = ",".join(str(p) for p in sorted(ports))
    return (
        f"block these ports from other hosts with a firewall, e.g. "
        f"`iptables -I INPUT ! -i lo -p tcp -m multiport --dports {listed} -j DROP` "
        f"(and ip6tables the same)"
    )


def report_exposure(
    sandbox: Sandbox,
    ports: Sequence[int],
    *,
    single_node: bool,
    loopback: bool,
    private_network: bool,
) -> None:
    """Logs what protects the tasks' ``ports``, and what to do where nothing does.

    Args:
        sandbox: The started sandbox the tasks run in.
        ports: The ports this launcher's tasks listen on.
        single_node: Whether the whole cluster runs on this machine (no ``hosts``).
        loopback: Whether the cluster's addresses are all loopback.
        private_network: Whether the caller asked for a private network namespace.
    """
    if sandbox.private_network:
        logger.info(
            "The tasks run in a private network namespace that has only loopback: other "
            "hosts cannot reach their ports."
        )
    elif loopback:  # Non-loopback addresses were warned about when allowed (require_loopback).
        if not single_node:
            why = "A multi-node cluster (--hosts) uses this host's network"
        elif not private_network:
            why = "private_network=False (--noprivate_network)"
        else:
            why = f"No private network namespace for the tasks ({sandbox.network_problem})"
        logger.warning(
            "%s: ports %s listen on every interface (TF ignores the host in TF_CONFIG), "
            "so other hosts can reach them, and %s. To prevent that, %s.",
            why,
            ", ".join(map(str, ports)),
            UNAUTHENTICATED,
            firewall_advice(ports),
        )
    if not sandbox.pid_namespace:
        logger.warning(
            "No PID namespace for the tasks (%s): a process that a task moves out of "
            "its process group can outlive a launcher killed with SIGKILL.",
            sandbox.pid_problem,
        )
