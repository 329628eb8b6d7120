// The shm transport's shared-memory arena (rpc/src/transport/shm/shm_arena.h): blocks
// handed to a receiver without copying, returned when it drops the tensor, reclaimed from
// a receiver that exited, and descriptors checked against the mapping. The receiver side
// maps this process's own arena through /proc/<pid>/fd, as a peer on this host does; the
// exited receiver is a real child process.
#include "transport/shm/shm_arena.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "absl/time/clock.h"
#include "gradwire/tensor/kernels.h"

namespace gw::rpc::internal {
namespace {

Tensor Filled(int64_t n, float start) {
  Tensor t = Tensor::Empty({n});
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = start + static_cast<float>(i);
  return t;
}

// A real receiver process for the arena to watch: it waits until told to exit.
class ChildProcess {
 public:
  ChildProcess() {
    EXPECT_EQ(::pipe(go_), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      char c;
      ::_exit(::read(go_[0], &c, 1) == 1 ? 0 : 2);
    }
    EXPECT_GT(pid_, 0);
  }
  ~ChildProcess() {
    if (pid_ > 0 && !exited_) (void)Exit();
    ::close(go_[0]);
    ::close(go_[1]);
  }
  pid_t pid() const { return pid_; }
  // Tells it to exit and reaps it; true if it exited cleanly.
  bool Exit() {
    exited_ = true;
    int status = 0;
    return ::write(go_[1], "x", 1) == 1 && ::waitpid(pid_, &status, 0) == pid_ && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0;
  }

