"""Metrics recorders: every figure a run reports is computed here, from callbacks.

- :class:`RoutingMetrics` (``on_route``): requests per worker, repeats and hits, prompt and
  cached blocks, the ideal bound (one infinite cache), the strategy's prediction error.
- :class:`ServingMetrics` (``on_first_token``, ``on_finish``, ``on_reject``, ``on_step``):
  the timed engine's TTFT, TPOT, E2E, queue wait, throughput, preemptions, KV usage, goodput.
- :class:`TierRecorder`: the CPU tier's figures (``gpu_hit_blocks`` ... ``cpu_blocks``).

Every recorder but the routing one is a :class:`Recorder`: a fleet calls the hooks a recorder
overrides (:func:`hooks`), and :func:`fleet_result` merges each recorder's :meth:`Recorder.result`
into the run's JSON, in the order the recorders were given. A new metric is one new recorder.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence

from dynlab.routing.hashing import overlap
from dynlab.routing.strategy import request_class


def ratio(num: float, den: float, digits: int = 4) -> float:
    """``num / den`` rounded to ``digits`` (0.0 when ``den`` is 0)."""
    return round(num / den, digits) if den else 0.0


def stats(values: Sequence[float]) -> dict:
    """``{"p50", "p90", "p99", "mean"}`` of ``values`` (ms) rounded to 0.1 (inclusive-method quantiles).

    No samples (a run where every request was rejected, a P/D run with no transfer) give ``None`` for
    each (JSON ``null``), never 0: a figure nothing measured (issue 24). The result does not depend on
    the order of ``values`` (the quantiles sort them; the mean is :func:`statistics.fmean`, an exact sum)."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    if len(values) == 1:
        v = round(values[0], 1)
        return {"p50": v, "p90": v, "p99": v, "mean": v}
    import statistics  # here, not at the top: count-based runs never need it (start-up)

    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": round(q[49], 1), "p90": round(q[89], 1), "p99": round(q[98], 1),
            "mean": round(statistics.fmean(values), 1)}


def event_refusals(strategy) -> dict[str, int]:
    """``events_refused_block_size`` and ``events_refused_parent`` of a strategy that keeps an index
    (``{}`` for one that does not); warns when every stored event was refused for its block size
    (router and engines hash at different block sizes: every overlap is 0)."""
    refused = strategy.refused_events()
    if refused is None:
        return {}
    if refused["stored"] and refused["block_size"] == refused["stored"]:
        import warnings

        warnings.warn(f"strategy {strategy.name!r} refused every one of its {refused['stored']} stored "
                      f"KV events: their block size differs from the router's ({strategy.ctx.block} tokens)",
                      stacklevel=2)
    return {"events_refused_block_size": refused["block_size"], "events_refused_parent": refused["parent"]}


class Recorder:
    """A metric of a run: it observes a fleet through the hooks below and adds keys to the result.

    Every hook is optional (the base class's do nothing, and a fleet never calls a hook a recorder
    does not override: :func:`hooks`). Times in ms on the run's clock; ``req`` an
    :class:`~dynlab.engine.worker.EngineRequest` (its fields: ``id``, ``arrival_ms``, lengths,
    ``hit_tokens``, ``first_scheduled_ms``, ``first_token_ms``, ``finish_ms``, ``preemptions``, ``rejected``).

    - ``on_route(request, worker, predicted, actual, cap)``: the router's
      :class:`~dynlab.routing.strategy.Request` went to ``worker``; ``predicted`` the strategy's overlap
      (``None``: no index), ``actual`` the blocks the worker held, ``cap`` the most that can hit
      (``None``: every block; count-based runs). Called in count-based and timed runs.
    - ``on_arrival(req, t)``, ``on_reject(req)``, ``on_shed(req)`` (the gateway's admission policy shed it:
      :mod:`dynlab.engine.gateway`; after its ``on_arrival``), ``on_first_token(req, t)``, ``on_finish(req, t)``,
      ``on_step(worker, result)`` (a :class:`~dynlab.engine.worker.StepResult`; in a P/D fleet decode
      workers are numbered after the prefill workers): timed runs only. ``on_first_token`` is the
      engine computing the first token: in a P/D fleet the prefill worker's (the user's first token,
      after the transfer, is ``req.first_token_ms`` by ``on_finish``).
    - ``on_handoff(record)``: a P/D fleet handed a prefilled request to a decode worker
      (a :class:`~dynlab.disagg.fleet.TransferRecord`, filled in as the transfer proceeds).
    - ``on_run(info)``: a :class:`RunInfo`, once before the first request (the run layer calls it:
      :func:`dynlab.sim.run`; a fleet driven directly does not).
    - ``result(engines) -> dict``: the keys this recorder adds to the run's JSON (``engines``: the
      fleet's engine workers, prefill then decode; ``[]`` in count-based runs).
    """

    def on_run(self, info: "RunInfo") -> None:
        pass

    def on_route(self, request, worker: int, predicted: Optional[int], actual: int, cap: Optional[int]) -> None:
        pass

    def on_arrival(self, req, t: float) -> None:
        pass

    def on_reject(self, req) -> None:
        pass

    def on_shed(self, req) -> None:
        pass

    def on_first_token(self, req, t: float) -> None:
        pass

    def on_finish(self, req, t: float) -> None:
        pass

    def on_step(self, worker: int, result) -> None:
        pass

    def on_handoff(self, record) -> None:
        pass

    def result(self, engines: Sequence) -> dict[str, Any]:
        return {}


