"""The GPU catalogue: datasheet figures of the GPUs a worker may run on.

Every figure is the vendor datasheet's, per GPU, **dense** (the datasheets quote Tensor-Core peaks
"with sparsity", doubled; those are halved here). Units: memory GB (read as GiB, see
:func:`dynlab.models.capacity.kv_blocks`), TFLOP/s (10^12 FLOP/s), bandwidth GB/s (10^9 B/s).
``link_gbps`` is the GPU-to-GPU bandwidth as the datasheet quotes it (NVLink: both directions
together, e.g. H100 SXM 900 GB/s = 450 GB/s each way; PCIe: the x16 slot, both directions; MI300X:
its seven Infinity Fabric links together). A peak the GPU lacks (FP8 on A100, FP4 before Blackwell)
is 0.

==============  ======  =====  =====  =====  ======  ===============  =====  ==============================================
name            memory  BF16   FP8    FP4    HBM     link             link   source (datasheet)
                GB      TF/s   TF/s   TF/s   GB/s                     GB/s
==============  ======  =====  =====  =====  ======  ===============  =====  ==============================================
h100            80      989    1979   0      3350    nvlink           900    NVIDIA H100 Tensor Core GPU datasheet, H100 SXM
h100-pcie       80      756    1513   0      2000    pcie             128    idem, H100 PCIe (PCIe Gen5 x16)
h100-nvl        94      835    1671   0      3900    nvlink           600    idem, H100 NVL (NVLink bridge, 2 GPUs)
h200            141     989    1979   0      4800    nvlink           900    NVIDIA H200 Tensor Core GPU datasheet, H200 SXM
a100-80gb       80      312    0      0      2039    nvlink           600    NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM
a100-40gb       40      312    0      0      1555    nvlink           600    idem, A100 40GB SXM
a100-80gb-pcie  80      312    0      0      1935    pcie             64     idem, A100 80GB PCIe (PCIe Gen4 x16)
a100-40gb-pcie  40      312    0      0      1555    pcie             64     idem, A100 40GB PCIe
b200            180     2250   4500   9000   8000    nvlink           1800   NVIDIA HGX B200 datasheet (1/8 of the board)
b300            288     2250   4500   13500  8000    nvlink           1800   NVIDIA HGX B300 datasheet (1/8 of the board)
gb200           186     2500   5000   10000  8000    nvlink           1800   NVIDIA GB200 NVL72 datasheet (1/72 of the rack)
l40s            48      362    733    0      864     pcie             64     NVIDIA L40S datasheet (PCIe Gen4 x16)
l4              24      121    242.5  0      300     pcie             64     NVIDIA L4 Tensor Core GPU datasheet
mi300x          192     1307   2615   0      5300    infinity-fabric  896    AMD Instinct MI300X data sheet (7 x 128 GB/s)
==============  ======  =====  =====  =====  ======  ===============  =====  ==============================================

Aliases (:data:`GPU_ALIASES`): ``a100`` is the A100 80GB SXM, ``h100-sxm``, ``h200-sxm``,
``a100-80gb-sxm``, ``a100-40gb-sxm`` name the SXM parts. Exact datasheet wording is in each entry's
``source``.

A GPU outside the catalogue is a JSON file of the same figures, named wherever a GPU is
(``--gpu my-gpu.json``; :func:`gpu_from_file`): its keys are :class:`GpuSpec`'s fields.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, fields
from functools import lru_cache

from dynlab.errors import InputFileError

GIB = 2**30
"""Bytes in one GiB: a datasheet's memory figure is read as GiB (see :func:`dynlab.models.capacity.kv_blocks`)."""

