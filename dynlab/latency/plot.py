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
    from matplotlib.ticker import LogFormatter, NullLocator

    # constrained layout keeps each panel's axis labels clear of its tick labels and of the other panel
    fig, (dec, pre) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    batches, prompts = set(), set()
    styles = ["-", "--", ":", "-."]
    for i, (name, row) in enumerate(grid["latency_models"].items()):
        for j, (ctx, by_batch) in enumerate(row["decode_ms"].items()):
            xs = [int(b) for b in by_batch]
            batches.update(xs)
            dec.plot(xs, list(by_batch.values()), marker="o", linestyle=styles[j % len(styles)],
                     color=f"C{i}", label=f"{name}, context {int(ctx):,}")
        xs = [int(t) for t in row["prefill_ms"]]
        prompts.update(xs)
        pre.plot(xs, list(row["prefill_ms"].values()), marker="o", color=f"C{i}", label=name)
    for ax, xlabel, title, xs in ((dec, "decode requests in the step", "decode step", batches),
                                  (pre, "prompt tokens (nothing cached)", "prefill step", prompts)):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        # ticks at the grid's own sizes and plain numbers (512, 2,048; 20, 100 ms), not 2^9 or 2x10^1
        ax.set_xticks(sorted(xs), [f"{x:,}" for x in sorted(xs)])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.4)))
        ax.set_xlabel(xlabel)
        ax.set_ylabel("step time (ms)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{grid['model']} on {grid['tp']} x {grid['gpu']}")
    save(fig, path)
