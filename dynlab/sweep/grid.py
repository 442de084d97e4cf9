"""A sweep's grid: the varied options (:class:`Axis`), their cells (:class:`Grid`), TOML grid files,
cell keys, and the text of strategy-option values."""
from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass, field
from typing import Any, Mapping

from dynlab.engine.config import SimConfig
from dynlab.engine.run import build_strategy
from dynlab.errors import DynlabError

#: Prefix of grid names that set a strategy option (``opt.NAME`` -> ``SimConfig.opts[NAME]``).
OPT_PREFIX = "opt."
#: fixed latency-model options of every cell (``--latency-opt NAME=VALUE``), as ``latency-opt.NAME``
LATENCY_OPT_PREFIX = "latency-opt."


class GridError(DynlabError):
    """The grid itself is wrong (unknown name, empty or duplicate values, unreadable grid file).

    The CLI shows it as a usage error (exit 2).
    """


@dataclass(frozen=True)
class Axis:
    """One varied option: its name, its converted values, and the text of each as written (for labels)."""

    name: str
    values: tuple
    labels: tuple = ()

    def label(self, i: int) -> str:
        """The text of value ``i`` as the user wrote it (its JSON form when unknown)."""
        if i < len(self.labels):
            return str(self.labels[i])
        return json.dumps(self.values[i])


@dataclass(frozen=True)
class Grid:
    """A sweep's cells: the cross product of ``axes``, each cell also holding ``fixed``.

    - ``axes``: the varied options in the order given; the first varies slowest.
    - ``fixed``: options given once that apply to every cell (name -> converted value);
      they are part of each cell's identity, so a results file records them.
    - ``fields``: option name -> :class:`SimConfig` field for every name used
      (``opt.NAME`` names need no entry: they go to ``SimConfig.opts``; ``latency-opt.NAME`` to
      ``SimConfig.latency_opts``).
    - ``base``: :class:`SimConfig` keyword arguments every cell starts from (``sim``'s defaults).
    """

    axes: tuple[Axis, ...]
    fixed: Mapping[str, Any] = field(default_factory=dict)
    fields: Mapping[str, str] = field(default_factory=dict)
    base: Mapping[str, Any] = field(default_factory=dict)

    def cells(self) -> list[dict]:
        """Every cell in order (the last axis varies fastest): axes' values first, then ``fixed``.

        Raises ``ValueError`` when the grid has more cells than :data:`dynlab.limits.MAX_GRID_CELLS`
        (counted before any is built).
        """
        from dynlab.limits import check_grid_cells

        check_grid_cells([len(a.values) for a in self.axes])
        names = [a.name for a in self.axes]
        out = []
        for combo in itertools.product(*(a.values for a in self.axes)):
            cell = dict(zip(names, combo))
            for name, value in self.fixed.items():
                cell.setdefault(name, value)
            out.append(cell)
        return out

    def varied(self) -> list[Axis]:
        """The axes with more than one value."""
        return [a for a in self.axes if len(a.values) > 1]

    def config(self, cell: Mapping[str, Any]) -> SimConfig:
        """The :class:`SimConfig` of ``cell``: ``base`` with the cell's options applied."""
        kwargs = dict(self.base)
        opts = dict(kwargs.get("opts") or {})
        latency_opts = dict(kwargs.get("latency_opts") or {})
        for name, value in cell.items():
            if name.startswith(OPT_PREFIX):
                opts[name[len(OPT_PREFIX):]] = value
            elif name.startswith(LATENCY_OPT_PREFIX):
                latency_opts[name[len(LATENCY_OPT_PREFIX):]] = value
            else:
                kwargs[self.fields.get(name, name.replace("-", "_"))] = value
        kwargs["opts"] = opts
        kwargs["latency_opts"] = latency_opts
        return SimConfig(**kwargs)


def cell_key(cell: Mapping[str, Any]) -> str:
    """A cell's identity: its options as canonical JSON (sorted names), as read back from a results file."""
    return json.dumps(json.loads(json.dumps(cell)), sort_keys=True, separators=(",", ":"))


def check_config(config: SimConfig) -> None:
    """Raise ``ValueError`` (or :class:`dynlab.plugins.UnknownNameError`) when ``run(config)`` would reject it.

    Checks the fields and builds the strategy with its options, without reading any trace.
    """
    config.validate()
    build_strategy(config, random.Random(0))


def read_grid_file(path: str) -> list[tuple[str, list]]:
    """Read a TOML grid file: ``(name, values)`` pairs in file order.

    Each top-level key is an option name; its value is an array (the values to sweep)
    or a single value (an option that applies to every cell, i.e. a one-value axis).
    A table ``[opt]`` (or keys ``"opt.NAME"``) holds strategy options. Raises
    :class:`GridError` when the file cannot be read or parsed, or holds a nested
    table or array.
    """
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise GridError("--grid-file needs Python 3.11 (tomllib) or the tomli package") from None
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise GridError(f"cannot read grid file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise GridError(f"grid file {path} is not valid TOML: {exc}") from None
    out: list[tuple[str, list]] = []

    def add(name, value):
        if isinstance(value, dict):
            raise GridError(f"grid file {path}: {name!r} is a table; give a value or an array of values")
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, (list, dict)):
                raise GridError(f"grid file {path}: {name!r} holds a nested array or table")
        out.append((name, values))

    for name, value in data.items():
        if name == "opt" and isinstance(value, dict):
            for sub, v in value.items():
                add(OPT_PREFIX + sub, v)
        else:
            add(name, value)
    return out


def option_text(value: Any) -> str:
    """A grid-file value as the text a strategy option (``opt.NAME``) takes: ``true``/``false`` for booleans."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
