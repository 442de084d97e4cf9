"""Calibrating dynlab against measured benchmark runs: :mod:`dynlab.calibrate.formats` reads the result
files that vllm bench serve, NVIDIA aiperf and guidellm write (and a plain points CSV/JSON) into
:class:`~dynlab.calibrate.formats.MeasuredPoint` records, one per measured run (one module per format:
:mod:`~dynlab.calibrate.vllm_bench`, :mod:`~dynlab.calibrate.aiperf_export`, :mod:`~dynlab.calibrate.guidellm_json`,
:mod:`~dynlab.calibrate.points_table`; what they share: :mod:`~dynlab.calibrate.measured`)."""
