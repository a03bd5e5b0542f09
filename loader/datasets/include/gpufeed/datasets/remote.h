#pragma once
// Remote data: WebDataset tar shards in S3-compatible object storage (s3://bucket/key) or behind
// HTTP(S), read without downloading them (docs/SCALING.md, "Remote data").
//
// Opening reads each shard's index (`<shard>.gpufeed-idx`, written beside it by `gpufeed pack`:
// shards.h) and a HEAD of the shard (its size and ETag); an index is used only when the shard's
// trailer (its last 512 bytes, one ranged GET) carries the SHA-256 the index records, so an index
// left beside another version of its shard is not trusted (a warning names the shard and why). A
// shard without a usable index is indexed from its tar headers with ranged reads, and that index
// kept in the index cache. Every request
// for samples carries If-Match on the ETag the index was made against, so an object that changed
// since is an error, never decoded. A loader reads through a SampleReader that requests ahead in
// the loader's announced order, in one of two modes (DataOptions::remote_read): per sample, a
// ranged GET of its image member (adjacent samples of one shard in one request; at most
// DataOptions::max_requests requests and read_ahead MiB in flight or buffered per loader), or
// per shard, each shard fetched whole (or in chunks of remote_chunk MiB) into memory, its samples
// served from there, dropped once the order's samples of it are read, at most
// remote_shards_in_flight shards or chunks ahead (src/remote_shard_reader.cpp). With DataOptions::cache_dir the bytes fetched are
// kept on local disk within cache_limit (least recently used shards out first), shared by the
// processes of a node, never served once the object's ETag changed.
//
// Faults: timeouts (no byte for request_timeout seconds), resets, bodies shorter than their
// range, 429, 503 (SlowDown) and other 5xx are retried max_retries times with exponential
// backoff and jitter, then fail with the URL, the status and what was tried; 403 and 404 fail at
// once (at open, naming the object); a redirect is not followed (its target is named). Only
// http, https and s3 URLs are accepted. Secrets stay out of every message: a URL is printed
// without its query string (a signed URL's signature) or user info, and credentials are never
// printed.
//
// Credentials and endpoint of s3:// URLs come from where boto3 finds them: AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, else the profile (AWS_DEFAULT_PROFILE, else
// AWS_PROFILE, else "default": botocore's order) of ~/.aws/credentials, else its
// credential_process, else its keys in ~/.aws/config (AWS_SHARED_CREDENTIALS_FILE,
// AWS_CONFIG_FILE); region from AWS_REGION / AWS_DEFAULT_REGION / the profile (else
// us-east-1); endpoint from DataOptions::endpoint_url, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL or
// the profile's endpoint_url (path-style requests), else AWS (virtual-hosted); CA bundle from
// AWS_CA_BUNDLE or the profile's ca_bundle. Without credentials requests go unsigned (public
// buckets); a 403 then says that no credentials were found and where they were looked for.
//
// CA certificates of https requests (gpufeed/datasets/ca_bundle.h): the file AWS_CA_BUNDLE, else
// CURL_CA_BUNDLE, else SSL_CERT_FILE names (for s3:// URLs the profile's ca_bundle comes after
// AWS_CA_BUNDLE and before the others), and the directory SSL_CERT_DIR names (CURLOPT_CAPATH);
// without a file variable, the first readable one of Debian/Ubuntu's
// /etc/ssl/certs/ca-certificates.crt, RHEL/Fedora's /etc/pki/tls/certs/ca-bundle.crt and
// /etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem, SUSE's /etc/ssl/ca-bundle.pem and
// /var/lib/ca-certificates/ca-bundle.pem, Alpine's /etc/ssl/cert.pem; libcurl's built-in file or
// directory last. With none of them an https request fails at once (no retry) with RemoteError
// naming the URL and every variable and path looked at.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "gpufeed/datasets/dataset.h"