 private:
  int go_[2] = {-1, -1};
  pid_t pid_ = -1;
  bool exited_ = false;
};

struct Pair {
  std::unique_ptr<ShmArena> arena;
  std::shared_ptr<PeerArena> peer;
};

Pair Open(size_t capacity) {
  Pair p;
  auto arena = ShmArena::Create(capacity);
  EXPECT_TRUE(arena.ok()) << arena.status();
  p.arena = *std::move(arena);
  auto peer = PeerArena::Open(::getpid(), p.arena->fd(), p.arena->capacity(), p.arena->cookie());
  EXPECT_TRUE(peer.ok()) << peer.status();
  p.peer = *std::move(peer);
  return p;
}

TEST(ShmArenaTest, ATensorArrivesWithoutACopyAndItsBlockReturnsWhenDropped) {
  Pair p = Open(16 << 20);
  const Tensor sent = Filled(100000, 1.0f);
  std::optional<uint64_t> offset = p.arena->Put(sent, ::getpid(), 1);
  ASSERT_TRUE(offset.has_value());
  {
    absl::StatusOr<Tensor> got = p.peer->Take(*offset, DType::kFloat32, {100000});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(kernels::AllClose(*got, sent));
    EXPECT_NE(got->raw_data(), sent.raw_data());
    EXPECT_EQ(p.arena->stats().in_use, 1u);
    // While the receiver holds it, a second tensor gets another block.
    std::optional<uint64_t> second = p.arena->Put(Filled(100000, 5.0f), ::getpid(), 1);
    ASSERT_TRUE(second.has_value());
    EXPECT_NE(*second, *offset);
    absl::StatusOr<Tensor> other = p.peer->Take(*second, DType::kFloat32, {100000});
    ASSERT_TRUE(other.ok());
    EXPECT_FLOAT_EQ(other->data<float>()[0], 5.0f);
    EXPECT_TRUE(kernels::AllClose(*got, sent));  // untouched by the second Put
  }
  EXPECT_EQ(p.arena->stats().in_use, 0u);
  // Dropped: the same size reuses a block instead of carving more.
  const size_t carved = p.arena->stats().blocks;
  ASSERT_TRUE(p.arena->Put(Filled(100000, 9.0f), ::getpid(), 1).has_value());
  EXPECT_EQ(p.arena->stats().blocks, carved);
}

// The receiver maps the sender's arena read-only and may write only into blocks it was
// given: a write into any other (a block in flight to someone else) faults in the
// receiver instead of altering another tensor.
TEST(ShmArenaDeathTest, AReceiverCanWriteOnlyIntoTheBlocksItHolds) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Pair p = Open(16 << 20);
  std::optional<uint64_t> a = p.arena->Put(Filled(100000, 1.0f), ::getpid(), 1);
  std::optional<uint64_t> b = p.arena->Put(Filled(100000, 2.0f), ::getpid(), 1);
  ASSERT_TRUE(a.has_value() && b.has_value());
  absl::StatusOr<Tensor> mine = p.peer->Take(*a, DType::kFloat32, {100000});
  ASSERT_TRUE(mine.ok()) << mine.status();
  float* own = mine->data<float>();
  own[5] = 7.0f;  // its own block: writable
  EXPECT_EQ(own[5], 7.0f);
  char* base = reinterpret_cast<char*>(own) - *a;  // the mapping of the arena
  float* not_given = reinterpret_cast<float*>(base + *b);
  EXPECT_EQ(not_given[0], 2.0f);  // readable
  EXPECT_DEATH({ not_given[0] = 3.0f; }, "");
  absl::StatusOr<Tensor> given_later = p.peer->Take(*b, DType::kFloat32, {100000});
  ASSERT_TRUE(given_later.ok()) << given_later.status();
  given_later->data<float>()[0] = 3.0f;  // once given, writable
  EXPECT_EQ(not_given[0], 3.0f);
}

TEST(ShmArenaTest, AFullArenaSaysSoAndHasRoomAgainOnceTensorsAreDropped) {
  Pair p = Open(4 << 20);  // one header page + under four 1 MiB blocks
  std::vector<Tensor> held;
  int put = 0;
  for (int i = 0; i < 8; ++i) {
    std::optional<uint64_t> offset = p.arena->Put(Filled(256 << 10, static_cast<float>(i)), ::getpid(), 1);
    if (!offset) break;
    absl::StatusOr<Tensor> t = p.peer->Take(*offset, DType::kFloat32, {256 << 10});
    ASSERT_TRUE(t.ok());
    held.push_back(*t);
    ++put;
  }
  EXPECT_EQ(put, 3);
  EXPECT_FALSE(p.arena->Put(Filled(256 << 10, 0), ::getpid(), 1).has_value());
  for (int i = 0; i < put; ++i) EXPECT_FLOAT_EQ(held[static_cast<size_t>(i)].data<float>()[7], static_cast<float>(i) + 7);
  held.clear();
  // Freed neighbours merge: a tensor larger than any single block now fits.
  std::optional<uint64_t> big = p.arena->Put(Filled(600 << 10, 3.0f), ::getpid(), 1);
  ASSERT_TRUE(big.has_value());
  absl::StatusOr<Tensor> t = p.peer->Take(*big, DType::kFloat32, {600 << 10});
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(kernels::AllClose(*t, Filled(600 << 10, 3.0f)));
}

TEST(ShmArenaTest, BlocksOfAReceiverThatExitedAreReclaimedThoseOfALiveOneAreNot) {
  Pair p = Open(4 << 20);
  ChildProcess child;  // the receiver: exits holding its blocks
  // Three blocks for the child (which never lets go), filling the arena.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(p.arena->Put(Filled(256 << 10, 0), child.pid(), 1).has_value());
  ASSERT_FALSE(p.arena->Put(Filled(256 << 10, 0), ::getpid(), 1).has_value()) << "the child is alive";
  ASSERT_TRUE(child.Exit());
  EXPECT_TRUE(p.arena->Put(Filled(256 << 10, 0), ::getpid(), 1).has_value()) << "the child's blocks were not reclaimed";
}

int OpenFds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

TEST(ShmArenaTest, ManyShortLivedReceiversDoNotPileUpFileDescriptors) {
  Pair p = Open(64 << 20);
  const int before = OpenFds();
  for (int i = 0; i < 100; ++i) {
    ChildProcess child;
    ASSERT_TRUE(p.arena->Put(Filled(20000, 0), child.pid(), 1).has_value());  // watches the child
    ASSERT_TRUE(child.Exit());
  }
  EXPECT_LT(OpenFds() - before, 70) << "pidfds of exited receivers are kept";
}

TEST(ShmArenaTest, DescriptorsOutsideTheArenaOrOfNoBlockAreRefused) {
  Pair p = Open(4 << 20);
  std::optional<uint64_t> offset = p.arena->Put(Filled(100000, 1.0f), ::getpid(), 1);
  ASSERT_TRUE(offset.has_value());
  EXPECT_FALSE(p.peer->Take(*offset, DType::kFloat32, {200000000}).ok());           // past the end
  EXPECT_FALSE(p.peer->Take(*offset, DType::kFloat32, {int64_t{1} << 40, 1 << 20}).ok());  // overflows
  EXPECT_FALSE(p.peer->Take(*offset, DType::kFloat32, {-1}).ok());
  EXPECT_FALSE(p.peer->Take(*offset + 4, DType::kFloat32, {10}).ok());   // not a block's data
  EXPECT_FALSE(p.peer->Take(64, DType::kFloat32, {10}).ok());            // the segment header
  EXPECT_FALSE(p.peer->Take(uint64_t{1} << 62, DType::kFloat32, {10}).ok());
  EXPECT_FALSE(p.peer->Take(*offset + (1 << 20), DType::kFloat32, {10}).ok());  // no block there
  EXPECT_FALSE(p.peer->Take(*offset, DType::kFloat32, {200000}).ok());  // more than the block holds
  // The real descriptor still works, once: a repeated descriptor would put two tensors
  // on one block.
  absl::StatusOr<Tensor> t = p.peer->Take(*offset, DType::kFloat32, {100000});
  ASSERT_TRUE(t.ok());
  EXPECT_FLOAT_EQ(t->data<float>()[99999], 100000.0f);
  EXPECT_FALSE(p.peer->Take(*offset, DType::kFloat32, {100000}).ok());
}

TEST(ShmArenaTest, AClosedConnectionsUntakenBlocksComeBackTakenOnesDoNot) {
  Pair p = Open(16 << 20);
  std::optional<uint64_t> taken = p.arena->Put(Filled(100000, 1.0f), ::getpid(), 7);
  std::optional<uint64_t> untaken = p.arena->Put(Filled(100000, 2.0f), ::getpid(), 7);
  std::optional<uint64_t> other = p.arena->Put(Filled(100000, 3.0f), ::getpid(), 8);
  ASSERT_TRUE(taken && untaken && other);
  absl::StatusOr<Tensor> held = p.peer->Take(*taken, DType::kFloat32, {100000});
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(p.arena->stats().in_use, 3u);
  p.arena->ReleaseUntaken(7);
  EXPECT_EQ(p.arena->stats().in_use, 2u);  // the taken one and connection 8's
  EXPECT_FALSE(p.peer->Take(*untaken, DType::kFloat32, {100000}).ok()) << "came back: not takeable";
  EXPECT_FALSE(p.arena->Put(Filled(100000, 4.0f), ::getpid(), 7).has_value()) << "closed";
  EXPECT_FLOAT_EQ(held->data<float>()[0], 1.0f);
  absl::StatusOr<Tensor> late = p.peer->Take(*other, DType::kFloat32, {100000});
  ASSERT_TRUE(late.ok());
  EXPECT_FLOAT_EQ(late->data<float>()[0], 3.0f);
}

TEST(ShmArenaTest, ATensorBeingWrittenIsNotCopiedTorn) {
  Pair p = Open(16 << 20);
  Tensor t = Filled(100000, 1.0f);
  t.storage()->BumpVersion();  // a write in progress (odd version) for as long as Put tries
  EXPECT_FALSE(p.arena->Put(t, ::getpid(), 1).has_value());
  EXPECT_EQ(p.arena->stats().in_use, 0u);
  t.storage()->BumpVersion();  // the write is done
  EXPECT_TRUE(p.arena->Put(t, ::getpid(), 1).has_value());
}

// A pid seen again after its process exited is another process: the old one's blocks
// are freed at once, and the new one's are not confused with them.
TEST(ShmArenaTest, APidSeenAgainAfterItsProcessExitedStartsAfresh) {
  Pair p = Open(16 << 20);
  ChildProcess child;
  const pid_t pid = child.pid();
  ASSERT_TRUE(p.arena->Put(Filled(100000, 0), pid, 1).has_value());
  EXPECT_EQ(p.arena->stats().in_use, 1u);
  ASSERT_TRUE(child.Exit());
  // The same pid number again (as if reused): the exited process's block is freed.
  ASSERT_TRUE(p.arena->Put(Filled(100000, 0), pid, 2).has_value());
  EXPECT_EQ(p.arena->stats().in_use, 1u);
}

// Puts for a receiver that has exited (its blocks reclaimed while others are filled)
// concurrent with Puts and Takes for a live one: every taken tensor keeps the bytes that
// were put. A stress test of the locking around blocks being filled, not a deterministic
// reproduction of any one interleaving.
TEST(ShmArenaTest, ConcurrentPutsForAnExitedAndALiveReceiverKeepEveryTakenTensorIntact) {
  Pair p = Open(8 << 20);
  const pid_t dead = ::fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) ::_exit(0);
  siginfo_t info{};  // exited, not reaped: its pid stays its own until the end
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(dead), &info, WEXITED | WNOWAIT), 0);
  std::atomic<bool> stop{false};
  std::thread for_the_dead([&] {
    const Tensor junk = Tensor::Full({750000}, -1.0);  // long copies: a wide window
    while (!stop.load()) (void)p.arena->Put(junk, dead, 1);
  });
  int checked = 0;
  for (int i = 0; i < 1000; ++i) {
    const Tensor sent = Tensor::Full({100000}, static_cast<double>(i));
    std::optional<uint64_t> offset = p.arena->Put(sent, ::getpid(), 2);
    if (!offset) continue;
    absl::StatusOr<Tensor> got = p.peer->Take(*offset, DType::kFloat32, {100000});
    ASSERT_TRUE(got.ok()) << got.status();
    absl::SleepFor(absl::Microseconds(50));  // let a copy that overlaps this block land
    // Still the bytes that were put (the other thread's copies never land here).
    ASSERT_EQ(kernels::MaxAbsDiff(*got, sent), 0.0) << "put " << i;
    ++checked;
  }
  stop = true;
  for_the_dead.join();
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  EXPECT_GT(checked, 100);
}

TEST(ShmArenaTest, OnlyTheRightSealedSegmentCanBeMapped) {
  auto arena = ShmArena::Create(1 << 20);
  ASSERT_TRUE(arena.ok());
  EXPECT_FALSE(PeerArena::Open(::getpid(), (*arena)->fd(), (*arena)->capacity(), (*arena)->cookie() + 1).ok());
  EXPECT_FALSE(PeerArena::Open(::getpid(), (*arena)->fd(), (*arena)->capacity() * 2, (*arena)->cookie()).ok());
  EXPECT_FALSE(PeerArena::Open(::getpid(), 12345, (*arena)->capacity(), (*arena)->cookie()).ok());
  EXPECT_FALSE(PeerArena::Open(::getpid(), STDIN_FILENO, 1 << 20, 0).ok());  // not a sealed memfd
  EXPECT_TRUE(PeerArena::Open(::getpid(), (*arena)->fd(), (*arena)->capacity(), (*arena)->cookie()).ok());
}

}  // namespace
}  // namespace gw::rpc::internal
