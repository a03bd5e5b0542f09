#include "remote_client.h"

#include <curl/curl.h>
#include <unistd.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <future>
#include <list>
#include <mutex>
#include <random>
#include <thread>

#include "gpufeed/log.h"
#include "gpufeed/datasets/ca_bundle.h"
#include "gpufeed/datasets/remote.h"

namespace gpufeed::datasets::remote {
namespace {

using Clock = std::chrono::steady_clock;

void global_init() {
  static const CURLcode rc = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (rc != CURLE_OK) throw RemoteError(std::string("libcurl: ") + curl_easy_strerror(rc));
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

// A status worth retrying: request timeout, throttling, server errors.
bool retryable_status(int status) {
  return status == 408 || status == 429 || status == 500 || status == 502 || status == 503 || status == 504;
}

// A transport failure worth retrying: the connection failed, stalled, was reset or cut short.
bool retryable_curl(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

// The <Code> and <Message> of an S3 error body, for messages (nothing else of it is printed: some
// error bodies echo the string that was signed).
std::string s3_error_code(const decode::ByteBuffer& body) {
  const std::string_view text(reinterpret_cast<const char*>(body.data()), body.size());
  const auto field = [&](std::string_view tag) -> std::string {
    std::string open = "<", close = "</";
    open.append(tag).push_back('>');
    close.append(tag).push_back('>');
    const auto b = text.find(open);
    if (b == std::string_view::npos) return {};
    const auto e = text.find(close, b);
    if (e == std::string_view::npos) return {};
    return std::string(text.substr(b + open.size(), std::min<size_t>(e - b - open.size(), 200)));
  };
  const std::string code = field("Code");
  if (code.empty()) return {};
  const std::string message = field("Message");
  return message.empty() ? code : code + " (" + message + ")";
}

// The CA certificates for https (ca_bundle.h's search). The variables are read at every request
// (a process may set them after its first dataset); a search that found something is kept while
// they stay the same, one that found nothing is run again (the file may appear).
CaBundle ca_bundle() {
  thread_local std::string key;
  thread_local CaBundle found;
  std::string now;
  for (const char* name : {"AWS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR"}) {
    const char* v = std::getenv(name);
    now.append(v ? v : "").push_back('\0');
  }
  if (found.found() && now == key) return found;
  CaBundle b = find_ca_bundle();
  if (b.found()) {
    key = std::move(now);
    found = b;
  }
  return b;
}

std::string describe(const Request& r) {
  if (r.head) return "HEAD " + redact_url(r.url);
  if (r.size < 0) return "GET " + redact_url(r.url);
  return fmt::format("GET {} bytes {}-{}", redact_url(r.url), r.offset, r.offset + r.size - 1);
}

}  // namespace

struct Client::Impl {
  struct Transfer {
    Request request;
    Callback done;
    std::string http_url;
    int attempts = 0;
    Clock::time_point not_before{};
    std::vector<std::string> failures;  // one per failed attempt, for the final message
    double retry_after_s = -1;
    // the attempt in progress
    CURL* easy = nullptr;
    curl_slist* headers = nullptr;
    Response response;
    bool too_long = false;
    bool range_ignored = false;  // the final failure: a ranged GET answered with the whole object
    std::string location;
    decode::ByteBuffer error_body;
  };

  DataOptions options;
  S3Config s3;  // client thread only, as the three below
  bool s3_loaded = false;
  std::string s3_error;              // why the first load failed
  Clock::time_point s3_loaded_at{};  // the last load's start
  CURLM* multi = nullptr;
  std::mutex mu;  // guards incoming, stop
  std::deque<std::unique_ptr<Transfer>> incoming;
  bool stop = false;
  std::thread thread;
  // client thread only
  std::list<std::unique_ptr<Transfer>> waiting;  // queued or backing off
  std::vector<std::unique_ptr<Transfer>> active;
  std::mt19937_64 rng{std::random_device{}()};
  std::atomic<int64_t> requests{0}, bytes{0};  // succeeded, and their body bytes

  explicit Impl(const DataOptions& o) : options(o) {
    global_init();
    multi = curl_multi_init();
    if (multi == nullptr) throw RemoteError("libcurl: curl_multi_init failed");
    curl_multi_setopt(multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, static_cast<long>(options.max_requests));
    thread = std::thread([this] { run(); });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> g(mu);
      stop = true;
    }
    curl_multi_wakeup(multi);
    thread.join();
    curl_multi_cleanup(multi);
  }

  // The S3 configuration: loaded at the first s3:// request, and again when credentials from a
  // credential_process come within 15 minutes of their Expiration (botocore's advisory window;
  // at most once a minute until they expire, then at every request until a load succeeds). A
  // refresh that fails while the old credentials are still valid keeps them, with a warning.
  // Throws what the load threw; a first load that failed is not run again (every request fails
  // with its message).
  const S3Config& s3_config_once() {
    const auto now = Clock::now();
    if (!s3_loaded && !s3_error.empty()) throw RemoteError(s3_error);
    if (s3_loaded) {
      if (!s3.expiration) return s3;
      const auto wall = std::chrono::system_clock::now();
      const bool expired = wall >= *s3.expiration;
      if (wall < *s3.expiration - std::chrono::minutes(15) ||
          (!expired && now - s3_loaded_at < std::chrono::minutes(1))) {
        return s3;
      }
    }
    s3_loaded_at = now;
    try {
      S3Config fresh = remote::s3_config(options.endpoint_url);
      if (!s3_loaded && fresh.access_key.empty()) {
        gpufeed::log()->info("remote shards: no AWS credentials found, s3:// requests go unsigned (public buckets); "
                             "looked at {}",
                             fresh.searched);
      }
      s3 = std::move(fresh);
      s3_loaded = true;
    } catch (const std::exception& e) {
      if (s3_loaded && std::chrono::system_clock::now() < *s3.expiration) {
        gpufeed::log()->warn("remote shards: refreshing the AWS credentials failed, the current ones (valid until "
                             "their Expiration) stay in use: {}",
                             e.what());
        return s3;
      }
      s3_loaded = false;
      s3_error = e.what();
      throw;
    }
    return s3;
  }

  void submit(std::unique_ptr<Transfer> t) {
    {
      std::lock_guard<std::mutex> g(mu);
      if (!stop) {
        incoming.push_back(std::move(t));
        t = nullptr;
      }
    }
    if (t) {
      fail(*t, interrupted() ? "cancelled (interrupted)" : "cancelled (the client is shutting down)");
      return;
    }
    curl_multi_wakeup(multi);
  }

  static size_t on_header(char* data, size_t size, size_t n, void* user) {
    auto& t = *static_cast<Transfer*>(user);
    const std::string_view line(data, size * n);
    if (line.starts_with("HTTP/")) {  // a new response (after a 100 Continue, say)
      t.response.etag.clear();
      t.location.clear();
      return size * n;
    }
    const auto colon = line.find(':');
    if (colon == std::string_view::npos) return size * n;
    const std::string name = lower(trim(line.substr(0, colon)));
    const std::string value = trim(line.substr(colon + 1));
    if (name == "etag") {
      t.response.etag = value;
    } else if (name == "content-range") {
      if (const auto slash = value.rfind('/'); slash != std::string::npos && value.substr(slash + 1) != "*") {
        t.response.object_size = std::strtoll(value.c_str() + slash + 1, nullptr, 10);
      }
    } else if (name == "content-length" && (t.request.head || t.request.size < 0)) {
      t.response.object_size = std::strtoll(value.c_str(), nullptr, 10);
    } else if (name == "location") {
      t.location = value;
    } else if (name == "retry-after") {
      t.retry_after_s = std::strtod(value.c_str(), nullptr);
    }
    return size * n;
  }

  static size_t on_body(char* data, size_t size, size_t n, void* user) {
    auto& t = *static_cast<Transfer*>(user);
    long status = 0;
    curl_easy_getinfo(t.easy, CURLINFO_RESPONSE_CODE, &status);
    const size_t bytes = size * n;
    if (status >= 300) {  // an error's body: kept for its S3 code, at most 64 KiB
      const size_t keep = std::min(bytes, size_t{65536} - std::min<size_t>(65536, t.error_body.size()));
      t.error_body.insert(t.error_body.end(), data, data + keep);
      return bytes;
    }
    decode::ByteBuffer& body = t.response.body;
    if (t.request.size >= 0 && body.size() + bytes > static_cast<size_t>(t.request.size) && (status == 206 || status == 200)) {
      t.too_long = true;
      return 0;  // more than the range asked for: abort
    }
    const size_t old = body.size();
    body.resize(old + bytes);
    std::memcpy(body.data() + old, data, bytes);
    return bytes;
  }

  void start(std::unique_ptr<Transfer> t) {
    ++t->attempts;
    t->response = Response{};
    t->too_long = false;
    t->location.clear();
    t->error_body.clear();
    t->retry_after_s = -1;
    const Request& r = t->request;
    const S3Config* s3c = nullptr;  // for s3:// URLs
    if (r.url.starts_with("s3://")) {
      try {
        s3c = &s3_config_once();
      } catch (const std::exception& e) {
        fail(*t, describe(r) + ": " + e.what());
        return;
      }
    }
    if (t->http_url.empty()) {
      try {
        t->http_url = s3c != nullptr ? s3_http_url(r.url, *s3c) : r.url;
      } catch (const std::exception& e) {
        fail(*t, e.what());
        return;
      }
    }
    CaBundle ca = ca_bundle();
    if (s3c != nullptr && !s3c->ca_bundle.empty()) ca.file = s3c->ca_bundle;
    if (!ca.found() && t->http_url.starts_with("https://")) {
      fail(*t, describe(r) + ": " + ca.missing_message());
      return;
    }
    CURL* e = curl_easy_init();
    t->easy = e;
    curl_easy_setopt(e, CURLOPT_URL, t->http_url.c_str());
    curl_easy_setopt(e, CURLOPT_PRIVATE, t.get());
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
    if (!ca.file.empty()) curl_easy_setopt(e, CURLOPT_CAINFO, ca.file.c_str());
    if (!ca.dir.empty()) curl_easy_setopt(e, CURLOPT_CAPATH, ca.dir.c_str());
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &Impl::on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, t.get());
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &Impl::on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, t.get());
    const auto timeout_ms = static_cast<long>(std::ceil(options.request_timeout * 1000));
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, std::max(1L, static_cast<long>(std::ceil(options.request_timeout))));
    if (r.head) curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 256L * 1024);  // fewer reads and callbacks per body
    if (!r.head && r.size > 0) t->response.body.reserve(static_cast<size_t>(r.size));
    std::string range;
    if (!r.head && r.size >= 0) {
      range = fmt::format("{}-{}", r.offset, r.offset + std::max<int64_t>(r.size, 1) - 1);
      curl_easy_setopt(e, CURLOPT_RANGE, range.c_str());  // copied by libcurl
    }
    curl_slist* h = nullptr;
    if (!r.if_match.empty()) h = curl_slist_append(h, ("If-Match: " + r.if_match).c_str());
    if (s3c != nullptr) {
      const S3Config& c = *s3c;
      if (!c.access_key.empty()) {
        h = curl_slist_append(h, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
        if (!c.session_token.empty()) h = curl_slist_append(h, ("x-amz-security-token: " + c.session_token).c_str());
        const std::string sigv4 = "aws:amz:" + c.region + ":s3";
        curl_easy_setopt(e, CURLOPT_AWS_SIGV4, sigv4.c_str());
        curl_easy_setopt(e, CURLOPT_USERNAME, c.access_key.c_str());
        curl_easy_setopt(e, CURLOPT_PASSWORD, c.secret_key.c_str());
      }
    }
    t->headers = h;
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_multi_add_handle(multi, e);
    active.push_back(std::move(t));
  }

  void cleanup(Transfer& t) {
    if (t.easy) {
      curl_multi_remove_handle(multi, t.easy);
      curl_easy_cleanup(t.easy);
      t.easy = nullptr;
    }
    curl_slist_free_all(t.headers);
    t.headers = nullptr;
  }

  void fail(Transfer& t, const std::string& why) {
    Response r;
    r.status = t.response.status;
    r.attempts = t.attempts;
    r.error = why;
    r.range_ignored = t.range_ignored;
    if (t.done) t.done(std::move(r));
  }

  // The outcome of one attempt: "" when it succeeded (or is a result: 404 with missing_ok), else
  // what failed; `retry` says whether another attempt may help.
  std::string judge(Transfer& t, CURLcode rc, bool& retry) {
    retry = false;
    long status = 0;
    curl_easy_getinfo(t.easy, CURLINFO_RESPONSE_CODE, &status);
    t.response.status = static_cast<int>(status);
    const Request& r = t.request;
    if (t.too_long && status == 200) {
      return std::string(kRangeIgnored) + " (it sent the whole object); range requests are needed";
    }
    if (t.too_long) return fmt::format("HTTP {}: the body is longer than the {} bytes asked for", status, r.size);
    if (rc != CURLE_OK) {
      retry = retryable_curl(rc);
      if (rc == CURLE_PARTIAL_FILE) return fmt::format("HTTP {}: the body ended early (connection closed)", status);
      if (rc == CURLE_OPERATION_TIMEDOUT)
        return fmt::format("timed out (no byte for {} s)", options.request_timeout);
      return std::string(curl_easy_strerror(rc));
    }
    // An optional object (a shard's index) that is missing, or that a signed URL does not cover.
    if ((status == 404 || status == 403) && r.missing_ok) return {};
    if (status >= 300 && status < 400) {
      return fmt::format("HTTP {}: redirected to {}; redirects are not followed (give the final URL)", status,
                         t.location.empty() ? "an unnamed location" : redact_url(t.location));
    }
    if (status >= 400) {
      retry = retryable_status(static_cast<int>(status));
      std::string what = fmt::format("HTTP {}", status);
      if (const std::string code = s3_error_code(t.error_body); !code.empty()) what += " " + code;
      if (status == 404) what += ": no such object";
      if (status == 403 && r.url.starts_with("s3://") && s3_loaded && s3.access_key.empty()) {
        what += ": access denied to an unsigned request: no AWS credentials were found (looked at " + s3.searched + ")";
      } else if (status == 403) {
        what += ": access denied (check the credentials and the object's permissions)";
      }
      if (status == 412) what += ": the object changed since it was indexed (its ETag differs)";
      if (status == 416) what += ": the range is past the object's end (the object is shorter than its index says)";
      return what;
    }
    if (!r.head && r.size >= 0) {
      const auto got = static_cast<int64_t>(t.response.body.size());
      if (status == 200 && !(r.offset == 0 && got == r.size)) {
        return fmt::format("{} (it sent {} bytes); range requests are needed", kRangeIgnored, got);
      }
      if (got != r.size) {
        retry = true;
        return fmt::format("HTTP {}: {} bytes of the {} asked for (a short body)", status, got, r.size);
      }
    }
    return {};
  }

  void finish(std::unique_ptr<Transfer> t, CURLcode rc) {
    bool retry = false;
    const std::string failure = judge(*t, rc, retry);
    cleanup(*t);
    if (failure.empty()) {
      Response r = std::move(t->response);
      r.attempts = t->attempts;
      ++requests;
      bytes += static_cast<int64_t>(r.body.size());
      if (t->done) t->done(std::move(r));
      return;
    }
    t->failures.push_back(failure);
    if (retry && t->attempts <= options.max_retries) {
      // Full jitter over an exponential bound (0.1 s doubling, at most 10 s); Retry-After raises it.
      const double bound = std::min(10.0, 0.1 * std::pow(2.0, t->attempts - 1));
      double wait = std::uniform_real_distribution<double>(bound / 2, bound)(rng);
      if (t->retry_after_s > 0) wait = std::max(wait, std::min(t->retry_after_s, 30.0));
      t->not_before = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait));
      waiting.push_back(std::move(t));
      return;
    }
    std::string tried;
    if (t->attempts > 1) {
      tried = fmt::format(" after {} attempts (", t->attempts);
      for (size_t i = 0; i < t->failures.size(); ++i) tried += (i ? "; " : "") + t->failures[i];
      tried += ")";
    }
    t->range_ignored = failure.starts_with(kRangeIgnored);
    fail(*t, fmt::format("{}: {}{}", describe(t->request), failure, tried));
  }

  // Starts what may start: queued transfers whose backoff is over, while fewer than max_requests
  // run. Returns the milliseconds until the next backoff ends (or 1000).
  long start_ready() {
    long next_ms = 1000;
    const auto now = Clock::now();
    for (auto it = waiting.begin(); it != waiting.end() && static_cast<int>(active.size()) < options.max_requests;) {
      if ((*it)->not_before <= now) {
        std::unique_ptr<Transfer> t = std::move(*it);
        it = waiting.erase(it);
        start(std::move(t));
      } else {
        next_ms = std::min<long>(
            next_ms,
            1 + static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>((*it)->not_before - now).count()));
        ++it;
      }
    }
    return next_ms;
  }

  bool interrupted() const { return options.interrupt && options.interrupt->load(std::memory_order_relaxed); }

  void run() {
    for (;;) {
      {
        std::lock_guard<std::mutex> g(mu);
        if (stop || interrupted()) break;
        while (!incoming.empty()) {
          waiting.push_back(std::move(incoming.front()));
          incoming.pop_front();
        }
      }
      const long wait_ms = start_ready();
      int running = 0;
      curl_multi_perform(multi, &running);
      int left = 0;
      while (CURLMsg* m = curl_multi_info_read(multi, &left)) {
        if (m->msg != CURLMSG_DONE) continue;
        const auto it = std::find_if(active.begin(), active.end(), [&](const auto& t) { return t->easy == m->easy_handle; });
        if (it == active.end()) continue;
        std::unique_ptr<Transfer> t = std::move(*it);
        active.erase(it);
        finish(std::move(t), m->data.result);
      }
      curl_multi_poll(multi, nullptr, 0, static_cast<int>(std::min(wait_ms, 200L)), nullptr);
    }
    // Shutting down (or interrupted: later submits fail too): everything pending fails, once.
    std::deque<std::unique_ptr<Transfer>> rest;
    {
      std::lock_guard<std::mutex> g(mu);
      stop = true;
      rest.swap(incoming);
    }
    const std::string why = interrupted() ? ": cancelled (interrupted)" : ": cancelled (the client is shutting down)";
    for (auto& t : active) {
      cleanup(*t);
      fail(*t, describe(t->request) + why);
    }
    for (auto& t : waiting) fail(*t, describe(t->request) + why);
    for (auto& t : rest) fail(*t, describe(t->request) + why);
    active.clear();
    waiting.clear();
  }
};

Client::Client(const DataOptions& options) : options_(options), impl_(std::make_unique<Impl>(options)) {}

Client::~Client() = default;

void Client::submit(Request r, Callback done) {
  auto t = std::make_unique<Impl::Transfer>();
  t->request = std::move(r);
  t->done = std::move(done);
  impl_->submit(std::move(t));
}

ClientStats Client::stats() const { return {.requests = impl_->requests.load(), .bytes = impl_->bytes.load()}; }

Response Client::fetch(Request r) {
  auto promise = std::make_shared<std::promise<Response>>();
  std::future<Response> result = promise->get_future();
  submit(std::move(r), [promise](Response&& response) { promise->set_value(std::move(response)); });
  Response response = result.get();
  if (!response.error.empty()) throw RemoteError(response.error);
  return response;
}

}  // namespace gpufeed::datasets::remote
