// A tiny process for the CPU-budget tests (test_cpu_budget.cpp runs it under `taskset`): builds a
// Loader over DATA with num_workers 0 and then with num_workers 2, and prints what it resolved:
//   cpu_budget=<gpufeed::cpu_budget()>
//   loader_threads=<Loader::num_threads() for num_workers 0>
//   budget=<CpuBudget::describe()>
// The loader's warning for num_workers 2 goes to stderr through the gpufeed logger.
#include <cstdio>
#include <memory>

#include "gpufeed/cpu_budget.h"
#include "gpufeed/datasets/dataset.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/sampler/sampler.h"

int main(int argc, char** argv) {
  using namespace gpufeed::loader;
  using namespace gpufeed::datasets;
  using namespace gpufeed::transforms;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DATA\n", argv[0]);
    return 2;
  }
  const auto ds = open_dataset(argv[1], {.index_cache = "off"});
  LoaderOptions o;
  o.batch_size = 2;
  o.prefetch_depth = 1;
  o.transform = TransformOptions::imagenet(TransformOptions::Kind::kEval, 16);
  const Loader by_default(ds, std::make_shared<gpufeed::sampler::SequentialSampler>(ds->size()), o);
  o.num_workers = 2;
  const Loader two(ds, std::make_shared<gpufeed::sampler::SequentialSampler>(ds->size()), o);
  std::printf("cpu_budget=%d\nloader_threads=%d\nbudget=%s\n", gpufeed::cpu_budget(), by_default.num_threads(),
              gpufeed::cpu_budget_info().describe().c_str());
  return 0;
}
