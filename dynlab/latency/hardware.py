"""The hardware and model catalogue as the latency models import it: re-exports of :mod:`dynlab.models`.

The GPU catalogue is :mod:`dynlab.models.gpus`, parameter counts :mod:`dynlab.models.params`, the
served model's shape :mod:`dynlab.models.spec` and the KV capacity rule :mod:`dynlab.models.capacity`;
this module keeps the names ``dynlab.latency.hardware.*`` working for earlier callers.
"""
from __future__ import annotations

from dynlab.models.capacity import kv_blocks  # noqa: F401
from dynlab.models.gpus import DEFAULT_GPU, GIB, GPUS, GpuSpec, gpu_spec  # noqa: F401
from dynlab.models.params import UnsupportedModelError, param_count  # noqa: F401
from dynlab.models.spec import (  # noqa: F401
    DEFAULT_MODEL, ModelSpec, model_names, model_spec, model_spec_from_config)
