#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <map>
#include <new>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/rpc/trace.h"
#include "gradwire/tensor/large_memory.h"
#include "observe/per_thread.h"
#include "observe/trace_clock.h"
#include "observe/trace_spill.h"

namespace gw::rpc {
namespace {

// A thread records into chunks of this many spans, and holds at most kMostChunks of them
// (64k spans) that the writer has not drained.
constexpr uint32_t kChunkSpans = 1024;
constexpr int kMostChunks = 64;
constexpr size_t kSpareChunks = 8;
constexpr size_t kFewChunks = kSpareChunks / 2;  // a thread taking one of the last wakes the writer
constexpr absl::Duration kDrainEvery = absl::Nanoseconds(internal::TraceClock::kSteerOverNs);
// A spill this large tells its user, when its worker closes the trace, that turning it
// into JSON takes a while.
constexpr uintmax_t kSayConvertingFrom = uintmax_t{64} << 20;

}  // namespace

struct Tracer::Impl {
  // Spans a thread recorded. Its thread fills [0, count) and publishes count; the
  // writer spills [spilled, count) while the thread goes on, and recycles the chunk once
  // the thread has handed it over full.
  struct alignas(64) Chunk {
    std::atomic<uint32_t> count{0};
    uint32_t spilled = 0;  // the writer's (Drain, under file_mu)
    Span spans[kChunkSpans];
  };
  struct ThreadBuffer {
    int tid = 0;
    std::string thread_name;
    std::atomic<Chunk*> current{nullptr};  // written by its thread only
    std::atomic<uint64_t> dropped{0};
    absl::Mutex mu;
    std::vector<Chunk*> full ABSL_GUARDED_BY(mu);  // handed over, not yet drained
    int held ABSL_GUARDED_BY(mu) = 0;              // current and full
  };

  const uint64_t uid = internal::NextOwnerId();
  std::string path;        // the JSON, written at Close
  std::string spill_path;  // written while the worker runs (observe/trace_spill.h)
  std::string worker;
  int rank = -1;
  int64_t origin_us = 0;  // the file's times are relative to this (us since the epoch)
  internal::TraceClock clock;  // Now's, calibrated by the writer

  absl::Mutex names_mu;
  std::deque<std::string> names ABSL_GUARDED_BY(names_mu);  // by Name; 0 is ""
  absl::flat_hash_map<std::string, Name> name_ids ABSL_GUARDED_BY(names_mu);
  // The threads' caches of name_ids (Intern), each read and written by its thread only.
  std::vector<std::unique_ptr<absl::flat_hash_map<std::string, Name>>> name_caches ABSL_GUARDED_BY(names_mu);

  absl::Mutex buffers_mu;
  std::vector<std::unique_ptr<ThreadBuffer>> buffers ABSL_GUARDED_BY(buffers_mu);

  absl::Mutex chunks_mu;
  // Chunks are made by the writer in slabs of a huge page (Stock), or one by one by a
  // thread that found none free.
  std::vector<std::unique_ptr<char[], FreeLargeDeleter>> slabs ABSL_GUARDED_BY(chunks_mu);
  std::vector<std::unique_ptr<Chunk>> chunks ABSL_GUARDED_BY(chunks_mu);
  std::vector<Chunk*> free_chunks ABSL_GUARDED_BY(chunks_mu);

  absl::Mutex offsets_mu;
  std::map<int, std::pair<int64_t, int64_t>> offsets ABSL_GUARDED_BY(offsets_mu);  // rank -> (offset, rtt) us
  bool offsets_changed ABSL_GUARDED_BY(offsets_mu) = false;

  // The spill, written by the writer thread (and Flush and Close).
  absl::Mutex file_mu;
  FILE* file ABSL_GUARDED_BY(file_mu) = nullptr;
  absl::Status write_error ABSL_GUARDED_BY(file_mu);
  size_t names_written ABSL_GUARDED_BY(file_mu) = 1;  // Name 0 ("") is never written
  size_t threads_written ABSL_GUARDED_BY(file_mu) = 0;
  std::string text_buffer ABSL_GUARDED_BY(file_mu);

