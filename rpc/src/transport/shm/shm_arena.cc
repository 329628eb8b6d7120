#include "transport/shm/shm_arena.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"

namespace gw::rpc::internal {
namespace {

constexpr uint64_t kSegmentMagic = 0x414e455241575347;  // "GSWARENA"
constexpr uint64_t kBlockMagic = 0x4b434f4c42575347;    // "GSWBLOCK"
constexpr uint64_t kPage = 4096;
constexpr uint64_t kFirstBlock = kPage;  // the segment header has the first page
constexpr uint64_t kSplitAtLeast = 16 * kPage;
constexpr size_t kFirstSweep = 32;  // receivers watched before exited ones are looked for

struct SegmentHeader {
  uint64_t magic;
  uint64_t cookie;
};

// At the start of every block, in shared memory; both sides touch only `in_use` after
// the sender wrote the header.
struct BlockHeader {
  uint64_t magic;
  std::atomic<uint32_t> in_use;  // 1 from Put until the receiver lets go of the tensor
  uint32_t reserved;
  uint64_t capacity;  // data bytes after the header
};
static_assert(sizeof(BlockHeader) <= kArenaHeaderBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free, "the in-use word is shared between processes");

uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

BlockHeader* HeaderAt(char* base, uint64_t offset) { return reinterpret_cast<BlockHeader*>(base + offset); }

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

}  // namespace

absl::StatusOr<std::unique_ptr<ShmArena>> ShmArena::Create(size_t capacity) {
  capacity = RoundUp(std::max<size_t>(capacity, 2 * kPage), kPage);
  const int fd = ::memfd_create("gradwire-shm-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return absl::UnavailableError(Errno("memfd_create"));
  // Sealed at its size, so a peer that mapped it can never fault past the end.
  if (::ftruncate(fd, static_cast<off_t>(capacity)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const std::string why = Errno("sizing the arena");
    ::close(fd);
    return absl::UnavailableError(why);
  }
  void* base = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const std::string why = Errno("mmap of the arena");
    ::close(fd);
    return absl::UnavailableError(why);
  }
  std::random_device rd;
  const uint64_t cookie = (static_cast<uint64_t>(rd()) << 32) | rd();
  auto* header = static_cast<SegmentHeader*>(base);
  header->magic = kSegmentMagic;
  header->cookie = cookie;
  return std::unique_ptr<ShmArena>(new ShmArena(fd, static_cast<char*>(base), capacity, cookie));
}

ShmArena::~ShmArena() {
  for (const auto& [_, pidfd] : pidfds_) ::close(pidfd);
  ::munmap(base_, capacity_);
  ::close(fd_);
}

void ShmArena::Watch(pid_t peer) {
  if (pidfds_.contains(peer)) return;
  // A server that outlives many short-lived receivers must not collect their pidfds.
  if (pidfds_.size() >= sweep_at_) {
    ReleaseExited();
    sweep_at_ = std::max<size_t>(kFirstSweep, 2 * pidfds_.size());
  }
  // Without pidfds (kernels before 5.3) blocks of exited receivers are not reclaimed.
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, peer, 0));
  if (pidfd >= 0) pidfds_[peer] = pidfd;
}

void ShmArena::ReleaseExited() {
  for (auto it = pidfds_.begin(); it != pidfds_.end();) {
    pollfd p{it->second, POLLIN, 0};
    if (::poll(&p, 1, 0) != 1) {  // still running
      ++it;
      continue;
    }
    for (Block& b : blocks_) {
      if (b.in_use && b.peer == it->first) {
        HeaderAt(base_, b.offset)->in_use.store(0, std::memory_order_release);
        b.in_use = false;
      }
    }
    ::close(it->second);
    pidfds_.erase(it++);
  }
}

void ShmArena::Refresh() {
  for (Block& b : blocks_) {
    if (b.in_use && HeaderAt(base_, b.offset)->in_use.load(std::memory_order_acquire) == 0) b.in_use = false;
  }
}

// The smallest free block of at least `bytes` that wastes at most as much as it uses.
std::optional<size_t> ShmArena::Find(uint64_t bytes) {
  std::optional<size_t> best;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    if (!b.in_use && b.bytes >= bytes && b.bytes <= 2 * bytes && (!best || b.bytes < blocks_[*best].bytes)) best = i;
  }
  return best;
}

// Joins runs of free neighbours; a free run at the top goes back to the uncarved space.
void ShmArena::Merge() {
  std::vector<Block> merged;
  for (const Block& b : blocks_) {
    if (!merged.empty() && !merged.back().in_use && !b.in_use) {
      merged.back().bytes += b.bytes;
    } else {
      merged.push_back(b);
    }
  }
  if (!merged.empty() && !merged.back().in_use) {
    top_ = merged.back().offset;
    merged.pop_back();
  }
  blocks_ = std::move(merged);
}

void ShmArena::Claim(Block& b, pid_t peer) {
  Watch(peer);
  b.in_use = true;
  b.peer = peer;
  BlockHeader* h = HeaderAt(base_, b.offset);
  h->magic = kBlockMagic;
  h->capacity = b.bytes - kArenaHeaderBytes;
  h->in_use.store(1, std::memory_order_relaxed);
}

