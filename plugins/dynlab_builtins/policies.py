"""Built-in policies (registered through the dynlab entry-point group)."""
