"""gpufeed: a C++ ImageNet input pipeline for PyTorch training loops.

    import gpufeed, torch
    loader = gpufeed.DataLoader("data/train", batch_size=256, shuffle=True, device="cuda",
                                dtype=torch.bfloat16, memory_format=torch.channels_last)
    for images, labels in loader: ...

See gpufeed.DataLoader, gpufeed.decode_image, gpufeed.inspect, gpufeed.profile and
`python -m gpufeed.export_onnx`.
"""
import json
import os
import re
from typing import Any, Dict, List, Optional

import torch

from . import _build


def _release(version: str) -> tuple:
    """(major, minor) of a version string such as "2.15.0+cu130" or "2.16.0.dev20261201"."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


# gpufeed._C links no LibTorch (batches reach torch through DLPack), so any torch from the oldest
# tested release on works; an older one is refused here, naming both versions.
if _release(torch.__version__) < _release(_build.MIN_TORCH):
    raise ImportError(f"gpufeed {_build.VERSION} needs torch >= {_build.MIN_TORCH}, but this Python has torch "
                      f"{torch.__version__}: upgrade torch (pip install 'torch>={_build.MIN_TORCH}')")


def _point_at_nvimgcodec() -> None:
    """decode_device="gpu"/"auto" opens libnvimgcodec.so.0 at run time: point it at the copy the
    nvidia-nvimgcodec-cu13 wheel installed (pip install gpufeed[gpu-decode]), unless
    GPUFEED_NVIMGCODEC_LIBRARY already names one. Nothing is imported or loaded here."""
    if os.environ.get("GPUFEED_NVIMGCODEC_LIBRARY"):
        return
    import importlib.util
    try:
        spec = importlib.util.find_spec("nvidia.nvimgcodec")
    except (ImportError, ValueError):
        return
    for folder in (spec.submodule_search_locations or []) if spec else []:
        lib = os.path.join(folder, "libnvimgcodec.so.0")
        if os.path.exists(lib):
            os.environ["GPUFEED_NVIMGCODEC_LIBRARY"] = lib
            return


_point_at_nvimgcodec()

from . import _C  # noqa: E402
from ._errors import DecodeError, SkipLimitExceeded  # noqa: E402
from ._loader import DataLoader, distributed_rank_world_size  # noqa: E402
from ._profile import profile  # noqa: E402

__version__ = _build.VERSION
IMAGE_EXTENSIONS = tuple(_C.IMAGE_EXTENSIONS)  # what the CLI's folder listing keeps (torchvision's and .gif)


def decode_image(source, apply_exif_orientation: bool = False) -> torch.Tensor:
    """Decodes a whole image to an ``[H, W, 3]`` uint8 RGB tensor on the CPU.

    Args:
        source: a path (str or os.PathLike) or the file's bytes (bytes, bytearray, memoryview).
            The format (JPEG, PNG, WebP, GIF, TIFF, BMP, PNM) is sniffed from the bytes, never
            from the name. Grey, palette and CMYK images become RGB; alpha is dropped.
        apply_exif_orientation: rotate/flip by the EXIF orientation (off by default, as
            torchvision's ImageFolder + PIL loader does not apply it).

    Raises gpufeed.DecodeError naming the file (or "<bytes>"), the kind and the reason.
    """
    return _C.decode_image(source, apply_exif_orientation)


def inspect(*paths, all_files: bool = False, apply_exif_orientation: bool = False, strict_decode: bool = False,
            allow_truncated: bool = False, max_pixels: Optional[int] = None,
            write_png: "str | os.PathLike[str] | None" = None, strict: Optional[bool] = None) -> Dict[str, Any]:
    """What the decoder makes of files: ``gpufeed inspect --json``'s document, as a dict.

    Args:
        paths: image files and/or folders (searched recursively as ImageFolder walks them; files
            with image extensions unless ``all_files``). A missing file is reported, not raised.
        apply_exif_orientation, strict_decode (every decoder warning is an error; DataLoader's
            ``strict_decode``), allow_truncated (accept JPEGs with lost data), max_pixels
            (largest width*height accepted; default the decoder's): the decode options, as the
            CLI's flags. ``strict`` is strict_decode's earlier name.
        write_png: write each decodable file's RGB image under this folder as <name>.png.

    Returns ``{"files": [{"path", "bytes", "format", "width", "height", "components",
    "bits_per_sample", "subsampling", "progressive", "arithmetic", "lossless",
    "exif_orientation", "result" ("ok" | "warnings" | "error"), "warnings", "output": {"width",
    "height"} or "error": {"kind", "reason"}, "png"}], "summary": {"files", "decoded", "failed",
    "by_result": {kind: n}}}`` (header fields only when the header could be read).
    Raises RuntimeError naming a folder that cannot be listed.
    """
    if len(paths) == 1 and isinstance(paths[0], (list, tuple)):
        paths = tuple(paths[0])
    if strict is not None:
        strict_decode = strict
    doc = _C.inspect_json([os.fspath(p) for p in paths], all_files, apply_exif_orientation, strict_decode,
                          allow_truncated, max_pixels or 0, "" if write_png is None else os.fspath(write_png))
    return json.loads(doc)


def views_preset(name: str, local_crops_number: Optional[int] = None) -> List[Dict[str, Any]]:
    """A self-supervised recipe's multi-crop views as DataLoader(views=...) takes them: a list of
    dicts, one per view, of the view keywords (image_size, scale, ratio, interpolation, hflip_p,
    color_jitter, color_jitter_p, grayscale_p, gaussian_blur_p, gaussian_blur_kernel,
    gaussian_blur_sigma, solarize_p, solarize_threshold, ...). Edit them and pass the list to
    ``DataLoader(views=...)``, or pass the name itself (``views="dinov2"``).

    Args:
        name: "dino" (facebookresearch/dino main_dino.py's DataAugmentationDINO defaults),
            "dinov2" (facebookresearch/dinov2 augmentations.py as its code runs it: its
            GaussianBlur(p) hands 1 - p to RandomApply, so the blur probabilities in force are
            0.0 / 0.9 / 0.5 for global crop 1 / 2 / the local crops) or "dinov2_paper" (the
            probabilities the paper and the code's arguments state: 1.0 / 0.1 / 0.5).
        local_crops_number: local crops after the 2 global ones (DINO's local_crops_number),
            0..64; None: the preset's 8.

    Every view is bicubic with RandomHorizontalFlip(0.5), RandomApply(ColorJitter(0.4, 0.4, 0.2,
    0.1), p=0.8), RandomGrayscale(0.2) and GaussianBlur(9, sigma (0.1, 2.0)); global crop 2 adds
    RandomSolarize(128, p=0.2). Raises ValueError for an unknown name or count.
    """
    return _C.views_preset(name, -1 if local_crops_number is None else int(local_crops_number))


__all__ = ["DataLoader", "DecodeError", "IMAGE_EXTENSIONS", "SkipLimitExceeded", "decode_image",
           "distributed_rank_world_size", "inspect", "profile", "views_preset"]
