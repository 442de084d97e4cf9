"""Disaggregated serving: KV bytes per token, the cost of moving the KV cache between GPUs, and model configs.

The transfer cost is :mod:`~dynlab.disagg.cost` (the model shapes it reads come from :mod:`dynlab.models`, below it).
"""
