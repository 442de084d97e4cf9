"""GPU-hour prices and what a fleet's GPU-hours cost (issue 41 item 4).

A bundled, dated table of **on-demand list prices** in USD per GPU-hour, one row per catalogue GPU for which a
public list price was found (:data:`PRICES`); each row says the provider, the instance it is derived from (the
instance's hourly price divided by its GPUs), the region, the date it was read and the page read. A GPU without a
row (``h100-pcie``, ``b200``, ``b300``, ``gb200``, ``l40s``, ``l4``, ``mi300x``, ``a100-40gb-pcie``, a ``--gpu``
file's) has no price until ``--price GPU=USD`` gives one: a run that needs it says so in one line.

==============  ==========  ========  ==============================  ===========  ==========
GPU             USD/GPU-h   provider  instance (hourly / GPUs)        region       read
==============  ==========  ========  ==============================  ===========  ==========
h100            6.88        AWS       p5.48xlarge (55.04 / 8)         us-east-1    2026-11-09
a100-80gb       3.4309      AWS       p4de.24xlarge (27.44705 / 8)    us-east-1    2026-11-09
a100-40gb       2.7447      AWS       p4d.24xlarge (21.957642 / 8)    us-east-1    2026-11-09
a100-80gb-pcie  3.673       Azure     NC24ads_A100_v4 (3.673 / 1)     eastus       2026-11-09
h100-nvl        6.98        Azure     NC40ads_H100_v5 (6.98 / 1)      eastus       2026-11-09
h200            10.4365     GCP       a3-ultragpu-8g (per GPU)        us-central1  2026-10-13
==============  ==========  ========  ==============================  ===========  ==========

SOURCES: the AWS and Azure rows are the list prices transcribed, with the instance, region and retrieval date, in
the public data set ``datareceipts/data-receipts`` (``109-gpu-pricing/hyperscalers.json``, "retrieved":
"2026-11-09"); the GCP row is the Cloud Billing Catalog price of an a3-ultragpu-8g's share per GPU (vCPUs and
memory included) in the public data set ``tanod/cloud-gpu-list-prices`` (snapshot 2026-10-13). List prices move
(AWS cut P4 and P5 prices in June 2025); check them against the provider's page before relying on a figure, and
give your own with ``--price``.

The spot discount (``--spot-discount F``, the fraction off the on-demand price) is the user's assumption: no
provider's spot price is bundled, and the default is 0 (on demand).
"""
from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Optional

_AWS_AZURE = "https://raw.githubusercontent.com/datareceipts/data-receipts/main/109-gpu-pricing/hyperscalers.json"
_GCP = "https://huggingface.co/datasets/tanod/cloud-gpu-list-prices"


class Price(NamedTuple):
    """One GPU's on-demand list price: ``usd_per_gpu_hour`` (USD per GPU-hour), ``provider``, ``instance`` (how the
    figure is derived from it), ``region``, ``read`` (the date the price was read, ISO) and ``url`` (the page)."""

    usd_per_gpu_hour: float
    provider: str
    instance: str
    region: str
    read: str
    url: str

    def source(self) -> str:
        """Where the price came from, in one line: ``table: AWS p5.48xlarge / 8 GPUs, us-east-1, 2026-11-09, URL``."""
        return f"table: {self.provider} {self.instance}, {self.region}, {self.read}, {self.url}"


#: catalogue GPU name (:data:`dynlab.models.gpus.GPUS`) -> its on-demand list price (module docstring)
PRICES: dict[str, Price] = {
    "h100": Price(6.88, "AWS", "p5.48xlarge $55.04/h / 8 GPUs", "us-east-1", "2026-11-09", _AWS_AZURE),
    "a100-80gb": Price(3.4309, "AWS", "p4de.24xlarge $27.44705/h / 8 GPUs", "us-east-1", "2026-11-09", _AWS_AZURE),
    "a100-40gb": Price(2.7447, "AWS", "p4d.24xlarge $21.957642/h / 8 GPUs", "us-east-1", "2026-11-09", _AWS_AZURE),
    "a100-80gb-pcie": Price(3.673, "Azure", "Standard_NC24ads_A100_v4 $3.673/h / 1 GPU", "eastus", "2026-11-09",
                            _AWS_AZURE),
    "h100-nvl": Price(6.98, "Azure", "Standard_NC40ads_H100_v5 $6.98/h / 1 GPU", "eastus", "2026-11-09", _AWS_AZURE),
    "h200": Price(10.4365, "GCP", "a3-ultragpu-8g, its share per GPU", "us-central1", "2026-10-13", _GCP),
}

#: ``price_source`` of a price given on the command line
GIVEN = "--price"


#: the ``--price`` item that asks for the bundled table's prices alone (no override)
TABLE = "table"


