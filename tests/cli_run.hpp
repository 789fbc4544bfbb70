#pragma once
// Running the real cuboid binary (CUBOID_BIN, set by meson test) from a test:
// exit code, stdout and stderr, each test case in its own fresh folder.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace cuboid::test {

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

// A fresh, empty folder under the temp dir, removed when the object goes.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("cuboid_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    // A case may have made a file or folder read-only: give write permission back first.
    for (auto it = std::filesystem::recursive_directory_iterator(path_, ec); !ec && it != std::filesystem::recursive_directory_iterator();
         it.increment(ec))
      std::filesystem::permissions(it->path(), std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  // The files in the folder (recursively), each with its permissions and
  // contents, to see that nothing new appeared and nothing was changed.
  std::map<std::string, std::string> listing() const {
    std::map<std::string, std::string> files;
    for (const auto& e : std::filesystem::recursive_directory_iterator(path_)) {
      std::string what = std::to_string(static_cast<unsigned>(e.status().permissions())) + ":";
      what += e.is_regular_file() ? slurp(e.path()) : std::string("<not a regular file>");
      files[e.path().string()] = std::move(what);
    }
    return files;
  }

 private:
  std::filesystem::path path_;
};

// Runs `cuboid <args>` with stdout and stderr captured in files of `capture_dir`
// (which should not be the folder a test watches).
inline CliResult run_cuboid(const std::string& args, const std::filesystem::path& capture_dir) {
  const char* bin = std::getenv("CUBOID_BIN");
  REQUIRE_MESSAGE(bin != nullptr, "CUBOID_BIN must name the cuboid binary (meson test sets it)");
  const auto out_file = capture_dir / "stdout.txt";
  const auto err_file = capture_dir / "stderr.txt";
  const std::string cmd = std::string(bin) + " " + args + " >" + out_file.string() + " 2>" + err_file.string();
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  r.out = slurp(out_file);
  r.err = slurp(err_file);
  std::filesystem::remove(out_file);
  std::filesystem::remove(err_file);
  return r;
}

inline int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n' ? 1 : 0;
  return n;
}

}  // namespace cuboid::test
