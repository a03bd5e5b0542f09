#include "gpufeed/profiler/trace.h"

#include "gpufeed/profiler/atomic_file.h"
#include "gpufeed/json_text.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

namespace gpufeed::profiler {

struct TraceRecorder::Impl {
  size_t head_cap = 0, tail_cap = 0;
  int64_t origin_ns = 0;
  mutable std::mutex mu;
  std::vector<TraceEvent> head;  // the first head_cap events, in arrival order
  std::vector<TraceEvent> tail;  // a ring of the latest tail_cap events
  size_t tail_next = 0;          // ring position of the oldest entry once full
  int64_t dropped = 0;
  std::map<int, std::pair<std::string, int>> tracks;

  void add_locked(const TraceEvent& e) {
    if (head.size() < head_cap) {
      head.push_back(e);
    } else if (tail.size() < tail_cap) {
      tail.push_back(e);
    } else {
      tail[tail_next] = e;
      tail_next = (tail_next + 1) % tail_cap;
      ++dropped;
    }
  }
};

TraceRecorder::TraceRecorder(size_t max_events, int64_t origin_ns)
    : impl_(std::make_unique<Impl>()) {
  if (max_events < 2) throw std::invalid_argument("TraceRecorder: max_events must be >= 2");
  impl_->head_cap = max_events / 2;
  impl_->tail_cap = max_events - impl_->head_cap;
  impl_->origin_ns = origin_ns;
  impl_->head.reserve(std::min<size_t>(impl_->head_cap, 1 << 16));
}

TraceRecorder::~TraceRecorder() = default;

void TraceRecorder::name_track(int track, const std::string& name, int sort_index) {
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->tracks[track] = {name, sort_index};
}

void TraceRecorder::add(const TraceEvent& event) {
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->add_locked(event);
}

void TraceRecorder::add_group(std::span<const TraceEvent> events) {
  std::lock_guard<std::mutex> g(impl_->mu);
  if (impl_->head.size() + events.size() > impl_->head_cap &&
      impl_->head.size() < impl_->head_cap) {
    impl_->head_cap = impl_->head.size();  // the head ends before a group that does not fit whole
  }
  for (const TraceEvent& e : events) impl_->add_locked(e);
}

size_t TraceRecorder::size() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->head.size() + impl_->tail.size();
}

int64_t TraceRecorder::dropped() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->dropped;
}

void TraceRecorder::write(const std::filesystem::path& path, const std::string& info) const {
  std::vector<TraceEvent> events;
  std::map<int, std::pair<std::string, int>> tracks;
  int64_t dropped = 0;
  {
    std::lock_guard<std::mutex> g(impl_->mu);
    events = impl_->head;
    // The ring, oldest first; a group it cut at its old end loses only whole events, never spans'
    // times, so whatever remains still nests.
    events.insert(events.end(), impl_->tail.begin() + static_cast<std::ptrdiff_t>(impl_->tail_next),
                  impl_->tail.end());
    events.insert(events.end(), impl_->tail.begin(),
                  impl_->tail.begin() + static_cast<std::ptrdiff_t>(impl_->tail_next));
    tracks = impl_->tracks;
    dropped = impl_->dropped;
  }
  // Parents before children at equal start times: longer spans first.
  std::stable_sort(events.begin(), events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.begin_ns != b.begin_ns ? a.begin_ns < b.begin_ns : a.dur_ns > b.dur_ns;
  });
  const double origin = static_cast<double>(impl_->origin_ns);
  const auto us = [&](int64_t ns) { return (static_cast<double>(ns) - origin) / 1000.0; };
  nlohmann::json list = nlohmann::json::array();
  list.push_back({{"ph", "M"},
                  {"pid", 1},
                  {"tid", 0},
                  {"name", "process_name"},
                  {"args", {{"name", "gpufeed"}}}});
  for (const auto& [track, named] : tracks) {
    list.push_back({{"ph", "M"},
                    {"pid", 1},
                    {"tid", track},
                    {"name", "thread_name"},
                    {"args", {{"name", named.first}}}});
    list.push_back({{"ph", "M"},
                    {"pid", 1},
                    {"tid", track},
                    {"name", "thread_sort_index"},
                    {"args", {{"sort_index", named.second}}}});
  }
  for (const TraceEvent& e : events) {
    nlohmann::json j = {{"name", e.name}, {"pid", 1}, {"tid", e.track}, {"ts", us(e.begin_ns)}};
    if (e.kind == TraceEvent::Kind::kSpan) {
      j["ph"] = "X";
      j["dur"] = static_cast<double>(e.dur_ns) / 1000.0;
      if (e.id >= 0) j["args"] = {{"id", e.id}};
    } else {
      j["ph"] = "C";
      nlohmann::json args = nlohmann::json::object();
      for (int k = 0; k < TraceEvent::kMaxSeries && e.keys[k]; ++k) args[e.keys[k]] = e.values[k];
      j["args"] = std::move(args);
    }
    list.push_back(std::move(j));
  }
  nlohmann::json other = nlohmann::json::parse(info.empty() ? "{}" : info);
  other["dropped_events"] = dropped;
  other["kept_events"] = events.size();
  const nlohmann::json doc = {
      {"traceEvents", std::move(list)}, {"displayTimeUnit", "ms"}, {"otherData", std::move(other)}};
  const std::string text = json_text(doc);
  try {
    write_file_atomically(path, std::vector<char>(text.begin(), text.end()));
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("trace: ") + e.what());
  }
}

}  // namespace gpufeed::profiler
