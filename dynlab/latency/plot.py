"""``dynlab latency --plot``: step time against batch size, one line per latency model (matplotlib)."""
from __future__ import annotations

from dynlab.plots import pyplot, save


def plot_latency_grid(grid: dict, path: str) -> None:
    """Two panels from :func:`dynlab.latency.grid.latency_grid`'s result, written atomically to ``path``.

    Left: decode step ms against the number of decodes (log-log), a line per model and context;
    right: prefill step ms against prompt tokens. Raises ``DynlabError`` without matplotlib or for
    a path that cannot be written.
    """
    plt = pyplot()
    fig, (dec, pre) = plt.subplots(1, 2, figsize=(11, 4))
    styles = ["-", "--", ":", "-."]
    for i, (name, row) in enumerate(grid["latency_models"].items()):
        for j, (ctx, by_batch) in enumerate(row["decode_ms"].items()):
            xs = [int(b) for b in by_batch]
            dec.plot(xs, list(by_batch.values()), marker="o", linestyle=styles[j % len(styles)],
                     color=f"C{i}", label=f"{name}, context {int(ctx):,}")
        xs = [int(t) for t in row["prefill_ms"]]
        pre.plot(xs, list(row["prefill_ms"].values()), marker="o", color=f"C{i}", label=name)
    for ax, xlabel, title in ((dec, "decode requests in the step", "decode step"),
                              (pre, "prompt tokens (nothing cached)", "prefill step")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("step time (ms)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{grid['model']} on {grid['tp']} x {grid['gpu']}")
    save(fig, path)
