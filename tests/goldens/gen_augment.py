"""Golden augmentations from torchvision.transforms.v2 itself (tests/test_augment.cpp reads them).

- ops: every op of the auto-augment family through torchvision's own
  _AutoAugmentBase._apply_image_or_video_transform (NEAREST, fill None = 0, as
  TrivialAugmentWide/RandAugment/AutoAugment call it, and BILINEAR for the geometric ops, as
  the classification references call them) over a grid of magnitudes, plus the
  functional colour ops at ColorJitter-like factors, on uint8 [3, H, W] tensors made here.
  Inputs and outputs are written as raw [H, W, 3] uint8 files.
- magnitudes: each policy's _AUGMENTATION_SPACE tables as torch computes them (float32).
- replays: TrivialAugmentWide, RandAugment, AutoAugment(IMAGENET), ColorJitter and RandomErasing
  run forward under torch.manual_seed with every random draw recorded (kind, range, value), and
  their outputs; the C++ plan is fed the same draws and must consume exactly them.
- ssl_ops / ssl_kernels / ssl_replays: the self-supervised recipes' per-crop ops (DINO's):
  rgb_to_grayscale(num_output_channels=3), gaussian_blur over kernel sizes and sigmas (with
  torch's 1-D kernels, to compare bit for bit) and solarize; and RandomApply(ColorJitter),
  RandomGrayscale, RandomApply(GaussianBlur), RandomSolarize and their DINO composition replayed
  as above.
"""
import json
import pathlib

import numpy as np
import torch
import torchvision.transforms.v2 as T
import torchvision.transforms.v2.functional as F
from torchvision.transforms.v2 import _augment, _auto_augment, _color, _container, _misc, _transform
from torchvision.transforms.v2.functional._misc import _get_gaussian_kernel1d

from draw_recorder import DrawRecorder

