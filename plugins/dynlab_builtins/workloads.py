"""The built-in workload generator ``synthetic``: seeded arrivals, lengths, prefix groups and sessions.

Spec keys (docs/workloads.md has the full table; rates in requests/s, lengths in tokens, times in s):

- ``seed`` (int, default 0), ``requests`` (int >= 1, required: requests generated, turns included);
- ``arrival``: ``{"process": "poisson"|"gamma"|"constant"|"piecewise", "rate": R}``; ``gamma`` takes
  ``burstiness`` (the shape of the gamma gaps, vLLM's ``benchmark_serving --burstiness``: 1 is
  Poisson, below 1 burstier, above 1 steadier); ``piecewise`` takes ``curve``: ``[[t_s, rate], ...]``,
  the rate from each ``t_s`` to the next (a Poisson process of that rate; the last rate holds on);
  ``{"process": "closed", "concurrency": C, "think_time_s": T}``: no rate, ``C`` users who each send
  the next request ``T`` s (default 0) after their previous answer (``dynlab sim --concurrency C
  --think-time-ms 1000T``: the timed run takes them from the spec, :attr:`SyntheticWorkload.closed`);
  its rows carry timestamp 0;
- ``input`` / ``output``: a length distribution: ``{"dist": "lognormal", "mean": M, "sigma": S}``
  (``mean`` is the distribution's MEAN, not its median: ``mu = ln(M) - S^2/2``, median
  ``M * exp(-S^2/2)``), ``{"dist": "uniform", "min": A, "max": B}`` (integers, both included),
  ``{"dist": "constant", "value": N}``, ``{"dist": "empirical", "trace": T}`` (the input or output
  lengths of a trace, drawn uniformly, a relative path read from the spec's folder; or ``"values": [...]``); lognormal draws are rounded, clamped to
  ``min`` (default 1) and ``max`` (optional);
- ``prefix``: shared system prompts: ``{"groups": G, "length": L, "popularity": "zipf"|"uniform"|[weights],
  "zipf_s": 1.0, "share": 1.0}``: a session gets one of G prompts of L tokens (group g weighs
  ``1/(g+1)^zipf_s`` under zipf) with probability ``share``, prepended to its prompts;
- ``sessions``: ``{"turns": N or a distribution, "think_time_s": T, "closed": false}``: each session's
  turns arrive ``T`` s apart on average (exponential; open loop: after the previous turn's arrival, not
  its answer); with ``"closed": true`` each later turn is sent exactly ``T`` s after the previous
  turn's last token (the timed run holds it: :attr:`SyntheticWorkload.follows`; its row carries the
  previous turn's timestamp); turn k's prompt is turn k-1's prompt, its answer (``output_length`` new tokens) and
  ``input`` new tokens, so turns of a session share their leading blocks. Rows of a spec with ``sessions``
  give their answer's token ids (``output_tokens``), so a turn's next turn hits the answer's blocks
  (:mod:`dynlab.traces.replies`), as vLLM's prefix cache does.

- ``adapters``: LoRA adapters (``dynlab sim --max-loras``): ``{"count": N, "popularity": "zipf"|"uniform"|[weights],
  "zipf_s": 1.0, "share": 1.0, "name": "lora-"}``: a session (a request without sessions) names adapter
  ``lora-k`` (k in 0..N-1, drawn by popularity as ``prefix``'s groups) with probability ``share``, in its rows'
  ``lora_name`` (vLLM's ``LoRARequest.lora_name``); the others run on the base model.

- ``classes``: a mix instead of top-level ``requests``: ``[{"class": NAME, "requests": N, "priority", "tenant",
  "user", "lora_name", and any of the traffic keys above}]``: each class a workload of its own (the top level's
  traffic keys, its own over them; RNGs seeded by the seed and its name), its rows carrying ``class`` and the
  attributes it gives, merged in time order, token ids apart; open loop only.

Each aspect draws from its own RNG (``random.Random(f"{seed}-arrival")``, ``-input``, ``-output``,
``-prefix``, ``-sessions``, ``-adapters``), so changing one key leaves the others' draws as they were.
"""
from __future__ import annotations

