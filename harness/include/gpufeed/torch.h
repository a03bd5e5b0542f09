#pragma once
// gpufeed's LibTorch side in one include (CMake: gpufeed::harness and gpufeed::prefetch, component
// `torch`), on top of the torch-free core (gpufeed/loader.h). docs/API.md is the tour.
//
//   Prefetcher    gpufeed/prefetch/prefetcher.h   Loader batches -> normalised [N, 3, H, W] tensors
//                                                 on a device (CUDA: copy stream + events)
//   distributed   gpufeed/harness/distributed.h   torchrun/Slurm env, c10d process group (NCCL,
//                                                 Gloo), DistributedDataParallel for any module
//   DataParallel  gpufeed/harness/data_parallel.h one process, several GPUs
//   Trainer       gpufeed/harness/trainer.h       gpufeed's own ResNet training loop (TrainOptions)
//   ResNet        gpufeed/harness/resnet.h        torchvision-identical ResNets
//   checkpoints   gpufeed/harness/checkpoint.h, torch_file.h, train_checkpoint.h: files Python reads and writes
//   schedules     gpufeed/harness/lr_schedule.h, amp.h (GradScaler), profiler.h, progress.h
//   recipes       gpufeed/harness/recipe.h        MixUp/CutMix, EMA, weight-decay groups, clipping

#include "gpufeed/harness/amp.h"
#include "gpufeed/harness/checkpoint.h"
#include "gpufeed/harness/data_parallel.h"
#include "gpufeed/harness/distributed.h"
#include "gpufeed/harness/lr_schedule.h"
#include "gpufeed/profiler/profiler.h"
#include "gpufeed/profiler/progress.h"
#include "gpufeed/harness/recipe.h"
#include "gpufeed/harness/resnet.h"
#include "gpufeed/harness/torch_file.h"
#include "gpufeed/harness/train_checkpoint.h"
#include "gpufeed/harness/trainer.h"
#include "gpufeed/loader.h"
#include "gpufeed/prefetch/prefetcher.h"
