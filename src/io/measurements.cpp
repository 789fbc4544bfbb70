// Strict reading of measurements.json (schema "cuboid.measurements/1").
#include "cuboid/io/measurements.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "cuboid/core/error.hpp"
#include "cuboid/core/json_reader.hpp"

namespace cuboid {

namespace {

constexpr std::int64_t kMaxSize = 1 << 20;  // ranks, TP, PP, DP, micro-batch, virtual stages
const std::string kRemeasure = "measure again with `cuboid run --plan plan.json --out measurements.json`";

// A time in seconds: a finite number >= 0. The executor writes NaN and
// infinity as null (nlohmann/json's convention), so null is a bad time, not a
// missing field.
double time_s(JsonReader& r, const nlohmann::json& obj, std::string_view key) {
  const auto it = obj.find(std::string(key));
  if (it != obj.end() && it->is_null())
    r.fail(key, "is null: the time was not finite (NaN or infinity) when it was written",
           "find why that op's timer failed, then " + kRemeasure);
  const double v = r.number(key);  // missing, wrong type or non-finite: InputError
  if (v < 0) r.fail(key, fmt::format("negative time {} s", v), "times cannot be negative; " + kRemeasure);
  return v;
}

TimeStats stats(JsonReader& parent, const nlohmann::json& obj, std::string_view key) {
  const auto it = obj.find(std::string(key));
  JsonReader r = parent.object(key);
  TimeStats t;
  t.median_s = time_s(r, *it, "median_s");
  t.min_s = time_s(r, *it, "min_s");
  t.max_s = time_s(r, *it, "max_s");
  // Rounding in the writer is far below a nanosecond.
  const double slack = 1e-12 + 1e-9 * t.max_s;
  if (t.min_s > t.median_s + slack || t.median_s > t.max_s + slack)
    r.fail("median_s", fmt::format("median {} s is not between min {} s and max {} s", t.median_s, t.min_s, t.max_s),
           "the summary is inconsistent (edited by hand?); " + kRemeasure);
  return t;
}

// Every per-step time in an optional array must be a time too.
void check_step_array(JsonReader& parent, const nlohmann::json& obj, std::string_view key) {
  const auto it = obj.find(std::string(key));
  if (it == obj.end()) return;
  const nlohmann::json& a = parent.raw(key);
  if (!a.is_array()) parent.fail(key, "expected an array of seconds", kRemeasure);
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string field = fmt::format("{}[{}]", key, i);
    if (a[i].is_null())
      parent.fail(field, "is null: the time was not finite (NaN or infinity) when it was written", kRemeasure);
    if (!a[i].is_number()) parent.fail(field, "expected a number of seconds", kRemeasure);
    const double v = a[i].get<double>();
    if (!std::isfinite(v)) parent.fail(field, "value is not finite", kRemeasure);
    if (v < 0) parent.fail(field, fmt::format("negative time {} s", v), "times cannot be negative; " + kRemeasure);
  }
}

template <class E>
E parse_enum(JsonReader& r, std::string_view key, std::initializer_list<E> values) {
  const std::string s = r.string(key);
  std::string names;
  for (E v : values) {
    if (to_string(v) == s) return v;
    names += (names.empty() ? "" : ", ") + std::string(to_string(v));
  }
  r.fail(key, "unknown value " + quote_value(s), "use one of " + names);
}

Pass parse_pass(JsonReader& r) {
  const std::string s = r.choice("pass", {"forward", "backward"});
  return s == "forward" ? Pass::forward : Pass::backward;
}

MeasuredOp read_op(JsonReader& r, const nlohmann::json& obj) {
  MeasuredOp op;
  op.name = r.string("name");
  if (op.name.empty()) r.fail("name", "is empty", kRemeasure);
  op.kind = parse_enum(r, "kind",
                       {OpKind::gemm, OpKind::attention_core, OpKind::memory_bound, OpKind::collective, OpKind::p2p});
  op.pass = parse_pass(r);
  op.calls_per_step = r.count<std::int64_t>("calls_per_step", 0);
  op.time_per_step = stats(r, obj, "time_per_step");
  check_step_array(r, obj, "step_seconds");
  switch (op.kind) {
    case OpKind::gemm:
    case OpKind::attention_core: {
      JsonReader s = r.object("shape");
      op.m = s.positive_integer("m");
      op.n = s.positive_integer("n");
      op.k = s.positive_integer("k");
      op.batch = s.positive_integer("batch");
      break;
    }
    case OpKind::memory_bound:
      op.bytes_per_call = r.number("bytes_per_call");
      if (op.bytes_per_call < 0) r.fail("bytes_per_call", "must not be negative", kRemeasure);
      break;
    case OpKind::collective:
    case OpKind::p2p:
      op.collective = parse_enum(r, "collective",
                                 {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather,
                                  Collective::broadcast, Collective::send_recv, Collective::all_to_all});
      op.group = parse_enum(r, "group", {Group::none, Group::tp, Group::pp, Group::dp, Group::ep, Group::cp});
      op.group_size = r.count<int>("group_size", 1, kMaxSize);
      op.bytes_per_call = r.number("bytes_per_call");
      if (op.bytes_per_call < 0) r.fail("bytes_per_call", "must not be negative", kRemeasure);
      break;
  }
  return op;
}

// "page_faults_per_step": one non-negative count per measured step; the median.
std::optional<std::int64_t> page_fault_median(JsonReader& parent, const nlohmann::json& obj) {
  const std::string key = "page_faults_per_step";
  if (!obj.contains(key)) return std::nullopt;
  const nlohmann::json& a = parent.raw(key);
  if (!a.is_array()) parent.fail(key, "expected an array of counts, one per measured step", kRemeasure);
  std::vector<std::int64_t> counts;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_number_integer() || a[i].get<std::int64_t>() < 0)
      parent.fail(fmt::format("{}[{}]", key, i), "expected a count of page faults (a non-negative integer)",
                  kRemeasure);
    counts.push_back(a[i].get<std::int64_t>());
  }
  if (counts.empty()) return std::nullopt;
  std::sort(counts.begin(), counts.end());
  return counts[counts.size() / 2];
}

