#!/usr/bin/env bash
# The GPU check, made to run inside one device call (GPU_CHECK_BUDGET_S, default 540 s), results under $OUT.
#
#   here:            tools/gpu_bundle.sh               # build + gather .gpu_bundle, packed (<= 56 MiB)
#   GPU machine:     bash tools/gpu_check.sh            # device tool: carry [".gpu_bundle.tar.xz"]
#   here, dry run:   bash tools/gpu_check.sh --dry-run  # CPU parts only, tiny sizes
#
# Steps (each time-boxed, each result kept even when a later step fails):
#   1. GPU unit tests (test_gpu): prefetched tensors equal the CPU prefetcher's output for both
#      layouts and all dtypes; the copy/compute overlap test (<= 1.05x compute-only step time,
#      CUDA events); test_prefetch.
#      The GPU decode test: decode_device gpu rows against the CPU path's (difference printed).
#      Multi-crop views on CUDA against the CPU path's (python/tests/test_multicrop.py).
#   2. H2D bandwidth from pinned slots vs a plain cudaMemcpyAsync peak, same run
#      (gpufeed_gpu_bench), and the fused conversion kernel's time.
#   3. Synthetic ImageNet-sized JPEGs generated there; the GPU decode bench: `gpufeed train`
#      ResNet-18 and ResNet-50 with --decode-device cpu (every thread), gpu and auto (4 threads).
#      Then `gpufeed train` ResNet-50, bf16 autocast,
#      channels_last, 200 steps: images/s, data wait, GPU busy fraction (CUDA events; NVML too
#      when the run reports it); then torchvision's DataLoader feeding the same model on the same
#      files (tools/bench/baselines/torch_train.py), for the ratio.
#      The same with --num-workers auto (ResNet-18 and ResNet-50, each beside the fixed count):
#      threads chosen, GPU busy, epoch-start wait.
#   4. examples/python/train_imagenet.py (the Python package from the repaired wheel, .gpu_bundle/py) on the same files,
#      one epoch with --loader gpufeed and one with --loader torch; examples/python/train_pipeline.py,
#      the model in 2 pipeline stages (torch.distributed.pipelining, NCCL), one epoch;
#      examples/python/train_dino.py (DINO, the dinov2 preset's multi-crop views), DINO_STEPS steps.
#   5. Harness paths only a GPU runs: DDP over NCCL (world size 1), DataParallel, fp16 + GradScaler.
#   6. A summary table printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
OUT=${OUT:-$(mktemp -d /tmp/gpu_check.XXXX)}
mkdir -p "$OUT"
B=${GPUFEED_BUNDLE:-.gpu_bundle}
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ "$DRY" = 1 ] && PY=.venv/bin/python
if [ ! -x "$B/bin/gpufeed" ] && [ -f "$B.tar.xz" ]; then
  tar -C "$(dirname "$B")" -xJf "$B.tar.xz"
fi
if [ ! -x "$B/bin/gpufeed" ]; then
  echo "gpu_check: $B/bin/gpufeed missing: run tools/gpu_bundle.sh here and carry .gpu_bundle" >&2
  exit 2
fi
TORCH_LIB=$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
NV_ROOT=$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia"))')
export LD_LIBRARY_PATH="$PWD/$B/lib:$TORCH_LIB:$NV_ROOT/cu13/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
if ! "$B/bin/gpufeed" --version >/dev/null 2>"$OUT/ldd_error.txt"; then
  echo "gpu_check: binaries do not start with the image's libstdc++; using the carried one"
  export LD_LIBRARY_PATH="$PWD/$B/lib-compat:$LD_LIBRARY_PATH"
