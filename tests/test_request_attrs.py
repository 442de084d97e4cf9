"""Per-request attributes from a trace to the result (issue 39, item 1): a trace row's ``priority``, ``tenant``,
``user``, ``lora_name``, ``session_id`` (and a format plugin's own fields) reach ``Request.attrs``, the strategy,
the engine's ``EngineRequest.attrs`` and the ``--requests-out`` records; a trace without them runs as before,
byte for byte (pinned against the code before attributes, commit 4b64f3e)."""
from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from types import MappingProxyType

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynlab import hookimpl, plugins
from dynlab.cli import main
from dynlab.engine.config import SimConfig
from dynlab.engine.metrics import Recorder
from dynlab.errors import InputError
from dynlab.routing.strategy import NO_ATTRS, Strategy, make_request
from dynlab.sim import run
from dynlab.sim.records import KEYS, RequestRecorder
from dynlab.traces.format import TraceFormat
from dynlab.traces.reader import TraceWarning, load_trace
from helpers import invoke, terms_off, terms_off_args

#: what rows 0 and 2 of both traces carry (row 1 carries nothing)
ATTRS = [{"priority": 2, "tenant": "acme", "lora_name": "L1"}, {},
         {"priority": -1, "tenant": "beta", "user": "u7", "session_id": "s1"}]
TOKEN_ROWS = [{"timestamp": 0, "tokens": list(range(32)), "output_length": 3, **ATTRS[0]},
              {"timestamp": 10, "tokens": list(range(32)), "output_length": 2},
              {"timestamp": 20, "tokens": list(range(16)) + [7] * 16, "output_length": 2, **ATTRS[2]}]
MOONCAKE_ROWS = [{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2], **ATTRS[0]},
                 {"timestamp": 10, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]},
                 # session_id alone would detect as aiperf-mooncake: the tests name the format
                 {"timestamp": 20, "input_length": 500, "output_length": 2, "hash_ids": [1], **ATTRS[2]}]
TRACES = {"tokens": TOKEN_ROWS, "mooncake": MOONCAKE_ROWS}
LINEAR = {"latency_model": "linear", **terms_off("linear", {"beta0": 10, "beta1": 1, "beta2": 2})}