  // The writer's: woken to stop, or to make chunks when few are free.
  absl::Mutex stop_mu;
  bool stopping ABSL_GUARDED_BY(stop_mu) = false;
  bool low_on_chunks ABSL_GUARDED_BY(stop_mu) = false;
  std::thread writer;

  ThreadBuffer* BufferOfThisThread();
  // A fresh chunk for `b`'s thread, its full one handed over; null when the thread holds
  // kMostChunks already (the writer is behind).
  Chunk* NextChunk(ThreadBuffer& b);
  void Recycle(const std::vector<Chunk*>& drained);
  // Makes free chunks, off the recording threads, until `wanted` are free: a thread that
  // finds none makes one, whose first touch of its 24 pages costs it 0.4 ms where page
  // faults are slow (gradwire/tensor/large_memory.h).
  void Stock(size_t wanted);
  void WriterLoop();
  // Spills what the threads recorded; returns how many full chunks they had handed over.
  size_t Drain();
  void Write(std::string_view bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(file_mu);
};

Tracer::Impl::ThreadBuffer* Tracer::Impl::BufferOfThisThread() {
  return internal::PerThread<ThreadBuffer>(uid, [this] {
    auto buffer = std::make_unique<ThreadBuffer>();
    char name[32] = {};
    if (pthread_getname_np(pthread_self(), name, sizeof(name)) != 0) name[0] = '\0';
    ThreadBuffer* raw = buffer.get();
    absl::MutexLock lock(&buffers_mu);
    raw->tid = static_cast<int>(buffers.size()) + 1;
    raw->thread_name = name[0] != '\0' ? name : absl::StrCat("thread ", raw->tid);
    buffers.push_back(std::move(buffer));
    return raw;
  });
}

void Tracer::Impl::Write(std::string_view bytes) {
  if (file == nullptr || bytes.empty() || !write_error.ok()) return;
  if (std::fwrite(bytes.data(), 1, bytes.size(), file) != bytes.size()) {
    write_error = absl::DataLossError(absl::StrCat("cannot write the trace ", spill_path, ": ", std::strerror(errno)));
    std::fprintf(stderr, "gradwire: %s: %s; the job goes on without its trace\n", worker.c_str(),
                 std::string(write_error.message()).c_str());
  }
}

Tracer::Impl::Chunk* Tracer::Impl::NextChunk(ThreadBuffer& b) {
  Chunk* full = b.current.load(std::memory_order_relaxed);
  {
    absl::MutexLock lock(&b.mu);
    if (b.held >= kMostChunks) return nullptr;
    ++b.held;
    if (full != nullptr) b.full.push_back(full);
  }
  Chunk* fresh = nullptr;
  bool few;
  {
    absl::MutexLock lock(&chunks_mu);
    if (free_chunks.empty()) {
      fresh = chunks.emplace_back(std::make_unique<Chunk>()).get();
    } else {
      fresh = free_chunks.back();
      free_chunks.pop_back();
    }
    few = free_chunks.size() < kFewChunks;
  }
  if (few) {
    absl::MutexLock lock(&stop_mu);
    low_on_chunks = true;
  }
  b.current.store(fresh, std::memory_order_release);
  return fresh;
}

void Tracer::Impl::Recycle(const std::vector<Chunk*>& drained) {
  if (drained.empty()) return;
  absl::MutexLock lock(&chunks_mu);
  for (Chunk* c : drained) {
    c->count.store(0, std::memory_order_relaxed);
    c->spilled = 0;
    free_chunks.push_back(c);
  }
}

void Tracer::Impl::Stock(size_t wanted) {
  constexpr size_t kChunksPerSlab = kHugePageBytes / sizeof(Chunk);
  static_assert(std::is_trivially_destructible_v<Chunk>, "a slab's chunks go with their slab, not destroyed");
  size_t free_now;
  {
    absl::MutexLock lock(&chunks_mu);
    free_now = free_chunks.size();
  }
  std::vector<std::unique_ptr<char[], FreeLargeDeleter>> made;
  std::vector<Chunk*> fresh;
  while (free_now + fresh.size() < wanted) {
    try {
      made.emplace_back(static_cast<char*>(AllocateLarge(kHugePageBytes)));
    } catch (const std::bad_alloc&) {
      break;  // no memory: the threads make their own or drop spans
    }
    for (size_t i = 0; i < kChunksPerSlab; ++i) fresh.push_back(new (made.back().get() + i * sizeof(Chunk)) Chunk());
  }
  if (made.empty()) return;
  absl::MutexLock lock(&chunks_mu);
  for (auto& slab : made) slabs.push_back(std::move(slab));
  free_chunks.insert(free_chunks.begin(), fresh.begin(), fresh.end());  // recycled ones first: still in cache
}

size_t Tracer::Impl::Drain() {
  std::vector<ThreadBuffer*> all;
  {
    absl::MutexLock lock(&buffers_mu);
    for (auto& b : buffers) all.push_back(b.get());
  }
  absl::MutexLock file_lock(&file_mu);
  std::string& text = text_buffer;  // kept between drains: its memory is reused
  text.clear();
  // What each thread handed over, and how far its current chunk is filled, taken first;
  // then the threads and names those spans use (interned before they were recorded) are
  // written ahead of them.
  struct Taken {
    ThreadBuffer* buffer;
    std::vector<Chunk*> full;
    Chunk* current;
    uint32_t current_count;
  };
  std::vector<Taken> taken;
  uint64_t dropped = 0;
  for (ThreadBuffer* b : all) {
    Taken& t = taken.emplace_back(Taken{.buffer = b, .full = {}, .current = nullptr, .current_count = 0});
    {
      absl::MutexLock lock(&b->mu);
      t.full.swap(b->full);
      b->held -= static_cast<int>(t.full.size());
    }
    // Loaded after the hand-over: a chunk handed over since is spilled up to here now and
    // the rest at the next drain.
    t.current = b->current.load(std::memory_order_acquire);
    if (t.current != nullptr) t.current_count = t.current->count.load(std::memory_order_acquire);
    dropped += b->dropped.exchange(0, std::memory_order_relaxed);
  }
  for (; threads_written < all.size(); ++threads_written) {
    internal::AppendSpillThread(text, all[threads_written]->tid, all[threads_written]->thread_name);
  }
  {
    absl::ReaderMutexLock names_lock(&names_mu);
    for (; names_written < names.size(); ++names_written) {
      internal::AppendSpillName(text, static_cast<Name>(names_written), names[names_written]);
    }
  }
  {
    absl::MutexLock lock(&offsets_mu);
    if (offsets_changed) {
      for (const auto& [rank, o] : offsets) internal::AppendSpillOffset(text, rank, o.first, o.second);
      offsets_changed = false;
    }
  }
  if (dropped != 0) internal::AppendSpillDropped(text, dropped);
  // The spans go from their chunk to the file, after their batch's header.
  auto spill = [&](int tid, Chunk& c, uint32_t count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(file_mu) {
    if (count <= c.spilled) return;
    internal::AppendSpillSpansHeader(text, tid, count - c.spilled);
    Write(text);
    text.clear();
    Write(internal::SpillBytesOf(std::span<const Span>(c.spans + c.spilled, count - c.spilled)));
    c.spilled = count;
  };
  for (Taken& t : taken) {
    for (Chunk* c : t.full) spill(t.buffer->tid, *c, c->count.load(std::memory_order_acquire));
    if (t.current != nullptr) spill(t.buffer->tid, *t.current, t.current_count);
  }
  Write(text);
  if (file != nullptr) std::fflush(file);
  size_t handed_over = 0;
  for (const Taken& t : taken) {
    Recycle(t.full);
    handed_over += t.full.size();
  }
  return handed_over;
}

void Tracer::Impl::WriterLoop() {
  pthread_setname_np(pthread_self(), "gw-trace");
  Stock(kSpareChunks);
  absl::MutexLock lock(&stop_mu);
  // The clock is calibrated first after 10 ms (its shortest baseline), then with each drain.
  absl::Time last = absl::Now();
  absl::Time next_drain = last + absl::Milliseconds(10);
  while (!stopping) {
    auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(stop_mu) { return stopping || low_on_chunks; };
    stop_mu.AwaitWithDeadline(absl::Condition(&woken), next_drain);
    if (std::exchange(low_on_chunks, false) && !stopping && absl::Now() < next_drain) {
      stop_mu.Unlock();
      Stock(2 * kSpareChunks);
      stop_mu.Lock();
      continue;
    }
    stop_mu.Unlock();
    clock.Calibrate();
    const size_t handed_over = Drain();
    // Free chunks for the next kDrainEvery at the rate the threads filled them since the
    // last drain, and some to spare.
    const absl::Time now = absl::Now();
    const double periods = absl::FDivDuration(kDrainEvery, std::max(now - last, absl::Milliseconds(1)));
    Stock(kSpareChunks + static_cast<size_t>(std::ceil(static_cast<double>(handed_over) * periods)));
    last = now;
    next_drain = now + kDrainEvery;
    stop_mu.Lock();
  }
}

Tracer::Tracer() = default;

std::unique_ptr<Tracer> Tracer::Open(const std::string& dir, const std::string& worker, int rank) {
  auto tracer = std::make_unique<Tracer>();
  if (dir.empty()) return tracer;
  auto impl = std::make_unique<Impl>();
  impl->worker = worker;
  impl->rank = rank;
  impl->path = (std::filesystem::path(dir) / (worker + ".trace.json")).string();
  impl->spill_path = (std::filesystem::path(dir) / (worker + ".trace.spill")).string();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  FILE* f = ec ? nullptr : std::fopen(impl->spill_path.c_str(), "w");
  if (f == nullptr) {
    const std::string why = ec ? ec.message() : std::strerror(errno);
    std::fprintf(stderr, "gradwire: %s cannot write its trace into %s: %s; it goes on without a trace\n",
                 worker.c_str(), dir.c_str(), why.c_str());
    return tracer;
  }
  impl->origin_us = impl->clock.Now();
  {
    absl::MutexLock lock(&impl->names_mu);
    impl->names.emplace_back();
  }
  {
    absl::MutexLock lock(&impl->file_mu);
    impl->file = f;
    // The clock's origin first, so that the spill of a worker that never closed its trace
    // (killed) can still be placed on the job's timeline (`gradwire trace merge`).
    std::string head;
    internal::AppendSpillHeader(head, worker, rank, impl->origin_us);
    impl->Write(head);
  }
  Impl* raw = impl.get();
  impl->writer = std::thread([raw] { raw->WriterLoop(); });
  tracer->rank_ = rank;
  tracer->impl_ = std::move(impl);
  tracer->enabled_.store(true, std::memory_order_release);
  return tracer;
}

Tracer::~Tracer() { (void)Close(); }

const std::string& Tracer::path() const {
  static const std::string* const kNone = new std::string();
  return impl_ ? impl_->path : *kNone;
}

int64_t Tracer::Now() const { return impl_ ? impl_->clock.Now() : internal::TraceClock::RealtimeNs() / 1000; }

Tracer::Name Tracer::Intern(std::string_view text) {
  if (!enabled() || text.empty()) return 0;
  // Each thread remembers the names it interned (layers intern per call: a function's
  // name), so only a thread's first use of a name takes the shared lock.
  using Names = absl::flat_hash_map<std::string, Name>;
  Names* mine = internal::PerThread<Names>(impl_->uid, [this] {
    absl::MutexLock lock(&impl_->names_mu);
    return impl_->name_caches.emplace_back(std::make_unique<Names>()).get();
  });
  if (auto it = mine->find(absl::string_view(text.data(), text.size())); it != mine->end()) {
    return it->second;
  }
  if (mine->size() >= 4096) mine->clear();
  const Name id = InternShared(text);
  mine->emplace(std::string(text), id);
  return id;
}

Tracer::Name Tracer::InternShared(std::string_view text) {
  absl::MutexLock lock(&impl_->names_mu);
  auto it = impl_->name_ids.find(absl::string_view(text.data(), text.size()));
  if (it != impl_->name_ids.end()) return it->second;
  // Names are few (functions, layers, tags); error notes could be many: past this many,
  // a new name is written as one that says so.
  constexpr size_t kMostNames = 1 << 20;
  if (impl_->names.size() >= kMostNames) text = "(name table full)";
  bool inserted;
  std::tie(it, inserted) = impl_->name_ids.try_emplace(std::string(text), 0);
  if (inserted) {
    it->second = static_cast<Name>(impl_->names.size());
    impl_->names.emplace_back(text);
  }
  return it->second;
}

void Tracer::Record(const Span& span) {
  if (!enabled()) return;
  const uint64_t context = span.context != 0 ? span.context : CurrentContext();
  Impl::ThreadBuffer* b = impl_->BufferOfThisThread();
  Impl::Chunk* c = b->current.load(std::memory_order_relaxed);
  uint32_t n = c != nullptr ? c->count.load(std::memory_order_relaxed) : kChunkSpans;
  if (n == kChunkSpans) {
    c = impl_->NextChunk(*b);
    if (c == nullptr) {
      b->dropped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    n = 0;
  }
  c->spans[n] = span;
  c->spans[n].context = context;
  c->count.store(n + 1, std::memory_order_release);
}

Tracer::Scope::Scope(Tracer& tracer, Name category, Name name) : tracer_(tracer.enabled() ? &tracer : nullptr) {
  if (tracer_ == nullptr) return;
  span_.category = category;
  span_.name = name;
  span_.begin_us = tracer_->Now();
}

Tracer::Scope::~Scope() {
  if (tracer_ == nullptr) return;
  span_.end_us = tracer_->Now();
  tracer_->Record(span_);
}

void Tracer::SetClockOffset(int rank, int64_t offset_us, int64_t rtt_us) {
  if (!enabled()) return;
  absl::MutexLock lock(&impl_->offsets_mu);
  auto [it, inserted] = impl_->offsets.try_emplace(rank, offset_us, rtt_us);
  if (!inserted && rtt_us < it->second.second) it->second = {offset_us, rtt_us};
  impl_->offsets_changed = true;
}

void Tracer::Flush() {
  if (enabled()) impl_->Drain();
}

absl::Status Tracer::Close() {
  if (!impl_ || !enabled_.exchange(false)) return absl::OkStatus();
  {
    absl::MutexLock lock(&impl_->stop_mu);
    impl_->stopping = true;
  }
  impl_->writer.join();
  impl_->Drain();
  {
    absl::MutexLock lock(&impl_->file_mu);
    std::string end;
    internal::AppendSpillEnd(end);
    impl_->Write(end);
    if (std::fclose(impl_->file) != 0 && impl_->write_error.ok()) {
      impl_->write_error =
          absl::DataLossError(absl::StrCat("cannot write the trace ", impl_->spill_path, ": ", std::strerror(errno)));
    }
    impl_->file = nullptr;
    if (!impl_->write_error.ok()) return impl_->write_error;
  }
  std::error_code ec;
  if (const uintmax_t size = std::filesystem::file_size(impl_->spill_path, ec); !ec && size >= kSayConvertingFrom) {
    std::fprintf(stderr, "gradwire: %s: writing its trace %s from %ju MB of spans...\n", impl_->worker.c_str(),
                 impl_->path.c_str(), size >> 20);
  }
  bool complete = false;
  if (absl::Status s = internal::SpillToJson(impl_->spill_path, impl_->path, &complete); !s.ok()) return s;
  std::filesystem::remove(impl_->spill_path, ec);
  return absl::OkStatus();
}

absl::Status Tracer::ConvertSpill(const std::string& spill_path, const std::string& json_path, bool* closed) {
  return internal::SpillToJson(spill_path, json_path, closed);
}

}  // namespace gw::rpc
