#include "gradwire/data/progress.h"

#include <unistd.h>

namespace gw::data {

ProgressBar::ProgressBar(std::string label, int64_t total, std::FILE* out)
    : label_(std::move(label)), total_(total > 0 ? total : 1), out_(out),
      tty_(::isatty(::fileno(out)) != 0) {}

void ProgressBar::Update(int64_t done, const std::string& fields) {
  const auto now = std::chrono::steady_clock::now();
  const int decile = static_cast<int>(10 * done / total_);
  if (tty_) {
    if (drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  } else if (decile == last_decile_ || done >= total_) {
    return;  // the final line is Finish()'s
  }
  last_draw_ = now;
  last_decile_ = decile;
  Draw(done, fields);
}

void ProgressBar::Draw(int64_t done, const std::string& fields) {
  drawn_ = true;
  constexpr int kWidth = 24;
  const int filled = static_cast<int>(kWidth * done / total_);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '.');
  std::fprintf(out_, "%s%s [%s] %lld/%lld %s%s", tty_ ? "\r\033[K" : "", label_.c_str(),
               bar.c_str(), static_cast<long long>(done), static_cast<long long>(total_),
               fields.c_str(), tty_ ? "" : "\n");
  std::fflush(out_);
}

void ProgressBar::Finish(const std::string& fields) {
  Draw(total_, fields);
  if (tty_) std::fputc('\n', out_);
  std::fflush(out_);
}

}  // namespace gw::data