fi
# nvImageCodec for decode_device gpu/auto, carried in the bundle (tools/gpu_bundle.sh's nv/).
[ -f "$B/nv/nvidia/nvimgcodec/libnvimgcodec.so.0" ] && export GPUFEED_NVIMGCODEC_LIBRARY="$PWD/$B/nv/nvidia/nvimgcodec/libnvimgcodec.so.0"
G="$B/bin/gpufeed"
THREADS=$(nproc)
{ echo "date: $(date -u)"; echo "threads: $THREADS"; nvidia-smi 2>&1 | head -15;
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'; } \
  > "$OUT/machine.txt"
cat "$OUT/machine.txt"

# The whole check stays inside GPU_CHECK_BUDGET_S (default 540 s, under the device call's limit):
# each step's time box is cut to what is left, and a step with under 15 s left is skipped (said so
# in status.txt). Steps run in order of importance. GPU_CHECK_SKIP="name ..." leaves steps out.
BUDGET=${GPU_CHECK_BUDGET_S:-540}
START=$SECONDS
run() {  # run NAME SECONDS CMD... : log to $OUT/NAME.log, remember the exit code
  local name=$1 secs=$2; shift 2
  case " ${GPU_CHECK_SKIP:-} " in *" $name "*) echo "$name skipped (GPU_CHECK_SKIP)" | tee -a "$OUT/status.txt"; return 0 ;; esac
  local left=$(( BUDGET - (SECONDS - START) ))
  if [ "$left" -lt 15 ]; then
    echo "$name skipped (budget spent)" | tee -a "$OUT/status.txt"
    return 0
  fi
  [ "$secs" -gt "$left" ] && secs=$left
  echo "== $name (<= ${secs}s, t=$(( SECONDS - START ))s)"
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc" | tee -a "$OUT/status.txt"
  tail -n 15 "$OUT/$name.log"
  return 0
}

run test_gpu 90 "$B/bin/test_gpu" --gtest_output=json:"$OUT/test_gpu.json"
run test_prefetch 45 "$B/bin/test_prefetch"
# decode_device from Python (the wheel's _C): batches decoded on the GPU against the CPU path's.
[ -d "$B/py/gpufeed" ] && run pytest_gpu_decode 60 env PYTHONPATH="$PWD/$B/py" "$PY" -m pytest -q -s -p no:cacheprovider \
  python/tests/test_gpu_decode.py
# Multi-crop views on CUDA (the engine's per-view copies and conversions) against the CPU path's.
[ -d "$B/py/gpufeed" ] && run pytest_multicrop 60 env PYTHONPATH="$PWD/$B/py" "$PY" -m pytest -q -s -p no:cacheprovider \
  python/tests/test_multicrop.py
run h2d_bench 45 "$B/bin/gpufeed_gpu_bench" 256 224

if [ "$DRY" = 1 ]; then
  CLASSES=4 PER_CLASS=16 STEPS=4 WARM=1 BATCH=8 ARCH=resnet18 DEVICE=cpu SIZE=64
else
  CLASSES=${CLASSES:-100} PER_CLASS=${PER_CLASS:-64} STEPS=${STEPS:-200} WARM=${WARM:-20} BATCH=256 ARCH=resnet50
  DEVICE=cuda:0 SIZE=224
fi
DATA=/tmp/gpufeed_gpu_check_data
EXTRA=()
[ "$DEVICE" != cpu ] && EXTRA+=(--precision bf16)
run make_dataset 120 "$G" make-dataset --out "$DATA" --classes "$CLASSES" --per-class "$PER_CLASS" \
  --min-size 350 --max-size 500 --seed 1

# GPU decode (decode_device): ResNet-18 and ResNet-50, bf16, channels_last, on the same files with
# decode_device cpu (every thread), gpu and auto (DECODE_THREADS threads, 4): images/s, data wait
# and GPU busy per epoch (the epoch lines), the engine's GPU/CPU split (its closing log line).
DECODE_THREADS=${DECODE_THREADS:-4}
DECODE_EPOCHS=${DECODE_EPOCHS:-4}
DECODE_MODES="cpu gpu auto"
[ "$DRY" = 1 ] && DECODE_EPOCHS=1 && DECODE_MODES=cpu  # gpu/auto need the CUDA engine
for arch in resnet18 resnet50; do
  for mode in $DECODE_MODES; do
    workers=$THREADS; [ "$mode" != cpu ] && workers=$DECODE_THREADS
    run "decode_${arch}_${mode}" 60 "$G" train --data "$DATA" --arch "$arch" --epochs "$DECODE_EPOCHS" \
      --batch-size "$BATCH" --num-workers "$workers" --device "$DEVICE" --channels-last --image-size "$SIZE" \
      --lr 0.1 --progress lines --decode-device "$mode" --metrics "$OUT/decode_${arch}_${mode}.jsonl" \
      --metrics-every 10 "${EXTRA[@]}"
  done
