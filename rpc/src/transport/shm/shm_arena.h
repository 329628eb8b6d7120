// Shared-memory arenas for the shm transport (internal header).
//
// ShmArena is this process's outgoing segment: a memfd mapped here, which same-host
// peers map too (PeerArena). Sending a large tensor copies it into a block of the arena
// (Put, on the sending thread); the receiver wraps the block as the tensor's storage
// without copying (PeerArena::Take), and the block returns to the sender when the last
// reference to that tensor is gone: the receiver's deleter clears the block's state word
// in shared memory, which the sender reads when it next allocates. No message is needed
// to hand a tensor over or back, so a large tensor costs one memcpy and no round trip
// (cross-memory attach needs the receiver to copy and the sender to confirm).
//
// Contract
//   - Layout: the first 64 bytes of the segment hold a magic number and a random cookie
//     (so a peer can check it mapped the right file); each block is a 64-byte header
//     (magic, state word, capacity) followed by its data, 4096-byte aligned. Blocks are
//     exclusive: one tensor of one receiver each.
//   - A block's state word is a small protocol between the two processes:
//       kFree  -> kSent    sender, Put (the block is being filled, then in flight)
//       kSent  -> kTaken   receiver, Take (compare-and-swap: a block is taken once)
//       kTaken -> kFree    receiver, when its tensor is destroyed
//       kSent  -> kFree    sender, ReleaseUntaken: its message will never be taken (the
//                          connection closed); the compare-and-swap against Take's
//                          decides who owns the block
//       any    -> kFree    sender, for a receiver process that has exited
//   - ShmArena::Put returns the data offset of a block now holding the tensor's bytes,
//     or nullopt when no free block fits, or when the tensor kept being written while it
//     was copied (its storage version moved; the caller then sends it another way, which
//     has its own protection against torn copies). Blocks are reused by size; freed
//     neighbours are merged when the arena runs out. The segment is sparse: only pages
//     that blocks ever used take memory.
//   - Receivers are identified by their pid and watched through pidfds: when the arena
//     runs out of room, and whenever a pid is seen again, the blocks of a receiver that
//     has exited are freed (a pid reused by a new process gets a fresh pidfd, so the new
//     process's blocks are never mistaken for the old one's). A live receiver's blocks
//     are never freed behind its back. Exited receivers are also dropped as new ones
//     arrive, so their pidfds do not pile up. Where pidfd_open fails (kernels before 5.3,
//     no descriptors left), that receiver's blocks come back only when it releases them.
//     A live receiver that keeps received tensors keeps their blocks: the arena fills and
//     the transport falls back to cross-memory attach.
//   - PeerArena::Take checks the offset, size and block header against the mapping and
//     claims the block (a malformed, hostile or repeated descriptor is an error, never an
//     out-of-range access or two tensors on one block). The tensor it returns keeps the
//     mapping alive; writing to it is allowed (the block is this receiver's until it lets
//     go of the tensor).
//   - A receiver maps a sender's arena read-only; Take makes the pages of the block it
//     claims writable (mprotect: no new mapping, no page faults), so a receiver can write
//     only into blocks it was given (a stray or hostile write elsewhere faults in the
//     receiver, never reaching a tensor in flight to another receiver). The pages stay
//     writable after it lets go: making them read-only again on every release cost 50-70
//     us per tensor (two TLB shootdowns; W2's 1 MiB echo went from 0.14 to 0.21 ms), so a
//     receiver keeps write access to the blocks it once held, which the sender may give to
//     others later.
//   - Trust: the shm transport maps a peer's arena only on a connection that
//     authenticated (security.h). Mapping needs the permission to open this process's
//     /proc/<pid>/fd entries (same user, ptrace read), which is weaker than the ptrace
//     attach permission cross-memory attach needs under Yama: any process of the same
//     user on this host that learns the fd could map the arena itself, read-write.
//   - Thread safety: ShmArena and PeerArena are thread-safe.
#ifndef GRADWIRE_RPC_SRC_TRANSPORT_SHM_SHM_ARENA_H_
#define GRADWIRE_RPC_SRC_TRANSPORT_SHM_SHM_ARENA_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/tensor/tensor.h"

