"""Calibrating dynlab against measured benchmark runs: :mod:`dynlab.calibrate.formats` reads the result
files that vllm bench serve, NVIDIA aiperf and guidellm write (and a plain points CSV/JSON) into
:class:`~dynlab.calibrate.formats.MeasuredPoint` records, one per measured run."""
