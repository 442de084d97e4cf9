"""The click options of ``dynlab sim``, ``compare`` and ``sweep``, generated from the declarations of
:data:`dynlab.engine.options.OPTIONS` (issue 39 item 5): each declaration's abstract kind mapped to a click type
(:func:`click_type`), :data:`SIM_OPTIONS` and :data:`SIM_FLAGS` (the tables ``plan`` and the tests read), and the
decorators :func:`sim_options` (sim, sweep), :func:`compare_options`, :func:`common_flags` and :func:`pool_option`.
"""
from __future__ import annotations

import math
import re

import click

from dynlab import plugins
from dynlab.cli.common import INPUT_FIELDS, input_path
from dynlab.engine.option_spec import Option
from dynlab.engine.options import BY_NAME, OPTIONS


class CapacityType(click.ParamType):
    """Blocks per worker: an int >= 0, or ``unbounded``."""

    name = "BLOCKS|unbounded"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, int):
            return value
        if str(value).strip().lower() in ("unbounded", "none", "inf"):
            return None
        try:
            v = int(value)
        except ValueError:
            self.fail(f"{value!r} is not an integer or 'unbounded'", param, ctx)
        if v < 0:
            self.fail(f"{v} is negative", param, ctx)
        return v


class FiniteFloat(click.FloatRange):
    """A float range that also refuses NaN and infinities."""

    def convert(self, value, param, ctx):
        v = super().convert(value, param, ctx)
        if not math.isfinite(v):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return v


class IntRangeOr(click.IntRange):
    """An ``int`` option's range (:class:`~dynlab.engine.option_spec.Option` with ``also``) that also takes the values
    ``also`` (``(value, meaning)`` pairs: SGLang's chunk ``-1``, no chunking); a value outside both is refused saying
    both: ``0 is not -1 (no chunking) or in the range 1<=x<=N``."""

    def __init__(self, option):
        super().__init__(option.min, option.max)
        self.also, self.said = tuple(option.also), option.also_text()

    def convert(self, value, param, ctx):
        v = click.INT.convert(value, param, ctx)
        if any(v == a for a, _ in self.also):
            return v
        try:
            return super().convert(v, param, ctx)
        except click.BadParameter:
            self.fail(f"{v} is not {self.said} or in the range {super()._describe_range()}.", param, ctx)

    def _describe_range(self) -> str:  # --help's [-1 or 1<=x<=N]
        return " or ".join([*(str(a) for a, _ in self.also), super()._describe_range()])


def _own_default(param, ctx, value) -> bool:
    """The option's own default, not given (its registry or check is then not imported at start-up)."""
    return param is not None and ctx is not None and value == param.default and \
        ctx.get_parameter_source(param.name) is click.core.ParameterSource.DEFAULT


class RegistryName(click.ParamType):
    """A name from a plugin registry; unknown names are usage errors that list the known ones.

    A default (a built-in's name) is not looked up here: the run looks it up where it needs it, so
    a command that never uses the registry (``--latency-model`` in a count-based run) does not
    import its plugins' modules at start-up.
    """

    def __init__(self, kind: str, registry_fn):
        self.name = kind
        self._registry_fn = registry_fn

    def convert(self, value, param, ctx):
        if _own_default(param, ctx, value):
            return value  # (a grid cell's value is checked: sweep)
        registry = self._registry_fn()
        if value not in registry:
            listed = isinstance(value, str) and "," in value and all(v.strip() in registry for v in value.split(","))
            hint = "; a comma list compares them: dynlab compare (or a sweep's --grid)" if listed else ""
            self.fail(f"unknown {self.name} {value!r}; available: {', '.join(registry.names())}{hint}", param, ctx)
        return value