import math
import random

from dynlab import hookimpl
from dynlab.limits import MAX_PROMPT_TOKENS, MAX_SEED_REQUESTS
from dynlab.traces.workload import SpecError, Workload

_KEYS = ("generator", "seed", "requests", "arrival", "input", "output", "prefix", "sessions", "adapters", "classes")
#: what a class of ``classes`` may give: its name, its requests, their attributes, its own traffic keys
_CLASS_KEYS = ("class", "requests", "priority", "tenant", "user", "lora_name", "arrival", "input", "output", "prefix",
               "sessions", "adapters")
_TRAFFIC = ("arrival", "input", "output", "prefix", "sessions", "adapters")
_PROCESSES = ("poisson", "gamma", "constant", "piecewise", "closed")
_DISTS = ("lognormal", "uniform", "constant", "empirical")


class _Reader:
    """Typed reads of one spec table, each error naming its dotted key."""

    def __init__(self, workload: Workload, table, path: str, allowed: tuple):
        self.w, self.path = workload, path
        if not isinstance(table, dict):
            raise workload.fail(path, f"must be an object, got {table!r}")
        for key in table:
            if key not in allowed:
                raise workload.fail(self.key(key), f"unknown key (keys: {', '.join(allowed)})")
        self.table = table

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def number(self, name: str, default=None, minimum: float = 0.0, open_min: bool = True, integer: bool = False):
        if name not in self.table:
            if default is None:
                raise self.w.fail(self.key(name), "missing")
            return default
        v = self.table[name]
        ok = (type(v) is int) if integer else (isinstance(v, (int, float)) and not isinstance(v, bool)
                                               and math.isfinite(v))
        if not ok or (v <= minimum if open_min else v < minimum):
            kind = "an integer" if integer else "a finite number"
            raise self.w.fail(self.key(name), f"must be {kind} {'>' if open_min else '>='} {minimum:g}, got {v!r}")
        return v


class Lengths:
    """A token-length distribution of a spec table (``input`` or ``output``); :meth:`draw` an int."""

    def __init__(self, workload: Workload, table, path: str, minimum: int):
        dist = table.get("dist") if isinstance(table, dict) else None
        if dist not in _DISTS:
            raise workload.fail(f"{path}.dist", f"must be one of {', '.join(_DISTS)}, got {dist!r}")
        allowed = {"lognormal": ("dist", "mean", "sigma", "min", "max"), "uniform": ("dist", "min", "max"),
                   "constant": ("dist", "value"), "empirical": ("dist", "trace", "values")}[dist]
        r = _Reader(workload, table, path, allowed)
        self.dist = dist
        if dist == "lognormal":
            mean, self.sigma = r.number("mean"), r.number("sigma", 0.0, open_min=False)
            self.mu = math.log(mean) - self.sigma ** 2 / 2  # so that E[X] = mean
            self.lo = r.number("min", minimum, minimum, False, True)
            self.hi = r.number("max", math.inf, self.lo, False, True) if "max" in table else math.inf
        elif dist == "uniform":
            self.lo = r.number("min", None, minimum, False, True)
            self.hi = r.number("max", None, self.lo, False, True)
        elif dist == "constant":
            self.lo = self.hi = r.number("value", None, minimum, False, True)
        else:
            self.values = _empirical(workload, r, path, minimum)

    def draw(self, rng: random.Random) -> int:
        if self.dist == "lognormal":
            return int(min(self.hi, max(self.lo, round(rng.lognormvariate(self.mu, self.sigma)))))
        if self.dist == "empirical":
            return rng.choice(self.values)
        return rng.randint(self.lo, self.hi)


