#pragma once
// The gpufeed CLI's sub-commands. Each registers its options on a CLI11 sub-app and returns the
// callback that runs it (returning the process exit code).
#include <CLI/CLI.hpp>
#include <functional>
#include <limits>

#include "gpufeed/transforms/transform.h"

namespace gpufeed::tools {

using Run = std::function<int()>;

/// Option checks with plain messages ("Value 0 not in range 1 to 2147483647"; CLI11's
/// PositiveNumber prints its bound as a 300-digit double).
inline const CLI::Range kAtLeastOne{int64_t{1}, int64_t{std::numeric_limits<int>::max()}};
inline const CLI::Range kAtLeastZero{int64_t{0}, int64_t{std::numeric_limits<int>::max()}};

Run add_train(CLI::App& app);
Run add_bench(CLI::App& app);
Run add_make_dataset(CLI::App& app);
Run add_launch(CLI::App& app);
Run add_ckpt(CLI::App& app);
Run add_inspect(CLI::App& app);
Run add_index(CLI::App& app);
Run add_pack(CLI::App& app);
Run add_option_specs(CLI::App& app);

}  // namespace gpufeed::tools
