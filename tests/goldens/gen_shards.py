"""WebDataset shards, written and read back by the webdataset package itself.

Writes a small ImageFolder (out/shards_folder/<class>/<n>.jpg, JPEGs of varied sizes; one file is
corrupt, for the skip policy) and the same samples, in ImageFolder order, as WebDataset shards
written by webdataset.TarWriter (out/shards/train-{000000..000002}.tar: key.jpg + key.cls, plus a
key.json member that gpufeed must ignore). Then reads the shards back with
webdataset.WebDataset(urls, shardshuffle=False) and records the order, keys, labels and a
checksum of each image's bytes: shards.json. tests/test_loader.cpp checks that gpufeed's
TarShards yields the same samples in the same order, and that the loader's batches over the
shards equal its batches over the folder.
"""
import hashlib
import io
import json
import os
import pathlib

import numpy as np
from PIL import Image


def make(out: pathlib.Path) -> None:
    import webdataset as wds

    folder = out / "shards_folder"
    shards = out / "shards"
    for d in (folder, shards):
        if d.exists():
            for p in sorted(d.rglob("*"), reverse=True):
                p.unlink() if p.is_file() else p.rmdir()
    rng = np.random.default_rng(15)
    classes = ["ant", "bee", "cat"]
    per_class = 9
    samples = []  # (class index, name, bytes), in ImageFolder order
    for c, name in enumerate(classes):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            w, h = int(rng.integers(40, 120)), int(rng.integers(40, 120))
            pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
            data = buf.getvalue()
            if c == 1 and i == 4:
                data = data[:60]  # cut inside the header: undecodable, in both layouts
            (folder / name / f"{i:03d}.jpg").write_bytes(data)
            samples.append((c, f"{i:03d}", data))
    # 27 samples over 3 shards of 10, 10 and 7, keys "<class>/<n>" as a packer writes them.
    per_shard = 10
    shards.mkdir(parents=True, exist_ok=True)
    for s in range(0, len(samples), per_shard):
        with wds.TarWriter(str(shards / f"train-{s // per_shard:06d}.tar")) as sink:
            for c, n, data in samples[s:s + per_shard]:
                sink.write({"__key__": f"{classes[c]}/{n}", "jpg": data, "cls": c,
                            "json": {"class": classes[c]}})
    urls = str(shards / "train-{000000..000002}.tar")
    read = []
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        # The bytes webdataset hands out are the folder file's: the C++ test compares gpufeed's
        # read of the member with that file.
        c, n, data = samples[len(read)]
        assert sample["__key__"] == f"{classes[c]}/{n}" and sample["jpg"] == data, sample["__key__"]
        read.append({"key": sample["__key__"], "label": int(sample["cls"]), "bytes": len(sample["jpg"]),
                     "sha256": hashlib.sha256(sample["jpg"]).hexdigest()})
    assert len(read) == len(samples), (len(read), len(samples))
    with open(out / "shards.json", "w") as f:
        json.dump({"urls": urls, "folder": str(folder), "samples": read, "keyless": keyless(out, samples)},
                  f, indent=1)


def keyless(out: pathlib.Path, samples) -> dict:
    """Shards holding a key group without an image, written by webdataset.TarWriter: a key with a
    dot in it ("22.05": webdataset splits "22.05.png" at its first '.'), a key with only a .cls,
    a key with only a .json. Returns, per shard, what webdataset.WebDataset yields: each sample's
    key and extensions (gpufeed must refuse each shard, naming that key's member)."""
    import webdataset as wds

    odd = out / "keyless"
    odd.mkdir(parents=True, exist_ok=True)
    for p in odd.glob("*.tar"):
        p.unlink()
    jpg = samples[0][2]
    groups = {
        "multidot": [{"__key__": "21", "jpg": jpg, "cls": 1}, {"__key__": "22.05", "png": jpg, "cls": 2},
                     {"__key__": "23", "jpg": jpg, "cls": 3}],
        "clsonly": [{"__key__": "a", "jpg": jpg, "cls": 0}, {"__key__": "b", "cls": 1}],
        "jsononly": [{"__key__": "a", "jpg": jpg, "cls": 0}, {"__key__": "c", "json": {"caption": "no image"}}],
    }
    yielded = {}
    for name, rows in groups.items():
        path = odd / f"{name}.tar"
        with wds.TarWriter(str(path)) as sink:
            for row in rows:
                sink.write(row)
        yielded[name] = {"path": str(path), "samples": [
            {"key": s["__key__"], "extensions": sorted(k for k in s if not k.startswith("__"))}
            for s in wds.WebDataset(str(path), shardshuffle=False, empty_check=False)]}
    return yielded
