"""The scorer interface: one term of a weighted routing decision (llm-d's inference scheduler).

A scorer is a plugin (hook ``dynlab_register_scorers``). The ``weighted`` strategy sums
``weight * score`` over its scorers and picks the worker with the highest total. A scorer sees
what a router knows: the request, the router's load view (:class:`~dynlab.routing.strategy.FleetView`)
and the index the router keeps from KV events (:class:`~dynlab.routing.index.KvIndex`).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Sequence

from dynlab.routing.index import KvIndex
from dynlab.routing.strategy import FleetView, Request, RunContext, StrategyOption


class Scorer(ABC):
    """Base class of scorers. The first docstring line is shown by ``dynlab plugins``.

    Subclasses set ``name`` (the name in ``--opt scorers=NAME:WEIGHT,...``) and implement
    :meth:`score`. ``options`` declares the scorer's options, given to the ``weighted`` strategy
    as ``--opt NAME.OPTION=VALUE``; their converted values arrive in ``ctx.options`` (defaults
    filled in). ``reads_load``: the scores come from the load view, which is zero without
    ``--timing`` (``weighted`` then refuses the scorer when named explicitly).
    """

    name: ClassVar[str] = ""
    options: ClassVar[Sequence[StrategyOption]] = ()
    reads_load: ClassVar[bool] = False

    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    def option(self, name: str) -> Any:
        """The value of the declared option ``name``; ``KeyError`` for one the class does not declare."""
        if name in self.ctx.options:
            return self.ctx.options[name]
        for o in self.options:
            if o.name == name:
                return o.default
        raise KeyError(f"scorer {self.name!r} declares no option {name!r}")

    @abstractmethod
    def score(self, request: Request, fleet: FleetView, index: KvIndex) -> list[float]:
        """One finite number per worker (``len(fleet)`` of them), higher is better."""
