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

#if defined(__SANITIZE_THREAD__)
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
#endif

namespace gw::rpc::internal {
namespace {

constexpr uint64_t kSegmentMagic = 0x414e455241575347;  // "GSWARENA"
constexpr uint64_t kBlockMagic = 0x4b434f4c42575347;    // "GSWBLOCK"
constexpr uint64_t kPage = 4096;
constexpr uint64_t kFirstBlock = kPage;  // the segment header has the first page
constexpr uint64_t kSplitAtLeast = 16 * kPage;
constexpr size_t kFirstSweep = 32;  // receivers watched before exited ones are looked for
constexpr int kCopyAttempts = 3;    // copies of a tensor that keeps changing before giving up

// Block states (the contract in shm_arena.h).
constexpr uint32_t kFree = 0, kSent = 1, kTaken = 2;

struct SegmentHeader {
  uint64_t magic;
  uint64_t cookie;
};

// At the start of every block, in shared memory; after the sender wrote the header, both
// sides touch only `state`.
struct BlockHeader {
  uint64_t magic;
  std::atomic<uint32_t> state;
  uint32_t reserved;
  uint64_t capacity;  // data bytes after the header
};
static_assert(sizeof(BlockHeader) <= kArenaHeaderBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free, "the state word is shared between processes");

uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

BlockHeader* HeaderAt(char* base, uint64_t offset) { return reinterpret_cast<BlockHeader*>(base + offset); }

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

bool Exited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

}  // namespace

void SeqlockCopy(void* dst, const void* src, size_t bytes) {
#if defined(__SANITIZE_THREAD__)
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
#endif
  std::memcpy(dst, src, bytes);
#if defined(__SANITIZE_THREAD__)
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
}

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

void ShmArena::ReleaseHeldBy(pid_t peer) {
  for (Block& b : blocks_) {
    if (b.in_use && !b.filling && b.peer == peer) {
      HeaderAt(base_, b.offset)->state.store(kFree, std::memory_order_release);
      b.in_use = false;
    }
  }
}

void ShmArena::Watch(pid_t peer) {
  auto it = pidfds_.find(peer);
  if (it != pidfds_.end()) {
    if (!Exited(it->second)) return;
    // The pid was reused: its blocks belong to the process that exited.
    ReleaseHeldBy(peer);
    ::close(it->second);
    pidfds_.erase(it);
  }
  // A server that outlives many short-lived receivers must not collect their pidfds.
  if (pidfds_.size() >= sweep_at_) {
    ReleaseExited();
    sweep_at_ = std::max<size_t>(kFirstSweep, 2 * pidfds_.size());
  }
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, peer, 0));
  if (pidfd >= 0) pidfds_[peer] = pidfd;
}

void ShmArena::ReleaseExited() {
  for (auto it = pidfds_.begin(); it != pidfds_.end();) {
    if (!Exited(it->second)) {
      ++it;
      continue;
    }
    ReleaseHeldBy(it->first);
    ::close(it->second);
    pidfds_.erase(it++);
  }
}

void ShmArena::Refresh() {
  for (Block& b : blocks_) {
    if (b.in_use && !b.filling && HeaderAt(base_, b.offset)->state.load(std::memory_order_acquire) == kFree) {
      b.in_use = false;
    }
  }
}

