#include "cuboid/core/json_reader.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "cuboid/core/error.hpp"
#include "cuboid/core/files.hpp"

namespace cuboid {

namespace {

std::string type_name(const nlohmann::json& v) {
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number_float()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  return "null";
}

// A value as a message shows it: its JSON text, at most 40 characters. dump()
// is safe here: parse_json_text refused anything nested deeper than kMaxJsonDepth.
std::string show(const nlohmann::json& v) {
  if (v.is_string()) return quote_value(v.get_ref<const std::string&>());
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

}  // namespace

std::optional<std::string_view> closest_field(std::string_view key, std::span<const std::string_view> known,
                                              std::size_t max_distance) {
  // Levenshtein distance with one row, ignoring case.
  auto distance = [](std::string_view a, std::string_view b) {
    std::vector<std::size_t> row(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
      std::size_t diagonal = row[0];
      row[0] = i;
      for (std::size_t j = 1; j <= b.size(); ++j) {
        const std::size_t above = row[j];
        const bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) == std::tolower(static_cast<unsigned char>(b[j - 1]));
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
        diagonal = above;
      }
    }
    return row[b.size()];
  };
  std::optional<std::string_view> best;
  std::size_t best_distance = max_distance + 1;
  for (std::string_view k : known) {
    const std::size_t d = distance(key, k);
    if (d < best_distance) {
      best_distance = d;
      best = k;
    }
  }
  return best;
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  return parse_json_text(read_input_file(path), path.string());
}

namespace {

// Refuses, while nlohmann parses, a document nested deeper than
// kMaxJsonDepth and an object holding one key twice (nlohmann keeps the last
// silently). One level per open object or array, in nesting order.
class StrictParse {
 public:
  explicit StrictParse(const std::string& source) : source_(source) {}

  bool operator()(int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if ((event == Event::object_start || event == Event::array_start) && depth >= kMaxJsonDepth)
      throw InputError(source_, "", "nested more than " + std::to_string(kMaxJsonDepth) + " levels deep",
                       "cuboid's files nest a few levels; give the card, plan or measurements file itself");
    if (event == Event::object_start || event == Event::array_start) levels_.push_back({event == Event::object_start, {}, {}});
    if ((event == Event::object_end || event == Event::array_end) && !levels_.empty()) levels_.pop_back();
    if (event == Event::key && !levels_.empty()) {
      Level& here = levels_.back();
      here.key = parsed.get<std::string>();
      if (!here.keys.insert(here.key).second)
        throw InputError(source_, field_path(), "appears twice in one object",
                         "keep one of the two (JSON readers differ on which one counts)");
    }
    return true;
  }

 private:
  struct Level {
    bool object;
    std::set<std::string> keys;
    std::string key;  // the object's latest key
  };

  // "parallel.tp", "ops[].name": the path of the latest key.
  std::string field_path() const {
    std::string path;
    for (std::size_t i = 1; i < levels_.size(); ++i) {
      const Level& outer = levels_[i - 1];
      if (outer.object) path += (path.empty() ? "" : ".") + outer.key;
      else path += "[]";
    }
    return path + (path.empty() ? "" : ".") + levels_.back().key;
  }

  const std::string& source_;
  std::vector<Level> levels_;
};

}  // namespace

nlohmann::json parse_json_text(const std::string& text, const std::string& source) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
    throw InputError(source, "", "file is empty", "give a JSON object");
  }
  try {
    nlohmann::json j = nlohmann::json::parse(text, StrictParse(source));
    if (!j.is_object()) {
      throw InputError(source, "", "top level is " + type_name(j) + ", expected a JSON object",
                       "wrap the fields in { ... }");
    }
    return j;
  } catch (const nlohmann::json::parse_error& e) {
    std::string what = e.what();
    // nlohmann's message starts with "[json.exception.parse_error.101] ".
    if (auto pos = what.find("] "); pos != std::string::npos) what = what.substr(pos + 2);
    throw InputError(source, "", "malformed JSON: " + what, "fix the JSON syntax at that position");
  } catch (const nlohmann::json::out_of_range& e) {
    // A number beyond double's range (1e400) is a parse-time error too.
    std::string what = e.what();
    if (auto pos = what.find("] "); pos != std::string::npos) what = what.substr(pos + 2);
    throw InputError(source, "", "malformed JSON: " + what, "give numbers within the range of a double");
  }
}

JsonReader::JsonReader(const nlohmann::json& obj, std::string source, std::string path)
    : obj_(obj), source_(std::move(source)), path_(std::move(path)) {}

std::string JsonReader::field_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

void JsonReader::fail(std::string_view key, const std::string& problem, const std::string& fix) const {
  throw InputError(source_, field_path(key), problem, fix);
}

bool JsonReader::has(std::string_view key) const {
  auto it = obj_.find(std::string(key));
  return it != obj_.end() && !it->is_null();
}

const nlohmann::json* JsonReader::find(std::string_view key) {
  used_.insert(std::string(key));
  auto it = obj_.find(std::string(key));
  if (it == obj_.end() || it->is_null()) return nullptr;
  return &*it;
}

const nlohmann::json& JsonReader::get(std::string_view key) {
  const nlohmann::json* v = find(key);
  if (v == nullptr) fail(key, "missing required field", "add \"" + std::string(key) + "\"");
  return *v;
}

const nlohmann::json& JsonReader::raw(std::string_view key) { return get(key); }

bool JsonReader::is_object(std::string_view key) const {
  auto it = obj_.find(std::string(key));
  return it != obj_.end() && it->is_object();
}

