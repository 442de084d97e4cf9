"""Shared pieces of the SGLang engine tests: a hand-set linear step model and a minimal driver."""
from __future__ import annotations

from dynlab.engine.request import EngineRequest
from dynlab.latency.grid import build_latency_model, hardware_for
from dynlab.latency.overheads import SERVER_TERMS_OFF


def linear(beta0: float = 10.0, beta1: float = 0.01, beta2: float = 1.0):
    """dynlab's ``linear`` model with its server terms off: a step is ``beta0 + beta1 x prefill tokens + beta2 x
    decode requests`` ms."""
    opts = {**SERVER_TERMS_OFF.get("linear", {}), "beta0": beta0, "beta1": beta1, "beta2": beta2}
    return build_latency_model("linear", hardware_for("llama-3.1-8b", "h100", 1), opts)


def req(rid, n_in: int, n_out: int, names=None, block: int = 16, at: float = 0.0) -> EngineRequest:
    """A request with its own names (``rid * 1000 + i``) unless ``names`` is given."""
    if names is None:
        names = [rid * 1000 + i for i in range(n_in // block)]
    return EngineRequest(rid, at, n_in, n_out, list(names))


def serve(worker, arrivals, check=None) -> dict:
    """Drive ``worker`` as a fleet does (at a time: finish the step ending then, submit the arrivals then,
    start a step); ``arrivals``: ``[(time ms, request)]``. Returns ``{id: (first token ms, finish ms)}``;
    ``check(worker, result)`` runs after every step."""
    pending = sorted(arrivals, key=lambda a: a[0])
    i, now = 0, 0.0
    while True:
        end = worker.step_end
        nxt = pending[i][0] if i < len(pending) else None
        if end is None:
            if worker.idle:
                if nxt is None:
                    break
                now = nxt
        elif nxt is not None and nxt < end:  # an arrival during the step
            worker.submit(pending[i][1], nxt)
            i += 1
            continue
        else:
            now = end
            res = worker.finish_step()
            if check is not None:
                check(worker, res)
        while i < len(pending) and pending[i][0] <= now:
            worker.submit(pending[i][1], pending[i][0])
            i += 1
        if worker.step_end is None and not worker.idle and worker.start_step(now) is None:
            raise AssertionError("nothing to run although requests wait")
    return {r.id: (r.first_token_ms, r.finish_ms) for _, r in pending}
