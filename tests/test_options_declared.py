"""Options declared once (issue 39 item 5): one :class:`~dynlab.engine.option_spec.Option` per option of ``dynlab sim``
(``dynlab/engine/options.py``) generates SimConfig's fields, its sections, the no-effect rules' field groups, the
click options of sim/compare/sweep and the docs' option table; a toy declaration reaches all of them."""
from __future__ import annotations

import importlib.util
import math
import re
import sys
from dataclasses import fields
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from dynlab.cli.sim_options import (SIM_FLAGS, SIM_OPTIONS, click_type, listed_options, option_rows,
                                    value_options)
from dynlab.engine.config import DECODE_ROUTERS, SECTIONS, SimConfig
from dynlab.engine.option_spec import Option, check_value, declare_fields, option_table, section_fields, with_rule
from dynlab.engine.options import BY_NAME, FIELD_ORDER, OPTIONS

ROOT = Path(__file__).resolve().parent.parent

#: a toy option: what a new option's declaration is (one entry), read by nothing but this test
TOY = Option("toy_blocks", "kv", 4, kind="int", min=1, unit="blocks", flags=("--toy-blocks",), rules=("timed",),
             help="A toy: blocks of nothing.")
WITH_TOY = OPTIONS + (TOY,)


@declare_fields(WITH_TOY, FIELD_ORDER)
class ToyConfig:
    """SimConfig's fields and the toy's (no methods: the declarations alone)."""


#: an option a user added before the toy (docs/development.md's recipe): declared, in no FIELD_ORDER entry
EARLIER = Option("toy_front_extra_ms", "slo", 0.0, kind="float", min=0.0, unit="ms", flags=("--toy-front-extra-ms",),
                 help="A toy: ms of nothing.")


@declare_fields(OPTIONS + (EARLIER, TOY), FIELD_ORDER)
class TwoToysConfig:
    """SimConfig's fields, a user's earlier new option and the toy (FIELD_ORDER not edited for either)."""


def test_a_toy_declaration_reaches_the_config_its_section_and_its_rule():
    simconfig = [f.name for f in fields(SimConfig)]  # FIELD_ORDER, then the options declared since, in OPTIONS order
    assert [f.name for f in fields(ToyConfig)] == simconfig + ["toy_blocks"]  # new fields go last
    # an option added by the recipe needs no FIELD_ORDER entry: it and the toy come after the frozen order
    assert [f.name for f in fields(TwoToysConfig)] == simconfig + ["toy_front_extra_ms", "toy_blocks"]
    assert ToyConfig().toy_blocks == 4 and ToyConfig(toy_blocks=9, workers=3).workers == 3  # flat keywords
    assert section_fields(WITH_TOY, FIELD_ORDER)["kv"][-1] == "toy_blocks"
    assert with_rule(WITH_TOY, "timed", FIELD_ORDER)[-1] == "toy_blocks"  # refused without --timing
    with pytest.raises(ValueError, match="toy_blocks must be >= 1, got 0"):
        check_value(TOY, 0)


def test_a_toy_declaration_reaches_the_click_commands_and_the_table():
    @click.command()
    @value_options(option_rows(WITH_TOY))
    def sim(**options):
        click.echo(ToyConfig(**options).toy_blocks)

    runner = CliRunner()
    assert runner.invoke(sim, ["--toy-blocks", "7"]).output == "7\n"
    assert runner.invoke(sim, []).output == "4\n"  # the declared default
    refused = runner.invoke(sim, ["--toy-blocks", "0"])  # the declared range: min=1
    assert refused.exit_code == 2 and "--toy-blocks" in refused.output
    assert "A toy: blocks of nothing." in " ".join(runner.invoke(sim, ["--help"]).output.split())

    @click.command()
    @listed_options(WITH_TOY)
    def compare(**options):
        pass

    text = " ".join(runner.invoke(compare, ["--help"]).output.split())
    assert "A toy: blocks of nothing. A comma list varies it. [type: integer >= 1; default: 4]" in text
    row = option_table(WITH_TOY).splitlines()[-1]  # the toy comes last: after every declaration
    assert row == ("| `--toy-blocks` | `toy_blocks` (kv) | integer >= 1 | 4 | blocks | sim, compare, sweep "
                   "| without --timing |")


