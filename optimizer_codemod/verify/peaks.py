"""Dense bfloat16 tensor peaks of accelerators, for model FLOPs utilisation (MFU).

MFU is the model's floating-point operations per second divided by the device's peak
(Chowdhery et al., "PaLM: Scaling Language Modeling with Pathways", 2022, appendix B). The peaks
are NVIDIA's datasheet figures for bfloat16 tensor cores without structured sparsity (the
datasheets print the sparse figure, twice the dense one, with a footnote):
- H100 SXM5 989 TFLOPS, H100 PCIe 756, H100 NVL 835: NVIDIA H100 Tensor Core GPU datasheet.
- H200 SXM 989, H200 NVL 835: NVIDIA H200 Tensor Core GPU datasheet.
- A100 312 (SXM and PCIe): NVIDIA A100 Tensor Core GPU datasheet.
A device not listed gets no MFU (its achieved FLOP/s are still reported).
"""

from __future__ import annotations

from typing import Optional, Tuple

TERA = 1e12

# (substring of torch.cuda.get_device_name(), dense bf16 FLOP/s, source); first match wins, so
# the more specific names come first.
DENSE_BF16_PEAKS: Tuple[Tuple[str, float, str], ...] = (
    ("H100 PCIe", 756 * TERA, "NVIDIA H100 datasheet, PCIe, dense"),
    ("H100 NVL", 835 * TERA, "NVIDIA H100 datasheet, NVL, dense"),
    ("H100", 989 * TERA, "NVIDIA H100 datasheet, SXM5, dense"),
    ("H200 NVL", 835 * TERA, "NVIDIA H200 datasheet, NVL, dense"),
    ("H200", 989 * TERA, "NVIDIA H200 datasheet, SXM, dense"),
    ("A100", 312 * TERA, "NVIDIA A100 datasheet, dense"),
)


def dense_bf16_peak(device_name: Optional[str]) -> Optional[Tuple[float, str]]:
    """The device's dense bfloat16 peak in FLOP/s and where the figure comes from, if known."""
    if not device_name:
        return None
    for fragment, peak, source in DENSE_BF16_PEAKS:
        if fragment.lower() in device_name.lower():
            return peak, source
    return None
