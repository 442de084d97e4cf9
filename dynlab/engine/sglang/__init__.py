"""SGLang as an engine kind (``--engine sglang``), along SGLang's own seams (sglang 0.5.23, the newest release
on PyPI when this was written; sources: ``python/sglang/srt/``):

- :mod:`~dynlab.engine.sglang.radix_cache`: ``mem_cache/radix_cache.py`` (the prefix cache, LRU leaf eviction);
- :mod:`~dynlab.engine.sglang.schedule_policy`: ``managers/schedule_policy.py`` (queue order, ``PrefillAdder``)
  and the new-token ratio (``managers/scheduler_components/new_token_ratio_tracker.py``);
- :mod:`~dynlab.engine.sglang.scheduler`: ``managers/scheduler.py`` (prefill or decode pass, retraction) and
  ``managers/schedule_batch.py`` (``retract_decode``, ``check_decode_mem``);
- :mod:`~dynlab.engine.sglang.worker`: the step interface the fleets drive;
- :mod:`~dynlab.engine.sglang.defaults`: the option defaults SGLang resolves (``arg_groups/``).

docs/engine.md ("SGLang") lists every rule with its source and what dynlab leaves out.
"""