def test_simconfig_and_the_cli_come_from_the_declarations():
    names = tuple(f.name for f in fields(SimConfig))  # the frozen order, then the options declared since it
    assert names[:len(FIELD_ORDER)] == FIELD_ORDER
    assert names[len(FIELD_ORDER):] == tuple(o.name for o in OPTIONS if o.name not in FIELD_ORDER)
    assert sorted(n for names in SECTIONS.values() for n in names) == sorted(BY_NAME)
    flagged = {o.name for o in OPTIONS if o.flags}
    by_hand = {o.name for o in OPTIONS if o.by_hand}
    assert {r[1] for r in SIM_OPTIONS} | {r[1] for r in SIM_FLAGS} == flagged - by_hand
    assert by_hand == {"opts", "latency_opts", "all_metrics", "timing", "pools"}  # repeatable, or the shared flags
    c = SimConfig(workers=4, link_gbps=2.0)  # flat keywords
    assert (c.fleet.workers, c.disagg.link_gbps) == (4, 2.0)


def test_declared_choices_are_the_engines_own():
    from dynlab.engine.sglang.schedule_policy import SCHEDULE_POLICIES
    from dynlab.engine.spec import SPEC_HASH_RULES, SPEC_METHODS
    from dynlab.routing.hashing import HASH_SCHEMES
    from dynlab.traces.rates import DURATION_REPEATS

    for name, own in (("schedule_policy", SCHEDULE_POLICIES), ("spec_method", SPEC_METHODS),
                      ("spec_hash_rule", SPEC_HASH_RULES), ("hash", HASH_SCHEMES),
                      ("duration_repeat", DURATION_REPEATS), ("decode_router", DECODE_ROUTERS)):
        assert tuple(BY_NAME[name].choices) == tuple(own), name


@pytest.mark.parametrize("section, field, bad", [
    ("traffic", "prefixes", -1), ("fleet", "routers", 0), ("engine", "max_num_seqs", 0), ("kv", "block", 0),
    ("events", "event_loss", 1.5), ("slo", "slo_ttft_ms", -1.0), ("disagg", "link_gbps", 0.0)])
def test_validate_checks_each_section_by_its_declarations(section, field, bad):
    assert field in SECTIONS[section]
    with pytest.raises(ValueError, match=f"^{field} must be "):
        SimConfig(**{field: bad}).validate()


def test_a_declaration_with_an_unknown_kind_section_or_rule_is_refused():
    for kw, word in ((dict(kind="integer"), "kind"), (dict(section="gpu"), "section"), (dict(rules=("never",)), "rule")):
        with pytest.raises(ValueError, match=f"unknown {word}"):
            Option(**{"name": "x", "section": "kv", "default": 1, "kind": "int", **kw})


def _cli_accepts(option: Option, value) -> bool:
    try:
        click_type(option).convert(str(value), None, None)
    except click.BadParameter:
        return False
    return True


def _core_accepts(option: Option, value) -> bool:
    try:
        check_value(option, value)
    except ValueError:
        return False
    return True


RANGED = [o for o in OPTIONS if o.kind in ("int", "float")]


@pytest.mark.parametrize("option", RANGED, ids=lambda o: o.name)
@settings(max_examples=40, deadline=None)
@given(st.one_of(st.integers(-3, 3), st.floats(allow_nan=True, allow_infinity=True)))
def test_the_core_and_the_cli_accept_the_same_values(option, value):
    """The declared range is one rule: ``SimConfig.validate``'s check and the click type agree on every value."""
    if option.kind == "int" and not (isinstance(value, int) or (math.isfinite(value) and value == int(value))):
        return  # (an int option's text must be an integer: click's own rule)
    if option.kind == "int":
        value = int(value)
    assert _core_accepts(option, value) == _cli_accepts(option, value)