class RunInfo(NamedTuple):
    """A run: ``timed``, ``pd`` (P/D), ``block_tokens`` (of names routed), ``dp`` (ranks per worker: target ``w*dp+r``)."""

    timed: bool
    pd: bool
    block_tokens: int
    dp: int = 1


def hooks(recorders: Sequence[Recorder], name: str) -> list:
    """The bound ``name`` hooks of the ``recorders`` that override it (in order): what a fleet calls."""
    base = getattr(Recorder, name)
    return [getattr(r, name) for r in recorders if getattr(type(r), name, base) is not base]


def fleet_result(routing: "RoutingMetrics", counts: dict, strategy, recorders: Sequence[Recorder] = (),
                 engines: Sequence = ()) -> dict[str, Any]:
    """The fleet metrics of a run, every topology alike: :meth:`RoutingMetrics.result`, then ``counts``
    (``evicted_blocks``, ``events_published``, ``events_dropped``), the strategy's refused events
    (:func:`event_refusals`), :meth:`RoutingMetrics.balance`, then each recorder's
    :meth:`Recorder.result` of ``engines`` in order."""
    out = routing.result()
    out.update(counts)
    out.update(event_refusals(strategy))
    out.update(routing.balance())
    for recorder in recorders:
        out.update(recorder.result(engines))
    specs = [e.spec for e in engines if getattr(e, "spec", None) is not None]
    if specs:  # speculative decoding (dynlab.engine.spec): a P/D fleet's decode pool
        from dynlab.engine.spec import spec_metrics

        out.update(spec_metrics(specs))
    return out


