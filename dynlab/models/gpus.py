"""The GPU catalogue: datasheet figures of the GPUs a worker may run on.

GPUs (:data:`GPUS`, one :class:`GpuSpec` each; dense = without 2:4 sparsity, which the datasheets
quote doubled):

=========  ======  ===============  ==========  ====================================================
name       memory  bf16 TFLOP/s     HBM GB/s    source
=========  ======  ===============  ==========  ====================================================
h100       80 GB   989 (dense)      3,350       NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column
                                                 (BF16 1,979 TFLOPS "with sparsity"; HBM3 3.35 TB/s)
h200       141 GB  989 (dense)      4,800       NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column
                                                 (BF16 1,979 TFLOPS with sparsity; HBM3e 4.8 TB/s)
a100-80gb  80 GB   312 (dense)      2,039       NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM
                                                 (BF16 312 / 624 sparse TFLOPS; HBM2e 2,039 GB/s)
l40s       48 GB   362 (dense)      864         NVIDIA L40S datasheet (BF16 362.05 / 733 sparse
                                                 TFLOPS; GDDR6 864 GB/s)
b200       180 GB  2,250 (dense)    8,000       NVIDIA HGX B200 datasheet (8 GPUs: FP16/BF16 36 PFLOPS
                                                 sparse = 2.25 PFLOPS dense per GPU; 1,440 GB HBM3e =
                                                 180 GB and 8 TB/s per GPU)
=========  ======  ===============  ==========  ====================================================

"""
from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
"""Bytes in one GiB: a datasheet's memory figure is read as GiB (see :func:`dynlab.models.capacity.kv_blocks`)."""

DEFAULT_GPU = "h100"


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's datasheet figures: memory (GB, read as GiB), dense bf16 TFLOP/s, HBM GB/s (10^9 B/s)."""

    name: str
    memory_gb: float
    bf16_tflops: float
    hbm_gbps: float
    source: str

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * GIB)

    def as_dict(self) -> dict:
        return {"memory_gb": self.memory_gb, "bf16_tflops": self.bf16_tflops, "hbm_gbps": self.hbm_gbps,
                "source": self.source}


GPUS: dict[str, GpuSpec] = {g.name: g for g in (
    GpuSpec("h100", 80, 989.0, 3350.0, "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM)"),
    GpuSpec("h200", 141, 989.0, 4800.0, "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM)"),
    GpuSpec("a100-80gb", 80, 312.0, 2039.0, "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM)"),
    GpuSpec("l40s", 48, 362.05, 864.0, "NVIDIA L40S datasheet"),
    GpuSpec("b200", 180, 2250.0, 8000.0, "NVIDIA HGX B200 datasheet (per GPU: 1/8 of the 8-GPU board)"),
)}


def gpu_spec(name: str) -> GpuSpec:
    """The catalogue entry ``name``; ``ValueError`` listing the known GPUs otherwise."""
    try:
        return GPUS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown GPU {name!r}; known GPUs: {', '.join(GPUS)}") from None

