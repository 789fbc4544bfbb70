// Chrome trace-event writer: the document parses back, carries the metadata
// Perfetto needs, nests strictly per thread, filters ranks and splits files.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuboid/core/trace.hpp"

using namespace cuboid;
using nlohmann::json;

namespace {

std::filesystem::path temp_dir() {
  auto dir = std::filesystem::temp_directory_path() / ("cuboid-trace-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

json read_json(const std::filesystem::path& p) {
  std::ifstream f(p);
  REQUIRE(f.good());
  return json::parse(f);
}

TraceWriter two_rank_trace() {
  TraceWriter t;
  t.set_world_size(16);
  for (int rank : {0, 8}) {
    t.set_process_name(rank, "rank " + std::to_string(rank));
    t.set_thread_name(rank, 0, "compute", 0);
    t.set_thread_name(rank, 1, "tp", 1);
    t.add_complete(rank, 0, "F mb0", "forward", 1000, 5000);
    t.add_complete(rank, 0, "qkv", "gemm", 1000, 1500, R"({"flops":1e9})");
    t.add_complete(rank, 0, "attn \"core\"", "attention", 2500, 2500);
    t.add_complete(rank, 1, "tp_ar", "tp", 6000, 1234);
  }
  return t;
}

}  // namespace

TEST_CASE("microsecond timestamps keep nanosecond precision and the document parses back") {
  const TraceWriter t = two_rank_trace();
  const json doc = json::parse(t.to_string());
  REQUIRE(doc.contains("traceEvents"));
  CHECK_FALSE(doc.contains("distributedInfo"));
  int complete = 0, meta = 0;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "X") {
      ++complete;
      if (e["name"] == "tp_ar") {
        CHECK(e["ts"].get<double>() == doctest::Approx(6.0));
        CHECK(e["dur"].get<double>() == doctest::Approx(1.234));
        CHECK(e["cat"] == "tp");
      }
      if (e["name"] == "qkv") CHECK(e["args"]["flops"].get<double>() == doctest::Approx(1e9));
    } else {
      CHECK(e["ph"] == "M");
      ++meta;
    }
  }
  CHECK(complete == 8);
  // process_name + process_sort_index per rank, thread_name + thread_sort_index per thread.
  CHECK(meta == 2 * 2 + 2 * 4);
  bool escaped = false;
  for (const json& e : doc["traceEvents"]) escaped = escaped || e.value("name", "") == "attn \"core\"";
  CHECK(escaped);
}

TEST_CASE("metadata names every process and thread") {
  const json doc = json::parse(two_rank_trace().to_string());
  bool rank8 = false, tp_thread = false;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] != "M") continue;
    if (e["name"] == "process_name" && e["pid"] == 8) rank8 = e["args"]["name"] == "rank 8";
    if (e["name"] == "thread_name" && e["pid"] == 0 && e["tid"] == TraceWriter::json_tid(1))
      tp_thread = e["args"]["name"] == "tp";
  }
  CHECK(rank8);
  CHECK(tp_thread);
}

// The rules below are Perfetto importer behaviours (tools/check-trace names
// the source of each); each test fails if the writer goes back to the old form.
TEST_CASE("no displayTimeUnit and no tid 0, which older or current Perfetto misread") {
  const json doc = json::parse(two_rank_trace().to_string());
  CHECK_FALSE(doc.contains("displayTimeUnit"));
  for (const json& e : doc["traceEvents"]) CHECK(e["tid"].get<int>() >= 1);
}

TEST_CASE("timestamps read back as the same nanoseconds when truncated or rounded") {
  // Perfetto converts "ts" and "dur" separately with int64(double * 1000)
  // (truncating) or llround; both must give the written nanoseconds.
  TraceWriter t;
  t.set_thread_name(0, 0, "compute");
  std::vector<std::int64_t> values;
  for (std::int64_t ns = 0; ns < 200000; ns += 7) values.push_back(ns);
  for (std::int64_t ns : {33262719LL, 1056379214LL, 528318907LL, 46176000001LL}) values.push_back(ns);
  for (std::size_t i = 0; i < values.size(); ++i) t.add_complete(0, 0, "e", "x", values[i], values[i] % 9973);
  const json doc = json::parse(t.to_string());
  std::size_t bad_trunc = 0, bad_round = 0, n = 0;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] != "X") continue;
    for (const char* key : {"ts", "dur"}) {
      const double us = e[key].get<double>();
      const std::int64_t want = std::llround(us * 1000.0 - 0.01);  // the value written, without the 0.01 ns lift
      bad_trunc += static_cast<std::int64_t>(us * 1000.0) != want;
      bad_round += std::llround(us * 1000.0) != want;
      ++n;
    }
  }
  CHECK(n == 2 * values.size());
  CHECK(bad_trunc == 0);
  CHECK(bad_round == 0);
}

