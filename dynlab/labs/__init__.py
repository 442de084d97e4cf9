"""The two labs dynlab reproduces, and the tools built for them.

- :mod:`~dynlab.labs.scenario`: lab 002's document scenarios and capacity cliffs over GPU/CPU KV tiers;
- :mod:`~dynlab.labs.summarize`: summaries of measured JSON-lines files (disaggregated serving, offload);
- :mod:`~dynlab.labs.reproduce`: every artifact of both labs in one run, with a report;
- :mod:`~dynlab.labs.lab_inputs`: the labs' inputs and the figures lab 000 quotes from its measurements;
- :mod:`~dynlab.labs.report_lab000`, :mod:`~dynlab.labs.report_lab002`, :mod:`~dynlab.labs.report_words`: the
  report's sentences, per lab, and its wording of numbers;
- :mod:`~dynlab.labs.report_plots`: the report's plots (matplotlib, imported only when drawing).

Nothing is re-exported here: ``reproduce`` pulls in the whole engine, and the CLI imports each module itself.
"""