def _write(tmp_path, rows, name="t.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


class AttrsSpy(Strategy):
    """Records each request's attributes as routed (test strategy)."""

    name = "test-attrs-spy"
    seen: list = []

    def route(self, request, fleet):
        AttrsSpy.seen.append((request.index, request.attrs))
        return request.index % fleet.workers


class Arrivals(Recorder):
    """Each engine request's attributes as it arrives."""

    def __init__(self):
        self.attrs = {}

    def on_arrival(self, req, t):
        self.attrs[req.id] = req.attrs


class _Plugin:
    @hookimpl
    def dynlab_register_strategies(self, register):
        register(AttrsSpy)


@pytest.fixture
def spy():
    pm = plugins.get_plugin_manager()
    pm.register(_Plugin(), name="test-attrs-spy-plugin")
    AttrsSpy.seen = []
    try:
        yield AttrsSpy
    finally:
        pm.unregister(name="test-attrs-spy-plugin")


@pytest.mark.parametrize("fmt", sorted(TRACES))
def test_a_trace_row_s_attributes_reach_the_request(tmp_path, fmt):
    reqs = load_trace(_write(tmp_path, TRACES[fmt]), fmt)
    assert [dict(r.attrs) for r in reqs] == ATTRS
    assert reqs[1].attrs is NO_ATTRS  # a row without attributes: the shared empty mapping
    assert list(reqs[2].attrs) == list(ATTRS[2])  # in the row's order
    with pytest.raises(TypeError):
        reqs[0].attrs["priority"] = 3  # read-only


@pytest.mark.parametrize("timing", [False, True])
@pytest.mark.parametrize("fmt", sorted(TRACES))
def test_attributes_reach_the_strategy_the_engine_and_the_records(tmp_path, spy, fmt, timing):
    arrivals, records = Arrivals(), RequestRecorder()
    config = SimConfig(trace=_write(tmp_path, TRACES[fmt]), trace_format=fmt, mode="test-attrs-spy", workers=2,
                       timing=timing, capacity=64 if timing else None, **(LINEAR if timing else {}))
    run(config, recorders=[arrivals, records])
    assert [(i, dict(a)) for i, a in spy.seen] == list(enumerate(ATTRS))
    if timing:  # the engine requests carry them too; count-based runs have none
        assert {i: dict(a) for i, a in arrivals.attrs.items()} == dict(enumerate(ATTRS))
        assert arrivals.attrs[1] is NO_ATTRS
    recs = list(records.records())
    assert [r.get("attrs") for r in recs] == [ATTRS[0], None, ATTRS[2]]
    assert list(recs[0]) == [*KEYS, "attrs"] and list(recs[1]) == list(KEYS)  # last, and only when given


def test_requests_out_writes_the_attributes(tmp_path):
    out = tmp_path / "r.jsonl"
    res = CliRunner().invoke(main, ["sim", "--trace", _write(tmp_path, TOKEN_ROWS), "--timing", "--workers", "2",
                                    "--requests-out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    lines = out.read_text().splitlines()
    assert lines[0].endswith(', "rejected": false, "attrs": {"priority": 2, "tenant": "acme", "lora_name": "L1"}}')
    assert lines[1].endswith(', "rejected": false}')
    assert [json.loads(x).get("attrs") for x in lines] == [ATTRS[0], None, ATTRS[2]]


@pytest.mark.parametrize("fmt, field, value, words", [
    ("tokens", "priority", "high", "field 'priority' must be an integer, got 'high'"),
    ("tokens", "priority", 1.0, "field 'priority' must be an integer, got 1.0"),
    ("mooncake", "priority", True, "field 'priority' must be an integer, got True"),
    ("mooncake", "tenant", 3, "field 'tenant' must be a string, got 3"),
    ("tokens", "session_id", ["a"], "field 'session_id' must be a string, got ['a']"),
])
def test_a_wrong_typed_attribute_is_refused_with_its_line(tmp_path, fmt, field, value, words):
    rows = [dict(r) for r in TRACES[fmt]]
    rows[1][field] = value
    path = _write(tmp_path, rows)
    res = invoke("sim", "--trace", path, "--trace-format", fmt)
    assert res.exit_code == 1
    assert res.stderr == f"Error: {path}:2: {words}\n"


def test_attribute_fields_are_not_unused_and_null_is_absent(tmp_path):
    rows = [{**TOKEN_ROWS[0], "user": None, "session_id": "s"}, {**MOONCAKE_ROWS[0], "user": "u", "session_id": "s"}]
    for fmt, row in zip(("tokens", "mooncake"), rows):
        with warnings.catch_warnings():
            warnings.simplefilter("error", TraceWarning)
            (req,) = load_trace(_write(tmp_path, [row]), fmt)
        assert "user" in req.attrs or row["user"] is None
    # a field that is neither read nor an attribute still warns, naming what the format carries
    with pytest.warns(TraceWarning, match=r"tokens fields not used by dynlab: prio \(the format reads .*priority"):
        load_trace(_write(tmp_path, [{**TOKEN_ROWS[1], "prio": 1}]), "tokens")


# -- a trace without attributes: the same output, byte for byte, as before attributes --------------------------

PIN_ROWS = [{"timestamp": 0, "tokens": list(range(40)), "output_length": 3},
            {"timestamp": 5, "tokens": list(range(20)) + [99] * 20, "output_length": 2},
            {"timestamp": 30, "tokens": list(range(40)), "output_length": 4}]
PIN_TIMED = ["--timing", "--latency-model", "linear", "--latency-opt", "beta0=10", "--latency-opt", "beta1=1",
             "--latency-opt", "beta2=2", *terms_off_args("linear"), "--capacity", "64"]
_REC = ('{{"id": {}, "worker": 0, "arrival_ms": {}, "first_scheduled_ms": {}, "first_token_ms": {}, "finish_ms": {}, '
        '"input_length": 40, "output_length": {}, "hit_tokens": {}, "preemptions": 0, "rejected": false}}\n')
#: ``(sha256 of stdout, records)`` of main's code at 4b64f3e, count-based then timed (its default mode, kv: given)
PINS = [("ffa70a6af51f67ee6930f4e83810cf136a6a2134d82e6d68cc69afd03d9df716",
         "".join(_REC.format(i, *["null"] * 4, o, h) for i, o, h in ((0, 3, 0), (1, 2, 16), (2, 4, 32)))),
        ("13d82a4ebf4f942db738fc70b293361537c41f85e925bd1ed0b1e8e09170b624",
         _REC.format(0, "0.0", "0.0", "50.0", "110.0", 3, 0) + _REC.format(1, "5.0", "50.0", "94.0", "110.0", 2, 16)
         + _REC.format(2, "30.0", "50.0", "94.0", "134.0", 4, 32))]


def _cli_run(tmp_path, rows, args) -> tuple[str, str]:
    out = tmp_path / "r.jsonl"
    res = CliRunner().invoke(main, ["sim", "--trace", _write(tmp_path, rows), "--workers", "2", "--mode", "kv", *args,
                                    "--requests-out", str(out)])
    assert res.exit_code == 0, res.output
    return res.stdout, out.read_text()


@pytest.mark.parametrize("args, pin", list(zip(([], PIN_TIMED), PINS)))
def test_a_trace_without_attributes_runs_as_before(tmp_path, args, pin):
    stdout, records = _cli_run(tmp_path, PIN_ROWS, args)
    assert (hashlib.sha256(stdout.encode()).hexdigest(), records) == pin


_VALUES = {"priority": st.integers(-5, 5), "tenant": st.text("ab", max_size=2), "user": st.text("xy", max_size=2),
           "lora_name": st.none(), "session_id": st.sampled_from(["s1", "s2"])}
_ROW_ATTRS = st.fixed_dictionaries({}, optional=_VALUES)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(attrs=st.lists(_ROW_ATTRS, min_size=3, max_size=3), timed=st.booleans())
def test_attributes_change_nothing_but_the_records_attrs(tmp_path, attrs, timed):
    # lora_name is left out (None: absent): it keys block names, so it changes the hits, as it should
    rows = [{**r, **a} for r, a in zip(PIN_ROWS, attrs)]
    stdout, records = _cli_run(tmp_path, rows, PIN_TIMED if timed else [])
    recs = [json.loads(x) for x in records.splitlines()]
    given_attrs = [{k: v for k, v in a.items() if v is not None} for a in attrs]
    assert [r.pop("attrs", {}) for r in recs] == given_attrs
    pin_stdout, pin_records = PINS[timed]
    out = json.loads(stdout)
    by_tenant = out.pop("by_tenant", None)  # timed runs: the per-tenant figures are what tenants and users add
    assert (by_tenant is not None) == (timed and any(a.get("tenant") or a.get("user") for a in given_attrs))
    stdout = json.dumps(out) + "\n"
    assert hashlib.sha256(stdout.encode()).hexdigest() == pin_stdout
    assert "".join(json.dumps(r) + "\n" for r in recs) == pin_records


# -- a format plugin's own attributes; the formats read whole ------------------------------------------------

class DeadlineTrace(TraceFormat):
    """Test format: {"ids": [ints]} rows carrying their own attribute deadline_ms and tenant."""

    name = "test-deadline"
    fields = frozenset(("ids",))
    attributes = frozenset(("deadline_ms", "tenant"))

    @classmethod
    def detect(cls, record):
        return isinstance(record, dict) and "ids" in record

    def parse(self, record, index):
        return make_request(tuple(record["ids"]), 16 * len(record["ids"]), 0, None, index)


class _FormatPlugin:
    @hookimpl
    def dynlab_register_trace_formats(self, register):
        register(DeadlineTrace)


@pytest.fixture
def deadline_format():
    pm = plugins.get_plugin_manager()
    pm.register(_FormatPlugin(), name="test-deadline-plugin")
    try:
        yield
    finally:
        pm.unregister(name="test-deadline-plugin")


def test_a_format_plugin_declares_its_own_attributes(tmp_path, deadline_format):
    rows = [{"ids": [1], "deadline_ms": 250.5, "tenant": "t"}, {"ids": [1, 2]}]
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)  # declared attributes are not "not used"
        reqs = load_trace(_write(tmp_path, rows), "test-deadline")
    assert [dict(r.attrs) for r in reqs] == [{"deadline_ms": 250.5, "tenant": "t"}, {}]
    path = _write(tmp_path, [rows[1], {"ids": [1], "deadline_ms": [1]}])
    with pytest.raises(InputError, match=r"t\.jsonl:2: field 'deadline_ms' \(a request attribute\) must be a "
                                         r"string, a finite number or a boolean, got \[1\]"):
        load_trace(path, "test-deadline")
    path = _write(tmp_path, [{"ids": [1], "tenant": 5}])
    with pytest.raises(InputError, match=r"t\.jsonl:1: field 'tenant' must be a string, got 5"):
        load_trace(path, "test-deadline")  # a standard attribute keeps its type


def test_formats_read_whole_carry_session_ids():
    base = str(Path(__file__).parent / "data" / "traces") + "/"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)  # their files hold fields dynlab does not use
        moon = load_trace(base + "aiperf_mooncake.jsonl")
        burst = load_trace(base + "burstgpt_sessions.csv")
        turns = load_trace(base + "aiperf_multi_turn.jsonl")
        single = load_trace(base + "aiperf_single_turn.jsonl")
    assert {r.attrs.get("session_id") for r in moon} >= {"s1", "s2"}
    assert all(dict(r.attrs) == {"session_id": r.attrs["session_id"]} for r in moon)
    assert [r.attrs.get("session_id") for r in burst] == ["a", "b", "a"]
    assert {r.attrs["session_id"] for r in turns} == {"chat_1", "chat_2"}
    assert all(r.attrs is NO_ATTRS for r in single)


def test_a_workload_row_s_standard_attributes_reach_the_request(tmp_path):
    from dynlab.traces import workload_io

    class Rows:
        closed = follows = None

        def rows(self):
            yield {"timestamp": 0, "tokens": [1, 2], "output_length": 1, "tenant": "a", "priority": 1}
            yield {"timestamp": 1, "tokens": [1, 2], "output_length": 1}

    orig = workload_io.open_workload
    workload_io.open_workload = lambda path: Rows()
    try:
        reqs = workload_io.workload_requests("spec.json")
    finally:
        workload_io.open_workload = orig
    assert [dict(r.attrs) for r in reqs] == [{"tenant": "a", "priority": 1}, {}]
    assert reqs[1].attrs is NO_ATTRS and type(reqs[0].attrs) is MappingProxyType