static std::int64_t as_integer(const JsonReader& r, std::string_view key, const nlohmann::json& v) {
  // Unsigned first: nlohmann's is_number_integer() is true for it too, and
  // 2^64 - 1 read as int64 would be -1.
  if (v.is_number_unsigned()) {
    auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(INT64_MAX)) r.fail(key, "value " + show(v) + " is too large", "use a smaller value");
    return static_cast<std::int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<std::int64_t>(d);
    r.fail(key, "expected an integer, got " + show(v), "give a whole number");
  }
  r.fail(key, "expected an integer, got " + type_name(v) + " " + show(v), "give a whole number");
}

static double as_number(const JsonReader& r, std::string_view key, const nlohmann::json& v) {
  if (!v.is_number()) r.fail(key, "expected a number, got " + type_name(v) + " " + show(v), "give a number");
  double d = v.get<double>();
  if (!std::isfinite(d)) r.fail(key, "value is not finite", "give a finite number");
  return d;
}

std::int64_t JsonReader::integer(std::string_view key) { return as_integer(*this, key, get(key)); }

std::int64_t JsonReader::positive_integer(std::string_view key) { return count<std::int64_t>(key); }

std::int64_t JsonReader::integer_in(std::string_view key, std::int64_t lo, std::int64_t hi) {
  const std::int64_t v = integer(key);
  if (v < lo) {
    const std::string fix = "give a value >= " + std::to_string(lo);
    if (lo == 1) fail(key, "must be positive, got " + std::to_string(v), fix);
    if (lo == 0) fail(key, "must not be negative, got " + std::to_string(v), fix);
    fail(key, "must be at least " + std::to_string(lo) + ", got " + std::to_string(v), fix);
  }
  if (v > hi)
    fail(key, "value " + std::to_string(v) + " is above the limit of " + std::to_string(hi),
         "give a value from " + std::to_string(lo) + " to " + std::to_string(hi));
  return v;
}

double JsonReader::number(std::string_view key) { return as_number(*this, key, get(key)); }

double JsonReader::positive_number(std::string_view key) {
  double v = number(key);
  if (!(v > 0)) fail(key, "must be positive, got " + show(obj_.at(std::string(key))), "give a value > 0");
  return v;
}

std::string JsonReader::string(std::string_view key) {
  const auto& v = get(key);
  if (!v.is_string()) fail(key, "expected a string, got " + type_name(v) + " " + show(v), "give a quoted string");
  return v.get<std::string>();
}

bool JsonReader::boolean(std::string_view key) {
  const auto& v = get(key);
  if (!v.is_boolean()) fail(key, "expected true or false, got " + type_name(v) + " " + show(v), "give true or false");
  return v.get<bool>();
}

static std::string join_choices(std::initializer_list<std::string_view> choices) {
  std::string out;
  for (auto c : choices) {
    if (!out.empty()) out += "|";
    out += c;
  }
  return out;
}

std::string JsonReader::choice(std::string_view key, std::initializer_list<std::string_view> choices) {
  std::string v = string(key);
  for (auto c : choices)
    if (v == c) return v;
  fail(key, "unknown value " + quote_value(v), "use one of " + join_choices(choices));
}

std::optional<std::int64_t> JsonReader::optional_positive_integer(std::string_view key) {
  if (find(key) == nullptr) return std::nullopt;
  return positive_integer(key);
}

std::optional<double> JsonReader::optional_positive_number(std::string_view key) {
  if (find(key) == nullptr) return std::nullopt;
  return positive_number(key);
}

std::optional<double> JsonReader::optional_number(std::string_view key) {
  if (find(key) == nullptr) return std::nullopt;
  return number(key);
}

std::optional<std::string> JsonReader::optional_string(std::string_view key) {
  if (find(key) == nullptr) return std::nullopt;
  return string(key);
}

std::optional<bool> JsonReader::optional_boolean(std::string_view key) {
  if (find(key) == nullptr) return std::nullopt;
  return boolean(key);
}

std::optional<std::string> JsonReader::optional_choice(std::string_view key,
                                                       std::initializer_list<std::string_view> choices) {
  if (find(key) == nullptr) return std::nullopt;
  return choice(key, choices);
}

double JsonReader::sourced_positive_number(std::string_view key, std::string* source_out) {
  const auto& v = get(key);
  if (v.is_object()) {
    JsonReader inner(v, source_, field_path(key));
    double value = inner.positive_number("value");
    std::optional<std::string> src = inner.optional_string("source");
    inner.reject_unknown({"unit", "note", "notes"});
    if (source_out != nullptr) *source_out = src.value_or("");
    return value;
  }
  if (source_out != nullptr) source_out->clear();
  return positive_number(key);
}

std::optional<double> JsonReader::optional_sourced_positive_number(std::string_view key,
                                                                   std::string* source_out) {
  if (find(key) == nullptr) return std::nullopt;
  return sourced_positive_number(key, source_out);
}

JsonReader JsonReader::object(std::string_view key) {
  const auto& v = get(key);
  if (!v.is_object()) fail(key, "expected an object, got " + type_name(v), "give { ... }");
  return JsonReader(v, source_, field_path(key));
}

void JsonReader::reject_unknown(std::initializer_list<std::string_view> ignored) const {
  for (const auto& [key, value] : obj_.items()) {
    if (used_.count(key) != 0) continue;
    bool skip = false;
    for (auto ig : ignored) skip = skip || (ig == key);
    if (key.rfind("_", 0) == 0 || key == "source" || key == "description" || key == "notes") skip = true;
    if (skip) continue;
    fail(key, "unknown field", "remove it or check its spelling (see the README's card schema)");
  }
}

}  // namespace cuboid
