#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// Strict, typed reading of JSON cards. Every loader (model, cluster, GPU
// profile, later plan files) reads through JsonReader so that a wrong type, a
// missing field, a non-positive size or an unknown (misspelled) field is
// reported the same way: InputError naming the file, the field path and a fix.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <concepts>
#include <initializer_list>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace cuboid {

// The entry of `known` closest to `key` by case-insensitive edit distance,
// when at most max_distance away: the field a typo most likely meant.
std::optional<std::string_view> closest_field(std::string_view key, std::span<const std::string_view> known,
                                              std::size_t max_distance);

// The deepest nesting of a JSON document cuboid reads: its own files nest
// six levels at most, and a bound keeps every recursive walk (dump, copy,
// destruction) far from the stack's end.
inline constexpr int kMaxJsonDepth = 64;

// Reads (through read_input_file: a regular file within the size limit) and
// parses a JSON file: one object, nested at most kMaxJsonDepth deep, no key
// twice in one object; unreadable or malformed files throw InputError
// (with the parser's line/column for syntax errors).
nlohmann::json read_json_file(const std::filesystem::path& path);
// The parsing half of read_json_file: `text` must be one JSON object; `source`
// names it in errors. (The fuzz harnesses feed loaders through it.)
nlohmann::json parse_json_text(const std::string& text, const std::string& source);

class JsonReader {
 public:
  // obj must outlive the reader. path is the JSON path prefix of obj ("" for the root).
  JsonReader(const nlohmann::json& obj, std::string source, std::string path = "");

  bool has(std::string_view key) const;

  // Required fields. Integers must be exact integers (1.5 is rejected).
  std::int64_t integer(std::string_view key);
  std::int64_t positive_integer(std::string_view key);
  double number(std::string_view key);
  double positive_number(std::string_view key);
  std::string string(std::string_view key);
  bool boolean(std::string_view key);
  // A string that must be one of `choices`.
  std::string choice(std::string_view key, std::initializer_list<std::string_view> choices);

  // A count stored as T: an exact integer from lo to hi, hi at most T's
  // largest value (by default 1 to T's largest). Anything else is an
  // InputError naming the range, so a count read from a file is never wrapped
  // or truncated where it is stored. Every loader reads its counts this way.
  template <std::integral T>
  T count(std::string_view key, std::int64_t lo = 1, std::int64_t hi = max_of<T>()) {
    return static_cast<T>(integer_in(key, lo, std::min(hi, max_of<T>())));
  }
  template <std::integral T>
  std::optional<T> optional_count(std::string_view key, std::int64_t lo = 1, std::int64_t hi = max_of<T>()) {
    if (find(key) == nullptr) return std::nullopt;
    return count<T>(key, lo, hi);
  }
  // The check behind count: an exact integer from lo to hi.
  std::int64_t integer_in(std::string_view key, std::int64_t lo, std::int64_t hi);

  // Optional fields: nullopt when absent (an explicit null is also treated as absent).
  std::optional<std::int64_t> optional_positive_integer(std::string_view key);
  std::optional<double> optional_positive_number(std::string_view key);
  std::optional<double> optional_number(std::string_view key);
  std::optional<std::string> optional_string(std::string_view key);
  std::optional<bool> optional_boolean(std::string_view key);
  std::optional<std::string> optional_choice(std::string_view key,
                                             std::initializer_list<std::string_view> choices);

  // A sourced constant: either a bare number or {"value": X, "source": "..."}
  // (other keys such as "unit" or "note" are allowed). Returns the value; the
  // source, when given, is stored in *source_out.
  double sourced_positive_number(std::string_view key, std::string* source_out = nullptr);
  std::optional<double> optional_sourced_positive_number(std::string_view key,
                                                         std::string* source_out = nullptr);

  // A nested object; its keys are checked by the child reader.
  JsonReader object(std::string_view key);
  bool is_object(std::string_view key) const;
  const nlohmann::json& raw(std::string_view key);  // marks the key as used

  // Keys never read are typos or unsupported options: reject them, naming each.
  // `ignored` lists keys that are accepted and deliberately not used.
  void reject_unknown(std::initializer_list<std::string_view> ignored = {}) const;

  // An InputError about `key` of this object.
  [[noreturn]] void fail(std::string_view key, const std::string& problem,
                         const std::string& fix) const;

  const std::string& source() const { return source_; }
  std::string field_path(std::string_view key) const;

 private:
  // T's largest value as an int64 (a uint64's is capped at int64's).
  template <std::integral T>
  static constexpr std::int64_t max_of() {
    if constexpr (std::numeric_limits<T>::max() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      return std::numeric_limits<std::int64_t>::max();
    else
      return static_cast<std::int64_t>(std::numeric_limits<T>::max());
  }

  const nlohmann::json& get(std::string_view key);  // required; marks used
  const nlohmann::json* find(std::string_view key);  // optional; marks used; null -> nullptr

  const nlohmann::json& obj_;
  std::string source_;
  std::string path_;
  std::set<std::string, std::less<>> used_;
};

}  // namespace cuboid
