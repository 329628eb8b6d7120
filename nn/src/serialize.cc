#include "gradwire/nn/serialize.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gradwire/tensor/kernels.h"

namespace gw::nn {
namespace {

constexpr char kMagic[4] = {'G', 'W', 'T', 'F'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxNameBytes = 4096;
constexpr uint8_t kMaxDims = 16;

static_assert(std::endian::native == std::endian::little, "the file format is little-endian");

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " '", path, "': ", std::strerror(errno)));
}

// Reads fixed-size values from a byte range, failing instead of reading past the end.
class Reader {
 public:
  Reader(const std::string& data, const std::string& path) : data_(data), path_(path) {}
  template <typename T>
  bool Get(T* v) {
    if (data_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Bytes(size_t n, const char** p) {
    if (data_.size() - pos_ < n) return false;
    *p = data_.data() + pos_;
    pos_ += n;
    return true;
  }
  size_t remaining() const { return data_.size() - pos_; }
  absl::Status Corrupt(const std::string& what) const {
    return absl::DataLossError(absl::StrCat("LoadTensors: '", path_, "' is corrupt at byte ", pos_,
                                            ": ", what));
  }

 private:
  const std::string& data_;
  const std::string& path_;
  size_t pos_ = 0;
};

}  // namespace

absl::Status SaveTensors(const std::string& path, const NamedTensors& tensors) {
  std::string header;
  header.append(kMagic, 4);
  Put<uint32_t>(&header, kVersion);
  Put<uint64_t>(&header, tensors.size());
  for (const auto& [name, t] : tensors) {
    if (!t.defined() || t.dim() > kMaxDims || name.size() > kMaxNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SaveTensors: entry '", name, "' cannot be saved (undefined, more than ",
          int{kMaxDims}, " dims, or a name over ", kMaxNameBytes, " bytes)"));
    }
  }
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("SaveTensors: cannot create", tmp);
  auto write_all = [&](const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  };
  bool ok = write_all(header.data(), header.size());
  for (const auto& [name, t] : tensors) {
    if (!ok) break;
    Tensor c = kernels::Contiguous(t);
    std::string meta;
    Put<uint32_t>(&meta, static_cast<uint32_t>(name.size()));
    meta += name;
    Put<uint8_t>(&meta, static_cast<uint8_t>(t.dtype()));
    Put<uint8_t>(&meta, static_cast<uint8_t>(t.dim()));
    for (int64_t d : t.sizes()) Put<int64_t>(&meta, d);
    Put<uint64_t>(&meta, c.nbytes());
    ok = write_all(meta.data(), meta.size()) &&
         write_all(static_cast<const char*>(c.raw_data()), c.nbytes());
  }
  if (!ok || ::fsync(fd) != 0) {
    absl::Status s = Errno("SaveTensors: cannot write", tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  if (::close(fd) != 0) return Errno("SaveTensors: cannot close", tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return Errno("SaveTensors: cannot rename to", path);
  return absl::OkStatus();
}

namespace {

// The whole file, read with open/fstat/read so that every failure is a Status naming the
// path with the errno's code (NOT_FOUND, PERMISSION_DENIED, ...), never an exception: a
// std::ifstream on a directory opens, then throws from its first read.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    return absl::ErrnoToStatus(e, absl::StrCat("LoadTensors: cannot open '", path, "'"));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const bool is_dir = S_ISDIR(st.st_mode);
    const int e = errno;
    ::close(fd);
    if (is_dir) {
      return absl::FailedPreconditionError(
          absl::StrCat("LoadTensors: '", path, "' is a directory, not a tensor file"));
    }
    return e != 0 ? absl::ErrnoToStatus(e, absl::StrCat("LoadTensors: cannot stat '", path, "'"))
                  : absl::FailedPreconditionError(absl::StrCat("LoadTensors: '", path, "' is not a regular file"));
  }
  std::string data;
  data.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::read(fd, data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return absl::ErrnoToStatus(e, absl::StrCat("LoadTensors: cannot read '", path, "'"));
    }
    if (n == 0) break;  // shorter than fstat said (it shrank): the parse names what is missing
    got += static_cast<size_t>(n);
  }
  data.resize(got);
  ::close(fd);
  return data;
}

}  // namespace

absl::StatusOr<NamedTensors> LoadTensors(const std::string& path) {
  absl::StatusOr<std::string> file = ReadFile(path);
  if (!file.ok()) return file.status();
  const std::string& data = *file;
  Reader r(data, path);
  const char* magic;
  uint32_t version;
  uint64_t count;
  if (!r.Bytes(4, &magic) || std::memcmp(magic, kMagic, 4) != 0) {
    return r.Corrupt("not a gradwire tensor file (bad magic)");
  }
  if (!r.Get(&version) || version != kVersion) return r.Corrupt("unsupported version");
  if (!r.Get(&count)) return r.Corrupt("truncated header");
  NamedTensors out;
  for (uint64_t i = 0; i < count; ++i) {
    uint32_t name_len;
    const char* name;
    uint8_t dtype, ndim;
    if (!r.Get(&name_len) || name_len > kMaxNameBytes || !r.Bytes(name_len, &name)) {
      return r.Corrupt(absl::StrCat("entry ", i, ": bad name"));
    }
    const std::string entry(name, name_len);
    if (!r.Get(&dtype) || dtype > static_cast<uint8_t>(DType::kBool)) {
      return r.Corrupt(absl::StrCat("entry '", entry, "': bad dtype"));
    }
    if (!r.Get(&ndim) || ndim > kMaxDims) return r.Corrupt(absl::StrCat("entry '", entry, "': bad rank"));
    Shape sizes(ndim);
    uint64_t numel = 1;
    for (auto& d : sizes) {
      // Every size is bounded by the bytes left in the file (even when another size is 0),
      // so no later stride or product can overflow.
      if (!r.Get(&d) || d < 0 || static_cast<uint64_t>(d) > r.remaining() ||
          (d > 0 && numel > r.remaining() / static_cast<uint64_t>(d))) {
        return r.Corrupt(absl::StrCat("entry '", entry, "': bad size"));
      }
      numel *= static_cast<uint64_t>(d);
    }
    uint64_t nbytes;
    const char* payload;
    const DType dt = static_cast<DType>(dtype);
    if (!r.Get(&nbytes) || nbytes != numel * ElementSize(dt) || !r.Bytes(nbytes, &payload)) {
      return r.Corrupt(absl::StrCat("entry '", entry, "': payload length does not match ",
                                    ShapeToString(sizes)));
    }
    Tensor t = Tensor::Empty(sizes, dt);
    if (nbytes > 0) std::memcpy(t.raw_data(), payload, nbytes);
    out.emplace_back(entry, std::move(t));
  }
  if (r.remaining() != 0) return r.Corrupt("trailing bytes after the last entry");
  return out;
}

}  // namespace gw::nn
