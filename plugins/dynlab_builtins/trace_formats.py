"""Built-in trace formats (``mooncake``, ``tokens``), registered through the dynlab entry-point group."""
from dynlab import hookimpl
from dynlab.traces import MooncakeTrace, TokenTrace


@hookimpl
def dynlab_register_trace_formats(register):
    register(MooncakeTrace)
    register(TokenTrace)