DEFAULT_GPU = "h100"


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's datasheet figures: memory (GB, read as GiB), dense bf16 TFLOP/s, HBM GB/s (10^9 B/s), and
    dense FP8 / FP4 TFLOP/s (0: none), the GPU-to-GPU link (``nvlink``, ``pcie``, ``infinity-fabric``) and
    its datasheet bandwidth in GB/s (both directions)."""

    name: str
    memory_gb: float
    bf16_tflops: float
    hbm_gbps: float
    source: str
    fp8_tflops: float = 0.0
    fp4_tflops: float = 0.0
    link: str = "pcie"
    link_gbps: float = 64.0

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * GIB)

    @property
    def link_gbps_each_way(self) -> float:
        """GB/s one direction of the link carries: half the datasheet's bidirectional figure."""
        return self.link_gbps / 2

    def as_dict(self) -> dict:
        return {"memory_gb": self.memory_gb, "bf16_tflops": self.bf16_tflops, "hbm_gbps": self.hbm_gbps,
                "source": self.source, "fp8_tflops": self.fp8_tflops, "fp4_tflops": self.fp4_tflops,
                "link": self.link, "link_gbps": self.link_gbps}


_H100 = "NVIDIA H100 Tensor Core GPU datasheet"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet"

GPUS: dict[str, GpuSpec] = {g.name: g for g in (
    GpuSpec("h100", 80, 989.0, 3350.0, f"{_H100} (H100 SXM)", 1979.0, 0.0, "nvlink", 900.0),
    GpuSpec("h200", 141, 989.0, 4800.0, "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM)", 1979.0, 0.0, "nvlink", 900.0),
    GpuSpec("a100-80gb", 80, 312.0, 2039.0, f"{_A100} (A100 80GB SXM)", 0.0, 0.0, "nvlink", 600.0),
    GpuSpec("l40s", 48, 362.05, 864.0, "NVIDIA L40S datasheet", 733.0, 0.0, "pcie", 64.0),
    GpuSpec("b200", 180, 2250.0, 8000.0, "NVIDIA HGX B200 datasheet (per GPU: 1/8 of the 8-GPU board)",
            4500.0, 9000.0, "nvlink", 1800.0),
    GpuSpec("h100-pcie", 80, 756.0, 2000.0, f"{_H100} (H100 PCIe; PCIe Gen5 x16 128 GB/s)", 1513.0, 0.0, "pcie", 128.0),
    GpuSpec("h100-nvl", 94, 835.0, 3900.0, f"{_H100} (H100 NVL; NVLink bridge 600 GB/s)", 1671.0, 0.0, "nvlink", 600.0),
    GpuSpec("a100-40gb", 40, 312.0, 1555.0, f"{_A100} (A100 40GB SXM)", 0.0, 0.0, "nvlink", 600.0),
    GpuSpec("a100-80gb-pcie", 80, 312.0, 1935.0, f"{_A100} (A100 80GB PCIe; PCIe Gen4 x16 64 GB/s)", 0.0, 0.0, "pcie", 64.0),
    GpuSpec("a100-40gb-pcie", 40, 312.0, 1555.0, f"{_A100} (A100 40GB PCIe; PCIe Gen4 x16 64 GB/s)", 0.0, 0.0, "pcie", 64.0),
    GpuSpec("b300", 288, 2250.0, 8000.0, "NVIDIA HGX B300 datasheet (per GPU: 1/8 of the 8-GPU board; "
            "FP4 108 PFLOPS dense per board)", 4500.0, 13500.0, "nvlink", 1800.0),
    GpuSpec("gb200", 186, 2500.0, 8000.0, "NVIDIA GB200 NVL72 datasheet (per GPU: 1/72 of the rack; "
            "13.4 TB HBM3e, 576 TB/s)", 5000.0, 10000.0, "nvlink", 1800.0),
    GpuSpec("l4", 24, 121.0, 300.0, "NVIDIA L4 Tensor Core GPU datasheet", 242.5, 0.0, "pcie", 64.0),
    GpuSpec("mi300x", 192, 1307.4, 5300.0, "AMD Instinct MI300X accelerator data sheet (7 Infinity Fabric "
            "links of 128 GB/s)", 2614.9, 0.0, "infinity-fabric", 896.0),
)}

GPU_ALIASES = {"a100": "a100-80gb", "a100-80gb-sxm": "a100-80gb", "a100-40gb-sxm": "a100-40gb",
               "h100-sxm": "h100", "h200-sxm": "h200"}
