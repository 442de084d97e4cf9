"""The ``add-then-retire`` controller, registered through the ``dynlab`` entry-point group."""
from __future__ import annotations

from dynlab import hookimpl
from dynlab.engine.controller import Add, Controller, Retire


class AddThenRetire(Controller):
    """Add a worker at add_s, retire worker `retire` at retire_s (kill=1: kill it) (an example third-party controller)."""

    name = "add-then-retire"

    def __init__(self, opts, spec=""):
        super().__init__(opts, spec)
        self.add_s = self.number("add_s", 10.0)
        self.retire_s = self.number("retire_s", 20.0)
        self.retire = self.number("retire", 0, integer=True)
        self.kill = bool(self.number("kill", 0, integer=True))
        self.ready_in_s = self.number("ready_in_s", 0.0)
        self.added = self.retired = False

    def decide(self, state):
        out = []
        if not self.added and state.now_s >= self.add_s:
            self.added = True
            out.append(Add(self.ready_in_s))
        if not self.retired and state.now_s >= self.retire_s:
            self.retired = True
            out.append(Retire(self.retire, kill=self.kill))
        return out


@hookimpl
def dynlab_register_controllers(register):
    register(AddThenRetire)