def _empirical(workload: Workload, r: _Reader, path: str, minimum: int) -> list:
    """The values of an empirical distribution: ``values``, or a trace's input (output) lengths."""
    if ("values" in r.table) == ("trace" in r.table):
        raise workload.fail(path, "an empirical distribution takes one of 'values' or 'trace'")
    if "values" in r.table:
        vals = r.table["values"]
        if not isinstance(vals, list) or not vals or any(type(v) is not int or v < minimum for v in vals):
            raise workload.fail(f"{path}.values", f"must be a non-empty list of integers >= {minimum}")
        return list(vals)
    from dynlab.traces.reader import load_trace

    trace = r.table["trace"]
    if not isinstance(trace, str):
        raise workload.fail(f"{path}.trace", f"must be a trace name or path, got {trace!r}")
    field = "output_length" if path == "output" else "input_length"
    return [max(minimum, getattr(q, field)) for q in load_trace(workload.resolve(trace))]  # refuses an empty one


def _gaps(workload: Workload, table, rng: random.Random):
    """Arrival times (ms) of the spec's ``arrival`` table, an endless iterator."""
    process = table.get("process") if isinstance(table, dict) else None
    if process not in _PROCESSES:
        raise workload.fail("arrival.process", f"must be one of {', '.join(_PROCESSES)}, got {process!r}")
    if process == "piecewise":
        curve = _curve(workload, _Reader(workload, table, "arrival", ("process", "curve")))
        return _piecewise(curve, rng)
    if process == "closed":
        r = _Reader(workload, table, "arrival", ("process", "concurrency", "think_time_s"))
        workload.closed = (r.number("concurrency", integer=True), r.number("think_time_s", 0.0, 0.0, False) * 1000.0)
        return iter(lambda: 0.0, None)
    allowed = ("process", "rate", "burstiness") if process == "gamma" else ("process", "rate")
    r = _Reader(workload, table, "arrival", allowed)
    rate = r.number("rate")
    shape = r.number("burstiness", 1.0) if process == "gamma" else 1.0

    def times():
        t = 0.0
        while True:
            if process == "poisson":
                t += rng.expovariate(rate) * 1000.0
            elif process == "gamma":
                t += rng.gammavariate(shape, 1.0 / (rate * shape)) * 1000.0
            else:
                t += 1000.0 / rate
            yield t
    return times()


def _curve(workload: Workload, r: _Reader) -> list:
    curve = r.table.get("curve")
    if not isinstance(curve, list) or not curve:
        raise workload.fail("arrival.curve", "must be a non-empty list of [time_s, rate] pairs")
    out, last = [], -1.0
    for i, pt in enumerate(curve):
        ok = isinstance(pt, list) and len(pt) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 for v in pt)
        if not ok or pt[0] <= last or (i == 0 and pt[0] != 0):
            raise workload.fail(f"arrival.curve[{i}]", "must be [time_s >= 0, rate >= 0], starting at time 0, "
                                f"times increasing; got {pt!r}")
        out.append((pt[0] * 1000.0, pt[1] / 1000.0))  # ms, requests per ms
        last = pt[0]
    if out[-1][1] <= 0:
        raise workload.fail(f"arrival.curve[{len(out) - 1}]", "the last rate must be > 0 (it holds on)")
    return out


def _piecewise(curve: list, rng: random.Random):
    """A Poisson process of a piecewise-constant rate: unit-rate exponential steps of the cumulative rate."""
    t, seg = 0.0, 0
    while True:
        need = rng.expovariate(1.0)
        while True:
            start, rate = curve[seg]
            end = curve[seg + 1][0] if seg + 1 < len(curve) else math.inf
            t = max(t, start)
            if rate > 0 and need <= rate * (end - t):
                t += need / rate
                break
            need -= rate * (end - t)
            seg += 1
        yield t