NEAREST = T.InterpolationMode.NEAREST
BILINEAR = T.InterpolationMode.BILINEAR
GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _images():
    """Name -> uint8 [3, H, W]: textures with edges and noise, a non-square one, a dull one."""
    rng = np.random.default_rng(16)
    out = {}
    for name, (h, w) in {"a": (80, 96), "b": (224, 224)}.items():
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        img = np.stack([128 + 110 * np.sin(xx / 7.0 + yy / 23.0),
                        128 + 100 * np.cos(yy / 5.0) * np.sin(xx / 31.0),
                        (xx * 3 + yy * 2) % 256], axis=0)
        img[:, h // 3: h // 2, w // 4: w // 2] = [[[250]], [[20]], [[128]]]  # a flat block
        img += rng.normal(0, 12, img.shape)
        out[name] = torch.from_numpy(np.clip(img, 0, 255).astype(np.uint8))
    # Low contrast, one constant channel: autocontrast's max == min path, equalize's step == 0.
    c = np.zeros((3, 40, 36), dtype=np.uint8)
    c[0] = 77
    c[1] = 100 + (np.arange(36)[None, :] % 5)
    c[2] = rng.integers(60, 70, size=(40, 36))
    out["c"] = torch.from_numpy(c)
    return out


def _hwc(t):
    return t.permute(1, 2, 0).contiguous().numpy().tobytes()


def _op_cases(out, images):
    ta = T.TrivialAugmentWide()
    ra = T.RandAugment()
    aa = T.AutoAugment()
    cases = []
    k = 0

    def add(name, img, op, magnitude, result, fn=None, interpolation=None):
        nonlocal k
        path = out / f"op{k}.rgb"
        path.write_bytes(_hwc(result))
        case = {"image": name, "op": op, "magnitude": magnitude, "output": str(path)}
        if fn is not None:
            case["fn"] = fn
        if interpolation is not None:
            case["interpolation"] = interpolation
        cases.append(case)
        k += 1

    for name, img in images.items():
        h, w = img.shape[-2:]
        for op in list(ta._AUGMENTATION_SPACE) + ["Invert"]:
            mags = set()
            picks_of = {"a": (range(0, 31, 2), range(0, 31, 5), range(10)),
                        "b": (range(0, 31, 6), [9], [0, 5, 9]),
                        "c": (range(0, 31, 10), [], [])}[name]
            for (policy, bins), picks in zip(((ta, 31), (ra, 31), (aa, 10)), picks_of):
                space = policy._AUGMENTATION_SPACE
                if op not in space:
                    continue
                fn, signed = space[op]
                table = fn(bins, h, w)
                if table is None:
                    mags.add(0.0)
                    continue
                for b in picks:
                    v = float(table[b])
                    mags.add(v)
                    if signed:
                        mags.add(-v)
            for m in sorted(mags):
                res = ta._apply_image_or_video_transform(img, op, m, interpolation=NEAREST, fill=ta._fill)
                add(name, img, op, m, res)
                if op in GEOMETRIC:  # the references' interpolation=BILINEAR
                    res = ta._apply_image_or_video_transform(img, op, m, interpolation=BILINEAR, fill=ta._fill)
                    add(name, img, op, m, res, interpolation="bilinear")
        # ColorJitter's functional ops at factors of its ranges (brightness/contrast/saturation
        # 0.4 -> [0.6, 1.4], hue 0.1 -> [-0.1, 0.1]) and the extremes.
        for f in (0.0, 0.6, 0.8123, 1.0, 1.2345, 1.4, 2.5):
            add(name, img, "brightness", f, F.adjust_brightness(img, f), fn="brightness")
            add(name, img, "contrast", f, F.adjust_contrast(img, f), fn="contrast")
            add(name, img, "saturation", f, F.adjust_saturation(img, f), fn="saturation")
        for f in (-0.5, -0.1, -0.03, 0.0, 0.05, 0.1, 0.37, 0.5):
            add(name, img, "hue", f, F.adjust_hue(img, f), fn="hue")
    return cases


def _magnitude_tables(images):
    tables = []
    for policy_name, policy, bins in (("ta_wide", T.TrivialAugmentWide(), 31),
                                      ("ra", T.RandAugment(), 31), ("imagenet", T.AutoAugment(), 10)):
        for name, img in images.items():
            h, w = img.shape[-2:]
            for op, (fn, signed) in policy._AUGMENTATION_SPACE.items():
                table = fn(bins, h, w)
                tables.append({"policy": policy_name, "op": op, "height": h, "width": w, "bins": bins,
                               "signed": signed,
                               "values": None if table is None else [float(v) for v in table.float()]})
    return tables


def _record(transform, img, seed):
    modules = (_augment, _auto_augment, _color, _container, _misc, _transform)
    real = torch
    rec = DrawRecorder(real)
    try:
        for m in modules:
            m.torch = rec
        torch.manual_seed(seed)
        out = transform(img)
    finally:
        for m in modules:
            m.torch = real
    return out, rec.draws


def _replay_into(cases, out, prefix, name, img, configs, seeds):
    """Appends to `cases` each (config, seed) of `configs` run on `img`, draws recorded."""
    for cname, options, transform in configs:
        for seed in range(seeds):
            res, draws = _record(transform, img, seed)
            path = out / f"{prefix}{len(cases)}.rgb"
            path.write_bytes(_hwc(res))
            cases.append({"config": cname, "options": options, "image": name, "seed": seed,
                          "draws": draws, "output": str(path)})


def _replays(out, images):
    configs = [
        ("ta_wide", {"auto_augment": "ta_wide"}, T.TrivialAugmentWide()),
        ("ra", {"auto_augment": "ra", "ra_num_ops": 2, "ra_magnitude": 9}, T.RandAugment()),
        ("ra3_m15", {"auto_augment": "ra", "ra_num_ops": 3, "ra_magnitude": 15},
         T.RandAugment(num_ops=3, magnitude=15)),
        ("imagenet", {"auto_augment": "imagenet"}, T.AutoAugment(T.AutoAugmentPolicy.IMAGENET)),
        ("ta_wide_bilinear", {"auto_augment": "ta_wide", "interpolation": "bilinear"},
         T.TrivialAugmentWide(interpolation=BILINEAR)),
        ("imagenet_bilinear", {"auto_augment": "imagenet", "interpolation": "bilinear"},
         T.AutoAugment(T.AutoAugmentPolicy.IMAGENET, interpolation=BILINEAR)),
        ("jitter", {"color_jitter": [0.4, 0.4, 0.4, 0.0]}, T.ColorJitter(0.4, 0.4, 0.4)),
        ("jitter_hue", {"color_jitter": [0.3, 0.0, 0.5, 0.1]}, T.ColorJitter(0.3, 0.0, 0.5, 0.1)),
    ]
    cases = []
    for name, img in images.items():
        if name == "c":
            continue
        _replay_into(cases, out, "replay", name, img, configs, 24 if name == "a" else 4)
        k = len(cases)
        # RandomErasing after Normalize, as the references run it; the expected uint8 is the
        # erased normalised value mapped back as gpufeed documents (RandomErasingOptions).
        for value in (0.0, "random"):
            for p in (1.0, 0.5):
                er = T.RandomErasing(p=p, value=value)
                norm = F.normalize(F.to_dtype(img, torch.float32, scale=True), MEAN, STD)
                for seed in range(12 if name == "a" else 3):
                    res, draws = _record(er, norm.clone(), seed)
                    mean = torch.tensor(MEAN, dtype=torch.float32).view(3, 1, 1)
                    std = torch.tensor(STD, dtype=torch.float32).view(3, 1, 1)
                    changed = (res != norm).any(dim=0)
                    boxes = [d for d in draws if d["kind"] == "randint"]
                    expected = img.clone()
                    if len(boxes) == 2:
                        # recompute the box from the draws (a value equal to the input hides it)
                        i, j = boxes[0]["value"], boxes[1]["value"]
                        h = boxes[0]["hi"] - 1
                        h = img.shape[-2] - h
                        w = img.shape[-1] - (boxes[1]["hi"] - 1)
                        v = res[:, i:i + h, j:j + w].numpy().astype(np.float32)
                        m = mean.numpy().astype(np.float32)
                        s = std.numpy().astype(np.float32)
                        mapped = np.clip(np.rint(np.float32(255) * (m + s * v)), 0, 255).astype(np.uint8)
                        expected[:, i:i + h, j:j + w] = torch.from_numpy(mapped)
                    else:
                        assert not bool(changed.any())
                    path = out / f"replay{k}.rgb"
                    path.write_bytes(_hwc(expected))
                    cases.append({"config": f"erase_{value}_{p}", "image": name, "seed": seed,
                                  "options": {"random_erase": p, "random_erase_value": value},
                                  "draws": draws, "output": str(path)})
                    k += 1
    return cases


BLUR_SIGMAS = (0.1, 0.3337, 0.5, 0.8, 1.0, 1.4142, 2.0, 3.7)


def _ssl_ops(out, images):
    cases = []
    for name, img in images.items():
        h, w = img.shape[-2:]

        def add(fn, result, **params):
            path = out / f"ssl_op{len(cases)}.rgb"
            path.write_bytes(_hwc(result))
            cases.append({"image": name, "fn": fn, "output": str(path), **params})

        add("grayscale", F.rgb_to_grayscale(img, num_output_channels=3))
        for t in (0.0, 1.0, 64.0, 128.0, 200.5, 255.0):
            add("solarize", F.solarize(img, t), threshold=t)
        for k in (1, 3, 9, 23):
            if k // 2 >= min(h, w):
                continue
            for sigma in BLUR_SIGMAS:
                add("gaussian_blur", F.gaussian_blur(img, [k, k], [sigma, sigma]), kernel_size=k, sigma=sigma)
    return cases


def _ssl_kernels():
    rng = np.random.default_rng(21)
    sigmas = list(BLUR_SIGMAS) + [float(np.float32(v)) for v in rng.uniform(0.1, 2.0, 40)]
    return [{"kernel_size": k, "sigma": s,
             "weights": [float(v) for v in _get_gaussian_kernel1d(k, s, torch.float32, "cpu")]}
            for k in (3, 9, 23) for s in sigmas]


def _ssl_replays(out, images):
    jitter = (0.4, 0.4, 0.2, 0.1)
    blur = T.GaussianBlur(9, (0.1, 2.0))
    configs = [
        ("jitter_p", {"color_jitter": list(jitter), "color_jitter_p": 0.8},
         T.RandomApply([T.ColorJitter(*jitter)], p=0.8)),
        ("grayscale", {"grayscale_p": 0.5}, T.RandomGrayscale(p=0.5)),
        ("blur", {"gaussian_blur_p": 0.5}, T.RandomApply([blur], p=0.5)),
        ("solarize", {"solarize_p": 0.5, "solarize_threshold": 128.0}, T.RandomSolarize(128, p=0.5)),
        # DINO's second global crop after the flip: colour jitter 0.8, grayscale 0.2, blur 0.1,
        # solarize 0.2 (blur with p=1 in the first global crop, 0.5 in the local ones).
        ("dino_global2", {"color_jitter": list(jitter), "color_jitter_p": 0.8, "grayscale_p": 0.2,
                          "gaussian_blur_p": 0.1, "solarize_p": 0.2, "solarize_threshold": 128.0},
         T.Compose([T.RandomApply([T.ColorJitter(*jitter)], p=0.8), T.RandomGrayscale(p=0.2),
                    T.RandomApply([blur], p=0.1), T.RandomSolarize(128, p=0.2)])),
        ("dino_global1", {"color_jitter": list(jitter), "color_jitter_p": 0.8, "grayscale_p": 0.2,
                          "gaussian_blur_p": 1.0},
         T.Compose([T.RandomApply([T.ColorJitter(*jitter)], p=0.8), T.RandomGrayscale(p=0.2),
                    T.RandomApply([blur], p=1.0)])),
    ]
    cases = []
    for name, img in images.items():
        if name != "c":
            _replay_into(cases, out, "ssl_replay", name, img, configs, 16 if name == "a" else 3)
    return cases


def make(out: pathlib.Path) -> None:
    folder = out / "augment"
    folder.mkdir(exist_ok=True)
    images = _images()
    image_files = {}
    for name, img in images.items():
        path = folder / f"input_{name}.rgb"
        path.write_bytes(_hwc(img))
        image_files[name] = {"path": str(path), "height": int(img.shape[1]), "width": int(img.shape[2])}
    (out / "augment.json").write_text(json.dumps({
        "images": image_files,
        "ops": _op_cases(folder, images),
        "magnitudes": _magnitude_tables(images),
        "replays": _replays(folder, images),
        "ssl_ops": _ssl_ops(folder, images),
        "ssl_kernels": _ssl_kernels(),
        "ssl_replays": _ssl_replays(folder, images),
        "mean": MEAN, "std": STD,
    }))