class RoutingMetrics:
    """What the routing decisions achieved, per request at routing time.

    ``workers``: fleet size. ``on_route(hashes, w, predicted, actual, cap, prefix)``: the request's
    block names, the chosen worker, the strategy's predicted overlap (``None``: no index), the
    worker's actual overlap (leading blocks held at routing time), ``cap``: most leading blocks
    that can hit (``None``: all; the timed engine recomputes the last prompt token, so ``cap`` is
    ``(input_length - 1) // block`` and ``actual`` is at most ``cap``), ``prefix``: the synthetic
    workload's prefix id. ``predicted_blocks`` sums ``min(predicted, cap)`` and ``prediction_error``
    ``|min(predicted, cap) - actual|``: like with like with ``cached_blocks`` (the capped ``actual``s;
    issue 24: an exact index has error 0 and ``predicted_blocks == cached_blocks`` in timed runs too,
    where a router's overlap can count the prompt's last block, which the engine recomputes).

    On a trace (``synthetic_prefix_blocks`` is ``None``) a *repeat* is a request whose first block
    was seen before anywhere, and a *hit* a repeat whose worker holds that block. On the labs'
    synthetic workload (``synthetic_prefix_blocks``: whether a prefix spans at least one full block)
    a *repeat* is a request whose prefix id was seen before, and a *hit* a repeat sent to a worker
    that processed that prefix before and, if it spans a block, still holds its first block. The
    ideal bound is one infinite cache of every block seen.

    ``runs`` (optional, given on every call or on none): ``hashes`` as runs ``(first name, count)``
    of :func:`dynlab.engine.names.engine_block_runs` (names ``first .. first + count - 1``, runs with
    different first names disjoint, a trace block's names seen always its run's leading ones); the
    ideal bound then keeps ``first name -> names seen`` instead of every name: the same figures, one
    step per run instead of per block.
    """

    __slots__ = ("counts", "requests", "repeats", "hits", "prompt_blocks", "cached_blocks", "ideal_blocks",
                 "predicted_blocks", "prediction_error", "has_prediction", "_seen", "_prefixes", "_processed",
                 "_spans_block", "_seen_runs")

    def __init__(self, workers: int, synthetic_prefix_blocks: Optional[bool] = None):
        self.counts = [0] * workers
        self.requests = self.repeats = self.hits = 0
        self.prompt_blocks = self.cached_blocks = self.ideal_blocks = 0
        self.predicted_blocks = self.prediction_error = 0
        self.has_prediction = False
        self._seen: set = set()
        self._seen_runs: dict = {}  # with runs: first name of a run -> how many of its names were seen
        self._spans_block = bool(synthetic_prefix_blocks)
        self._prefixes: set = set()
        self._processed = None if synthetic_prefix_blocks is None else [set() for _ in range(workers)]

    def on_route(self, hashes: Sequence, w: int, predicted: Optional[int], actual: int,
                 cap: Optional[int] = None, prefix=None, runs: Optional[Sequence] = None) -> None:
        self.counts[w] += 1
        self.requests += 1
        seen = self._seen
        if predicted is not None:
            self.has_prediction = True
            # like with like: ``actual`` is capped at ``cap`` (the hit the engine can take), so is the prediction,
            # in the sum as in the error (an exact index: predicted_blocks == cached_blocks, timed runs too)
            if cap is not None and predicted > cap:
                predicted = cap
            self.predicted_blocks += predicted
            self.prediction_error += abs(predicted - actual)
        processed = self._processed
        if processed is not None:
            if prefix in self._prefixes:
                self.repeats += 1
                if prefix in processed[w] and (not self._spans_block or actual > 0):
                    self.hits += 1
            else:
                self._prefixes.add(prefix)
            processed[w].add(prefix)
        elif runs is not None:
            if runs and runs[0][0] in self._seen_runs:  # a run's first name seen: the run's entry is there
                self.repeats += 1
                if actual:
                    self.hits += 1
        elif hashes and hashes[0] in seen:
            self.repeats += 1
            if actual:
                self.hits += 1
        if runs is None:
            j = overlap(hashes, seen)
            seen.update(hashes[j:])
        else:
            j = self._seen_through(runs)
        self.ideal_blocks += j if cap is None or j <= cap else cap
        self.prompt_blocks += len(hashes)
        self.cached_blocks += actual if cap is None or actual <= cap else cap

    def saw_reply(self, names: Sequence) -> None:
        """The names of a routed request's reply blocks (a token trace's ``output_tokens``,
        ``Request.output_hashes``) join the ideal bound's cache, as its prompt's do: a later prompt
        quoting the reply can hit them."""
        self._seen.update(names)

    def _seen_through(self, runs: Sequence) -> int:
        """How many leading names of ``runs`` were seen (the ideal overlap); then mark them all seen."""
        seen = self._seen_runs
        get = seen.get
        j = 0
        for i, (first, c) in enumerate(runs):
            s = get(first, 0)
            if s < c:
                j += s
                seen[first] = c
                for first, c in runs[i + 1:]:
                    if get(first, 0) < c:
                        seen[first] = c
                return j
            j += c
        return j

    def result(self) -> dict[str, Any]:
        """The routing keys of ``dynlab sim``'s JSON, from ``requests`` to ``prediction_error``."""
        return {
            "requests": self.requests,
            "repeat_requests": self.repeats,
            "hits": self.hits,
            "hit_rate": ratio(self.hits, self.repeats),
            "prompt_blocks": self.prompt_blocks,
            "cached_blocks": self.cached_blocks,
            "block_hit_rate": ratio(self.cached_blocks, self.prompt_blocks),
            "ideal_block_hit_rate": ratio(self.ideal_blocks, self.prompt_blocks),
            "predicted_blocks": self.predicted_blocks if self.has_prediction else None,
            "prediction_error": self.prediction_error if self.has_prediction else None,
        }

    def balance(self) -> dict[str, Any]:
        """``requests_per_worker`` and ``load_imbalance`` (max ÷ mean requests per worker)."""
        counts = self.counts
        mean = self.requests / len(counts) if counts else 0.0
        return {"requests_per_worker": list(counts),
                "load_imbalance": round(max(counts) / mean, 4) if mean else 0.0}


def client_times(req, finish_ms: float, front_ms: float, token_ms: float) -> tuple[float, float]:
    """``(TTFT, E2E)`` in ms of a finished request as its client sees them: the engine's times plus the server's
    front end ``front_ms`` and ``token_ms`` of detokenisation per token that reached the client (one for the
    first token, ``output_length`` for the last; :mod:`dynlab.latency.overheads`)."""
    engine_ttft = req.first_token_ms - req.arrival_ms
    return (engine_ttft + front_ms + token_ms,
            finish_ms - req.arrival_ms + front_ms + token_ms * req.output_length)


