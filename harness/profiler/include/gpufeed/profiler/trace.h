#pragma once
// A Chrome trace (the JSON that Perfetto and chrome://tracing open), recorded from many threads
// and bounded in size: long runs keep their first and their last events and count the rest.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>

namespace gpufeed::profiler {

/// One trace event. Names and series keys must be string literals (or otherwise outlive the
/// recorder): events are stored by the hundred thousand and never copy strings.
struct TraceEvent {
  enum class Kind : uint8_t {
    kSpan,     ///< a complete span ("ph":"X") on track `track`: [begin_ns, begin_ns + dur_ns)
    kCounter,  ///< counter values ("ph":"C") at begin_ns, one series per key
  };
  Kind kind = Kind::kSpan;
  const char* name = "";
  int track = 0;         ///< "tid" of the event; name tracks with TraceRecorder::name_track
  int64_t begin_ns = 0;  ///< steady_clock time since its epoch
  int64_t dur_ns = 0;    ///< spans only
  int64_t id = -1;       ///< spans: written as args.id when >= 0 (step number, sample index)
  static constexpr int kMaxSeries = 4;
  const char* keys[kMaxSeries] = {};  ///< counters: series names, first null ends the list
  double values[kMaxSeries] = {};     ///< counters: one value per key
};

/// Collects events from any thread and writes them as one Chrome trace JSON object:
/// {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}. Timestamps are written
/// in microseconds since `origin_ns`. Thread-safe.
class TraceRecorder {
 public:
  /// Keeps at most `max_events` events: the first max_events / 2 and the most recent
  /// max_events / 2 (a ring); the ones in between are counted in dropped(). max_events >= 2.
  TraceRecorder(size_t max_events, int64_t origin_ns);
  ~TraceRecorder();

  /// Names track `track` (a "thread" in the viewer) and orders it among the others.
  void name_track(int track, const std::string& name, int sort_index);
  /// Adds one event.
  void add(const TraceEvent& event);
  /// Adds events together: a ring that drops old events never splits a group it keeps whole.
  void add_group(std::span<const TraceEvent> events);
  /// Events held now.
  size_t size() const;
  /// Events dropped from the middle of the run so far.
  int64_t dropped() const;
  /// Writes the trace (held events sorted by time) to `path`, atomically (temp file + rename).
  /// `info` is a JSON object text put under "otherData" (pass "{}" for none). Throws
  /// std::runtime_error naming the path on an I/O error.
  void write(const std::filesystem::path& path, const std::string& info = "{}") const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpufeed::profiler
