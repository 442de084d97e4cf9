"""Built-in trace_formats (registered through the dynlab entry-point group)."""