MeasuredRank read_rank(JsonReader& r, const nlohmann::json& obj) {
  MeasuredRank m;
  m.rank = r.count<int>("rank", 0, kMaxSize - 1);
  m.hostname = r.string("hostname");
  JsonReader c = r.object("coord");
  auto coord = [&](std::string_view key) { return c.count<int>(key, 0, kMaxSize - 1); };
  m.coord.rank = m.rank;
  m.coord.tp = coord("tp");
  m.coord.pp = coord("pp");
  m.coord.dp = coord("dp");
  if (c.has("cp")) m.coord.cp = coord("cp");  // runs of context-parallel plans
  m.coord.node = coord("node");
  m.coord.gpu = coord("gpu");
  m.iteration = stats(r, obj, "iteration");
  check_step_array(r, obj, "step_seconds");
  m.compute_s = time_s(r, obj, "compute_s");
  m.communication_s = time_s(r, obj, "communication_s");
  m.page_faults_per_step = page_fault_median(r, obj);
  const nlohmann::json& ops = r.raw("ops");
  if (!ops.is_array()) r.fail("ops", "expected an array of ops", kRemeasure);
  if (ops.empty()) r.fail("ops", "is empty: no op of this rank was timed", kRemeasure);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const std::string path = r.field_path(fmt::format("ops[{}]", i));
    if (!ops[i].is_object()) throw InputError(r.source(), path, "expected an object", kRemeasure);
    JsonReader o(ops[i], r.source(), path);
    MeasuredOp op = read_op(o, ops[i]);
    if (m.find(op.name) != nullptr) o.fail("name", "op \"" + op.name + "\" appears twice", kRemeasure);
    m.ops.push_back(std::move(op));
  }
  return m;
}

}  // namespace

const MeasuredOp* MeasuredRank::find(const std::string& name) const {
  for (const MeasuredOp& op : ops)
    if (op.name == name) return &op;
  return nullptr;
}

