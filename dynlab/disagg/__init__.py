"""Disaggregated serving: KV bytes per token, the cost of moving the KV cache between GPUs, and model configs.

Everything lives in :mod:`~dynlab.disagg.cost`; the bundled model configs are under ``dynlab/data/models``.
"""
