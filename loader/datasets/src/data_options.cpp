// The datasets room's option schema (gpufeed/option.h), beside its struct (dataset.h): every
// user-facing field of DataOptions, declared once. `gpufeed bench`, `gpufeed train`, `gpufeed
// pack` and gpufeed.DataLoader build their flags and keywords from the rows.
// The rows name only the Spec fields they set (designated initialisers); the rest keep their
// defaults on purpose, which GCC's -Wextra would report one by one.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include "gpufeed/datasets/dataset.h"

namespace gpufeed::datasets {
namespace {

using options::Schema;
using options::Type;

Schema<DataOptions> make_data_schema() {
  Schema<DataOptions> s;
  s.member({.name = "index_cache", .type = Type::kString,
            .help = "where the dataset's listing is cached: unset for the user's cache folder "
                    "($XDG_CACHE_HOME/gpufeed, else ~/.cache/gpufeed), beside (<parent>/<name>.gpufeed-index, "
                    "never in a folder whose mode forbids writing), off, or a folder"},
           &DataOptions::index_cache);
  s.member({.name = "endpoint_url", .type = Type::kString,
            .help = "the S3 endpoint of s3:// data (MinIO, Ceph, R2, ...): unset for AWS_ENDPOINT_URL_S3, "
                    "AWS_ENDPOINT_URL, the profile's endpoint_url, else AWS"},
           &DataOptions::endpoint_url);
  s.member({.name = "max_requests", .type = Type::kInt, .help = "ranged GETs of remote data in flight at once, per loader",
            .unit = "requests", .min = 1, .max = 4096},
           &DataOptions::max_requests);
  s.member({.name = "read_ahead", .type = Type::kInt,
            .help = "remote sample bytes requested ahead of the loader, per loader", .unit = "MiB", .min = 1,
            .max = 1 << 20},
           &DataOptions::read_ahead);
  s.member({.name = "request_timeout", .type = Type::kFloat,
            .help = "seconds a remote request may go without a byte before it is retried", .unit = "seconds",
            .min = 0.1, .max = 3600},
           &DataOptions::request_timeout);
  s.member({.name = "max_retries", .type = Type::kInt,
            .help = "retries of a remote request that timed out, was reset, cut short, throttled or got a 5xx",
            .min = 0, .max = 100},
           &DataOptions::max_retries);
  s.member({.name = "cache_dir", .type = Type::kString,
            .help = "a local folder keeping the remote bytes fetched, shared by a node's processes and kept "
                    "across runs; unset for none"},
           &DataOptions::cache_dir);
  s.member({.name = "cache_limit", .type = Type::kFloat,
            .help = "the cache_dir's size on disk at most: the shards used least recently are removed first",
            .unit = "GiB", .min = 1e-6, .max = 1e6},
           &DataOptions::cache_limit);
  s.add({.name = "remote_read", .type = Type::kChoice,
         .help = "remote data read shard by shard (one GET per shard or remote_chunk, served from memory), "
                 "sample by sample (a ranged GET each), or auto: shards under shuffle_order shards; under "
                 "any other order shards when it keeps at most remote_shards_in_flight shards open at once, "
                 "samples otherwise",
         .words = {"auto", "shards", "samples"}},
        [](DataOptions& o, const options::Value& v) { o.remote_read = std::get<std::string>(v); },
        [](const DataOptions& o) -> options::Value { return o.remote_read; });
  s.member({.name = "remote_chunk", .type = Type::kInt,
            .help = "bytes of one GET of shard-granular remote reads: a larger shard is fetched in chunks of "
                    "this size, several in flight",
            .unit = "MiB", .min = 8, .max = 4096},
           &DataOptions::remote_chunk);
  s.member({.name = "remote_shards_in_flight", .type = Type::kInt,
            .help = "shards (or chunks) of shard-granular remote reads fetched ahead or held in memory at once, "
                    "per loader",
            .unit = "shards", .min = 1, .max = 4096},
           &DataOptions::remote_shards_in_flight);
  return s;
}

}  // namespace

const options::Schema<DataOptions>& data_options_schema() {
  return options::made_once<make_data_schema>();
}

}  // namespace gpufeed::datasets