"""Other names of catalogue GPUs (``--gpu a100`` is the A100 80GB SXM)."""


#: the links a GPU file may name (the catalogue's)
LINKS = ("nvlink", "pcie", "infinity-fabric")
#: a GPU file's keys that may be left out (their :class:`GpuSpec` defaults; ``name``: the file's stem)
OPTIONAL_GPU_KEYS = ("name", "fp8_tflops", "fp4_tflops", "link", "link_gbps")


def gpu_spec(name: str) -> GpuSpec:
    """The catalogue entry ``name`` (or an alias of it), or the GPU file ``name`` when it ends in ``.json``
    (:func:`gpu_from_file`); ``ValueError`` listing the known GPUs otherwise."""
    if isinstance(name, str) and name.endswith(".json"):
        return gpu_from_file(name)
    try:
        return GPUS[GPU_ALIASES.get(name, name)]
    except (KeyError, TypeError):
        raise ValueError(f"unknown GPU {name!r}; known GPUs: {', '.join(GPUS)}") from None


@lru_cache(maxsize=64)
def gpu_from_file(path: str) -> GpuSpec:
    """The GPU described by the JSON object in ``path``: :class:`GpuSpec`'s fields by name (``memory_gb``,
    ``bf16_tflops``, ``hbm_gbps`` and ``source`` required; ``fp8_tflops``/``fp4_tflops`` TFLOP/s, 0 for
    none; ``link`` one of :data:`LINKS` and ``link_gbps`` both directions, GB/s; ``name`` defaults to the
    file's stem). Figures are the datasheet's dense peaks, as the catalogue's (module docstring).

    Raises :class:`~dynlab.errors.InputFileError` for a file that cannot be opened and ``ValueError``
    (``PATH: why``, ``PATH:LINE: not JSON`` for bad JSON) for an unknown or missing key or a bad value.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(path, getattr(exc, "strerror", None) or str(exc)) from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    except _Duplicate as exc:
        raise ValueError(f"{path}: key {exc.args[0]!r} is given twice") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a GPU file holds one JSON object (GpuSpec's fields), got {type(data).__name__}")
    keys = [f.name for f in fields(GpuSpec)]
    for key in data:
        if key not in keys:
            raise ValueError(f"{path}: unknown key {key!r} (a GPU file's keys: {', '.join(keys)})")
    for key in keys:
        if key not in data and key not in OPTIONAL_GPU_KEYS:
            raise ValueError(f"{path}: missing key {key!r}")
    return GpuSpec(**{"name": os.path.splitext(os.path.basename(path))[0], **_checked(path, data)})


class _Duplicate(Exception):
    pass


def _no_duplicates(pairs: list) -> dict:
    """A JSON object's pairs as a dict; :class:`_Duplicate` (naming it) for a key given twice."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def _checked(path: str, data: dict) -> dict:
    """:func:`gpu_from_file`'s values, each checked (``ValueError`` naming the key)."""
    for key in ("name", "source", "link"):
        if key in data and not (isinstance(data[key], str) and data[key].strip()):
            raise ValueError(f"{path}: key {key!r} must be a non-empty string, got {data[key]!r}")
    if data.get("link", LINKS[0]) not in LINKS:
        raise ValueError(f"{path}: key 'link' must be one of {', '.join(LINKS)}, got {data['link']!r}")
    for key in ("memory_gb", "bf16_tflops", "hbm_gbps", "link_gbps", "fp8_tflops", "fp4_tflops"):
        v = data.get(key)
        if v is None and key not in ("memory_gb", "bf16_tflops", "hbm_gbps"):
            continue
        least = 0.0 if key.startswith("fp") else None  # a peak the GPU lacks is 0; the rest must be > 0
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or \
                (v < least if least is not None else v <= 0):
            bound = ">= 0" if least is not None else "> 0"
            raise ValueError(f"{path}: key {key!r} must be a finite number {bound}, got {v!r}")
    return {k: (float(v) if k not in ("name", "source", "link") else v) for k, v in data.items()}