class CheckedText(click.ParamType):
    """Text that ``check(text)`` accepts (it raises ``ValueError``, one line, for a bad one); ``name``: its form."""

    def __init__(self, name: str, check):
        self.name, self.check = name, check

    def convert(self, value, param, ctx):
        if _own_default(param, ctx, value):
            return value  # (a count-based run imports no run layer)
        try:
            self.check(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return value


def _class_slos(text: str) -> None:
    from dynlab.engine.class_metrics import parse_class_slos

    parse_class_slos(text)


def _admission_policy(text: str) -> None:  # checked as the run will build it (name and options)
    from dynlab.sim.drive import build_policy

    build_policy(text)


def _prices(text: str) -> None:  # checked as the run will read it (GPU=USD items)
    from dynlab.models.prices import parse_prices

    parse_prices(text)


def _controller(text: str) -> None:  # checked as the run will build it (name and options)
    from dynlab.sim.control import build_controller

    build_controller(text)


#: a ``checked`` declaration's ``check`` -> the function that checks its text (imports what it needs when called)
CHECKS = {"class_slos": _class_slos, "admission_policy": _admission_policy, "prices": _prices,
          "controller": _controller}


def click_type(option: Option) -> click.ParamType:
    """The click type of a declaration's kind (:data:`dynlab.engine.option_spec.KINDS`) and range."""
    kind = option.kind
    if kind == "int" and option.also:
        return IntRangeOr(option)
    if kind == "int":
        return click.INT if option.min is None and option.max is None else click.IntRange(option.min, option.max)
    if kind == "float":
        return FiniteFloat(option.min, option.max, min_open=option.min_open, max_open=option.max_open)
    if kind == "choice":
        return click.Choice(list(option.choices))
    if kind == "registry":
        return RegistryName(option.label, getattr(plugins, option.registry))
    if kind == "checked":
        return CheckedText(option.label, CHECKS[option.check])
    if kind == "capacity":
        return CapacityType()
    if kind == "text":
        return click.STRING
    raise ValueError(f"option {option.name}: kind {kind} has no click type of its own (wired by hand)")


def _generated(o: Option) -> bool:
    return bool(o.flags) and not o.by_hand and "sim" in o.commands


def option_rows(options) -> list:
    """``(flags, field, click type, default, help)`` of each generated option of ``options`` that takes a value."""
    return [(o.flags, o.name, click_type(o), o.default, o.help) for o in options if _generated(o) and o.kind != "flag"]


def flag_rows(options) -> list:
    """``(flag, field, help)`` of each generated on/off flag of ``options``."""
    return [(o.flags[0], o.name, o.help) for o in options if _generated(o) and o.kind == "flag"]


#: ``(flags, field, click type, default, help)`` of every generated option that takes a value, in ``--help`` order;
#: compare takes the same flags with comma lists
SIM_OPTIONS = option_rows(OPTIONS)
#: ``(flag, field, help)`` of the on/off flags of sim, compare and sweep that are SimConfig fields (compare and sweep
#: apply them to every run)
SIM_FLAGS = flag_rows(OPTIONS)
#: the options whose values hold commas of their own: compare takes one value of each, sweep's --grid none
OWN_COMMAS = tuple(o.name for o in OPTIONS if o.own_commas)


def value_options(rows: list):
    """A decorator adding the click options of ``rows`` (:func:`option_rows`) as sim takes them."""
    def decorate(fn):
        for flags, field, ptype, default, help_ in reversed(rows):
            fn = click.option(*flags, field, type=ptype, default=default, show_default=default is not None,
                              help=help_, callback=input_path if field in INPUT_FIELDS else None)(fn)
        return fn
    return decorate


def listed_options(options):
    """A decorator adding the generated options of ``options`` as compare takes them: text, a comma list varying
    one of them (one value of an option whose commas are its own, ``Option.own_commas``), the type and default said
    in the help."""
    def decorate(fn):
        for o in reversed([o for o in options if _generated(o) and o.kind != "flag"]):
            help_ = re.sub(r"\s*\[default: [^]]*\]", "", o.help)  # said once, below
            many = " One value: its commas are its own." if o.own_commas else " A comma list varies it."
            fn = click.option(*o.flags, o.name, type=click.STRING, default=None,
                              metavar="V" if o.own_commas else "V[,V...]",
                              help=f"{help_}{many} [type: {o.type_text()}; default: {o.default_text()}]")(fn)
        return fn
    return decorate


#: sim's (and sweep's) options of :data:`SIM_OPTIONS`; compare's, as comma lists
sim_options = value_options(SIM_OPTIONS)
compare_options = listed_options(OPTIONS)


def common_flags(quiet_help: str = "No progress bar on stderr (shown only when stderr is a terminal)."):
    """The flags sim, compare and sweep share; ``quiet_help`` says what --quiet silences in that command."""
    def decorate(fn):
        fn = click.option("--opt", "opt", multiple=True, metavar="NAME=VALUE", help=BY_NAME["opts"].help)(fn)
        fn = click.option("--all-metrics", is_flag=True, help=BY_NAME["all_metrics"].help)(fn)
        fn = click.option("--latency-opt", "latency_opt", multiple=True, metavar="NAME=VALUE",
                          help=BY_NAME["latency_opts"].help)(fn)
        fn = click.option("--timing", is_flag=True, help=BY_NAME["timing"].help)(fn)
        fn = click.option("--quiet", is_flag=True, help=quiet_help)(fn)
        for flag, field, help_ in reversed(SIM_FLAGS):
            fn = click.option(flag, field, is_flag=True, help=help_)(fn)
        return fn
    return decorate


def pool_option(fn):
    """``--pool GPU:tpN:COUNT``, repeatable (sim and compare): a mixed fleet (:mod:`dynlab.engine.pools`)."""
    return click.option("--pool", "pools", multiple=True, metavar="[ROLE:]GPU:tpN:COUNT",
                        help=BY_NAME["pools"].help)(fn)
