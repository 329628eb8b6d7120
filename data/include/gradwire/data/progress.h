// ProgressBar: one self-updating status line for long-running loops.
//
// Contract
//   - Update(done, fields) redraws "label [#####.....] done/total fields" on the given
//     stream, at most every 100 ms; Finish(fields) always draws the final state.
//   - On a terminal it rewrites the line with '\r'; otherwise (CI logs, pipes) it prints a
//     new line at most every ~10% so logs stay short.
//   - Finish() ends the line. Not thread-safe.
#ifndef GRADWIRE_DATA_PROGRESS_H_
#define GRADWIRE_DATA_PROGRESS_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace gw::data {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, std::FILE* out = stderr);
  void Update(int64_t done, const std::string& fields = "");
  void Finish(const std::string& fields = "");

 private:
  void Draw(int64_t done, const std::string& fields);

  std::string label_;
  int64_t total_;
  std::FILE* out_;
  bool tty_;
  std::chrono::steady_clock::time_point last_draw_{};
  int last_decile_ = -1;
  bool drawn_ = false;
};

}  // namespace gw::data

#endif  // GRADWIRE_DATA_PROGRESS_H_
