// Benchmark `checksums` (issue 28, BENCHMARKS.md): what the CRC32C checksums and the
// finite-value check of tensor files (nn/serialize.h) cost, on tables the size of W6's:
// an MLP 784-512-512-10 as float32 values plus one momentum buffer of the same size
// (12 tables, 669,706 floats each side, 5.36 MB of payload).
//
//   checksum_bench [--quick]
//
// Figures, each the median over the timed iterations:
//   crc32c_gbps                        Crc32c over the tables' payload (what the CPU picks:
//                                      AVX-512 VPCLMULQDQ folding here), from the cache
//   crc32c_sse42_gbps, crc32c_portable_gbps  the same with three streams of the CRC32
//                                      instruction and with the portable slicing-by-8 loop
//   crc32c_64MiB_gbps                  Crc32c over 64 MiB (from memory)
//   crc_ms                             Crc32c over every table's payload: what a save checksums
//   save_<fs>_ms                       SaveTensors of the tables (checksums computed while
//                                      writing; temp file, fsync, rename, directory fsync)
//   raw_write_<fs>_ms                  the same file written the same way (temporary file,
//                                      writev of the payloads from the tensors and of the
//                                      other bytes, fsync, close, rename, directory fsync)
//                                      without computing anything: the floor
//   crc_share_<fs>                     crc_ms / save_<fs>_ms (percent)
//   save_over_raw_<fs>                 save / raw_write - 1 (percent)
//   load_<fs>_ms                       LoadTensors with the default options: every CRC and
//                                      the finite check, in one pass with the copy
//   load_allow_non_finite_<fs>_ms      the same without the finite check
//   load_v1_<fs>_ms                    the same tables in a version 1 file (no CRCs to check)
// with <fs> = shm (/dev/shm, tmpfs: fsync costs nothing) and disk (/tmp). The iterations
// of save and raw write (and of the three loads) are interleaved, so that drift of the
// machine's speed hits them alike.
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "bench_util.h"
#include "gradwire/nn/crc32c.h"
#include "gradwire/nn/serialize.h"

namespace {

using gw::Tensor;
using gw::nn::NamedTensors;

// The directory of the files being measured, removed by Fail too.
std::string scratch_dir;

void Fail(const std::string& what) {
  std::fprintf(stderr, "checksum_bench: %s\n", what.c_str());
  if (!scratch_dir.empty()) std::filesystem::remove_all(scratch_dir);
  std::exit(1);
}

// W6's parameters and one momentum buffer for each.
NamedTensors W6Tables() {
  gw::Generator gen(0);
  NamedTensors tables;
  const int64_t widths[] = {784, 512, 512, 10};
  for (int layer = 0; layer < 3; ++layer) {
    const std::string prefix = std::to_string(2 * layer);
    const gw::Shape weight = {widths[layer + 1], widths[layer]}, bias = {widths[layer + 1]};
    tables.emplace_back(prefix + ".weight", Tensor::Randn(weight, gen));
    tables.emplace_back(prefix + ".bias", Tensor::Randn(bias, gen));
    tables.emplace_back(prefix + ".weight.momentum", Tensor::Randn(weight, gen));
    tables.emplace_back(prefix + ".bias.momentum", Tensor::Randn(bias, gen));
  }
  return tables;
}

// The file SaveTensors wrote, as it writes it: the small parts (header, metadata, CRCs,
// trailer) from the file's bytes, the payloads from the tensors' own memory.
std::vector<iovec> Pieces(const std::string& file, const NamedTensors& tables) {
  std::vector<iovec> pieces;
  size_t at = 0;
  auto small = [&](size_t n) {
    pieces.push_back({const_cast<char*>(file.data() + at), n});
    at += n;
  };
  small(16);  // header
  for (const auto& [name, t] : tables) {
    small(4 + name.size() + 2 + 8 * static_cast<size_t>(t.dim()) + 8);  // metadata
    pieces.push_back({const_cast<void*>(t.raw_data()), t.nbytes()});
    at += t.nbytes();
    small(4);  // the entry's CRC
  }
  small(12);  // trailer
  if (at != file.size()) Fail("the file's layout is not the one expected");
  return pieces;
}

// What SaveTensors does with those pieces, without computing anything: temporary file,
// writev, fsync, close, rename, directory fsync.
void RawWrite(const std::string& path, std::vector<iovec> pieces) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) Fail("cannot create " + tmp);
  size_t total = 0;
  for (const iovec& v : pieces) total += v.iov_len;
  const ssize_t w = ::writev(fd, pieces.data(), static_cast<int>(pieces.size()));
  if (w != static_cast<ssize_t>(total)) Fail("short write to " + tmp);  // regular files: all at once
  if (::fsync(fd) != 0 || ::close(fd) != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) Fail("cannot finish " + path);
  const int dir = ::open(std::filesystem::path(path).parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0 || ::fsync(dir) != 0) Fail("cannot sync the directory of " + path);
  ::close(dir);
}

double Median(const std::vector<double>& v) { return gw::bench::Quantile(v, 0.5); }