class SyntheticWorkload(Workload):
    """Seeded synthetic traffic: Poisson/gamma/constant/piecewise arrivals, length distributions, prefix groups, sessions."""

    name = "synthetic"

    def __init__(self, spec: dict, source: str = "<spec>"):
        super().__init__(spec, source)
        top = _Reader(self, spec, "", _KEYS)
        self.seed = spec.get("seed", 0)
        if type(self.seed) is not int:
            raise self.fail("seed", f"must be an integer, got {self.seed!r}")
        self.token_base = 1  # the first token id its rows use (a class of a mix: after the classes before it)
        self.classes = _classes(self, spec) if "classes" in spec else None
        if self.classes is not None:
            self.requests = sum(c.requests for c, _ in self.classes)
            if self.requests > MAX_SEED_REQUESTS:
                raise self.fail("classes", f"at most {MAX_SEED_REQUESTS:,} requests in all (docs/limits.md), "
                                f"got {self.requests:,}")
            return
        self.requests = top.number("requests", integer=True)
        if self.requests > MAX_SEED_REQUESTS:
            raise self.fail("requests", f"at most {MAX_SEED_REQUESTS:,} (docs/limits.md), got {self.requests:,}")
        if "arrival" not in spec:
            raise self.fail("arrival", "missing (for example {\"process\": \"poisson\", \"rate\": 5})")
        _gaps(self, spec["arrival"], random.Random(0))  # checks the table now
        for key in ("input", "output"):
            if key not in spec:
                raise self.fail(key, "missing (for example {\"dist\": \"uniform\", \"min\": 20, \"max\": 200})")
        self.input = Lengths(self, spec["input"], "input", 1)
        self.output = Lengths(self, spec["output"], "output", 0)
        self._prefix(spec.get("prefix"))
        self._sessions(spec.get("sessions"))
        self._adapters(spec.get("adapters"))

    def _rng(self, aspect: str) -> random.Random:
        return random.Random(f"{self.seed}-{aspect}")

    def _prefix(self, table) -> None:
        self.groups, self.weights, self.share, self.plen = 0, [], 0.0, 0
        if table is None:
            return
        r = _Reader(self, table, "prefix", ("groups", "length", "popularity", "zipf_s", "share"))
        self.groups = r.number("groups", integer=True)
        self.plen = r.number("length", integer=True)
        self.share = r.number("share", 1.0, 0.0, False)
        if self.share > 1:
            raise self.fail("prefix.share", f"must be a probability in [0, 1], got {self.share!r}")
        self.weights = self._popularity(r, table, "prefix", self.groups)
        if self.groups * self.plen > MAX_PROMPT_TOKENS:
            raise self.fail("prefix", f"groups x length is over {MAX_PROMPT_TOKENS:,} tokens")

    def _popularity(self, r: "_Reader", table, path: str, n: int) -> list:
        """The weights of ``n`` items under ``table``'s ``popularity`` (``zipf``: item g weighs ``1/(g+1)^zipf_s``;
        ``uniform``; or a list of ``n`` weights >= 0)."""
        pop = table.get("popularity", "zipf")
        if pop == "zipf":
            s = r.number("zipf_s", 1.0, 0.0, False)
            return [1.0 / (g + 1) ** s for g in range(n)]
        if pop == "uniform":
            return [1.0] * n
        if isinstance(pop, list) and len(pop) == n and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in pop) and sum(pop) > 0:
            return [float(v) for v in pop]
        raise self.fail(f"{path}.popularity", f"must be zipf, uniform or a list of {n} weights >= 0, got {pop!r}")

    def _adapters(self, table) -> None:
        """``adapters``: ``{"count": N, "popularity": ..., "zipf_s": 1.0, "share": 1.0, "name": "lora-"}``: a
        session (each request without sessions) names adapter ``NAME + k`` (k in 0..N-1, drawn by popularity from
        its own RNG, ``-adapters``) with probability ``share``, in its rows' ``lora_name``."""
        self.adapter_names, self.adapter_weights, self.adapter_share = [], [], 0.0
        if table is None:
            return
        r = _Reader(self, table, "adapters", ("count", "popularity", "zipf_s", "share", "name"))
        count = r.number("count", integer=True)
        self.adapter_share = r.number("share", 1.0, 0.0, False)
        if self.adapter_share > 1:
            raise self.fail("adapters.share", f"must be a probability in [0, 1], got {self.adapter_share!r}")
        name = table.get("name", "lora-")
        if not isinstance(name, str) or not name:
            raise self.fail("adapters.name", f"must be a non-empty string, got {name!r}")
        self.adapter_weights = self._popularity(r, table, "adapters", count)
        self.adapter_names = [f"{name}{k}" for k in range(count)]

    def _adapter(self, rng: random.Random):
        """A session's adapter name (``None``: the base model), drawn from ``rng``."""
        if not self.adapter_names or (self.adapter_share < 1 and rng.random() >= self.adapter_share):
            return None
        return rng.choices(self.adapter_names, self.adapter_weights)[0]

    def _sessions(self, table) -> None:
        self.turns, self.think_ms, self.closed_turns = None, 0.0, False
        if table is None:
            return
        r = _Reader(self, table, "sessions", ("turns", "think_time_s", "closed"))
        self.closed_turns = table.get("closed", False)
        if not isinstance(self.closed_turns, bool):
            raise self.fail("sessions.closed", f"must be true or false, got {self.closed_turns!r}")
        if self.closed_turns and self.closed is not None:
            raise self.fail("sessions.closed", "closed turns need an open-loop arrival (the sessions' first turns)")
        turns = table.get("turns", 1)
        if type(turns) is int:
            if turns < 1:
                raise self.fail("sessions.turns", f"must be an integer >= 1 or a distribution, got {turns!r}")
            self.turns = Lengths(self, {"dist": "constant", "value": turns}, "sessions.turns", 1)
        else:
            self.turns = Lengths(self, turns, "sessions.turns", 1)
        self.think_ms = r.number("think_time_s", 0.0, 0.0, False) * 1000.0

    def rows(self):
        if self.classes is not None:
            yield from _mixed(self.classes)
            return
        # every call starts every RNG afresh: the same spec yields the same rows each time
        self.arrivals = _gaps(self, self.spec["arrival"], self._rng("arrival"))
        self.rng_prefix, self.rng_sessions = self._rng("prefix"), self._rng("sessions")
        rin, rout = self._rng("input"), self._rng("output")
        rlora = self._rng("adapters") if self.adapter_names else None
        next_token = self.token_base
        prompts = []
        for _ in range(self.groups):
            prompts.append(list(range(next_token, next_token + self.plen)))
            next_token += self.plen
        made, total_tokens, parents = [], 0, {}
        while len(made) < self.requests:
            t = next(self.arrivals)
            system = []
            if self.groups and (self.share >= 1 or self.rng_prefix.random() < self.share):
                system = prompts[self.rng_prefix.choices(range(self.groups), self.weights)[0]]
            turns = self.turns.draw(self.rng_sessions) if self.turns is not None else 1
            lora = self._adapter(rlora) if rlora is not None else None
            history = list(system)
            for k in range(min(turns, self.requests - len(made))):
                if k and self.closed_turns:  # sent think_time_s after the previous answer: the run times it
                    parents[len(made)] = len(made) - 1
                elif k:
                    t += self.rng_sessions.expovariate(1.0 / self.think_ms) if self.think_ms > 0 else 0.0
                user = self.input.draw(rin)
                prompt = history + list(range(next_token, next_token + user))
                next_token += user
                out = self.output.draw(rout)
                total_tokens += len(prompt)
                if total_tokens > MAX_PROMPT_TOKENS:
                    raise self.fail("requests", f"the workload's prompts add up to over {MAX_PROMPT_TOKENS:,} "
                                    "tokens: fewer requests, shorter inputs or fewer turns")
                answer = list(range(next_token, next_token + out))
                made.append((round(t, 3), len(made), prompt, out, answer, lora))
                history = prompt + answer  # the answer joins the history
                next_token += out
        self.token_end = next_token
        made.sort(key=lambda m: (m[0], m[1]))
        if self.closed_turns:  # row position of each later turn -> (its previous turn's, think time ms)
            where = {m[1]: i for i, m in enumerate(made)}
            self.follows = {where[c]: (where[p], self.think_ms) for c, p in parents.items()}
        replies = self.turns is not None  # sessions: each row says its answer's ids, which the next turn quotes
        for t, _, prompt, out, answer, lora in made:
            row = {"timestamp": t, "tokens": prompt, "output_length": out}
            if replies:  # each row says its answer's ids, which the next turn quotes
                row["output_tokens"] = answer
            if lora is not None:
                row["lora_name"] = lora
            yield row