done

# gpufeed: enough epochs over the generated set for STEPS steps.
PER_EPOCH=$(( CLASSES * PER_CLASS / BATCH ))
EPOCHS=$(( (STEPS + PER_EPOCH - 1) / PER_EPOCH ))
run train_gpufeed 150 "$G" train --data "$DATA" --arch "$ARCH" --epochs "$EPOCHS" \
  --batch-size "$BATCH" --num-workers "$THREADS" --device "$DEVICE" --channels-last \
  --image-size "$SIZE" --lr 0.1 --progress lines --metrics "$OUT/train_metrics.jsonl" \
  --metrics-every 10 --trace "$OUT/train_trace.json" "${EXTRA[@]}"
# NVML utilisation next to the CUDA-event busy fraction, per metrics record.
run train_profile_summary 30 "$PY" -c 'import json, sys
for r in map(json.loads, open(sys.argv[1])):
    if r["type"] in ("steps", "epoch", "summary"):
        print(r["type"], r.get("first_step", ""), "nvml_util_%", r.get("gpu_util_percent"),
              "event_busy", r.get("gpu_busy_fraction"), "wait", round(r.get("data_wait_fraction", 0), 3))
    if r["type"] == "summary":
        print(r.get("nvml")); print(r["verdict"]["text"])' "$OUT/train_metrics.jsonl"

# num_workers auto beside the fixed count (the run above; resnet18's fixed run here): GPU busy,
# images/s, the threads auto ended with and the epoch-start wait (the epoch lines and the metrics'
# loader records: threads, thread_decisions).
AUTO_ARCHS=("$ARCH"); [ "$ARCH" != resnet18 ] && AUTO_ARCHS=(resnet18 "$ARCH")
for arch in "${AUTO_ARCHS[@]}"; do
  for workers in auto "$THREADS"; do
    [ "$arch" = "$ARCH" ] && [ "$workers" = "$THREADS" ] && continue  # train_gpufeed above
    run "train_${arch}_workers_$workers" 90 "$G" train --data "$DATA" --arch "$arch" --epochs "$EPOCHS" \
      --batch-size "$BATCH" --num-workers "$workers" --device "$DEVICE" --channels-last --image-size "$SIZE" \
      --lr 0.1 --progress lines --metrics "$OUT/train_${arch}_workers_$workers.jsonl" --metrics-every 10 "${EXTRA[@]}"
  done
done

BF16=(); [ "$DEVICE" != cpu ] && BF16=(--bf16)
run train_torch 150 "$PY" tools/bench/baselines/torch_train.py --data "$DATA" --arch "$ARCH" \
  --batch-size "$BATCH" --num-workers "$THREADS" --steps "$STEPS" --warmup-steps "$WARM" \
  --image-size "$SIZE" --device "$DEVICE" --channels-last "${BF16[@]}"

# The Python package: examples/python/train_imagenet.py, one epoch over the same files with
# gpufeed.DataLoader and with torchvision + torch's DataLoader (AMP, channels_last on CUDA).
if [ -d "$B/py/gpufeed" ]; then
  EX=(--data "$DATA" --arch "$ARCH" --epochs 1 --batch-size "$BATCH" --num-workers "$THREADS"
      --image-size "$SIZE" --device "${DEVICE%%:*}" --channels-last --metrics "$OUT/example_metrics.jsonl")
  [ "$DEVICE" != cpu ] && EX+=(--amp)
  run example_gpufeed 120 env PYTHONPATH="$PWD/$B/py" "$PY" examples/python/train_imagenet.py --loader gpufeed "${EX[@]}"
  run example_torch 150 env PYTHONPATH="$PWD/$B/py" "$PY" examples/python/train_imagenet.py --loader torch "${EX[@]}"
  # Pipeline parallelism: 2 stages, GPipe over 4 micro-batches. NCCL takes one process per GPU: on
  # one GPU both stages share a process on cuda:0, on two or more they are 2 processes exchanging
  # activations and gradients over NCCL (the dry run: 2 CPU processes over Gloo).
  PP_PROCS=2
  if [ "$DEVICE" != cpu ] && [ "$("$PY" -c 'import torch; print(torch.cuda.device_count())')" -lt 2 ]; then
    PP_PROCS=1
  fi
  run example_pipeline 120 env PYTHONPATH="$PWD/$B/py" "$PY" -m torch.distributed.run --standalone \
    --nproc-per-node "$PP_PROCS" examples/python/train_pipeline.py --data "$DATA" --arch "$ARCH" --stages 2 \
    --microbatches 4 --batch-size "$BATCH" --image-size "$SIZE" --epochs 1 --workers "$THREADS" \
    --device "${DEVICE%%:*}"
  # Self-supervised multi-crop: examples/python/train_dino.py fed by the dinov2 preset's 10 views
  # (2 x 224 + 8 x 96, decoded once per image, copied and normalised per view by the engine).
  run example_dino 150 env PYTHONPATH="$PWD/$B/py" "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 \
    examples/python/train_dino.py --data "$DATA" --device "${DEVICE%%:*}" --epochs 2 --batch-size 64 \
    --num-workers "$THREADS" --max-steps "${DINO_STEPS:-30}"
