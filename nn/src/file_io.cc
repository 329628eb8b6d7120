#include "gradwire/nn/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gw::nn {
namespace {

// A Status for the errno of a failed system call on `path`, its code from the errno.
absl::Status Errno(absl::string_view what, const std::string& path) {
  const int e = errno;
  return absl::ErrnoToStatus(e, absl::StrCat(what, " '", path, "'"));
}

class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now, returning close()'s result (errno set on failure).
  int Close() { return ::close(std::exchange(fd_, -1)); }

 private:
  int fd_;
};

// Writes every piece to fd (writev, as few calls as IOV_MAX allows). False on an error
// (errno set).
bool WriteAll(int fd, const std::vector<absl::string_view>& in) {
  std::vector<iovec> pieces;
  for (absl::string_view p : in) {
    if (!p.empty()) pieces.push_back({const_cast<char*>(p.data()), p.size()});
  }
  for (size_t next = 0; next < pieces.size();) {
    const int count = static_cast<int>(std::min<size_t>(pieces.size() - next, IOV_MAX));
    const ssize_t w = ::writev(fd, &pieces[next], count);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (w == 0) {  // nothing written with bytes left: not a regular file's behaviour
      errno = EIO;
      return false;
    }
    // Skip what was written; a piece written in part is advanced.
    for (size_t left = static_cast<size_t>(w); left > 0;) {
      iovec& piece = pieces[next];
      const size_t step = std::min(left, piece.iov_len);
      piece.iov_base = static_cast<char*>(piece.iov_base) + step;
      piece.iov_len -= step;
      left -= step;
      if (piece.iov_len == 0) ++next;
    }
    while (next < pieces.size() && pieces[next].iov_len == 0) ++next;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, absl::string_view who) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return Errno(absl::StrCat(who, ": cannot open"), path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Errno(absl::StrCat(who, ": cannot stat"), path);
  if (S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(who, ": '", path, "' is a directory, not a file"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(who, ": '", path, "' is not a regular file"));
  }
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t r = ::read(fd.get(), data.data() + got, data.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno(absl::StrCat(who, ": cannot read"), path);
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  data.resize(got);  // shorter than fstat said (it shrank): the parse names what is missing
  return data;
}

absl::Status WriteFileAtomically(const std::string& path, const std::vector<absl::string_view>& pieces,
                                 absl::string_view who, absl::string_view writer) {
  const std::string tmp = writer.empty() ? absl::StrCat(path, ".tmp") : absl::StrCat(path, ".", writer, ".tmp");
  ScopedFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return Errno(absl::StrCat(who, ": cannot create"), tmp);
  if (!WriteAll(fd.get(), pieces) || ::fsync(fd.get()) != 0) {
    absl::Status s = Errno(absl::StrCat(who, ": cannot write"), tmp);
    ::unlink(tmp.c_str());
    return s;
  }
  if (fd.Close() != 0) {
    absl::Status s = Errno(absl::StrCat(who, ": cannot close"), tmp);
    ::unlink(tmp.c_str());
    return s;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = Errno(absl::StrCat(who, ": cannot rename '", tmp, "' to"), path);
    ::unlink(tmp.c_str());
    return s;
  }
  // The directory too, so that the rename into it is durable.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const ScopedFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() < 0) {
    return Errno(absl::StrCat(who, ": '", path, "' is in place, but cannot open its directory"), dir);
  }
  if (::fsync(dir_fd.get()) != 0) {
    return Errno(absl::StrCat(who, ": '", path, "' is in place, but cannot sync its directory"), dir);
  }
  return absl::OkStatus();
}

}  // namespace gw::nn
