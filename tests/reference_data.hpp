#pragma once
// The published measurements of tests/data/reference/ (see its README.md),
// read by the tests that compare with them, so each number exists once: a
// small CSV reader (RFC 4180: quoted cells may hold commas and "" for a quote).
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "fixtures.hpp"

namespace cuboid::test {

// One CSV record: column name -> cell text.
class CsvRow {
 public:
  CsvRow(std::string source, std::map<std::string, std::string> cells)
      : source_(std::move(source)), cells_(std::move(cells)) {}
  const std::string& operator[](const std::string& column) const {
    const auto it = cells_.find(column);
    if (it == cells_.end()) throw std::runtime_error(source_ + ": no column " + column);
    return it->second;
  }
  int integer(const std::string& column) const { return std::stoi((*this)[column]); }
  double number(const std::string& column) const { return std::stod((*this)[column]); }
  // A measured value, 0 where the source gives none ("?").
  double measured(const std::string& column) const {
    const std::string& s = (*this)[column];
    return s == "?" ? 0.0 : std::stod(s);
  }

 private:
  std::string source_;
  std::map<std::string, std::string> cells_;
};

inline std::vector<CsvRow> read_csv(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path.string() + ": cannot open");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  std::vector<std::vector<std::string>> records;
  std::vector<std::string> record;
  std::string cell;
  bool quoted = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        cell += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cell += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      record.push_back(std::move(cell));
      cell.clear();
    } else if (c == '\n') {
      record.push_back(std::move(cell));
      cell.clear();
      records.push_back(std::move(record));
      record.clear();
    } else if (c != '\r') {
      cell += c;
    }
  }
  if (!cell.empty() || !record.empty()) {
    record.push_back(std::move(cell));
    records.push_back(std::move(record));
  }
  if (records.empty()) throw std::runtime_error(path.string() + ": empty");
  const std::vector<std::string>& header = records.front();
  std::vector<CsvRow> rows;
  for (std::size_t r = 1; r < records.size(); ++r) {
    if (records[r].size() != header.size())
      throw std::runtime_error(path.string() + ": line " + std::to_string(r + 1) + " has " +
                               std::to_string(records[r].size()) + " cells, the header " +
                               std::to_string(header.size()));
    std::map<std::string, std::string> cells;
    for (std::size_t i = 0; i < header.size(); ++i) cells[header[i]] = records[r][i];
    rows.emplace_back(path.filename().string(), std::move(cells));
  }
  return rows;
}

// tests/data/reference/<name>.
inline std::vector<CsvRow> reference_csv(const std::string& name) {
  return read_csv(source_root() / "tests" / "data" / "reference" / name);
}

// The row of `rows` whose `column` is `value`.
inline const CsvRow& row_where(const std::vector<CsvRow>& rows, const std::string& column, const std::string& value) {
  for (const CsvRow& r : rows)
    if (r[column] == value) return r;
  throw std::runtime_error("reference data: no row with " + column + " = " + value);
}

}  // namespace cuboid::test