fi

# Harness paths that only a GPU exercises: DDP over NCCL at world size 1, DataParallel on one
# device, fp16 with loss scaling (few steps each; exit status and finite loss are the check).
run ddp_nccl_world1 60 "$G" launch --nproc-per-node 1 --master-port 0 -- "$PWD/$G" train \
  --data "$DATA" --arch resnet18 --device cuda --precision bf16 --channels-last --batch-size 64 \
  --epochs 1 --max-steps-per-epoch 20 --num-workers "$THREADS" --progress off
run data_parallel_1 60 "$G" train --data "$DATA" --devices 0 --arch resnet18 --batch-size 64 \
  --epochs 1 --max-steps-per-epoch 20 --num-workers "$THREADS" --progress off
run fp16_scaler 60 "$G" train --data "$DATA" --device cuda:0 --precision fp16 --arch resnet18 \
  --batch-size 64 --epochs 1 --max-steps-per-epoch 30 --num-workers "$THREADS" --progress off

echo "== summary (full logs in $OUT)"
cat "$OUT/status.txt"
grep -h "overlap:" "$OUT/test_gpu.log" 2>/dev/null
grep -h -E '"(memcpy_peak_gb_per_s|slot_h2d_gb_per_s|slot_over_peak|convert_bf16_cl_ms)"' "$OUT/h2d_bench.log" 2>/dev/null
for f in "$OUT"/decode_*.log; do [ -f "$f" ] && echo "$(basename "$f" .log):" && grep -h -E "^epoch|GPU decode:|rror" "$f" | tail -n 4; done
grep -h -E "^gpu decode" "$OUT/test_gpu.log" 2>/dev/null
grep -h -E "^epoch|verdict|busy|steps:" "$OUT/train_gpufeed.log" 2>/dev/null | tail -n 6
tail -n 3 "$OUT/train_profile_summary.log" 2>/dev/null
for f in "$OUT"/train_*_workers_*.log; do [ -f "$f" ] && echo "$(basename "$f" .log):" && grep -h -E "^epoch|verdict" "$f" | tail -n 3; done
grep -h -E '"(images_per_s|gpu_busy_fraction_events|data_wait_fraction)"' "$OUT/train_torch.log" 2>/dev/null
grep -h -E "^epoch|verdict" "$OUT/example_gpufeed.log" "$OUT/example_torch.log" 2>/dev/null
grep -h -E "^pipeline|^epoch" "$OUT/example_pipeline.log" 2>/dev/null
grep -h -E "^epoch|rror" "$OUT/example_dino.log" 2>/dev/null | tail -n 4
tail -n 2 "$OUT/pytest_multicrop.log" 2>/dev/null
# The device tool brings back at most 8 files: GPU_CHECK_PACK=1 leaves one archive of them all.
if [ "${GPU_CHECK_PACK:-0}" = 1 ]; then
  tar -C "$OUT" -czf /tmp/gpu_check_logs.tgz . && find "$OUT" -mindepth 1 -delete && mv /tmp/gpu_check_logs.tgz "$OUT/"
fi