const MeasuredRank& Measurements::slowest_rank() const { return slowest_rank(Statistic::median); }

const MeasuredRank& Measurements::slowest_rank(Statistic s) const {
  return *std::max_element(ranks.begin(), ranks.end(), [s](const MeasuredRank& a, const MeasuredRank& b) {
    return pick(a.iteration, s) < pick(b.iteration, s);
  });
}

Statistic parse_statistic(const std::string& word, const std::string& flag) {
  if (word == "median") return Statistic::median;
  if (word == "min") return Statistic::min;
  throw InputError("command line", flag, "is '" + word + "'", "use median or min");
}

std::string_view to_string(Statistic s) noexcept { return s == Statistic::min ? "min" : "median"; }

Measurements measurements_from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw InputError(source, "(top level)", "expected a JSON object", kRemeasure);
  JsonReader r(j, source);
  Measurements m;
  m.source = source;
  const std::string schema = r.string("schema");
  if (schema != kMeasurementsSchemaV1)
    r.fail("schema", "is " + quote_value(schema) + ", not \"" + std::string(kMeasurementsSchemaV1) + "\"",
           "give a measurements file written by `cuboid run --out` of this cuboid version");
  m.generator = r.optional_string("generator").value_or("");
  m.plan_file = r.optional_string("plan_file").value_or("");

  JsonReader mo = r.object("model");
  m.model.name = mo.string("name");
  m.model.num_layers = mo.positive_integer("num_layers");
  m.model.hidden_size = mo.positive_integer("hidden_size");
  m.model.num_attention_heads = mo.positive_integer("num_attention_heads");
  m.model.ffn_hidden_size = mo.positive_integer("ffn_hidden_size");
  m.model.vocab_size = mo.positive_integer("vocab_size");

  JsonReader p = r.object("plan");
  // Bounded so that products of sizes stay far inside int (fuzzed input).
  auto pos = [&](std::string_view key) { return p.count<int>(key, 1, kMaxSize); };
  m.plan.tp = pos("tp");
  m.plan.pp = pos("pp");
  m.plan.dp = pos("dp");
  if (p.has("cp")) m.plan.cp = pos("cp");
  m.plan.micro_batch = pos("micro_batch");
  m.plan.global_batch = p.positive_integer("global_batch");
  m.plan.num_micro_batches = p.positive_integer("num_micro_batches");
  m.plan.seq_length = p.positive_integer("seq_length");
  m.plan.virtual_stages = pos("virtual_stages");
  m.plan.zero_stage = p.count<int>("zero_stage", 0, 3);
  m.plan.recompute = parse_recompute(p.string("recompute"), source, "plan.recompute");
  m.plan.sequence_parallel = p.boolean("sequence_parallel");
  m.plan.schedule = parse_schedule(p.string("schedule"), source, "plan.schedule");
  m.plan.rank_order = p.string("rank_order");
  if (const auto precision = p.optional_string("precision"))
    m.plan.precision = parse_precision(*precision, source, "plan.precision");
  m.plan.world_size = pos("world_size");
  if (m.plan.world_size != m.plan.tp * m.plan.cp * m.plan.pp * m.plan.dp)
    p.fail("world_size",
           fmt::format("{} is not TP {}{} x PP {} x DP {}", m.plan.world_size, m.plan.tp,
                       m.plan.cp > 1 ? fmt::format(" x CP {}", m.plan.cp) : "", m.plan.pp, m.plan.dp),
           kRemeasure);

  if (r.has("cluster")) {
    JsonReader c = r.object("cluster");
    m.cluster_name = c.string("name");
    m.cluster_source_file = c.optional_string("source_file").value_or("");
  }

  JsonReader env = r.object("environment");
  m.backend = env.choice("backend", {"cpu", "cuda"});
  m.device = env.optional_string("device").value_or("");
  if (env.has("hostnames")) {
    const nlohmann::json& h = env.raw("hostnames");
    if (!h.is_array()) env.fail("hostnames", "expected an array of host names", kRemeasure);
    for (const auto& name : h) {
      if (!name.is_string()) env.fail("hostnames", "expected an array of host names", kRemeasure);
      m.hostnames.push_back(name.get<std::string>());
    }
  }
  if (env.has("host")) m.host = host_from_json(env.raw("host"), source, "environment.host");
  m.steps = r.count<int>("steps");
  m.warmup = r.count<int>("warmup", 0);
  m.iteration_time_s = time_s(r, j, "iteration_time_s");

  const nlohmann::json& ranks = r.raw("ranks");
  if (!ranks.is_array()) r.fail("ranks", "expected an array with one entry per rank", kRemeasure);
  if (ranks.empty()) r.fail("ranks", "is empty: no rank reported its timings", kRemeasure);
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const std::string path = fmt::format("ranks[{}]", i);
    if (!ranks[i].is_object()) throw InputError(source, path, "expected an object", kRemeasure);
    JsonReader rr(ranks[i], source, path);
    m.ranks.push_back(read_rank(rr, ranks[i]));
  }
  std::sort(m.ranks.begin(), m.ranks.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  for (std::size_t i = 0; i < m.ranks.size(); ++i) {
    if (m.ranks[i].rank != static_cast<int>(i))
      throw InputError(source, "ranks",
                       i > 0 && m.ranks[i].rank == m.ranks[i - 1].rank
                           ? fmt::format("rank {} appears twice", m.ranks[i].rank)
                           : fmt::format("rank {} is missing", i),
                       kRemeasure);
  }
  if (static_cast<int>(m.ranks.size()) != m.plan.world_size)
    r.fail("ranks", fmt::format("{} ranks reported, but the plan has {}", m.ranks.size(), m.plan.world_size),
           kRemeasure);
  const double slowest = m.slowest_rank().iteration.median_s;
  if (std::fabs(slowest - m.iteration_time_s) > 1e-9 + 1e-6 * slowest)
    r.fail("iteration_time_s",
           fmt::format("{} s is not the slowest rank's median iteration ({} s)", m.iteration_time_s, slowest),
           "the summary is inconsistent (edited by hand?); " + kRemeasure);
  return m;
}

