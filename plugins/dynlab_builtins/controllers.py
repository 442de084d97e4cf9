"""Built-in controllers (``--controller``), registered through the ``dynlab`` entry-point group: ``none``."""
from __future__ import annotations

from dynlab import hookimpl
from dynlab.engine.controller import NoController


@hookimpl
def dynlab_register_controllers(register):
    register(NoController)
