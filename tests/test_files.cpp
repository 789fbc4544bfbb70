// cuboid/core/files.hpp and the JSON reader's bounds: regular inputs within
// the size limit, outputs checked before any work and written whole, JSON
// nested at most kMaxJsonDepth deep without a key twice, and messages that
// stay on one short line whatever the user's values.
#include <doctest/doctest.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "cuboid/core/error.hpp"
#include "cuboid/core/files.hpp"
#include "cuboid/core/json_reader.hpp"
#include "cli_run.hpp"

using namespace cuboid;
using cuboid::test::TempDir;
namespace fs = std::filesystem;

namespace {

// The file names in a folder (not recursive).
std::vector<std::string> names(const TempDir& d) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(d.path())) out.push_back(e.path().filename().string());
  return out;
}

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string message(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

std::string nested(int depth) { return "{\"a\": " + std::string(depth - 1, '[') + std::string(depth - 1, ']') + "}"; }

}  // namespace

TEST_CASE("read_input_file reads a regular file and refuses folders, devices, FIFOs and files above the limit") {
  TempDir d("files");
  write(d / "card.json", "{\"a\": 1}");
  CHECK(read_input_file(d / "card.json") == "{\"a\": 1}");
  CHECK(is_input_file(d / "card.json"));
  CHECK_FALSE(is_input_file(d / "other.json"));

  CHECK(message([&] { read_input_file(d / "none.json"); }) ==
        (d / "none.json").string() + ": file not found (fix: check the path; shipped cards are in models/ and topologies/)");
  CHECK(message([&] { read_input_file(d.path()); }) ==
        d.path().string() + ": is a directory, not a file (fix: pass the path of a .json file)");
  CHECK(message([] { read_input_file("/dev/zero"); }) ==
        "/dev/zero: is a character device, not a regular file (fix: give the path of a file: cuboid reads only regular files)");
  REQUIRE(::mkfifo((d / "fifo").c_str(), 0600) == 0);
  CHECK(message([&] { read_input_file(d / "fifo"); }).find("fifo: is a FIFO (named pipe), not a regular file") != std::string::npos);
  // A sparse file one byte above the limit: refused from its size, never read.
  write(d / "huge.json", "");
  fs::resize_file(d / "huge.json", kMaxInputBytes + 1);
  CHECK(message([&] { read_input_file(d / "huge.json"); }).find("huge.json: is larger than cuboid's limit of 256 MiB") !=
        std::string::npos);
}

