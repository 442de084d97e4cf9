"""What one option of ``dynlab sim`` is (issue 39 item 5, "options declared once"): :class:`Option`, and what is
generated from a list of them: :class:`~dynlab.engine.config.SimConfig`'s fields (:func:`declare_fields`), its
sections (:func:`section_fields`), the field groups of the no-effect rules (:func:`with_rule`), the range checks of
``SimConfig.validate`` (:func:`check_value`) and the docs' option table (:func:`option_table`).

The declarations themselves are :data:`dynlab.engine.options.OPTIONS`. No click here: a declaration's ``kind`` is
abstract and ``dynlab/cli/sim_options.py`` maps it to a click type (the core never imports the CLI).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

#: the kinds of value an option takes. ``int``/``float`` (``min``, ``max``, ``min_open``, ``max_open``; floats are
#: finite; an ``int``'s ``also``: values taken outside that range, each with its meaning), ``text``, ``choice``
#: (``choices``), ``registry`` (a name in ``dynlab.plugins.<registry>()``, ``label`` its kind in messages), ``checked`` (text the CLI's check ``check`` accepts, ``label`` its form), ``capacity`` (blocks,
#: an int >= 0 or ``None``: unbounded), ``flag`` (on/off); ``mapping`` (``NAME=VALUE`` options) and ``pools``
#: (``--pool`` texts) are repeatable options the CLI wires by hand
KINDS = ("int", "float", "text", "choice", "registry", "checked", "capacity", "flag", "mapping", "pools")
#: the sections of :class:`~dynlab.engine.config.SimConfig`, in order (:mod:`dynlab.engine.sections`)
SECTION_NAMES = ("traffic", "fleet", "engine", "kv", "events", "slo", "disagg")
#: the no-effect rules an option can take part in (:mod:`dynlab.engine.option_rules`): ``timed`` refused without
#: ``--timing``; ``parallel`` a timed worker's parallelism (refused without it too); ``sglang`` refused without
#: ``--engine sglang``; ``pd`` refused for an aggregated fleet; ``synthetic`` refused with a trace or a workload
#: spec; ``lora`` refused without ``--max-loras``; ``spec`` speculative decoding's, refused without ``--spec-tokens``
RULES = ("timed", "parallel", "sglang", "pd", "synthetic", "lora", "spec")
#: the commands that take every option of ``dynlab sim`` (compare as comma lists, sweep as grid axes)
SIM_COMMANDS = ("sim", "compare", "sweep")


@dataclass(frozen=True)
class Option:
    """One option: the :class:`~dynlab.engine.config.SimConfig` field ``name`` in ``section``, its ``default`` (in
    ``unit``: tokens, blocks, ms, GB/s = 1e9 B/s, ...), the ``kind`` of value and its range (:data:`KINDS`), its
    command-line ``flags`` (``()``: a field with no flag of its own, or one the CLI wires by hand), ``help`` (as
    ``--help`` prints it), the ``commands`` it appears on, the no-effect ``rules`` it takes part in (:data:`RULES`),
    ``own_commas`` (its values hold commas: compare takes one value, a sweep's ``--grid`` does not split it),
    ``none_means``: what the default ``None`` stands for when ``help`` has no ``[default: ...]`` (which ``sim --help``
    prints and compare's help and the docs' table say too), ``by_hand``: the CLI wires its click option itself (a
    repeatable option, or one of the flags every command shares), with this help, and ``plan_own``: how ``plan``'s
    option of the same flag differs from sim's (its range and default, ``dynlab/cli/plan.py:_TYPES``), for the
    table. ``also``: an ``int``'s values outside ``min``..``max``, as ``(value, meaning)`` pairs (SGLang's chunk
    ``-1``: no chunking)."""

    name: str
    section: str
    default: Any
    kind: str
    flags: tuple = ()
    help: str = ""
    unit: str = ""
    min: Optional[float] = None
    max: Optional[float] = None
    min_open: bool = False
    max_open: bool = False
    choices: tuple = ()
    registry: str = ""
    label: str = ""
    check: str = ""
    commands: tuple = SIM_COMMANDS
    rules: tuple = ()
    own_commas: bool = False
    none_means: str = ""
    by_hand: bool = False
    plan_own: str = ""
    also: tuple = ()

    def __post_init__(self):
        bad = ([f"kind {self.kind!r}"] if self.kind not in KINDS else []) + \
              ([f"section {self.section!r}"] if self.section not in SECTION_NAMES else []) + \
              [f"rule {r!r}" for r in self.rules if r not in RULES]
        if bad:
            raise ValueError(f"option {self.name}: unknown {', '.join(bad)}")
        if self.also and (self.kind != "int" or self.min is None or self.max is None):
            raise ValueError(f"option {self.name}: also= is for an int option with its min and max")

    @property
    def flag(self) -> str:
        """The option's name on the command line: its first flag (``--async-scheduling`` of
        ``--async-scheduling/--no-async-scheduling``), else ``--`` + the field name with dashes."""
        return self.flags[0].split("/")[0] if self.flags else "--" + self.name.replace("_", "-")

    @property
    def annotation(self) -> str:
        """The field's type, as text (``"int"``, ``"Optional[float]"``, ``"Mapping[str, str]"``)."""
        base = {"int": "int", "float": "float", "capacity": "int", "flag": "bool", "mapping": "Mapping[str, str]",
                "pools": "tuple"}.get(self.kind, "str")
        return f"Optional[{base}]" if self.default is None and self.kind != "mapping" else base

    def dataclass_field(self):
        """This option as a dataclass field (a ``mapping``'s default: a fresh empty dict per configuration)."""
        return field(default_factory=dict) if self.kind == "mapping" else field(default=self.default)

    def type_text(self) -> str:
        """What a value is, for ``--help`` and the docs' table: ``integer >= 1``, ``number 0.0 to 1.0``, ``yes|no``,
        ``strategy name``, ``integer >= 0 or unbounded``."""
        if self.kind == "choice":
            return "|".join(self.choices)
        if self.kind == "registry":
            return f"{self.label} name"
        if self.kind == "capacity":
            return "integer >= 0 or unbounded"
        if self.kind == "checked":
            return self.label
        if self.kind in ("int", "float"):
            word = "integer" if self.kind == "int" else "number"
            word = f"{self.also_text()} or {word}" if self.also else word
            if self.min is not None and self.max is not None:  # an open bound said as such: 0.0 <= x < 1.0
                if self.min_open or self.max_open:
                    return f"{word} {'>' if self.min_open else '>='} {self.min} and {'<' if self.max_open else '<='} " \
                           f"{self.max}"
                return f"{word} {self.min} to {self.max}"
            if self.min is not None:
                return f"{word} {'>' if self.min_open else '>='} {self.min}"
            return word
        return {"text": "text", "flag": "on/off", "mapping": "NAME=VALUE", "pools": "[ROLE:]GPU:tpN:COUNT"}[self.kind]

    def also_text(self) -> str:
        """The values of ``also`` with their meanings: ``-1 (no chunking)``; ``""`` without any."""
        return " or ".join(f"{v} ({meaning})" for v, meaning in self.also)

    def default_text(self) -> str:
        """The default as compare's ``--help`` and the docs' table say it: the ``[default: ...]`` its help ends with
        (what ``sim --help`` prints), else ``none_means`` for ``None``, else the value."""
        said = re.search(r"\[default: ([^]]*)\]", self.help)
        if said:
            return said.group(1)
        return self.none_means or str(self.default)


