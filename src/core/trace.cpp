// Chrome trace-event JSON (see trace.hpp). The text is produced by hand, not
// through a JSON DOM: a trace of one rank of a long pipeline has hundreds of
// thousands of events, and names are escaped once when interned.
#include "cuboid/core/trace.hpp"

#include "cuboid/core/error.hpp"
#include "cuboid/core/files.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <stdexcept>
#include <system_error>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace cuboid {

namespace {

// Microseconds with nanosecond precision plus 0.01 ns: 1234567 ns ->
// "1234.56701". Perfetto's importer turns ts and dur into nanoseconds each on
// its own, in all but its newest parser as int64(double(x) * 1000), which
// truncates: "1.001" becomes 1000 ns, and a kernel ending where its span ends
// then sticks out by 1 ns and is dropped or mis-parented (json_utils.cc
// CoerceToTs; about 1 value in 130, 150 overlaps in one rank of the seed
// trace). The extra 0.01 ns lifts every value above the double's rounding
// error, so truncating, rounding (newer Perfetto) and exact decimal readers
// all get the same ns.
void append_us(std::string& out, std::int64_t ns) {
  if (ns < 0) {
    out += '-';
    ns = -ns;
  }
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, ns / 1000);
  out.append(buf, end);
  const auto frac = static_cast<int>(ns % 1000);
  out += '.';
  out += static_cast<char>('0' + frac / 100);
  out += static_cast<char>('0' + frac / 10 % 10);
  out += static_cast<char>('0' + frac % 10);
  out += "01";
}

void append_int(std::string& out, std::int64_t v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, end);
}

std::string json_quoted(std::string_view s) { return nlohmann::json(std::string(s)).dump(); }

void append_metadata(std::string& out, bool& first, std::string_view what, int pid, int tid, std::string_view arg_key,
                     const std::string& arg_json) {
  out += first ? "\n" : ",\n";
  first = false;
  out += R"({"ph":"M","name":")";
  out += what;
  out += R"(","pid":)";
  append_int(out, pid);
  out += R"(,"tid":)";
  append_int(out, TraceWriter::json_tid(tid));
  out += R"(,"args":{")";
  out += arg_key;
  out += "\":";
  out += arg_json;
  out += "}}";
}

}  // namespace

void TraceWriter::set_ranks(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  ranks_ = std::move(ranks);
}

bool TraceWriter::wants(int rank) const {
  return ranks_.empty() || std::binary_search(ranks_.begin(), ranks_.end(), rank);
}

void TraceWriter::set_process_name(int rank, std::string name) {
  if (wants(rank)) process_names_[rank] = std::move(name);
}

void TraceWriter::set_thread_name(int rank, int tid, std::string name, int sort_index) {
  if (wants(rank)) thread_names_[{rank, tid}] = Thread{std::move(name), sort_index};
}

std::uint32_t TraceWriter::intern(std::string_view s) {
  auto it = name_index_.find(std::string(s));
  if (it != name_index_.end()) return it->second;
  const auto id = static_cast<std::uint32_t>(names_.size());
  names_.push_back(json_quoted(s));
  name_index_.emplace(std::string(s), id);
  return id;
}

void TraceWriter::add_complete(int rank, int tid, std::string_view name, std::string_view category,
                               std::int64_t start_ns, std::int64_t duration_ns, std::string args) {
  if (!wants(rank)) return;
  Event e;
  e.start_ns = start_ns;
  e.duration_ns = std::max<std::int64_t>(0, duration_ns);
  e.rank = rank;
  e.tid = tid;
  e.name = intern(name);
  e.category = intern(category);
  e.args = std::move(args);
  events_.push_back(std::move(e));
}

