#!/usr/bin/env bash
# The Python iterator beside the C++ loader, and beside another build of the Python package, in one
# run: per round, `gpufeed bench` (C++), gpufeed.DataLoader uint8 (tools/bench/bench_compare.py's child)
# and float32 (the CPU conversion) with this build's package, then the same with the package under
# OTHER (a folder holding gpufeed/, e.g. an older commit's site-packages copy). Images/s, 2 threads.
#   tools/bench/bench_python_iter.sh OTHER [ROUNDS]      (DATA=... : default ../shared/data/imagenet-sample)
set -euo pipefail
cd "$(dirname "$0")/../.."
D=${DATA:-../shared/data/imagenet-sample}; OLD=$1; NEW=build/release/python; ROUNDS=${2:-3}
f32() { PYTHONPATH=$1 .venv/bin/python -c "
import sys, time, torch, gpufeed
l = gpufeed.DataLoader(sys.argv[1], batch_size=256, num_workers=2, image_size=224, dtype=torch.float32)
n = 0
for e in range(3):
    if e == 1: t0 = time.perf_counter()
    l.set_epoch(e)
    for x, y in l: n += x.shape[0] if e else 0
print(round(n / (time.perf_counter() - t0), 1))" "$D"; }
u8() { PYTHONPATH=$1 .venv/bin/python tools/bench/bench_compare.py --child python --threads 2 --data "$D" --batch-size 256 --image-size 224 --epochs 2 --warmup 1 | .venv/bin/python -c "import json,sys; print(round(json.load(sys.stdin)['images_per_s'],1))"; }
cpp() { build/release/tools/gpufeed bench --data "$D" --num-workers 2 --batch-size 256 --image-size 224 --epochs 2 --warmup 1 --json 2>/dev/null | .venv/bin/python -c "import json,sys; d=json.load(sys.stdin); print(round(d['samples']/d['seconds'],1))"; }
echo "| round | C++ bench | new uint8 | OTHER uint8 | new float32 | OTHER float32 |"
for r in $(seq "$ROUNDS"); do echo "| $r | $(cpp) | $(u8 $NEW) | $(u8 $OLD) | $(f32 $NEW) | $(f32 $OLD) |"; done