def test_the_docs_option_table_is_current():
    spec = importlib.util.spec_from_file_location("docs_tables", ROOT / "benchmarks" / "docs_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_tables"] = module
    spec.loader.exec_module(module)
    for path, command in module.OPTION_TABLES.items():
        diff = module.update_option_table(path, command, check=True)
        assert diff == [], "stale; run python benchmarks/docs_tables.py --cheap\n" + "".join(diff)


def test_the_options_declared_for_plan_are_the_ones_plan_takes():
    from dynlab.cli.plan import FLAGS, SHARED
    from dynlab.cli.plan_shapes import CANDIDATES

    assert {o.name for o in OPTIONS if "plan" in o.commands} == set(SHARED) | set(FLAGS) | set(CANDIDATES)


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.flags and o.kind != "flag"], ids=lambda o: o.name)
def test_the_tables_default_is_the_one_sim_help_says(option):
    """The docs' table and compare's help say the default ``sim --help`` says: its help's ``[default: X]``, else the
    value sim shows, never a raw ``None`` (issue: 18 rows read None)."""
    said = re.search(r"\[default: ([^]]*)\]", option.help)
    text = option.default_text()
    assert text != "None"
    if said:
        assert text == said.group(1)
    elif option.none_means:
        assert text == option.none_means  # (a repeatable option's empty default too)
    else:
        assert text == str(option.default)  # what click's show_default prints


def test_the_table_says_open_bounds_and_plans_own_capacity():
    rows = {line.split(" | ")[0][3:-1]: line for line in option_table(OPTIONS).splitlines()[2:]}
    # spot_discount: 0 <= x < 1 (1.0 refused); gpu_memory_utilization: 0 < x <= 1 (0 refused)
    assert "| number >= 0.0 and < 1.0 | 0.0 |" in rows["--spot-discount"]
    assert "| number > 0.0 and <= 1.0 | 0.9 |" in rows["--gpu-memory-utilization"]
    with pytest.raises(ValueError, match=r"spot_discount must be in \[0, 1\), got 1.0"):
        check_value(BY_NAME["spot_discount"], 1.0)
    # plan's --capacity is its own (dynlab/cli/plan.py: _TYPES, IntRange(min=1); default from GPU memory)
    assert "| sim, compare, sweep, plan (at least 1, derived from GPU memory) |" in rows["--capacity"]
    assert "| sim, compare, sweep, plan |" in rows["--block"]


def test_compare_help_takes_one_value_of_an_option_with_its_own_commas():
    from dynlab.cli import main

    text = " ".join(CliRunner().invoke(main, ["compare", "--help"]).output.split())
    for flag in ("--controller", "--price", "--admission-policy", "--slo", "--spec-acceptance"):
        part = text[text.index(f"{flag} V "):]
        part = part[:part.index("[type:")]
        assert "One value: its commas are its own." in part and "A comma list varies it" not in part, flag
    part = text[text.index("--workers V[,V...]"):]
    assert "A comma list varies it." in part[:part.index("[type:")]


@pytest.mark.parametrize("name, accepted, refused", [
    ("chunked_prefill_size", (-1, 1, 10**8), (-2, 0, 10**8 + 1)),  # -1: no chunking (also=), else 1 to 100,000,000
    ("max_running_requests", (1, 10**8), (0, 10**8 + 1))])
def test_an_upper_bound_and_an_also_value_are_one_rule_for_the_core_and_the_cli(name, accepted, refused):
    option = BY_NAME[name]
    for value in accepted:
        assert _core_accepts(option, value) and _cli_accepts(option, value), value
    for value in refused:
        assert not _core_accepts(option, value) and not _cli_accepts(option, value), value


def test_also_is_declared_only_for_a_bounded_int():
    for kw in (dict(kind="float", min=0, max=1), dict(kind="int", min=1)):
        with pytest.raises(ValueError, match="also= is for an int option with its min and max"):
            Option(**{"name": "x", "section": "kv", "default": 1, "also": ((-1, "off"),), **kw})
    toy = Option("x", "kv", 1, kind="int", min=1, max=9, also=((-1, "off"),))
    assert toy.type_text() == "-1 (off) or integer 1 to 9"
