"""The model and GPU catalogue: what latency/, disagg/ and the engine know of a served model and its GPUs.

Below every other part of dynlab (it imports only :mod:`dynlab.errors`):

- :mod:`~dynlab.models.config`: reading a Hugging Face ``config.json`` (field rules, files, bundled configs);
- :mod:`~dynlab.models.kv`: KV bytes per token;
- :mod:`~dynlab.models.params`: parameter counts;
- :mod:`~dynlab.models.spec`: :class:`~dynlab.models.spec.ModelSpec`, the served model;
- :mod:`~dynlab.models.gpus`: the GPU catalogue;
- :mod:`~dynlab.models.capacity`: KV blocks a worker holds beside its weights.
"""