Measurements load_measurements(const std::filesystem::path& path) {
  return measurements_from_json(read_json_file(path), path.string());
}

namespace {

const std::string kSameRun =
    "give runs of one plan file on one host (cuboid run --out, the same --plan, --backend and launch)";

// The median of the runs' medians (the mean of two), their smallest min and largest max.
TimeStats merge_stats(const std::vector<TimeStats>& all) {
  std::vector<double> medians;
  TimeStats t{0, all.front().min_s, all.front().max_s};
  for (const TimeStats& s : all) {
    medians.push_back(s.median_s);
    t.min_s = std::min(t.min_s, s.min_s);
    t.max_s = std::max(t.max_s, s.max_s);
  }
  std::sort(medians.begin(), medians.end());
  const std::size_t n = medians.size();
  t.median_s = n % 2 == 1 ? medians[n / 2] : 0.5 * (medians[n / 2 - 1] + medians[n / 2]);
  return t;
}

void same_as_first(const Measurements& first, const Measurements& m) {
  auto differ = [&](const std::string& field, const std::string& what) {
    throw InputError(m.source, field, fmt::format("{} differs from {}'s: not a run of the same plan", what, first.source),
                     kSameRun);
  };
  const MeasuredModel &a = first.model, &b = m.model;
  if (a.name != b.name || a.num_layers != b.num_layers || a.hidden_size != b.hidden_size ||
      a.num_attention_heads != b.num_attention_heads || a.ffn_hidden_size != b.ffn_hidden_size ||
      a.vocab_size != b.vocab_size)
    differ("model", "the model");
  const MeasuredPlan &p = first.plan, &q = m.plan;
  if (p.tp != q.tp || p.pp != q.pp || p.dp != q.dp || p.cp != q.cp || p.micro_batch != q.micro_batch ||
      p.virtual_stages != q.virtual_stages || p.zero_stage != q.zero_stage || p.world_size != q.world_size ||
      p.global_batch != q.global_batch || p.num_micro_batches != q.num_micro_batches ||
      p.seq_length != q.seq_length || p.recompute != q.recompute || p.sequence_parallel != q.sequence_parallel ||
      p.schedule != q.schedule || p.rank_order != q.rank_order)
    differ("plan", "the plan");
  if (first.backend != m.backend) differ("environment.backend", "the backend");
  if (first.device != m.device) differ("environment.device", "the device");
  if (first.host && m.host && !(*first.host == *m.host)) differ("environment.host", "the host");
  if (first.hostnames != m.hostnames) differ("environment.hostnames", "the host names");
  for (std::size_t r = 0; r < m.ranks.size(); ++r) {
    const MeasuredRank &x = first.ranks[r], &y = m.ranks[r];
    const std::string path = fmt::format("ranks[{}]", r);
    if (x.coord.tp != y.coord.tp || x.coord.pp != y.coord.pp || x.coord.dp != y.coord.dp ||
        x.coord.cp != y.coord.cp || x.coord.node != y.coord.node || x.coord.gpu != y.coord.gpu)
      differ(path + ".coord", fmt::format("rank {}'s coordinates", r));
    if (x.ops.size() != y.ops.size()) differ(path + ".ops", fmt::format("rank {}'s list of ops", r));
    for (std::size_t i = 0; i < x.ops.size(); ++i) {
      const MeasuredOp &o = x.ops[i], &u = y.ops[i];
      if (o.name != u.name || o.kind != u.kind || o.pass != u.pass || o.calls_per_step != u.calls_per_step ||
          o.m != u.m || o.n != u.n || o.k != u.k || o.batch != u.batch || o.bytes_per_call != u.bytes_per_call ||
          o.group != u.group || o.collective != u.collective || o.group_size != u.group_size)
        differ(fmt::format("{}.ops[{}]", path, i), fmt::format("rank {}'s op \"{}\"", r, o.name));
    }
  }
}

}  // namespace

