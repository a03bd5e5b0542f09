#!/usr/bin/env bash
# The main job: set up, write a learnable synthetic ImageFolder (train and val), train ResNet-18
# on it with gpufeed feeding the model, on the GPU when one is visible, else on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
./setup.sh
GPUFEED=build/release/tools/gpufeed
DATA=${GPUFEED_DATA:-data/synthetic}
if [ ! -d "$DATA/train" ]; then
  $GPUFEED make-dataset --out "$DATA/train" --classes 10 --per-class 64 --seed 1
  $GPUFEED make-dataset --out "$DATA/val" --classes 10 --per-class 16 --seed 2
fi
DEVICE=cpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then DEVICE=cuda:0; fi
exec $GPUFEED train --data "$DATA/train" --val-data "$DATA/val" --arch resnet18 --epochs 3 \
  --batch-size 32 --lr 0.8 --warmup-epochs 0.5 --image-size 112 --device "$DEVICE" \
  --checkpoint runs/main/resnet18.pt "$@"