namespace gpufeed::datasets {

namespace remote {
struct Store;
}

/// A remote object that cannot be read: what() names the URL (redacted), the HTTP status or
/// transport error, and the attempts made.
class RemoteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Whether `s` is a URL ("scheme://..." with a scheme of letters, digits, '+', '-', '.'), which
/// the datasets read as remote data rather than a local path.
bool is_url(std::string_view s);

/// Throws std::invalid_argument when `url`'s scheme is not http, https or s3, naming the scheme.
void check_url(std::string_view url);

/// `url` as messages print it: an http(s) URL's query string (a presigned URL's signature)
/// replaced by "?<redacted>", user info ("user:password@") by "<redacted>@". An s3:// URL has no
/// query: a '?' or '#' in it is part of the key, printed as it is.
std::string redact_url(std::string_view url);

/// Where and how an s3:// URL is requested: the HTTP(S) URL (path-style on a custom endpoint,
/// virtual-hosted on AWS), the signing region, and credentials (empty: unsigned requests).
struct S3Config {
  std::string endpoint_url;  ///< "" for AWS
  std::string region = "us-east-1";
  std::string access_key, secret_key, session_token;
  /// The CA bundle for https (CURLOPT_CAINFO): AWS_CA_BUNDLE, else the profile's ca_bundle;
  /// "" leaves the client's search (CURL_CA_BUNDLE, SSL_CERT_FILE, the distributions' files:
  /// gpufeed/datasets/ca_bundle.h).
  std::string ca_bundle;
  /// When the credentials expire (credential_process's Expiration); nullopt: they do not.
  std::optional<std::chrono::system_clock::time_point> expiration;
  /// Where the credentials were looked for, for messages: what a refused unsigned request
  /// reports (no secret in it).
  std::string searched;
};

/// The S3 configuration boto3 would use. Credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
/// / AWS_SESSION_TOKEN, else the profile (AWS_DEFAULT_PROFILE, else AWS_PROFILE, else
/// "default": botocore reads them in that order) of the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, else
/// ~/.aws/credentials), else the profile's credential_process (of either file, the credentials
/// file's value first), else the profile's keys in the config file (AWS_CONFIG_FILE, else
/// ~/.aws/config). credential_process is run as botocore runs it: the command line split as a
/// POSIX shell splits words (quotes and backslashes; no expansion), no shell, stdin and the
/// environment inherited; its stdout is JSON with Version 1, AccessKeyId, SecretAccessKey and
/// optionally SessionToken and Expiration (ISO 8601). The region from AWS_REGION,
/// AWS_DEFAULT_REGION, else the profile's; the endpoint from `endpoint_url`, else
/// AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else the profile's endpoint_url; the CA bundle from
/// AWS_CA_BUNDLE, else the profile's ca_bundle.
/// Throws std::invalid_argument for an endpoint that is not an http(s) URL, and RemoteError when
/// the credential_process fails: exits non-zero (its status and the first line of its stderr),
/// runs longer than `process_timeout_s` seconds (it is killed), or prints what is not such JSON;
/// the message names the profile and the command's program (never its arguments or output).
S3Config s3_config(const std::string& endpoint_url, double process_timeout_s = 60);

/// The HTTP(S) URL an s3:// URL is requested at under `config`. Throws std::invalid_argument for
/// an s3:// URL without a bucket or key.
std::string s3_http_url(const std::string& s3_url, const S3Config& config);

/// The shard URLs `data` names: a URL, a brace pattern of URLs (expand_braces), or a local list
/// file whose first entry is a URL (one per line; blank lines and '#' comments skipped). Throws
/// std::invalid_argument for a scheme check_url refuses; returns an empty list when `data` names
/// no URL.
std::vector<std::string> remote_shard_urls(const std::string& data);

/// What a RemoteShards fetched and what its local cache served, summed over its life (every
/// loader over it, the open's requests included).
struct RemoteStats {
  int64_t requests = 0;                 ///< requests that succeeded (HEADs, index and range GETs)
  int64_t bytes_fetched = 0;            ///< their body bytes
  int64_t cache_hits = 0;               ///< samples read from DataOptions::cache_dir
  int64_t cache_hit_bytes = 0;          ///< their bytes
  int64_t cache_checksum_failures = 0;  ///< cached samples whose bytes failed their CRC-32C: fetched again
  int64_t cache_read_errors = 0;        ///< cached samples the disk could not give back: fetched again
  /// The shards' sizes summed (their HEADs' Content-Length): bytes_fetched / dataset_bytes is the
  /// egress in copies of the dataset.
  int64_t dataset_bytes = 0;
  /// Shard-granular reads (DataOptions::remote_read): whole shards or chunks fetched (GETs that
  /// succeeded; from the cache: not counted), those fetched again while samples of them were
  /// still to be read in the same order (evicted to keep remote_shards_in_flight), and the most
  /// bytes one loader's reader held in memory at once.
  int64_t chunks_fetched = 0;
  int64_t chunks_refetched = 0;
  int64_t peak_held_bytes = 0;
};

/// WebDataset tar shards read over HTTP(S) or S3: the samples, order and labels of TarShards over
/// the same shards on a local disk (shard order, then archive order).
class RemoteShards : public Dataset {
 public:
  /// Opens `urls` (their indexes and HEADs, all requests in flight at once). `source`: what the
  /// user gave, for messages. Throws RemoteError naming the object (403, 404, retries exhausted,
  /// a redirect), ShardError for an index or tar that cannot be used, std::invalid_argument for
  /// a refused scheme.
  RemoteShards(std::vector<std::string> urls, const std::string& source, const DataOptions& options = {});
  ~RemoteShards() override;
  int64_t size() const override;
  SampleRef at(int64_t i) const override;
  const std::vector<std::string>& classes() const override { return classes_; }
  /// One ranged GET of sample i's image member (retried as the header says).
  void read(int64_t i, const SampleRef& ref, decode::ByteBuffer& out) const override;
  /// remote_read's reader (DataOptions::remote_read): auto is the shard reader for
  /// ReadOrder::kShardRuns, else chooses per announced plan.
  std::unique_ptr<SampleReader> reader(ReadOrder order = ReadOrder::kAny) const override;
  const std::vector<std::string>& shards() const;
  /// Samples per shard in shards() order (each shard's samples are contiguous, in archive order).
  std::vector<int64_t> shard_sizes() const override;
  bool remote() const override { return true; }
  /// How many shards' indexes came from `<shard>.gpufeed-idx`, from the index cache, and from
  /// reading their tar headers.
  int64_t indexes_beside() const { return beside_; }
  int64_t indexes_cached() const { return cached_; }
  int64_t indexes_built() const { return built_; }
  /// The requests and the cache's use so far.
  RemoteStats stats() const;
  /// The options it was opened with.
  const DataOptions& options() const;
  /// The units shard-granular reads fetch shard s in (remote_read shards): 1 for a shard of at
  /// most remote_chunk MiB, else its bytes / remote_chunk MiB, rounded down (the last chunk takes
  /// the rest); averaged over the shards.
  double mean_units_per_shard() const;

 private:
  // The samples' places, the client and the cache: what this dataset and its readers read
  // through (src/remote_store.h).
  std::unique_ptr<remote::Store> store_;
  std::vector<std::string> classes_;
  int64_t beside_ = 0, cached_ = 0, built_ = 0;
};

}  // namespace gpufeed::datasets