namespace gw::rpc::internal {

inline constexpr size_t kArenaHeaderBytes = 64;

// The optimistic read of a seqlock: copies `bytes` from `src`, which a writer may be
// changing (the caller checks the storage version around it). ThreadSanitizer is told
// to ignore these reads: the version check makes the race harmless.
void SeqlockCopy(void* dst, const void* src, size_t bytes);

class ShmArena {
 public:
  // A segment of `capacity` bytes (virtual; memory is used as blocks are touched).
  static absl::StatusOr<std::unique_ptr<ShmArena>> Create(size_t capacity);
  ~ShmArena();
  ShmArena(const ShmArena&) = delete;
  ShmArena& operator=(const ShmArena&) = delete;

  int fd() const { return fd_; }
  size_t capacity() const { return capacity_; }
  uint64_t cookie() const { return cookie_; }

  // Copies the bytes of `t` (contiguous, CPU) into a free block held for process `peer`
  // (the receiver's pid) on the sender's connection `connection` (any id the caller
  // uses); its data offset, or nullopt (see the contract).
  std::optional<uint64_t> Put(const Tensor& t, pid_t peer, uint64_t connection);
  // `connection` closed: frees the blocks Put for it that no receiver took (kSent), whose
  // messages will never be delivered, and makes later Puts for it return nullopt.
  void ReleaseUntaken(uint64_t connection);

  struct Stats {
    size_t blocks = 0;      // blocks carved so far
    size_t in_use = 0;      // sent or taken now
    size_t high_water = 0;  // bytes of the segment ever used
  };
  Stats stats();

 private:
  struct Block {
    uint64_t offset;         // of the header
    uint64_t bytes;          // header + data, a multiple of 4096
    pid_t peer = 0;          // receiver, while in use
    uint64_t connection = 0;  // the connection it was sent on, while in use
    bool in_use = false;     // as far as this side knows (Refresh reads the state word)
    bool filling = false;    // Put is copying into it outside the lock: never freed meanwhile
  };
  ShmArena(int fd, char* base, size_t capacity, uint64_t cookie)
      : fd_(fd), base_(base), capacity_(capacity), cookie_(cookie) {}
  void Refresh() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // learns which blocks receivers released
  std::optional<size_t> Find(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<size_t> Carve(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Merge() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Claim(Block& b, pid_t peer, uint64_t connection) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Watch(pid_t peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseExited() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // blocks of receivers that are gone
  void ReleaseHeldBy(pid_t peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Block* BlockAt(uint64_t offset) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int fd_;
  char* const base_;
  const size_t capacity_;
  const uint64_t cookie_;
  absl::Mutex mu_;
  std::vector<Block> blocks_ ABSL_GUARDED_BY(mu_);  // by offset
  uint64_t top_ ABSL_GUARDED_BY(mu_) = 4096;        // first byte never carved
  absl::flat_hash_map<pid_t, int> pidfds_ ABSL_GUARDED_BY(mu_);  // receivers, watched for exit
  size_t sweep_at_ ABSL_GUARDED_BY(mu_) = 32;  // pidfds_ size at which exited receivers are dropped
  absl::flat_hash_set<uint64_t> closed_ ABSL_GUARDED_BY(mu_);  // connections ReleaseUntaken saw
};

// A peer's ShmArena, mapped here.
class PeerArena : public std::enable_shared_from_this<PeerArena> {
 public:
  // Maps the arena that process `pid` holds as file descriptor `fd` (through
  // /proc/<pid>/fd) and checks its cookie.
  static absl::StatusOr<std::shared_ptr<PeerArena>> Open(pid_t pid, int fd, size_t capacity, uint64_t cookie);
  ~PeerArena();
  PeerArena(const PeerArena&) = delete;
  PeerArena& operator=(const PeerArena&) = delete;

  // The tensor in the block at data offset `offset`, without copying; claims the block.
  absl::StatusOr<Tensor> Take(uint64_t offset, DType dtype, const Shape& sizes);

 private:
  PeerArena(char* base, size_t capacity) : base_(base), capacity_(capacity) {}
  char* const base_;
  const size_t capacity_;
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_TRANSPORT_SHM_SHM_ARENA_H_
