"""The traces that ship inside the package: a name a ``--trace`` may give instead of a path.

A module of its own, importing nothing, so that both the trace reader and a workload spec (which
resolves the files it names) can tell a bundled name from a path.
"""

#: name -> (package resource under dynlab/data, number of requests). The Mooncake
#: conversation trace: kvcache-ai/Mooncake FAST25-release/traces, Apache-2.0.
BUILTIN_TRACES = {
    "mooncake-conversation": ("traces/mooncake_conversation.jsonl.gz", 12031),
}
