"""The suite's pytest-xdist scheduler: ``--dist loadscope`` with an order, and without two hangs.

* ``first``: these scopes (modules) go out first, in this order (see ``tests/conftest.py``).
* ``aliases``: a test id -> the scope it joins (e.g. the Ray notebook joins the Ray module).
* A worker that crashes (the process dies in a test) is replaced. pytest-xdist 3.8.0's
  ``LoadScopeScheduling`` can then hang the whole run with every worker idle. Seen here once:
  "replacing crashed worker gw1", then no test ran for 10 minutes. Two causes, both reported
  upstream (pytest-xdist issues 1323/1378 and 1327):

  - the crashed worker's whole workload goes back on the queue, its finished modules included;
    one of those then goes out as an empty unit, which never completes, so no worker is given
    more work. Here only unfinished modules go back, and the test the worker died in does
    not (xdist has reported it failed; run again, it would crash the next worker too);
  - a worker runs a test only once it holds the next one, or is told to stop. A replacement
    given a one-test module would wait forever. It gets a second unit here.

* A worker can die between finishing a test and xdist noticing: its last "test complete"
  message still arrives, and sending it more work raises ``OSError: cannot send (already
  closed?)``, which xdist turns into an INTERNALERROR that ends the run (seen once in CI, on a
  loaded machine). The unit stays assigned to that worker, and `remove_node` puts it back on
  the queue when xdist reports the crash.
"""

from xdist.scheduler import LoadScopeScheduling


class Scheduling(LoadScopeScheduling):
    first: tuple[str, ...] = ()
    aliases: dict[str, str] = {}

    def _split_scope(self, nodeid: str) -> str:
        return self.aliases.get(nodeid) or super()._split_scope(nodeid)

    def _assign_work_unit(self, node) -> None:
        for scope in reversed(self.first):
            if scope in self.workqueue:
                self.workqueue.move_to_end(scope, last=False)
        try:
            super()._assign_work_unit(node)
        except OSError:  # the worker died before xdist saw it: see the module docstring
            pass

    def remove_node(self, node) -> str | None:
        """As xdist's, but finished modules stay off the queue and the crashed test is not rerun."""
        workload = self.assigned_work.pop(node)
        pending = [
            nodeid for unit in workload.values() for nodeid, done in unit.items() if not done
        ]
        if not pending:
            return None
        crashitem = pending[0]  # The first pending test is the one the worker died in.
        for unit in workload.values():
            if crashitem in unit:
                unit[crashitem] = True  # Reported failed by xdist; run again, it would crash again.
        self.workqueue.update({s: u for s, u in workload.items() if not all(u.values())})
        for other in self.assigned_work:
            self._reschedule(other)
        return crashitem

    def _reschedule(self, node) -> None:
        super()._reschedule(node)
        if (
            self.workqueue
            and not node.shutting_down
            and self._pending_of(self.assigned_work.get(node, {})) < 2
        ):
            self._assign_work_unit(node)


def scheduler(config, log, *, first=(), aliases=None):
    """A :class:`Scheduling` for ``--dist loadscope`` with this order and these aliases."""
    cls = type("SuiteScheduling", (Scheduling,), {"first": tuple(first), "aliases": aliases or {}})
    return cls(config, log)
