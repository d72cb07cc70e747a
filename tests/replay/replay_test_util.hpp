// Helpers shared by the replay tests: a temporary directory, writing trace text plain
// or gzip-compressed (through zlib, as a user's tool would), and small traces.
#pragma once

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace reservoir::replay::test {

// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "reservoir-replay-XXXXXX");
    if (mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void write_plain(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

inline void write_gzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())),
            static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

inline std::string read_gzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  std::string out;
  if (f == nullptr) return out;
  char buf[4096];
  int n = 0;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, static_cast<std::size_t>(n));
  gzclose(f);
  return out;
}

// Every kind of event, two streams.
inline std::string sample_trace_text() {
  return "# trace v1: a,ID,SIZE,STREAM | f,ID | u,ID,STREAM | s,STREAM\n"
         "a,0,1048576,0\n"
         "a,1,4096,0\n"
         "a,2,33554432,1\n"
         "u,0,1\n"
         "f,1\n"
         "s,1\n"
         "f,0\n"
         "a,3,2097152,0\n"
         "f,2\n"
         "f,3\n";
}

}  // namespace reservoir::replay::test