Measurements merge_runs(const std::vector<Measurements>& runs) {
  if (runs.empty()) throw std::logic_error("merge_runs: no run");
  if (runs.size() == 1) return runs.front();
  const Measurements& first = runs.front();
  for (std::size_t i = 1; i < runs.size(); ++i) {
    if (runs[i].ranks.size() != first.ranks.size())
      throw InputError(runs[i].source, "ranks",
                       fmt::format("{} ranks, {} has {}: not a run of the same plan", runs[i].ranks.size(),
                                   first.source, first.ranks.size()),
                       kSameRun);
    same_as_first(first, runs[i]);
  }
  Measurements out = first;
  out.source.clear();
  out.steps = 0;
  for (const Measurements& m : runs) {
    out.source += (out.source.empty() ? "" : " + ") + m.source;
    out.steps += m.steps;
  }
  for (std::size_t r = 0; r < out.ranks.size(); ++r) {
    MeasuredRank& rank = out.ranks[r];
    std::vector<TimeStats> iteration;
    std::vector<double> compute, communication, faults;
    for (const Measurements& m : runs) {
      const MeasuredRank& x = m.ranks[r];
      iteration.push_back(x.iteration);
      compute.push_back(x.compute_s);
      communication.push_back(x.communication_s);
      if (x.page_faults_per_step) faults.push_back(static_cast<double>(*x.page_faults_per_step));
    }
    rank.iteration = merge_stats(iteration);
    rank.compute_s = median_of(compute);
    rank.communication_s = median_of(communication);
    rank.page_faults_per_step =
        faults.empty() ? std::nullopt : std::optional<std::int64_t>(std::llround(median_of(faults)));
    for (std::size_t i = 0; i < rank.ops.size(); ++i) {
      std::vector<TimeStats> op;
      for (const Measurements& m : runs) op.push_back(m.ranks[r].ops[i].time_per_step);
      rank.ops[i].time_per_step = merge_stats(op);
    }
  }
  out.iteration_time_s = out.slowest_rank().iteration.median_s;
  return out;
}

}  // namespace cuboid
