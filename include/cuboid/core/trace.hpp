#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// Chrome trace-event writer (the JSON object format that chrome://tracing,
// Perfetto and TensorBoard open): pid = rank, one tid per stream, "M" events
// naming processes and threads, "X" complete events in microseconds with
// nanosecond precision (three decimals, plus 0.01 ns so that importers that
// truncate get the same nanoseconds, see trace.cpp). Events of one (pid, tid)
// must nest strictly (each pair either disjoint or one inside the other);
// write() verifies that and throws otherwise, and writes each thread's events
// enclosing-first. The rules come from Perfetto's JSON importer; tools/check-trace
// lists them with the source that enforces each. Large runs stay openable by recording
// only selected ranks (set_ranks / wants) and by writing one file per rank,
// each with PyTorch-profiler-style top-level "distributedInfo": {"rank": r}.
// Files are written atomically (temporary file, then rename).
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cuboid {

class TraceWriter {
 public:
  TraceWriter() = default;

  // Only these ranks are recorded (empty: every rank). Call before adding.
  void set_ranks(std::vector<int> ranks);
  bool wants(int rank) const;
  void set_world_size(int world_size) { world_size_ = world_size; }

  // Thread ids in the file are `tid + 1`: Perfetto reads tid 0 as "no tid"
  // and substitutes the pid (json_trace_tokenizer.cc), which would put rank
  // 1's stream 0 on its stream 1.
  static constexpr int json_tid(int tid) { return tid + 1; }

  void set_process_name(int rank, std::string name);
  // `sort_index` orders the threads of a process in the viewer.
  void set_thread_name(int rank, int tid, std::string name, int sort_index = 0);
  // A complete ("X") event; ignored when the rank is not wanted. `args` is a
  // JSON object text ("{...}") or empty.
  void add_complete(int rank, int tid, std::string_view name, std::string_view category, std::int64_t start_ns,
                    std::int64_t duration_ns, std::string args = {});

  std::size_t num_events() const { return events_.size(); }
  std::vector<int> ranks_with_events() const;

  // Throws std::logic_error naming the first pair of events on one
  // (pid, tid) that overlap without nesting.
  void check_nesting() const;

  // One file with every recorded rank.
  void write(const std::filesystem::path& path) const;
  // One file per recorded rank: "out.json" -> "out.rank0.json", ...; each
  // carries "distributedInfo": {"rank": r, "world_size": n}. Returns the paths.
  std::vector<std::filesystem::path> write_per_rank(const std::filesystem::path& path) const;
  static std::filesystem::path rank_path(const std::filesystem::path& path, int rank);

  // The document as text (all ranks, or one rank with distributedInfo).
  std::string to_string(std::optional<int> only_rank = std::nullopt) const;

 private:
  struct Event {
    std::int64_t start_ns = 0;
    std::int64_t duration_ns = 0;
    int rank = 0;
    int tid = 0;
    std::uint32_t name = 0;      // index into names_ (interned, JSON-escaped)
    std::uint32_t category = 0;
    std::string args;
  };
  struct Thread {
    std::string name;
    int sort_index = 0;
  };
  std::uint32_t intern(std::string_view s);
  // Event indices by (rank, tid, start, longest first, insertion).
  std::vector<std::uint32_t> nesting_order() const;
  void check_nesting(const std::vector<std::uint32_t>& order) const;
  std::string render(std::optional<int> only_rank, const std::vector<std::uint32_t>& order) const;
  void append_events(std::string& out, std::optional<int> only_rank, const std::vector<std::uint32_t>& order) const;

  std::vector<int> ranks_;  // sorted; empty = all
  int world_size_ = 0;
  std::vector<Event> events_;
  std::vector<std::string> names_;  // JSON string literals, quotes included
  std::unordered_map<std::string, std::uint32_t> name_index_;
  std::map<int, std::string> process_names_;
  std::map<std::pair<int, int>, Thread> thread_names_;
};

// Above this size a JSON trace does not open in chrome://tracing (256 MB,
// google/perfetto#99) and strains the Perfetto UI, whose in-browser engine has
// about 2 GB for the whole parsed trace (perfetto.dev/docs/visualization/large-traces).
inline constexpr std::uintmax_t kTraceViewerLimitBytes = std::uintmax_t{256} << 20;

// Parses "0,8,16" (the --trace-ranks flag) into ranks; throws
// std::invalid_argument on anything but non-negative integers and commas.
std::vector<int> parse_rank_list(std::string_view text);

}  // namespace cuboid