def client_tpot(req, finish_ms: float, token_ms: float) -> Optional[float]:
    """TPOT (ms) as the client sees it: ``(finish - first token) / (output_length - 1)`` (vLLM's benchmark_serving)
    plus ``token_ms`` of detokenisation; ``None`` for a one-token request."""
    return (finish_ms - req.first_token_ms) / (req.output_length - 1) + token_ms if req.output_length > 1 else None


def meets(slo: tuple, ttft: float, tpot: Optional[float]) -> bool:
    """Whether ``ttft``, ``tpot`` (ms; ``None`` meets any) meet ``slo`` ``(TTFT ms, TPOT ms)`` (``None``: not asked)."""
    return (slo[0] is None or ttft <= slo[0]) and (slo[1] is None or tpot is None or tpot <= slo[1])


class ServingMetrics(Recorder):
    """The timed engine's figures, from per-request and per-step callbacks (times in ms).

    A request's times are its :class:`~dynlab.engine.worker.EngineRequest`'s, read at its finish:
    ``ttft_ms`` is ``first_token_ms - arrival_ms``, the user's first token (in a P/D fleet the decode
    worker's first token after the KV arrived: :mod:`dynlab.disagg.fleet`), ``tpot_ms``
    ``(finish - first token) / (output_length - 1)`` (vLLM's ``benchmark_serving`` definition, so a
    P/D transfer, which ends before the user's first token, is not in it), ``e2e_ms`` ``finish -
    arrival``, ``queue_wait_ms`` ``first_scheduled_ms - arrival_ms``. A distribution with no sample
    is ``null`` (:func:`stats`).

    ``front_ms`` (``--request-overhead-ms``): the server's front end before the engine sees a request (HTTP,
    tokenisation, the first stream chunk), added to every ``ttft_ms`` and ``e2e_ms``; ``token_ms``
    (``--detok-us-per-token`` / 1000): detokenisation and streaming per output token, added to each token's
    arrival at the client as BLIS does (:mod:`dynlab.latency.overheads`): ``ttft_ms`` gains one, ``tpot_ms``
    one, ``e2e_ms`` one per output token. The engine's own times (``queue_wait_ms``, ``makespan_s``, the
    ``--requests-out`` records) include neither.

    ``slo_ttft_ms`` / ``slo_tpot_ms``: when either is given, ``goodput`` is the share of ALL
    requests (rejected and shed ones included, as failures) whose TTFT and TPOT meet the SLOs given
    (DistServe's definition); a one-token request has no TPOT and meets any TPOT SLO. ``class_slos``
    (``{class: (ttft ms, tpot ms)}``, ``--slo``): a request of such a class meets its class's SLOs instead,
    and ``goodput`` is given even without run-wide SLOs.
    ``prefix_hit_rate``: prompt tokens hit at first admission over the prompt tokens of the requests
    admitted (a rejected request never reaches the cache: neither its hits nor its prompt count);
    ``None`` (JSON ``null``) when no request was admitted (every one rejected): no denominator, like a
    distribution with no sample (:func:`stats`), never 0.
    ``mean_kv_usage`` (per worker): blocks held by requests integrated over the run's span, first
    arrival to last finish of the whole fleet, idle time counting as what is held then (0 unless a
    P/D reservation or a CPU-tier load holds blocks), over ``capacity x span``;
    ``mean_kv_usage_busy``: the same over the worker's time in steps only (``busy_block_ms /
    (capacity x busy_ms)`` of :class:`~dynlab.engine.worker.EngineWorker`; 0.0 for a worker that never
    ran a step), what a usage gauge sampled at regular times while the engine runs averages to
    (vLLM exports only the instantaneous ``kv_cache_usage_perc``).

    ``warmup``: requests whose id is below it are left out of every figure (``--warmup``, as the
    benchmark clients' warm-up requests are); the span starts at the first measured arrival.
    """

    def __init__(self, slo_ttft_ms: Optional[float] = None, slo_tpot_ms: Optional[float] = None, warmup: int = 0,
                 front_ms: float = 0.0, token_ms: float = 0.0, class_slos: Optional[dict] = None):
        self.warmup, self.front_ms, self.token_ms = warmup, front_ms, token_ms
        self.class_slos = class_slos or None
        self.slo_ttft_ms = slo_ttft_ms
        self.slo_tpot_ms = slo_tpot_ms
        self.ttft: list = []
        self.tpot: list = []
        self.e2e: list = []
        self.wait: list = []
        self.good = 0
        self.total = 0
        self.rejected = 0
        self.failed = 0
        self.output_tokens = 0
        self.prompt_tokens = 0
        self.hit_tokens = 0
        self.first_arrival: Optional[float] = None
        self.last_finish = 0.0
        self.steps = 0

    def on_arrival(self, req, t: float) -> None:
        """A request (an :class:`~dynlab.engine.worker.EngineRequest`) arrived at ``t``."""
        if self.warmup and req.id < self.warmup:
            return
        if self.first_arrival is None:
            self.first_arrival = t
        self.total += not failed(req)  # a failed request (--keep-failed) is outside goodput
        self.prompt_tokens += req.input_length

    def on_reject(self, req) -> None:
        """``req`` (counted at its arrival) was refused: a failure for goodput, outside ``prefix_hit_rate``."""
        if self.warmup and req.id < self.warmup:
            return
        self.rejected += 1
        self.prompt_tokens -= req.input_length

    def on_shed(self, req) -> None:
        """``req`` (counted at its arrival) was shed at the gateway: a failure for goodput, never admitted."""
        if not (self.warmup and req.id < self.warmup):
            self.prompt_tokens -= req.input_length

    def on_finish(self, req, t: float) -> None:
        if self.warmup and req.id < self.warmup:
            return
        if t > self.last_finish:
            self.last_finish = t
        if failed(req):  # prefilled, its prompt looked up and cached, but no answer: no client figure
            self.failed += 1
            self.hit_tokens += req.hit_tokens or 0
            return
        token = self.token_ms
        ttft, e2e = client_times(req, t, self.front_ms, token)
        self.ttft.append(ttft)
        self.e2e.append(e2e)
        self.wait.append(req.first_scheduled_ms - req.arrival_ms)
        self.output_tokens += req.output_length
        self.hit_tokens += req.hit_tokens or 0
        tpot = client_tpot(req, t, token)
        if tpot is not None:
            self.tpot.append(tpot)
        slo = (self.slo_ttft_ms, self.slo_tpot_ms)
        if self.class_slos is not None:
            slo = self.class_slos.get(request_class(req.attrs), slo)
        if meets(slo, ttft, tpot):
            self.good += 1

    def on_step(self, worker: int, result) -> None:
        self.steps += result.steps

    def result(self, engines: Sequence) -> dict[str, Any]:
        """The timed keys of ``dynlab sim``'s JSON; ``engines``: the fleet's engine workers."""
        start = self.first_arrival or 0.0
        span_ms = max(self.last_finish - start, 0.0)
        out = {
            "ttft_ms": stats(self.ttft),
            "tpot_ms": stats(self.tpot),
            "e2e_ms": stats(self.e2e),
            "queue_wait_ms": stats(self.wait),
            "output_tokens_per_s": round(self.output_tokens / (span_ms / 1000.0), 1) if span_ms else 0.0,
            "makespan_s": round(span_ms / 1000.0, 3),
            "preemptions": sum(e.preemptions for e in engines),
            "rejected": self.rejected,
            **({"failed_requests": self.failed} if self.failed else {}),
            "engine_steps": self.steps,
            "prefix_hit_rate": ratio(self.hit_tokens, self.prompt_tokens) if self.prompt_tokens else None,
            "peak_kv_blocks": [e.peak_used_blocks for e in engines],
            "mean_kv_usage": kv_usage(engines, self.last_finish, span_ms),
            "mean_kv_usage_busy": kv_usage_busy(engines),
        }
        if self.slo_ttft_ms is not None or self.slo_tpot_ms is not None or self.class_slos:
            out["goodput"] = ratio(self.good, self.total)
        return out


def failed(req) -> bool:
    """Whether ``req`` is a failed request the trace recorded, replayed by ``--keep-failed`` (its attribute
    ``failed``, :attr:`dynlab.traces.format.TraceFormat.records_failed`): served, but with no answer."""
    return (getattr(req, "attrs", None) or {}).get("failed") is True


def kv_usage(engines: Sequence, until: float, span_ms: float) -> list:
    """Per engine, blocks held by requests integrated up to ``until`` (ms) over ``capacity x span_ms``
    (blocks x ms): ``mean_kv_usage``, the span mean (idle time included), rounded to 4 digits."""
    return [ratio(e.used_block_ms(until), e.capacity * span_ms) for e in engines]


def kv_usage_busy(engines: Sequence) -> list:
    """Per engine, blocks held by requests integrated over its steps only over ``capacity x`` its time
    in steps (``busy_block_ms`` / ``busy_ms``): ``mean_kv_usage_busy``, rounded to 4 digits (0.0: no step)."""
    return [ratio(e.busy_block_ms, e.capacity * e.busy_ms) for e in engines]
