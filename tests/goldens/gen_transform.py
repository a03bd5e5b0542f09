"""Golden crop boxes and pixels from torchvision itself.

- RandomResizedCrop.get_params on a grid of image sizes and seeds, with every random draw it made
  recorded (torch.empty(1).uniform_ and torch.randint results), so the C++ plan can be fed the same
  draws and must return the same box.
- Resize(256) + CenterCrop(224): torchvision's resized size and crop offsets, read back from the
  transforms applied to coordinate tensors.
- torchvision's eval transform output (PIL path, as ImageFolder + DataLoader would produce) on JPEGs
  written here, for the pixel-closeness test of the loader.
- ImageFolder's class list and sample order on a tricky tree made here (nested folders, mixed-case
  extensions, spaces, non-image files), and on ../shared/data/hymenoptera when present.
"""
import json
import os
import pathlib

import numpy as np
import torch
import torchvision
import torchvision.transforms as T
import torchvision.transforms.functional as F
from PIL import Image

from draw_recorder import DrawRecorder

_tt = torchvision.transforms.transforms


def _rrc_cases():
    sizes = [(500, 375), (375, 500), (224, 224), (1, 1), (30000, 2), (2, 30000), (640, 480),
             (4032, 3024), (100, 2000), (17, 1023), (300, 301)]
    scales = [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.35, 1.0), (3 / 4, 4 / 3)), ((0.9, 1.0), (0.5, 2.0))]
    cases = []
    real = _tt.torch
    try:
        for (w, h) in sizes:
            for scale, ratio in scales:
                for seed in range(40):
                    rec = DrawRecorder(real)
                    _tt.torch = rec
                    torch.manual_seed(seed)
                    img = torch.empty(1, h, w) if w * h < 10_000_000 else None
                    if img is None:
                        continue
                    i, j, hh, ww = T.RandomResizedCrop.get_params(img, list(scale), list(ratio))
                    _tt.torch = real
                    cases.append({"width": w, "height": h, "scale": list(scale),
                                  "ratio": list(ratio), "draws": rec.draws,
                                  "box": [j, i, ww, hh]})
    finally:
        _tt.torch = real
    return cases


def _center_cases():
    out = []
    for (w, h) in [(500, 375), (375, 500), (256, 256), (224, 224), (1, 1), (3000, 2), (2, 3000),
                   (640, 480), (4032, 3024), (333, 257), (257, 333), (1000, 999)]:
        for resize, crop in [(256, 224), (160, 128), (224, 224)]:
            new_h, new_w = F.resize(torch.zeros(1, h, w, dtype=torch.uint8), resize,
                                    antialias=False).shape[-2:]
            # Coordinates of the resized image, center-cropped by torchvision itself.
            ys = torch.arange(new_h).view(new_h, 1).expand(new_h, new_w)
            xs = torch.arange(new_w).view(1, new_w).expand(new_h, new_w)
            cropped = F.center_crop(torch.stack([ys, xs]), [crop, crop])
            out.append({"width": w, "height": h, "resize": resize, "crop": crop,
                        "resized": [int(new_w), int(new_h)],
                        "top": int(cropped[0, 0, 0]), "left": int(cropped[1, 0, 0])})
    return out


def _pixel_cases(out: pathlib.Path):
    """JPEGs with real structure, and what torchvision's eval transform makes of them."""
    folder = out / "pixels"
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    cases = []
    for k, (w, h) in enumerate([(500, 375), (333, 500), (1024, 768), (256, 256)]):
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        img = np.stack([128 + 100 * np.sin(xx / (13 + k)), 128 + 100 * np.cos(yy / (17 + k)),
                        (xx + yy) * 255 / (w + h)], axis=-1)
        img += rng.normal(0, 4, img.shape)
        arr = np.clip(img, 0, 255).astype(np.uint8)
        path = folder / f"img{k}.jpg"
        Image.fromarray(arr).save(path, quality=92)
        tf = T.Compose([T.Resize(256), T.CenterCrop(224)])
        with Image.open(path) as im:
            res = np.asarray(tf(im.convert("RGB")), dtype=np.uint8)
        ref = folder / f"img{k}.eval224.rgb"
        ref.write_bytes(res.tobytes())
        cases.append({"path": str(path), "reference": str(ref), "height": 224, "width": 224})
    return cases


def _folder_cases(out: pathlib.Path):
    root = out / "tree"
    files = ["b/zeta.JPG", "b/Alpha.jpg", "b/sub/inner.png", "b/sub dir/x.jpeg", "b/notes.txt",
             "a/one file.jpg", "a/_first.bmp", "a/deep/deeper/z.webp", "a/0.gif", "a/UPPER.PNG",
             "a b/k.jpg", "B/q.tif", "c/é.jpg", "c/d.ppm", "c/x.pgm"]
    for f in files:
        p = root / f
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"")
    (root / "not_a_class.jpg").write_bytes(b"")
    cases = []
    roots = [root]
    # $GPUFEED_SHARED_DIR (ctest passes the build's), else ../shared beside the checkout.
    shared = pathlib.Path(os.environ.get("GPUFEED_SHARED_DIR")
                        or pathlib.Path(__file__).resolve().parents[3] / "shared") / "data" / "hymenoptera" / "train"
    if shared.is_dir():
        roots.append(shared)
    for r in roots:
        # torchvision leaves .gif out of IMG_EXTENSIONS; gpufeed decodes GIF, so it adds it.
        exts = torchvision.datasets.folder.IMG_EXTENSIONS + (".gif",)
        ds = torchvision.datasets.DatasetFolder(str(r), loader=lambda p: p, extensions=exts)
        cases.append({"root": str(r), "classes": ds.classes,
                      "samples": [[str(p), t] for p, t in ds.samples]})
    return cases


def make(out: pathlib.Path) -> None:
    (out / "transform.json").write_text(json.dumps({
        "random_resized_crop": _rrc_cases(),
        "center_crop": _center_cases(),
        "pixels": _pixel_cases(out),
        "image_folder": _folder_cases(out),
    }))
