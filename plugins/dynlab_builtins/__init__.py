"""dynlab's built-in plugins: strategies, eviction policies and trace formats.

They are registered only through the ``dynlab`` entry-point group in
``pyproject.toml``, the same path a third-party plugin takes.
"""
