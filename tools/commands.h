#pragma once
// The gpufeed CLI's sub-commands. Each registers its options on a CLI11 sub-app and returns the
// callback that runs it (returning the process exit code).
#include <CLI/CLI.hpp>
#include <functional>
#include <limits>

#include "gpufeed/loader/transform.h"

namespace gpufeed::tools {

using Run = std::function<int()>;

/// Option checks with plain messages ("Value 0 not in range 1 to 2147483647"; CLI11's
/// PositiveNumber prints its bound as a 300-digit double).
inline const CLI::Range kAtLeastOne{int64_t{1}, int64_t{std::numeric_limits<int>::max()}};
inline const CLI::Range kAtLeastZero{int64_t{0}, int64_t{std::numeric_limits<int>::max()}};

/// The augmentation flags (--auto-augment, --ra-magnitude, --ra-num-ops, --color-jitter,
/// --random-erase, --random-erase-value) on `app`, writing into `o` (which must outlive the
/// parse). Returns what to call after parsing: it fills the text-valued options in and validates
/// `o`, throwing std::invalid_argument naming the option.
std::function<void()> add_augment_options(CLI::App& app, loader::AugmentOptions& o);

Run add_train(CLI::App& app);
Run add_bench(CLI::App& app);
Run add_make_dataset(CLI::App& app);
Run add_launch(CLI::App& app);
Run add_ckpt(CLI::App& app);
Run add_inspect(CLI::App& app);
Run add_index(CLI::App& app);
Run add_pack(CLI::App& app);

}  // namespace gpufeed::tools
