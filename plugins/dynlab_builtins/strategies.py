"""Built-in routing strategies (registered through the dynlab entry-point group)."""