def parse_prices(text: Optional[str], flag: str = "--price") -> dict[str, float]:
    """``"h100=2.5,h200=3"`` -> ``{"h100": 2.5, "h200": 3.0}`` (USD per GPU-hour; ``None`` or ``"table"`` (any
    case): ``{}``, the table's prices; an empty or blank text is refused). A catalogue alias is read as its GPU
    (``a100`` -> ``a100-80gb``). Raises
    ``ValueError`` (one line, naming ``flag``) for an item not ``GPU=USD``, a GPU priced twice or a price that is
    not a finite number >= 0. Other names are kept as given (:func:`check_names` checks them)."""
    from dynlab.models.gpus import GPU_ALIASES

    out: dict[str, float] = {}
    if text is not None and not text.replace(",", "").strip():
        raise ValueError(f"{flag} {text!r}: give table or GPU=USD (USD per GPU-hour), e.g. h100=2.5")
    for item in (text or "").split(","):
        name, sep, value = item.strip().partition("=")
        name = GPU_ALIASES.get(name.strip(), name.strip())
        if not item.strip() or item.strip().lower() == TABLE:  # TABLE as --help writes it
            continue
        if not sep or not name:
            raise ValueError(f"{flag} {item.strip()!r}: give GPU=USD (USD per GPU-hour), e.g. h100=2.5")
        try:
            usd = float(value)
        except ValueError:
            raise ValueError(f"{flag} {name}={value}: not a number of USD per GPU-hour") from None
        if not (usd >= 0 and math.isfinite(usd)):
            raise ValueError(f"{flag} {name}={value}: must be a finite number >= 0")
        if name in out:
            raise ValueError(f"{flag}: {name} is priced twice")
        out[name] = usd
    return out


def run_prices(text: Optional[str], run_gpus) -> dict[str, float]:
    """:func:`parse_prices` of ``text`` with a key that is one of the run's ``--gpu`` values (``run_gpus``; e.g. a GPU
    file ``h20.json``) read as that GPU's name (``h20``), as ``plan --price`` reads it."""
    out = {}
    for name, usd in parse_prices(text).items():
        key = gpu_name(name) if name in run_gpus else name
        if key in out:
            raise ValueError(f"--price: {key} is priced twice")
        out[key] = usd
    return out


def gpu_name(gpu: str) -> str:
    """The catalogue name of a ``--gpu`` value (an alias resolved; a GPU file's ``name``): the key of its price."""
    from dynlab.models.gpus import gpu_spec

    return gpu_spec(gpu).name


def check_names(given: Mapping[str, float], run_gpus: set) -> None:
    """``ValueError`` for a GPU in ``given`` that is neither a catalogue GPU nor one of ``run_gpus`` (a ``--gpu``
    file's name): ``unknown GPU 'x' in --price; known GPUs: ...``."""
    from dynlab.models.gpus import GPUS

    for name in given:
        if name not in GPUS and name not in run_gpus:
            raise ValueError(f"unknown GPU {name!r} in --price; known GPUs: {', '.join(sorted(set(GPUS) | run_gpus))}")


def check_discount(discount: float, flag: str = "--spot-discount") -> None:
    """``ValueError`` unless 0 <= ``discount`` < 1 (the fraction off the on-demand price)."""
    if not (0.0 <= discount < 1.0):
        raise ValueError(f"{flag} {discount!r}: must be a fraction 0 <= F < 1 off the on-demand price")


def price_of(gpu: str, given: Optional[Mapping[str, float]] = None) -> tuple[float, str]:
    """``(USD per GPU-hour, its source)`` of ``gpu`` (a catalogue name, or a ``--gpu`` file's ``name``): ``given``'s
    (``--price``) over the table's. Raises ``ValueError`` ``no price for GPU X: give --price X=USD``."""
    if given and gpu in given:
        return given[gpu], GIVEN
    if gpu in PRICES:
        return PRICES[gpu].usd_per_gpu_hour, PRICES[gpu].source()
    raise ValueError(f"no price for GPU {gpu}: give --price {gpu}=USD (USD per GPU-hour; the bundled table has "
                     f"{', '.join(PRICES)})")


def cost(gpu_hours: Mapping[str, float], given: Optional[Mapping[str, float]] = None, discount: float = 0.0) -> dict:
    """What ``gpu_hours`` (GPU name -> GPU-hours, one entry per GPU type of the fleet) cost:
    ``{"cost_usd": sum of gpu_hours x price x (1 - discount), "price_source": {gpu: source}}`` (``cost_usd``
    to 6 decimals, as ``gpu_hours``), with ``discount`` the fraction off on-demand (``--spot-discount``)
    and ``spot_discount`` in the keys when it is not 0. Prices: :func:`price_of`. Raises ``ValueError`` for a GPU
    without a price or a bad discount."""
    check_discount(discount)
    given = given or {}
    total, sources = 0.0, {}
    for gpu, hours in gpu_hours.items():
        usd, sources[gpu] = price_of(gpu, given)
        total += hours * usd * (1.0 - discount)
    out = {"cost_usd": round(total, 6), "price_source": sources}
    if discount:
        out["spot_discount"] = discount
    return out
