"""``dynlab plan``'s prices: --price per --gpu candidate, and ``--objective cost``'s (--price's over the bundled
table's, :mod:`dynlab.models.prices`), with usage errors in one line."""
from __future__ import annotations

import click

from dynlab.cli.common import parse_opts


def plan_prices(values, gpus: set, objective: str = "gpus") -> tuple:
    """``(prices, sources)``: --price's USD per GPU-hour per --gpu candidate (as written) and, with ``--objective
    cost``, every candidate's price (--price's over the bundled table's, :mod:`dynlab.models.prices`) and where each
    came from. Usage errors in one line: a bad item, a GPU not a candidate, some candidates priced and not others
    (objective gpus), a candidate with no price at all (objective cost)."""
    prices = {}
    for name, text in parse_opts(values, "--price").items():
        try:
            price = float(text)
        except ValueError:
            raise click.BadParameter(f"{name}={text}: not a number of USD per GPU-hour", param_hint="'--price'")
        if not (price >= 0 and price < float("inf")):
            raise click.BadParameter(f"{name}={text}: must be a finite number >= 0", param_hint="'--price'")
        name = candidate_named(name, gpus)
        if name not in gpus:
            raise click.BadParameter(f"{name} has no effect: it is not a --gpu candidate "
                                     f"({', '.join(sorted(gpus))})", param_hint="'--price'")
        prices[name] = price
    if objective == "cost":
        return table_prices(prices, gpus)
    missing = sorted(gpus - set(prices))
    if prices and missing:
        raise click.BadParameter(f"no price for {', '.join(missing)}: give one per --gpu candidate",
                                 param_hint="'--price'")
    return prices, {}


def candidate_named(name: str, gpus: set) -> str:
    """The --gpu candidate (as written) that ``name`` prices: itself, else the candidate whose catalogue name or GPU
    file's ``name`` it is (``h20`` for ``--gpu h20.json``, the name the price errors give); ``name`` when none."""
    if name in gpus:
        return name
    from dynlab.models.prices import gpu_name

    for gpu in gpus:
        try:
            if gpu_name(gpu) == name:
                return gpu
        except ValueError:
            continue
    return name


def table_prices(given: dict, gpus: set) -> tuple:
    """``--objective cost``'s prices: each candidate GPU's (--price's, else the bundled table's) and its source."""
    from dynlab.models.prices import gpu_name, price_of

    prices, sources = {}, {}
    for gpu in sorted(gpus):
        try:
            prices[gpu], sources[gpu] = price_of(gpu_name(gpu), {gpu_name(gpu): given[gpu]} if gpu in given else {})
        except ValueError as exc:
            raise click.UsageError(f"--objective cost: {exc}") from None
    return prices, sources