TEST_CASE("each thread's events are written enclosing-first, as old Perfetto sorted equal timestamps by file order") {
  TraceWriter t;
  t.add_complete(0, 0, "kernel", "kernel", 100, 10);
  t.add_complete(0, 0, "span", "forward", 100, 50);
  t.add_complete(0, 0, "earlier", "kernel", 20, 10);
  const json doc = json::parse(t.to_string());
  std::vector<std::string> names;
  for (const json& e : doc["traceEvents"])
    if (e["ph"] == "X") names.push_back(e["name"]);
  CHECK(names == std::vector<std::string>{"earlier", "span", "kernel"});
}

TEST_CASE("events on one thread must nest strictly") {
  TraceWriter ok = two_rank_trace();
  CHECK_NOTHROW(ok.check_nesting());
  // Back to back is fine (end == next start).
  ok.add_complete(0, 0, "next", "gemm", 6000, 10);
  CHECK_NOTHROW(ok.check_nesting());

  TraceWriter bad;
  bad.add_complete(0, 0, "a", "x", 0, 100);
  bad.add_complete(0, 0, "b", "x", 50, 100);
  CHECK_THROWS_WITH_AS(bad.check_nesting(),
                       R"(trace: events "a" [0, 100) ns and "b" [50, 150) ns on pid 0 tid 0 overlap without nesting)",
                       std::logic_error);
  // The same overlap on different threads is fine.
  TraceWriter other;
  other.add_complete(0, 0, "a", "x", 0, 100);
  other.add_complete(0, 1, "b", "x", 50, 100);
  CHECK_NOTHROW(other.check_nesting());
  CHECK_THROWS_AS(bad.write(temp_dir() / "bad.json"), std::logic_error);
  CHECK_FALSE(std::filesystem::exists(temp_dir() / "bad.json"));
}

TEST_CASE("rank filter records only the selected ranks") {
  TraceWriter t;
  t.set_ranks({8, 0, 8});
  CHECK(t.wants(0));
  CHECK(t.wants(8));
  CHECK_FALSE(t.wants(1));
  t.add_complete(1, 0, "dropped", "x", 0, 1);
  t.add_complete(8, 0, "kept", "x", 0, 1);
  t.set_process_name(1, "rank 1");
  CHECK(t.num_events() == 1);
  CHECK(t.ranks_with_events() == std::vector<int>{8});
}

TEST_CASE("per-rank files carry distributedInfo and only their rank") {
  const auto dir = temp_dir();
  const TraceWriter t = two_rank_trace();
  const auto files = t.write_per_rank(dir / "out.json");
  REQUIRE(files.size() == 2);
  CHECK(files[0] == dir / "out.rank0.json");
  CHECK(files[1] == dir / "out.rank8.json");
  for (int i = 0; i < 2; ++i) {
    const int rank = i == 0 ? 0 : 8;
    const json doc = read_json(files[static_cast<std::size_t>(i)]);
    CHECK(doc["distributedInfo"]["rank"] == rank);
    CHECK(doc["distributedInfo"]["world_size"] == 16);
    for (const json& e : doc["traceEvents"]) CHECK(e["pid"] == rank);
  }
  // Single file: atomically written, no temporary left behind.
  t.write(dir / "all.json");
  CHECK(read_json(dir / "all.json")["traceEvents"].size() == 20);
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    CHECK(entry.path().string().find(".tmp.") == std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("rank lists parse, bad ones name the problem") {
  CHECK(parse_rank_list("0,8") == std::vector<int>{0, 8});
  CHECK(parse_rank_list("5") == std::vector<int>{5});
  CHECK_THROWS_AS(parse_rank_list(""), std::invalid_argument);
  CHECK_THROWS_AS(parse_rank_list("0,,8"), std::invalid_argument);
  CHECK_THROWS_AS(parse_rank_list("0,x"), std::invalid_argument);
  CHECK_THROWS_AS(parse_rank_list("-1"), std::invalid_argument);
}
