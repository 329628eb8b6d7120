#include "gradwire/rpc/security.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "security/handshake.h"

namespace gw::rpc {
namespace {

// A secret file larger than this is not one (a path naming something else by mistake).
constexpr size_t kMaxSecretBytes = 1 << 16;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

absl::Status Readable(const char* what, const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("TLS ", what, " file '", path,
                                                   "' cannot be read (scripts/make-certs makes a test CA and "
                                                   "certificates)"));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status ReadLimit(const char* name, T* field) {
  const std::string v = Env(name);
  if (v.empty()) return absl::OkStatus();
  if (!absl::SimpleAtoi(v, field) || *field < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad ", name, "=", v, " (a count, 0 for no limit)"));
  }
  return absl::OkStatus();
}

// N when `path` names an inherited descriptor, /proc/self/fd/N or /dev/fd/N (how
// `gradwire launch` passes the job secret's memfd); -1 otherwise.
int InheritedDescriptor(const std::string& path) {
  absl::string_view rest = path;
  if (!absl::ConsumePrefix(&rest, "/proc/self/fd/") && !absl::ConsumePrefix(&rest, "/dev/fd/")) return -1;
  int fd = -1;
  if (rest.empty() || !std::all_of(rest.begin(), rest.end(), absl::ascii_isdigit) || !absl::SimpleAtoi(rest, &fd)) {
    return -1;
  }
  return fd;
}

const char* FileKind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a pipe";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  return "not a regular file";
}

// The secret in GRADWIRE_SECRET_FILE=`path`: a regular file (a memfd is one), never a
// pipe, socket or device, whose reading could block or yield someone else's bytes. For an
// inherited descriptor (/proc/self/fd/N) the descriptor itself is checked and read, then
// marked close-on-exec: the programs this worker starts do not inherit the secret.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  const std::string what = absl::StrCat("GRADWIRE_SECRET_FILE=", path);
  const int inherited = InheritedDescriptor(path);
  // Why a descriptor the launcher passed can be missing or be something else here.
  const std::string closed_hint =
      inherited < 0
          ? std::string()
          : absl::StrCat(": the descriptor ", inherited,
                         " that `gradwire launch` passed to its workers (the job "
                         "secret's memfd) was closed by something between the launcher and this process, which "
                         "may then have opened another file under that number (Python's subprocess closes "
                         "inherited descriptors unless given pass_fds=(",
                         inherited,
                         ",); sudo closes them too), "
                         "or this process was executed by a worker "
                         "that had read the secret (the descriptor is close-on-exec from then on: pass the "
                         "secret on as GRADWIRE_SECRET or in a file of your own)");
  int fd = inherited;
  int opened = -1;
  if (inherited < 0) {
    // O_NONBLOCK: opening a FIFO with no writer must not hang (it is refused below).
    opened = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (opened < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, " cannot be read (", std::strerror(errno),
                                                     "): it names the file holding the job's secret"));
    }
    fd = opened;
  }
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } closer{opened};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    if (err == EBADF && inherited >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " cannot be read: descriptor ", inherited, " is not open in this process", closed_hint));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(what, " cannot be read (", std::strerror(err), "): it names the file holding the job's secret"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", FileKind(st.st_mode),
                                                   ", not the regular file holding the job's secret",
                                                   inherited >= 0 ? closed_hint : std::string()));
  }
  std::string bytes;
  char buffer[4096];
  for (off_t offset = 0;;) {
    // pread: an inherited descriptor's offset is shared with every process holding it.
    const ssize_t n = ::pread(fd, buffer, sizeof buffer, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, " cannot be read (", std::strerror(errno),
                                                     "): it names the file holding the job's secret"));
    }
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
    offset += n;
    if (bytes.size() > kMaxSecretBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " is larger than ", kMaxSecretBytes, " bytes: it should hold only the job's secret"));
    }
  }
  if (inherited >= 0) {
    // Read once per process (restarts of a worker are new processes the launcher starts
    // with the descriptor open); nothing this worker executes gets the secret.
    const int flags = ::fcntl(fd, F_GETFD);
    if (flags < 0 || ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC) != 0) {
      return absl::InternalError(
          absl::StrCat(what, ": cannot mark descriptor ", inherited, " close-on-exec (", std::strerror(errno), ")"));
    }
  }
  std::string secret(absl::StripTrailingAsciiWhitespace(bytes));
  if (secret.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  return secret;
}

}  // namespace

absl::Status Security::Validate() const {
  if (!tls.enabled()) return absl::OkStatus();
  if (tls.cert_file.empty() || tls.key_file.empty() || tls.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs a certificate, its key and the job's CA (TlsOptions cert_file, key_file, ca_file; "
        "GRADWIRE_TLS_CERT, GRADWIRE_TLS_KEY, GRADWIRE_TLS_CA): some are missing");
  }
  for (auto [what, path] :
       {std::pair{"certificate", &tls.cert_file}, std::pair{"key", &tls.key_file}, std::pair{"CA", &tls.ca_file}}) {
    if (absl::Status s = Readable(what, *path); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<Security> Security::FromEnv() {
  Security s;
  if (std::string auth = absl::AsciiStrToLower(Env("GRADWIRE_AUTH")); !auth.empty()) {
    if (auth != "off" && auth != "on") {
      return absl::InvalidArgumentError(absl::StrCat("bad GRADWIRE_AUTH=", auth, " (on or off)"));
    }
    s.authenticate = auth == "on";
  }
  s.secret = Env("GRADWIRE_SECRET");
  if (std::string file = Env("GRADWIRE_SECRET_FILE"); !file.empty() && s.secret.empty()) {
    absl::StatusOr<std::string> secret = ReadSecretFile(file);
    if (!secret.ok()) return secret.status();
    s.secret = *std::move(secret);
  }
  s.tls.cert_file = Env("GRADWIRE_TLS_CERT");
  s.tls.key_file = Env("GRADWIRE_TLS_KEY");
  s.tls.ca_file = Env("GRADWIRE_TLS_CA");
  if (absl::Status v = s.Validate(); !v.ok()) return v;
  for (absl::Status v : {ReadLimit("GRADWIRE_MAX_CALLS_IN_FLIGHT", &s.limits.max_calls_in_flight),
                         ReadLimit("GRADWIRE_MAX_RREFS_PER_PEER", &s.limits.max_rrefs),
                         ReadLimit("GRADWIRE_MAX_CONTEXTS_PER_PEER", &s.limits.max_contexts),
                         ReadLimit("GRADWIRE_MAX_CONNECTIONS_PER_SECOND", &s.limits.max_connections_per_second)}) {
    if (!v.ok()) return v;
  }
  return s;
}

std::string MakeJobSecret() { return absl::BytesToHexString(internal::Handshake::RandomBytes(32)); }

}  // namespace gw::rpc