def declare_fields(options: Iterable[Option], order: tuple):
    """A class decorator: the frozen dataclass of the class with one field per option, in ``order`` (field names)
    then the options not in it, in their order. Raises ``ValueError`` for a name in ``order`` no option declares."""
    by_name = {o.name: o for o in options}
    missing = [n for n in order if n not in by_name]
    if missing:
        raise ValueError(f"field order names undeclared options: {', '.join(missing)}")
    names = list(order) + [n for n in by_name if n not in order]

    def decorate(cls):
        cls.__annotations__ = {n: by_name[n].annotation for n in names}
        for n in names:
            setattr(cls, n, by_name[n].dataclass_field())
        return dataclass(frozen=True)(cls)
    return decorate


def section_fields(options: Iterable[Option], order: tuple) -> dict:
    """Section name -> its field names (:data:`SECTION_NAMES` order; fields in ``order``, then the others)."""
    options = list(options)
    rank = {n: i for i, n in enumerate(order)}
    ranked = sorted(options, key=lambda o: (rank.get(o.name, len(rank)), options.index(o)))
    return {s: tuple(o.name for o in ranked if o.section == s) for s in SECTION_NAMES}


def with_rule(options: Iterable[Option], rule: str, order: tuple) -> tuple:
    """The field names of the options taking part in the no-effect ``rule`` (:data:`RULES`), in ``order``."""
    options = list(options)
    rank = {n: i for i, n in enumerate(order)}
    chosen = [o for o in options if rule in o.rules]
    return tuple(o.name for o in sorted(chosen, key=lambda o: (rank.get(o.name, len(rank)), options.index(o))))


