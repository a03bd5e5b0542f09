"""Export a gpufeed or torchvision checkpoint of a torchvision classifier to ONNX.

    python -m gpufeed.export_onnx CHECKPOINT --arch resnet50 --num-classes K --out model.onnx

CHECKPOINT is anything `torch.load(weights_only=True)` reads that holds the model's state_dict:
`gpufeed train --checkpoint` (torchvision's parameter names), the "model" entry of a gpufeed
training checkpoint (--save-checkpoint), `torch.save(model.state_dict())` from Python, nested under
"state_dict" or "model" beside optimizer state (examples/imagenet's checkpoints), with or without
DistributedDataParallel's "module." prefix. The weights load strictly into
torchvision.models.<arch>(num_classes=K), which is exported in eval mode with
torch.onnx.export (input "images" [N, 3, S, S] float32, normalised as the loader does; output
"logits" [N, K]; N is dynamic). --check runs onnxruntime on a random batch and compares its logits
with torch's.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Dict

import torch


def extract_state_dict(obj: Any) -> Dict[str, torch.Tensor]:
    """The model's state_dict inside a loaded checkpoint (see the module docstring), with
    DistributedDataParallel's "module." prefix removed. Raises ValueError when none is found."""
    if isinstance(obj, dict) and not all(isinstance(v, torch.Tensor) for v in obj.values()):
        for key in ("state_dict", "model", "model_state_dict"):
            if key in obj and isinstance(obj[key], dict):
                return extract_state_dict(obj[key])
        raise ValueError(f"no state_dict in the checkpoint (top-level keys: {sorted(obj)[:10]})")
    if not isinstance(obj, dict) or not obj:
        raise ValueError(f"the checkpoint holds a {type(obj).__name__}, not a state_dict")
    if all(k.startswith("module.") for k in obj):
        obj = {k[len("module."):]: v for k, v in obj.items()}
    return dict(obj)


def load_model(checkpoint: str, arch: str, num_classes: int) -> torch.nn.Module:
    """torchvision.models.<arch>(num_classes) with the checkpoint's weights, in eval mode."""
    import torchvision

    if arch not in torchvision.models.list_models(module=torchvision.models):
        raise ValueError(f"unknown --arch {arch!r}: not a torchvision classification model")
    model = torchvision.models.get_model(arch, num_classes=num_classes)
    state = extract_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))
    model.load_state_dict(state, strict=True)
    return model.eval()


def export(model: torch.nn.Module, out: str, image_size: int = 224, opset: int = 18) -> None:
    """Writes `model` as ONNX to `out` (input "images" [N, 3, S, S], output "logits", N dynamic)."""
    example = torch.randn(2, 3, image_size, image_size)
    batch = torch.export.Dim("batch", min=1)
    torch.onnx.export(model, (example,), out, input_names=["images"], output_names=["logits"],
                      dynamic_shapes={"x": {0: batch}}, opset_version=opset, dynamo=True,
                      external_data=False, verbose=False)


def check(model: torch.nn.Module, out: str, image_size: int = 224, batch: int = 3) -> float:
    """Runs onnxruntime on a random batch; returns the largest |logit difference| to torch's."""
    import onnxruntime

    x = torch.randn(batch, 3, image_size, image_size)
    with torch.no_grad():
        ref = model(x).numpy()
    session = onnxruntime.InferenceSession(out, providers=["CPUExecutionProvider"])
    got = session.run(["logits"], {"images": x.numpy()})[0]
    return float(abs(got - ref).max())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpufeed.export_onnx", description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--arch", required=True, help="torchvision model name, e.g. resnet50")
    ap.add_argument("--num-classes", type=int, required=True)
    ap.add_argument("--out", required=True, help="the .onnx file to write")
    ap.add_argument("--image-size", type=int, default=224, help="the example input's side")
    ap.add_argument("--opset", type=int, default=18)
    ap.add_argument("--check", action="store_true", help="compare onnxruntime's logits with torch's")
    a = ap.parse_args(argv)
    try:
        model = load_model(a.checkpoint, a.arch, a.num_classes)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"export_onnx: {a.checkpoint}: {e}", file=sys.stderr)
        return 2
    export(model, a.out, a.image_size, a.opset)
    print(f"export_onnx: wrote {a.out} ({a.arch}, {a.num_classes} classes)")
    if a.check:
        diff = check(model, a.out, a.image_size)
        print(f"export_onnx: onnxruntime vs torch: max |logit difference| {diff:.3g}")
        if diff > 1e-3:
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