TEST_CASE("check_output_paths refuses, before any work, what would destroy or lose a file") {
  TempDir d("files");
  const std::string cl = "command line: ";
  write(d / "input.json", "{}");
  (void)read_input_file(d / "input.json");
  const std::string in = (d / "input.json").string();
  const std::string out = (d / "out.json").string();

  auto check = [](std::vector<OutputPath> outputs) { check_output_paths(outputs); };
  CHECK_NOTHROW(check({{"--out", out}, {"--svg", (d / "out.svg").string()}}));
  CHECK(message([&] { check({{"--out", in}}); }) ==
        cl + "--out: " + in + " is the input " + in + "; writing it would destroy what the command reads (fix: write to another file)");
  // The same file under another spelling, and through a link.
  CHECK(message([&] { check({{"--out", (d / "." / "input.json").string()}}); }).find("is the input") != std::string::npos);
  fs::create_symlink(d / "input.json", d / "link.json");
  CHECK(message([&] { check({{"--out", (d / "link.json").string()}}); }).find("is the input") != std::string::npos);

  CHECK(message([&] { check({{"--out", out}, {"--svg", (d / "." / "out.json").string()}}); }) ==
        cl + "--svg: --out and --svg name the same file " + (d / "." / "out.json").string() +
            "; one would overwrite the other (fix: give each output its own file)");

  write(d / "ro.json", "keep");
  fs::permissions(d / "ro.json", fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  CHECK(message([&] { check({{"--out", (d / "ro.json").string()}}); }) ==
        cl + "--out: " + (d / "ro.json").string() +
            " is read-only; cuboid does not replace it (fix: make it writable, remove it, or write elsewhere)");

  fs::create_directory(d / "ro");
  fs::permissions(d / "ro", fs::perms::owner_read | fs::perms::owner_exec);
  CHECK(message([&] { check({{"--report", (d / "ro" / "r.html").string()}}); }) ==
        cl + "--report: folder " + (d / "ro").string() + " of " + (d / "ro" / "r.html").string() +
            " is not writable (fix: make the folder writable or write elsewhere)");
  CHECK(message([&] { check({{"--out", (d / "missing" / "p.json").string()}}); }).find("does not exist") != std::string::npos);
  CHECK(message([&] { check({{"--out", d.path().string()}}); }).find("is a folder, not a file") != std::string::npos);
  CHECK(message([&] { check({{"--out", "/dev/null"}}); }) ==
        "command line: --out: /dev/null is a character device, not a regular file (fix: give the path of a regular file)");
  CHECK(message([&] { check({{"--out", ""}}); }) == "command line: --out: empty file name (fix: give a file name, e.g. --out out.json)");
}

TEST_CASE("write_output_file writes whole files and refuses what check_output_paths refuses") {
  TempDir d("files");
  write_output_file(d / "a.json", "old");
  write_output_file(d / "a.json", "new");
  CHECK(read(d / "a.json") == "new");
  CHECK(names(d) == std::vector<std::string>{"a.json"});  // no temporary left

  write(d / "ro.json", "keep");
  fs::permissions(d / "ro.json", fs::perms::owner_read);
  CHECK(message([&] { write_output_file(d / "ro.json", "x"); }).find("is read-only") != std::string::npos);
  CHECK(read(d / "ro.json") == "keep");

  write(d / "in.json", "{}");
  (void)read_input_file(d / "in.json");
  CHECK(message([&] { write_output_file(d / "in.json", "x"); }) ==
        (d / "in.json").string() + ": is the input " + (d / "in.json").string() +
            "; writing it would destroy what the command reads (fix: write to another file)");
  CHECK(read(d / "in.json") == "{}");

  CHECK(message([] { write_output_file("/nonexistent-cuboid-dir/plan.json", "{}"); }) ==
        "/nonexistent-cuboid-dir/plan.json: directory /nonexistent-cuboid-dir does not exist (fix: create the directory first, "
        "or write to an existing one)");
  // /proc refuses new files even for root, so this holds in containers too.
  CHECK(message([] { write_output_file("/proc/cuboid-plan.json", "{}"); }).rfind("/proc/cuboid-plan.json: cannot create a file in /proc: ", 0) == 0);
  CHECK_FALSE(fs::exists("/proc/cuboid-plan.json"));
}

TEST_CASE("JSON is read at most kMaxJsonDepth deep, and a key twice in one object is refused with its path") {
  CHECK_NOTHROW(parse_json_text(nested(kMaxJsonDepth), "ok.json"));
  CHECK(message([] { parse_json_text(nested(kMaxJsonDepth + 1), "deep.json"); }) ==
        "deep.json: nested more than 64 levels deep (fix: cuboid's files nest a few levels; give the card, plan or "
        "measurements file itself)");
  // A million levels: refused at level 64, long before any recursion could run out of stack.
  CHECK(message([] { parse_json_text(nested(1000000), "deeper.json"); }).find("nested more than 64") != std::string::npos);

  CHECK(message([] { parse_json_text(R"({"parallel": {"tp": 4, "pp": 2, "tp": 8}})", "plan.json"); }) ==
        "plan.json: parallel.tp: appears twice in one object (fix: keep one of the two (JSON readers differ on which "
        "one counts))");
  CHECK(message([] { parse_json_text(R"({"ops": [{"name": "a"}, {"name": "b", "name": "c"}]})", "m.json"); }) ==
        "m.json: ops[].name: appears twice in one object (fix: keep one of the two (JSON readers differ on which one "
        "counts))");
  // The same key in sibling objects is fine.
  CHECK_NOTHROW(parse_json_text(R"({"a": {"x": 1}, "b": {"x": 2}, "c": [{"x": 1}, {"x": 2}]})", "ok.json"));
}

TEST_CASE("messages stay on one short line whatever the values") {
  CHECK(quote_value("bogus") == "\"bogus\"");
  CHECK(quote_value("a\nb") == "\"a\\nb\"");
  CHECK(quote_value(std::string(1000, 'x')) == "\"" + std::string(40, 'x') + "...\" (1000 characters)");
  // A cut never splits a UTF-8 character: 20 two-byte letters, cut at 39 bytes, keep 19.
  std::string umlauts;
  for (int i = 0; i < 30; ++i) umlauts += "\xc3\xa4";
  CHECK(quote_value(umlauts, 39).size() == std::string("\"...\" (60 characters)").size() + 38);

  const InputError e("card.json", std::string(500, 'k'), "bad\nvalue", "fix\tit");
  const std::string what = e.what();
  CHECK(what.find('\n') == std::string::npos);
  CHECK(what.find('\t') == std::string::npos);
  CHECK(what.find("... (500 characters)") != std::string::npos);
  CHECK(what.find("bad\\nvalue") != std::string::npos);
  CHECK(what.size() < 400);
}