def check_value(option: Option, value) -> None:
    """Raise ``ValueError`` (``NAME must be ..., got VALUE``) unless ``value`` is in ``option``'s declared range; a
    ``None`` default admits ``None``. Kinds whose values the run checks (text, registry names, ...) pass."""
    if value is None and option.default is None:
        return
    name, kind = option.name, option.kind
    if kind == "choice" and value not in option.choices:
        raise ValueError(f"{name} must be one of {', '.join(option.choices)}, got {value!r}")
    if kind == "capacity" and value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    if kind == "int" and any(value == v for v, _ in option.also):
        return
    if kind == "int" and option.also and not option.min <= value <= option.max:
        raise ValueError(f"{name} must be {option.also_text()} or an integer from {option.min} to {option.max}, "
                         f"got {value}")
    if kind == "int" and option.min is not None and value < option.min:
        raise ValueError(f"{name} must be >= {option.min}, got {value}")
    if kind == "int" and option.max is not None and value > option.max:
        raise ValueError(f"{name} must be <= {option.max}, got {value}")
    if kind == "float" and not _in_range(option, value):
        raise ValueError(f"{name} must be {_range_text(option)}, got {value}")


def _in_range(option: Option, v) -> bool:
    lo, hi = option.min, option.max
    return (math.isfinite(v) and (lo is None or (v > lo if option.min_open else v >= lo))
            and (hi is None or (v < hi if option.max_open else v <= hi)))


def _range_text(option: Option) -> str:
    lo, hi = option.min, option.max
    if lo is not None and hi is not None:
        if not option.min_open and not option.max_open:
            return f"between {lo:g} and {hi:g}"
        return f"in {'(' if option.min_open else '['}{lo:g}, {hi:g}{')' if option.max_open else ']'}"
    if lo is not None:
        return f"a finite number {'>' if option.min_open else '>='} {lo:g}"
    return "a finite number"


#: what each no-effect rule (:data:`RULES`) refuses an option in, for the docs' table
RULE_TEXT = {"timed": "without --timing", "parallel": "without --timing", "sglang": "without --engine sglang",
             "pd": "without a P/D fleet", "synthetic": "with --trace or --workload", "lora": "without --max-loras",
             "spec": "without --spec-tokens"}


def option_table(options: Iterable[Option], command: str = "sim") -> str:
    """The docs' option table of ``command`` (Markdown), one row per option with a flag, in declaration order
    (``--help``'s): flag, ``SimConfig`` field and section, type, default, unit, the commands that take it, and
    where its declared no-effect rules refuse it (the other rules: ``dynlab/engine/option_rules.py``)."""
    rows = ["| option | field (section) | type | default | unit | commands | refused |",
            "|---|---|---|---|---|---|---|"]
    for o in options:
        if o.flags and command in o.commands:
            default = "off" if o.kind == "flag" else o.default_text()
            refused = "; ".join(dict.fromkeys(RULE_TEXT[r] for r in o.rules)) or "-"
            commands = ", ".join(f"{c} ({o.plan_own})" if c == "plan" and o.plan_own else c for c in o.commands)
            rows.append(f"| `{o.flag}` | `{o.name}` ({o.section}) | {o.type_text().replace('|', '&#124;')} | "
                        f"{default} | {o.unit or '-'} | {commands} | {refused} |")
    return "\n".join(rows)