def _classes(parent: SyntheticWorkload, spec: dict) -> list:
    """The classes of a mix (``classes``): ``[(SyntheticWorkload, attributes)]``, each class a workload of its
    own spec (the top level's traffic keys, its own over them; its ``requests``; its own RNGs, seeded by the
    spec's seed and its name) whose rows carry ``class`` and the attributes it gives."""
    classes = spec["classes"]
    if not isinstance(classes, list) or not classes:
        raise parent.fail("classes", f"must be a list of classes ({{\"class\": NAME, \"requests\": N, ...}}), "
                          f"got {classes!r}")
    if "requests" in spec:
        raise parent.fail("requests", "a mix of classes gives requests per class (classes[i].requests)")
    out, names = [], set()
    for i, table in enumerate(classes):
        path = f"classes[{i}]"
        r = _Reader(parent, table, path, _CLASS_KEYS)
        name = table.get("class")
        if not isinstance(name, str) or not name:
            raise parent.fail(f"{path}.class", f"must be a name (a non-empty string), got {name!r}")
        if name in names:
            raise parent.fail(f"{path}.class", f"class {name!r} is given twice")
        names.add(name)
        r.number("requests", integer=True)
        attrs = {"class": name}
        for key in ("priority", "tenant", "user", "lora_name"):
            if key in table:
                value = table[key]
                if (type(value) is not int) if key == "priority" else not isinstance(value, str):
                    kind = "an integer" if key == "priority" else "a string"
                    raise parent.fail(f"{path}.{key}", f"must be {kind}, got {value!r}")
                attrs[key] = value
        if "lora_name" in attrs and ("adapters" in table or "adapters" in spec):
            raise parent.fail(f"{path}.lora_name", "a class names one adapter (lora_name) or draws them (adapters), "
                              "not both")
        own = {k: v for k, v in spec.items() if k in _TRAFFIC}
        own.update({k: table[k] for k in _TRAFFIC if k in table})
        own["requests"] = table["requests"]
        try:
            child = SyntheticWorkload(own, parent.source)
        except SpecError as exc:  # named where the class's key (or the top level's it took) is
            raise parent.fail(f"{path}.{exc.key}" if exc.key else path, exc.message) from None
        if child.closed is not None or child.closed_turns:
            raise parent.fail(path, "a class of a mix arrives open loop (no closed arrival or closed sessions)")
        child.seed = f"{parent.seed}-{name}"
        out.append((child, attrs))
    return out


def _mixed(classes: list):
    """The rows of every class, in time order (a tie: the earlier class first, then its own order), each
    carrying its class's attributes; token ids apart (each class starts after the ids of the one before)."""
    merged, base = [], 1
    for k, (child, attrs) in enumerate(classes):
        child.token_base = base
        for i, row in enumerate(child.rows()):
            merged.append((row["timestamp"], k, i, {**row, **attrs}))
        base = child.token_end
    merged.sort(key=lambda m: m[:3])
    for *_, row in merged:
        yield row


@hookimpl
def dynlab_register_workloads(register):
    register(SyntheticWorkload)
