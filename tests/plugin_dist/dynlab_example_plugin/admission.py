"""The ``short-only`` admission policy, registered through the ``dynlab`` entry-point group."""
from __future__ import annotations

from dynlab import hookimpl
from dynlab.engine.gateway import AdmissionPolicy


class ShortOnly(AdmissionPolicy):
    """Shed every prompt longer than `max_tokens` (an example third-party admission policy)."""

    name = "short-only"

    def __init__(self, opts, spec="", warmup=0):
        super().__init__(opts, spec, warmup)
        unknown = set(opts) - {"max_tokens"}
        if unknown:
            raise ValueError(f"admission policy {self.spec!r}: unknown option {sorted(unknown)[0]!r}")
        self.max_tokens = self.number(opts, "max_tokens", 1024, minimum=1, spec=self.spec)

    def admit(self, request, now):
        return request.input_length <= self.max_tokens


@hookimpl
def dynlab_register_admission_policies(register):
    register(ShortOnly)
