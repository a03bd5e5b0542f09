#pragma once
// gpufeed's torch-free core in one include (CMake: gpufeed::loader, component `core`; pkg-config:
// gpufeed). docs/API.md is the tour; every type is documented in the header it comes from.
//
//   Dataset       gpufeed/datasets/dataset.h    (file, label) lists: ImageFolder, FileList, FlatFolder
//   Sampler       gpufeed/sampler/sampler.h   index order per epoch; DistributedSampler = PyTorch's; RASampler (ra_sampler.h)
//   Loader        gpufeed/loader/loader.h     LoaderOptions -> Batch of [N, H, W, 3] uint8 + [N] int64
//   Batch         gpufeed/loader/batch.h      a leased slot: the memory is the loader's until released
//   HostAllocator gpufeed/loader/host_allocator.h   where batch slots live (pinned, NUMA, your pool)
//   transforms    gpufeed/transforms/transform.h  RandomResizedCrop / Resize+CenterCrop / flip plans
//   augment       gpufeed/transforms/augment.h    TrivialAugmentWide / RandAugment / AutoAugment /
//                                             ColorJitter / RandomErasing, per sample, uint8
//   decode        gpufeed/decode/decoder.h    bytes -> RGB, with typed DecodeError
//
//   auto dataset = gpufeed::datasets::open_dataset("train/");
//   auto sampler = std::make_shared<gpufeed::sampler::DistributedSampler>(
//       dataset->size(), gpufeed::sampler::DistributedSamplerOptions{.num_replicas = world, .rank = rank});
//   gpufeed::loader::Loader loader(dataset, sampler, {.batch_size = 64, .num_workers = 4});
//   loader.start_epoch(epoch);
//   while (auto batch = loader.next()) consume(batch->images, batch->labels, batch->size);

#include "gpufeed/decode/decoder.h"
#include "gpufeed/transforms/augment.h"
#include "gpufeed/decode/error.h"
#include "gpufeed/loader/batch.h"
#include "gpufeed/datasets/dataset.h"
#include "gpufeed/loader/host_allocator.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/loader/rank_sampler.h"
#include "gpufeed/transforms/resize.h"
#include "gpufeed/datasets/synthetic.h"
#include "gpufeed/transforms/transform.h"
#include "gpufeed/sampler/ra_sampler.h"
#include "gpufeed/sampler/randperm.h"
#include "gpufeed/sampler/sampler.h"
#include "gpufeed/sampler/shard_order.h"
#include "gpufeed/version.h"
