#pragma once
// The HTTP(S)/S3 client behind remote datasets (internal): one thread driving libcurl's multi
// interface, so any number of ranged GETs are in flight on reused connections without a thread
// each. Requests are retried with backoff on timeouts, resets, short bodies, throttling and 5xx;
// every message names the URL redacted (redact_url). S3 requests are signed with libcurl's
// CURLOPT_AWS_SIGV4 with credentials found as boto3 finds them (aws_config.cpp).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpufeed/decode/decoder.h"
#include "gpufeed/datasets/dataset.h"
#include "gpufeed/datasets/remote.h"

namespace gpufeed::datasets::remote {

using datasets::S3Config;
using datasets::s3_config;
using datasets::s3_http_url;

/// One request: a HEAD, or a GET of bytes [offset, offset + size) (size < 0: the whole object).
struct Request {
  std::string url{};  ///< as the user gave it (http, https or s3)
  bool head = false;
  int64_t offset = 0, size = -1;
  std::string if_match{};  ///< ETag the object must still have ("" = any)
  bool missing_ok = false;  ///< a 404 or 403 is a result (its status), not an error
};

/// Its outcome, delivered once.
/// How the error of a ranged GET answered with the whole object (HTTP 200) begins.
inline constexpr std::string_view kRangeIgnored = "HTTP 200: the server ignored the Range request";

struct Response {
  int status = 0;            ///< the HTTP status (0 when it failed before one)
  int64_t object_size = -1;  ///< the object's size (HEAD's Content-Length, a range's "/total")
  std::string etag;
  decode::ByteBuffer body;
  std::string error;  ///< non-empty: it failed (after its retries); names the URL, redacted
  int attempts = 0;
  /// It failed because the server answered a ranged GET with the whole object (error begins
  /// with kRangeIgnored): no retry or other request to that server will do better.
  bool range_ignored = false;
};

using Callback = std::function<void(Response&&)>;

/// Requests that succeeded so far, and their body bytes.
struct ClientStats {
  int64_t requests = 0, bytes = 0;
};

class Client {
 public:
  explicit Client(const DataOptions& options);
  ~Client();  // fails what is pending with "cancelled" and joins the thread
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// Queues `r`; `done` runs once, on the client's thread (it may submit again, never wait).
  void submit(Request r, Callback done);
  /// submit and wait. Throws RemoteError with the response's error.
  Response fetch(Request r);

  const DataOptions& options() const { return options_; }
  ClientStats stats() const;

 private:
  struct Impl;
  DataOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpufeed::datasets::remote