std::optional<uint64_t> ShmArena::Put(const Tensor& t, pid_t peer) {
  const uint64_t n = static_cast<uint64_t>(t.nbytes());
  const uint64_t need = RoundUp(kArenaHeaderBytes + n, kPage);
  uint64_t offset = 0;
  {
    absl::MutexLock lock(&mu_);
    Refresh();
    std::optional<size_t> i = Find(need);
    if (!i && need <= capacity_ - top_) {
      blocks_.push_back(Block{top_, need});
      top_ += need;
      i = blocks_.size() - 1;
    }
    if (!i) {
      ReleaseExited();
      Merge();
      if (need <= capacity_ - top_) {
        blocks_.push_back(Block{top_, need});
        top_ += need;
        i = blocks_.size() - 1;
      }
      for (size_t k = 0; !i && k < blocks_.size(); ++k) {
        if (!blocks_[k].in_use && blocks_[k].bytes >= need) i = k;
      }
      if (!i) return std::nullopt;
      if (blocks_[*i].bytes - need >= kSplitAtLeast) {  // keep the rest for others
        Block rest{blocks_[*i].offset + need, blocks_[*i].bytes - need};
        blocks_[*i].bytes = need;
        blocks_.insert(blocks_.begin() + static_cast<std::ptrdiff_t>(*i) + 1, rest);
      }
    }
    Claim(blocks_[*i], peer);
    offset = blocks_[*i].offset + kArenaHeaderBytes;
  }
  // Outside the lock: the block is ours until the receiver has it.
  std::memcpy(base_ + offset, t.raw_data(), n);
  std::atomic_thread_fence(std::memory_order_release);
  return offset;
}

ShmArena::Stats ShmArena::stats() {
  absl::MutexLock lock(&mu_);
  Refresh();
  Stats s;
  s.blocks = blocks_.size();
  for (const Block& b : blocks_) s.in_use += b.in_use ? 1 : 0;
  s.high_water = top_;
  return s;
}

absl::StatusOr<std::shared_ptr<PeerArena>> PeerArena::Open(pid_t pid, int fd, size_t capacity, uint64_t cookie) {
  if (capacity < 2 * kPage || capacity % kPage != 0 || capacity > (size_t{1} << 40)) {
    return absl::InvalidArgumentError(absl::StrCat("bad arena size ", capacity));
  }
  const std::string path = absl::StrCat("/proc/", pid, "/fd/", fd);
  const int local = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (local < 0) return absl::UnavailableError(Errno(path.c_str()));
  // Only a segment sealed against shrinking can be mapped safely (no SIGBUS later).
  const int seals = ::fcntl(local, F_GET_SEALS);
  struct stat st {};
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0 || ::fstat(local, &st) != 0 ||
      static_cast<uint64_t>(st.st_size) < capacity) {
    ::close(local);
    return absl::UnavailableError(absl::StrCat(path, " is not a sealed arena of ", capacity, " bytes"));
  }
  void* base = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED, local, 0);
  ::close(local);
  if (base == MAP_FAILED) return absl::UnavailableError(Errno("mmap of a peer's arena"));
  const auto* header = static_cast<const SegmentHeader*>(base);
  if (header->magic != kSegmentMagic || header->cookie != cookie) {
    ::munmap(base, capacity);
    return absl::UnavailableError(absl::StrCat(path, " is not the peer's arena (cookie mismatch)"));
  }
  return std::shared_ptr<PeerArena>(new PeerArena(static_cast<char*>(base), capacity));
}

PeerArena::~PeerArena() { ::munmap(base_, capacity_); }

absl::StatusOr<Tensor> PeerArena::Take(uint64_t offset, DType dtype, const Shape& sizes) {
  uint64_t bytes = ElementSize(dtype);
  for (int64_t d : sizes) {
    if (d < 0 || (d > 0 && bytes > (uint64_t{1} << 40) / static_cast<uint64_t>(d))) {
      return absl::InvalidArgumentError("arena tensor: bad size");
    }
    bytes *= static_cast<uint64_t>(d);
  }
  if (offset < kFirstBlock + kArenaHeaderBytes || offset % kPage != kArenaHeaderBytes || offset > capacity_ ||
      bytes > capacity_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat("arena tensor: offset ", offset, " and ", bytes,
                                                   " bytes are outside the peer's arena"));
  }
  BlockHeader* h = HeaderAt(base_, offset - kArenaHeaderBytes);
  if (h->magic != kBlockMagic || h->capacity < bytes || h->in_use.load(std::memory_order_acquire) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("arena tensor: no block in use at offset ", offset));
  }
  auto storage = Storage::Wrap(base_ + offset, bytes, kCPU, [self = shared_from_this(), h](void*) {
    h->in_use.store(0, std::memory_order_release);  // back to the sender
  });
  return Tensor::FromStorage(std::move(storage), dtype, sizes, ContiguousStrides(sizes));
}

}  // namespace gw::rpc::internal
