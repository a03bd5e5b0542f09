#pragma once
// The gpufeed CLI's sub-commands. Each registers its options on a CLI11 sub-app and returns the
// callback that runs it (returning the process exit code).
#include <CLI/CLI.hpp>
#include <functional>

namespace gpufeed::tools {

using Run = std::function<int()>;

Run add_train(CLI::App& app);
Run add_bench(CLI::App& app);
Run add_make_dataset(CLI::App& app);
Run add_launch(CLI::App& app);
Run add_ckpt(CLI::App& app);
Run add_inspect(CLI::App& app);

}  // namespace gpufeed::tools
