"""Golden pixels for the loader's resize and its end-to-end quality, from PIL and torchvision.

- resize.json "resize": random RGB images (noise and smooth patterns) resized by PIL's
  Image.resize(BILINEAR, box=...) to random sizes, with fractional boxes, up- and downscaling,
  optionally mirrored: the C++ Resizer must agree within two levels (see test_resize.cpp).
- resize.json "resize_bicubic": the same kind of cases (other random draws) resized with
  Image.BICUBIC, the filter of torchvision's InterpolationMode.BICUBIC on PIL images.
- resize.json "files": a few real JPEGs of ../shared/data/imagenet-sample (when present): the
  largest ones (so the decoder's DCT scaling is exercised), grayscale ones and ordinary ones, with
  torchvision's eval transform output (Resize(256) + CenterCrop(224), as ImageFolder + DataLoader
  produce it) and RandomResizedCrop outputs for fixed boxes (F.resized_crop + hflip), so the
  loader's decode-at-scale + resize can be held to a mean difference bound.
"""
import json
import os
import pathlib

import numpy as np
import torchvision.transforms as T
import torchvision.transforms.functional as F
from PIL import Image


def _resize_cases(folder: pathlib.Path, resample=Image.BILINEAR, seed=3, prefix=""):
    rng = np.random.default_rng(seed)
    cases = []
    for k in range(40):
        w, h = (int(v) for v in rng.integers(1, 600, 2))
        if k % 2:
            yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
            img = np.stack([128 + 100 * np.sin(xx / 7), 128 + 100 * np.cos(yy / 5),
                            (xx + yy) % 256], axis=-1).astype(np.uint8)
        else:
            img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        if k % 5 == 0:
            box = (0.0, 0.0, float(w), float(h))
        else:
            x0 = float(rng.uniform(0, w - 0.5))
            y0 = float(rng.uniform(0, h - 0.5))
            box = (x0, y0, float(rng.uniform(x0 + 0.3, w)), float(rng.uniform(y0 + 0.3, h)))
        # PIL takes the box as float32: give it values float32 holds exactly.
        box = tuple(float(np.float32(v)) for v in box)
        ow, oh = (int(v) for v in rng.integers(1, 300, 2))
        flip = bool(k % 3 == 1)
        ref = np.asarray(Image.fromarray(img).resize((ow, oh), resample, box=box))
        if flip:
            ref = ref[:, ::-1]
        src = folder / f"{prefix}src{k}.{'noise' if k % 2 == 0 else 'smooth'}.rgb"
        dst = folder / f"{prefix}ref{k}.rgb"
        src.write_bytes(img.tobytes())
        dst.write_bytes(np.ascontiguousarray(ref).tobytes())
        cases.append({"source": str(src), "width": w, "height": h, "box": list(box),
                      "out": [ow, oh], "flip": flip, "reference": str(dst)})
    return cases


def _file_cases(folder: pathlib.Path):
    # $GPUFEED_SHARED_DIR (ctest passes the build's), else ../shared beside the checkout.
    data = pathlib.Path(os.environ.get("GPUFEED_SHARED_DIR")
                        or pathlib.Path(__file__).resolve().parents[3] / "shared") / "data" / "imagenet-sample"
    if not data.is_dir():
        return []
    files = sorted(p for p in data.iterdir() if p.suffix.lower() in (".jpeg", ".jpg"))
    info = []
    for p in files:
        with Image.open(p) as im:
            info.append((p, im.size, im.mode))
    largest = sorted(info, key=lambda t: -t[1][0] * t[1][1])[:3]
    gray = [t for t in info if t[2] == "L"][:2]
    chosen = []
    for t in largest + gray + info[:3]:
        if t not in chosen:
            chosen.append(t)
    rng = np.random.default_rng(5)
    evaluate = T.Compose([T.Resize(256), T.CenterCrop(224)])
    cases = []
    for n, (path, (w, h), _) in enumerate(chosen):
        with Image.open(path) as im:
            img = im.convert("RGB")
        ref = folder / f"file{n}.eval.rgb"
        ref.write_bytes(np.asarray(evaluate(img), dtype=np.uint8).tobytes())
        train = []
        for m, frac in enumerate([1.0, 0.5, 0.2, 0.08]):
            bw = max(1, min(w, int(round(w * np.sqrt(frac) * rng.uniform(0.85, 1.0)))))
            bh = max(1, min(h, int(round(h * np.sqrt(frac) * rng.uniform(0.85, 1.0)))))
            x = int(rng.integers(0, w - bw + 1))
            y = int(rng.integers(0, h - bh + 1))
            flip = bool(m % 2)
            out = F.resized_crop(img, y, x, bh, bw, [224, 224], T.InterpolationMode.BILINEAR,
                                 antialias=True)
            if flip:
                out = F.hflip(out)
            tref = folder / f"file{n}.train{m}.rgb"
            tref.write_bytes(np.asarray(out, dtype=np.uint8).tobytes())
            train.append({"box": [x, y, bw, bh], "flip": flip, "reference": str(tref)})
        cases.append({"path": str(path), "width": w, "height": h, "eval_reference": str(ref),
                      "train": train})
    return cases


def make(out: pathlib.Path) -> None:
    folder = out / "resize"
    folder.mkdir(exist_ok=True)
    (out / "resize.json").write_text(json.dumps({
        "resize": _resize_cases(folder),
        "resize_bicubic": _resize_cases(folder, Image.BICUBIC, seed=4, prefix="bicubic_"),
        "files": _file_cases(folder),
    }))