// Runs the functions in rounds, each round in another order (so that none always follows
// the same one, inheriting its writeback or its cache), and returns each one's median ms
// over the rounds after the first two.
std::vector<double> Interleaved(int rounds, const std::vector<std::function<void()>>& fns) {
  std::vector<std::vector<double>> ms(fns.size());
  for (int round = 0; round < rounds + 2; ++round) {
    for (size_t k = 0; k < fns.size(); ++k) {
      const size_t f = (k + static_cast<size_t>(round)) % fns.size();
      const double t0 = gw::bench::NowSeconds();
      fns[f]();
      if (round >= 2) ms[f].push_back((gw::bench::NowSeconds() - t0) * 1e3);
    }
  }
  std::vector<double> medians;
  for (const auto& m : ms) medians.push_back(Median(m));
  return medians;
}

// The same file in version 1 (no CRCs, no trailer), from a version 2 file's bytes.
std::string VersionOne(const std::string& file, const NamedTensors& tables) {
  std::string v1 = file.substr(0, 16);
  const uint32_t one = 1;
  std::memcpy(v1.data() + 4, &one, 4);
  size_t at = 16;
  for (const auto& [name, t] : tables) {
    const size_t entry = 4 + name.size() + 2 + 8 * static_cast<size_t>(t.dim()) + 8 + t.nbytes();
    v1 += file.substr(at, entry);
    at += entry + 4;
  }
  return v1;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int iters = quick ? 5 : 60;
  const NamedTensors tables = W6Tables();
  uint64_t payload = 0;
  for (const auto& [name, t] : tables) payload += t.nbytes();
  std::fprintf(stderr, "checksums: %zu tables, %.2f MB of payload\n", tables.size(), static_cast<double>(payload) / 1e6);

  volatile uint32_t sink = 0;  // the CRCs are used: no call is optimised away
  auto crc_all = [&](auto extend) {
    uint32_t crc = 0;
    for (const auto& [name, t] : tables) crc = extend(crc, t.raw_data(), t.nbytes());
    sink = crc;
  };
  const double crc_ms = Median(gw::bench::TimeMs(3, iters * 5, [&] { crc_all(&gw::nn::Crc32cExtend); }));
  const double sse42_ms =
      gw::nn::crc32c_internal::HasSse42()
          ? Median(gw::bench::TimeMs(3, iters * 5, [&] { crc_all(&gw::nn::crc32c_internal::ExtendSse42); }))
          : 0;
  const double portable_ms =
      Median(gw::bench::TimeMs(1, iters, [&] { crc_all(&gw::nn::crc32c_internal::ExtendPortable); }));
  std::string big(64 << 20, '\x5a');
  const double big_ms = Median(gw::bench::TimeMs(1, quick ? 3 : 10, [&] { sink = gw::nn::Crc32c(big.data(), big.size()); }));
  big.clear();
  big.shrink_to_fit();
  gw::bench::Report("checksums", "crc32c_gbps", static_cast<double>(payload) / crc_ms / 1e6, "GB/s");
  if (sse42_ms > 0) gw::bench::Report("checksums", "crc32c_sse42_gbps", static_cast<double>(payload) / sse42_ms / 1e6, "GB/s");
  gw::bench::Report("checksums", "crc32c_portable_gbps", static_cast<double>(payload) / portable_ms / 1e6, "GB/s");
  gw::bench::Report("checksums", "crc32c_64MiB_gbps", static_cast<double>(64 << 20) / big_ms / 1e6, "GB/s");
  gw::bench::Report("checksums", "crc_ms", crc_ms, "ms");

  for (const auto& [fs, root] : {std::pair<std::string, std::string>{"shm", "/dev/shm"}, {"disk", "/tmp"}}) {
    std::string dir = root + "/gw-checksum-bench-XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr) Fail("cannot make a directory under " + root);
    scratch_dir = dir;
    const std::string saved = dir + "/saved.gwtf", raw = dir + "/raw.gwtf";
    if (absl::Status s = gw::nn::SaveTensors(saved, tables); !s.ok()) Fail(std::string(s.message()));
    std::ifstream in(saved, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::vector<iovec> pieces = Pieces(bytes, tables);
    auto save = [&] {
      if (absl::Status s = gw::nn::SaveTensors(saved, tables); !s.ok()) Fail(std::string(s.message()));
    };
    const std::vector<double> writes = Interleaved(iters, {save, [&] { RawWrite(raw, pieces); }});
    const std::string v1 = dir + "/v1.gwtf";
    std::ofstream(v1, std::ios::binary) << VersionOne(bytes, tables);
    auto load = [&](const std::string& path, gw::nn::LoadOptions options) {
      return [&, path, options] {
        if (!gw::nn::LoadTensors(path, options).ok()) Fail("cannot load " + path);
      };
    };
    const std::vector<double> loads =
        Interleaved(iters, {load(saved, {}), load(saved, {.allow_non_finite = true}), load(v1, {})});
    std::filesystem::remove_all(dir);
    scratch_dir.clear();
    gw::bench::Report("checksums", "save_" + fs + "_ms", writes[0], "ms");
    gw::bench::Report("checksums", "raw_write_" + fs + "_ms", writes[1], "ms");
    gw::bench::Report("checksums", "crc_share_" + fs, 100 * crc_ms / writes[0], "%");
    gw::bench::Report("checksums", "save_over_raw_" + fs, 100 * (writes[0] / writes[1] - 1), "%");
    gw::bench::Report("checksums", "load_" + fs + "_ms", loads[0], "ms");
    gw::bench::Report("checksums", "load_allow_non_finite_" + fs + "_ms", loads[1], "ms");
    gw::bench::Report("checksums", "load_v1_" + fs + "_ms", loads[2], "ms");
  }
  return 0;
}