std::vector<int> TraceWriter::ranks_with_events() const {
  std::vector<int> r;
  for (const Event& e : events_) r.push_back(e.rank);
  for (const auto& [rank, name] : process_names_) r.push_back(rank);
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

std::vector<std::uint32_t> TraceWriter::nesting_order() const {
  std::vector<std::uint32_t> idx(events_.size());
  std::iota(idx.begin(), idx.end(), 0U);
  // Per (pid, tid): by start, the longer (enclosing) first.
  std::sort(idx.begin(), idx.end(), [&](std::uint32_t a, std::uint32_t b) {
    const Event& x = events_[a];
    const Event& y = events_[b];
    if (x.rank != y.rank) return x.rank < y.rank;
    if (x.tid != y.tid) return x.tid < y.tid;
    if (x.start_ns != y.start_ns) return x.start_ns < y.start_ns;
    if (x.duration_ns != y.duration_ns) return x.duration_ns > y.duration_ns;
    return a < b;
  });
  return idx;
}

void TraceWriter::check_nesting() const { check_nesting(nesting_order()); }

void TraceWriter::check_nesting(const std::vector<std::uint32_t>& idx) const {
  std::vector<std::uint32_t> stack;
  for (std::size_t i = 0; i < idx.size(); ++i) {
    const Event& e = events_[idx[i]];
    if (i > 0) {
      const Event& p = events_[idx[i - 1]];
      if (p.rank != e.rank || p.tid != e.tid) stack.clear();
    }
    const std::int64_t end = e.start_ns + e.duration_ns;
    while (!stack.empty()) {
      const Event& top = events_[stack.back()];
      if (e.start_ns >= top.start_ns + top.duration_ns) {
        stack.pop_back();
        continue;
      }
      if (end > top.start_ns + top.duration_ns) {
        throw std::logic_error("trace: events " + names_[top.name] + " [" + std::to_string(top.start_ns) + ", " +
                               std::to_string(top.start_ns + top.duration_ns) + ") ns and " + names_[e.name] + " [" +
                               std::to_string(e.start_ns) + ", " + std::to_string(end) + ") ns on pid " +
                               std::to_string(e.rank) + " tid " + std::to_string(e.tid) +
                               " overlap without nesting");
      }
      break;
    }
    stack.push_back(idx[i]);
  }
}

void TraceWriter::append_events(std::string& out, std::optional<int> only_rank,
                                const std::vector<std::uint32_t>& order) const {
  bool first = true;
  for (const auto& [rank, name] : process_names_) {
    if (only_rank && *only_rank != rank) continue;
    append_metadata(out, first, "process_name", rank, 0, "name", json_quoted(name));
    append_metadata(out, first, "process_sort_index", rank, 0, "sort_index", std::to_string(rank));
  }
  for (const auto& [key, thread] : thread_names_) {
    if (only_rank && *only_rank != key.first) continue;
    append_metadata(out, first, "thread_name", key.first, key.second, "name", json_quoted(thread.name));
    append_metadata(out, first, "thread_sort_index", key.first, key.second, "sort_index",
                    std::to_string(thread.sort_index));
  }
  // Enclosing events before the ones they contain: Perfetto sorted equal
  // timestamps by file order until it sorted them longest first
  // (trace_sorter.h SlowOperatorLess), and nests what comes later inside.
  // `order` is by rank first, so one rank's events are one run of it.
  auto begin = order.begin();
  auto end = order.end();
  if (only_rank) {
    begin = std::partition_point(begin, end, [&](std::uint32_t i) { return events_[i].rank < *only_rank; });
    end = std::partition_point(begin, end, [&](std::uint32_t i) { return events_[i].rank == *only_rank; });
  }
  for (auto it = begin; it != end; ++it) {
    const Event& e = events_[*it];
    out += first ? "\n" : ",\n";
    first = false;
    out += R"({"ph":"X","name":)";
    out += names_[e.name];
    out += R"(,"cat":)";
    out += names_[e.category];
    out += R"(,"pid":)";
    append_int(out, e.rank);
    out += R"(,"tid":)";
    append_int(out, json_tid(e.tid));
    out += R"(,"ts":)";
    append_us(out, e.start_ns);
    out += R"(,"dur":)";
    append_us(out, e.duration_ns);
    if (!e.args.empty()) {
      out += R"(,"args":)";
      out += e.args;
    }
    out += '}';
  }
}

std::string TraceWriter::to_string(std::optional<int> only_rank) const { return render(only_rank, nesting_order()); }

std::string TraceWriter::render(std::optional<int> only_rank, const std::vector<std::uint32_t>& order) const {
  std::string out;
  out.reserve(64 + events_.size() * 120);
  // No "displayTimeUnit": older Perfetto read every ts and dur as
  // nanoseconds when it said "ns" (json_trace_tokenizer.cc, json_tracker.h).
  out += "{";
  if (only_rank) {
    out += R"("distributedInfo":{"rank":)";
    append_int(out, *only_rank);
    if (world_size_ > 0) {
      out += R"(,"world_size":)";
      append_int(out, world_size_);
    }
    out += "},";
  }
  out += R"("traceEvents":[)";
  append_events(out, only_rank, order);
  out += "\n]}\n";
  return out;
}

void TraceWriter::write(const std::filesystem::path& path) const {
  const std::vector<std::uint32_t> order = nesting_order();
  check_nesting(order);
  write_output_file(path, render(std::nullopt, order));
}

std::filesystem::path TraceWriter::rank_path(const std::filesystem::path& path, int rank) {
  std::filesystem::path out = path.parent_path() / path.stem();
  out += ".rank" + std::to_string(rank);
  out += path.has_extension() ? path.extension() : std::filesystem::path(".json");
  return out;
}

std::vector<std::filesystem::path> TraceWriter::write_per_rank(const std::filesystem::path& path) const {
  const std::vector<std::uint32_t> order = nesting_order();
  check_nesting(order);
  std::vector<std::filesystem::path> written;
  for (int rank : ranks_with_events()) {
    const std::filesystem::path p = rank_path(path, rank);
    write_output_file(p, render(rank, order));
    written.push_back(p);
  }
  return written;
}

std::vector<int> parse_rank_list(std::string_view text) {
  std::vector<int> ranks;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view item = text.substr(pos, comma - pos);
    int value = -1;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc{} || ptr != item.data() + item.size() || value < 0) {
      throw std::invalid_argument("bad rank list '" + std::string(text) +
                                  "': expected non-negative integers separated by commas, e.g. 0,8");
    }
    ranks.push_back(value);
    pos = comma + 1;
  }
  return ranks;
}

}  // namespace cuboid