ShmArena::Block* ShmArena::BlockAt(uint64_t offset) {
  auto it = std::lower_bound(blocks_.begin(), blocks_.end(), offset,
                             [](const Block& b, uint64_t o) { return b.offset < o; });
  return it != blocks_.end() && it->offset == offset ? &*it : nullptr;
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

std::optional<size_t> ShmArena::Carve(uint64_t bytes) {
  if (bytes > capacity_ - top_) return std::nullopt;
  blocks_.push_back(Block{top_, bytes});
  top_ += bytes;
  return blocks_.size() - 1;
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

void ShmArena::Claim(Block& b, pid_t peer, uint64_t connection) {
  b.in_use = true;
  b.filling = true;
  b.peer = peer;
  b.connection = connection;
  BlockHeader* h = HeaderAt(base_, b.offset);
  h->magic = kBlockMagic;
  h->capacity = b.bytes - kArenaHeaderBytes;
  h->state.store(kSent, std::memory_order_relaxed);
}

std::optional<uint64_t> ShmArena::Put(const Tensor& t, pid_t peer, uint64_t connection) {
  const uint64_t n = static_cast<uint64_t>(t.nbytes());
  const uint64_t need = RoundUp(kArenaHeaderBytes + n, kPage);
  uint64_t block = 0;
  {
    absl::MutexLock lock(&mu_);
    if (closed_.contains(connection)) return std::nullopt;  // its messages go nowhere
    Watch(peer);  // first: a reused pid frees the old process's blocks
    Refresh();
    std::optional<size_t> i = Find(need);
    if (!i) i = Carve(need);
    if (!i) {
      ReleaseExited();
      Merge();
      i = Carve(need);
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
    Claim(blocks_[*i], peer, connection);
    block = blocks_[*i].offset;
  }
  // Outside the lock (the block is ours while it is filling): a copy during which the
  // tensor's storage version stayed even and unchanged (storage.h), so never torn.
  const Storage& storage = *t.storage();
  bool whole = false;
  for (int attempt = 0; attempt < kCopyAttempts && !whole; ++attempt) {
    const uint64_t before = storage.version();
    std::atomic_thread_fence(std::memory_order_acquire);
    SeqlockCopy(base_ + block + kArenaHeaderBytes, t.raw_data(), n);
    std::atomic_thread_fence(std::memory_order_acquire);
    whole = before % 2 == 0 && storage.version() == before;
  }
  std::atomic_thread_fence(std::memory_order_release);
  absl::MutexLock lock(&mu_);
  Block* b = BlockAt(block);  // in use, so neither merged nor moved by a split
  b->filling = false;
  if (!whole || closed_.contains(connection)) {  // torn, or closed while filling
    HeaderAt(base_, block)->state.store(kFree, std::memory_order_release);
    b->in_use = false;
    return std::nullopt;
  }
  return block + kArenaHeaderBytes;
}

void ShmArena::ReleaseUntaken(uint64_t connection) {
  absl::MutexLock lock(&mu_);
  closed_.insert(connection);  // a block filling for it now is freed when Put is done
  for (Block& b : blocks_) {
    if (!b.in_use || b.filling || b.connection != connection) continue;
    uint32_t sent = kSent;
    if (HeaderAt(base_, b.offset)->state.compare_exchange_strong(sent, kFree, std::memory_order_acq_rel)) b.in_use = false;
  }
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
  // Read-only: Take opens the pages of one block at a time for writing (PeerArena::Take).
  void* base = ::mmap(nullptr, capacity, PROT_READ, MAP_SHARED, local, 0);
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
  if (h->magic != kBlockMagic || h->capacity < bytes) {  // reads: the mapping is read-only
    return absl::InvalidArgumentError(absl::StrCat("arena tensor: no block was sent at offset ", offset));
  }
  // This block's pages (its header and the tensor) become writable while the receiver
  // holds it; the rest of the arena stays read-only.
  char* pages = base_ + (offset - kArenaHeaderBytes);
  const size_t span = RoundUp(kArenaHeaderBytes + bytes, kPage);
  if (::mprotect(pages, span, PROT_READ | PROT_WRITE) != 0) {
    return absl::UnavailableError(Errno("mprotect of a peer's arena block"));
  }
  uint32_t sent = kSent;
  if (!h->state.compare_exchange_strong(sent, kTaken, std::memory_order_acq_rel)) {
    if (sent != kTaken) ::mprotect(pages, span, PROT_READ);  // (a block held here stays writable)
    return absl::InvalidArgumentError(absl::StrCat("arena tensor: no block was sent at offset ", offset));
  }
  auto storage = Storage::Wrap(base_ + offset, bytes, kCPU, [self = shared_from_this(), h](void*) {
    h->state.store(kFree, std::memory_order_release);  // back to the sender
  });
  return Tensor::FromStorage(std::move(storage), dtype, sizes, ContiguousStrides(sizes));
}

}  // namespace gw::rpc::internal
