"""The two labs dynlab reproduces, and the tools built for them.

- :mod:`~dynlab.labs.scenario`: lab 002's document scenarios and capacity cliffs over GPU/CPU KV tiers;
- :mod:`~dynlab.labs.summarize`: summaries of measured JSON-lines files (disaggregated serving, offload);
- :mod:`~dynlab.labs.reproduce`: every artifact of both labs in one run, with a report;
- :mod:`~dynlab.labs.report_plots`: the report's plots (matplotlib, imported only when drawing).

Nothing is re-exported here: ``reproduce`` pulls in the whole engine, and the CLI imports each module itself.
"""
