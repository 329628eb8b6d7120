#include <pthread.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <map>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/rpc/trace.h"
#include "observe/per_thread.h"

namespace gw::rpc {
namespace {

// A thread's buffer holds at most this many spans between two drains of the writer.
constexpr size_t kMaxBuffered = 64 * 1024;
constexpr absl::Duration kDrainEvery = absl::Milliseconds(100);

// JSON string contents (without the quotes).
void AppendEscaped(std::string& out, std::string_view s) {
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppend(&out, "\\u00", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        } else {
          out += c;
        }
    }
  }
}

void AppendInt(std::string& out, int64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, end);
}

}  // namespace

struct Tracer::Impl {
  struct ThreadBuffer {
    int tid = 0;
    std::string thread_name;
    absl::Mutex mu;
    std::vector<Span> spans ABSL_GUARDED_BY(mu);
    uint64_t dropped ABSL_GUARDED_BY(mu) = 0;
    std::vector<Span> draining;  // the writer's (Drain, under file_mu)
  };

  const uint64_t uid = internal::NextOwnerId();
  std::string path;
  std::string worker;
  int rank = -1;
  int64_t origin_us = 0;  // the file's times are relative to this (us since the epoch)

  absl::Mutex names_mu;
  std::deque<std::string> names ABSL_GUARDED_BY(names_mu);  // by Name; 0 is ""
  absl::flat_hash_map<std::string, Name> name_ids ABSL_GUARDED_BY(names_mu);
  // The threads' caches of name_ids (Intern), each read and written by its thread only.
  std::vector<std::unique_ptr<absl::flat_hash_map<std::string, Name>>> name_caches ABSL_GUARDED_BY(names_mu);

  absl::Mutex buffers_mu;
  std::vector<std::unique_ptr<ThreadBuffer>> buffers ABSL_GUARDED_BY(buffers_mu);

  absl::Mutex offsets_mu;
  std::map<int, std::pair<int64_t, int64_t>> offsets ABSL_GUARDED_BY(offsets_mu);  // rank -> (offset, rtt) ns

  // The file, written by the writer thread (and Close, once it has stopped).
  absl::Mutex file_mu;
  FILE* file ABSL_GUARDED_BY(file_mu) = nullptr;
  bool first_event ABSL_GUARDED_BY(file_mu) = true;
  absl::Status write_error ABSL_GUARDED_BY(file_mu);
  uint64_t dropped_total ABSL_GUARDED_BY(file_mu) = 0;
  std::string text_buffer ABSL_GUARDED_BY(file_mu);

  absl::Mutex stop_mu;
  bool stopping ABSL_GUARDED_BY(stop_mu) = false;
  std::thread writer;

  ThreadBuffer* BufferOfThisThread();
  void WriterLoop();
  void Drain();
  void Format(std::string& out, const ThreadBuffer& buffer, const Span& s, bool& first)
      ABSL_SHARED_LOCKS_REQUIRED(names_mu);
  void Write(const std::string& text) ABSL_EXCLUSIVE_LOCKS_REQUIRED(file_mu);
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

void Tracer::Impl::Write(const std::string& text) {
  if (file == nullptr || text.empty() || !write_error.ok()) return;
  if (std::fwrite(text.data(), 1, text.size(), file) != text.size()) {
    write_error = absl::DataLossError(absl::StrCat("cannot write the trace ", path, ": ", std::strerror(errno)));
    std::fprintf(stderr, "gradwire: %s: %s; the job goes on without its trace\n", worker.c_str(),
                 std::string(write_error.message()).c_str());
  }
}

void Tracer::Impl::Format(std::string& out, const ThreadBuffer& buffer, const Span& s, bool& first) {
  auto begin_event = [&](char phase, std::string_view category, int64_t ts) {
    absl::StrAppend(&out, first ? "" : ",\n", "{\"ph\":\"", absl::string_view(&phase, 1), "\",\"cat\":\"");
    first = false;
    AppendEscaped(out, category);
    absl::StrAppend(&out, "\",\"pid\":", rank, ",\"tid\":", buffer.tid, ",\"ts\":");
    AppendInt(out, ts - origin_us);
  };
  const std::string& category = names[s.category];
  const std::string& name = names[s.name];
  // Read here, under names_mu (the lambda below is not analysed as holding it).
  const std::string* arg_names[2] = {&names[s.arg_names[0]], &names[s.arg_names[1]]};
  const std::string& note = names[s.note];
  auto append_name_and_args = [&] {
    out += ",\"name\":\"";
    AppendEscaped(out, name);
    out += '"';
    if (s.arg_names[0] == 0 && s.arg_names[1] == 0 && s.note == 0) return;
    out += ",\"args\":{";
    bool first_arg = true;
    for (int i = 0; i < 2; ++i) {
      if (s.arg_names[i] == 0) continue;
      absl::StrAppend(&out, first_arg ? "\"" : ",\"");
      AppendEscaped(out, *arg_names[i]);
      absl::StrAppend(&out, "\":", s.arg_values[i]);
      first_arg = false;
    }
    if (s.note != 0) {
      absl::StrAppend(&out, first_arg ? "" : ",", "\"note\":\"");
      AppendEscaped(out, note);
      out += '"';
    }
    out += '}';
  };
  const int64_t end = std::max(s.end_us, s.begin_us);
  if (s.async) {
    begin_event('b', category, s.begin_us);
    append_name_and_args();
    absl::StrAppend(&out, ",\"id\":\"0x", absl::Hex(s.async_id), "\"}");
    begin_event('e', category, end);
    out += ",\"name\":\"";
    AppendEscaped(out, name);
    absl::StrAppend(&out, "\",\"id\":\"0x", absl::Hex(s.async_id), "\"}");
    return;
  }
  begin_event('X', category, s.begin_us);
  out += ",\"dur\":";
  AppendInt(out, end - s.begin_us);
  append_name_and_args();
  out += '}';
  // Flow steps bind to the slice enclosing their time on the same thread. Both are put at
  // the slice's start: what the slice starts (a request it sends, the reply of the
  // request it handles) cannot have been received before that, so every arrow points
  // forward in time.
  if (s.flow_in != 0) {
    begin_event('f', "flow", s.begin_us);
    absl::StrAppend(&out, ",\"bp\":\"e\",\"name\":\"flow\",\"id\":\"0x", absl::Hex(s.flow_in), "\"}");
  }
  if (s.flow_out != 0) {
    begin_event('s', "flow", s.begin_us);
    absl::StrAppend(&out, ",\"name\":\"flow\",\"id\":\"0x", absl::Hex(s.flow_out), "\"}");
  }
}

void Tracer::Impl::Drain() {
  std::vector<ThreadBuffer*> all;
  {
    absl::MutexLock lock(&buffers_mu);
    for (auto& b : buffers) all.push_back(b.get());
  }
  uint64_t dropped = 0;
  absl::MutexLock file_lock(&file_mu);
  std::string& text = text_buffer;  // kept between drains: its memory is reused
  text.clear();
  bool first = first_event;
  for (ThreadBuffer* b : all) {
    // The thread's buffer and the drained one trade places: both keep their memory, so
    // a steady stream of spans allocates (and faults in) nothing.
    std::vector<Span>& spans = b->draining;
    {
      absl::MutexLock lock(&b->mu);
      spans.swap(b->spans);
      dropped += b->dropped;
      b->dropped = 0;
    }
    if (spans.empty()) continue;
    absl::ReaderMutexLock names_lock(&names_mu);
    for (const Span& s : spans) {
      Format(text, *b, s, first);
      if (text.size() > (1 << 20)) {
        Write(text);
        text.clear();
      }
    }
    spans.clear();
  }
  Write(text);
  first_event = first;
  dropped_total += dropped;
  if (file != nullptr) std::fflush(file);
}

void Tracer::Impl::WriterLoop() {
  pthread_setname_np(pthread_self(), "gw-trace");
  absl::MutexLock lock(&stop_mu);
  while (!stopping) {
    auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(stop_mu) { return stopping; };
    stop_mu.AwaitWithTimeout(absl::Condition(&stop), kDrainEvery);
    stop_mu.Unlock();
    Drain();
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
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  FILE* f = ec ? nullptr : std::fopen(impl->path.c_str(), "w");
  if (f == nullptr) {
    const std::string why = ec ? ec.message() : std::strerror(errno);
    std::fprintf(stderr, "gradwire: %s cannot write its trace into %s: %s; it goes on without a trace\n",
                 worker.c_str(), dir.c_str(), why.c_str());
    return tracer;
  }
  impl->origin_us = Now();
  {
    absl::MutexLock lock(&impl->names_mu);
    impl->names.emplace_back();
  }
  {
    absl::MutexLock lock(&impl->file_mu);
    impl->file = f;
    // The clock's origin first, so that a file its worker never closed (killed) can still
    // be placed on the job's timeline (`gradwire trace merge`).
    std::string head =
        absl::StrCat("{\"traceEvents\":[\n{\"ph\":\"M\",\"name\":\"gradwire_clock_origin\",\"pid\":", rank,
                     ",\"args\":{\"us\":", impl->origin_us, ",\"worker\":\"");
    AppendEscaped(head, worker);
    head += "\"}}";
    impl->Write(head);
    impl->first_event = false;
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

int64_t Tracer::Now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1000000 + ts.tv_nsec / 1000;
}

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
  Impl::ThreadBuffer* b = impl_->BufferOfThisThread();
  absl::MutexLock lock(&b->mu);
  if (b->spans.size() >= kMaxBuffered) {
    ++b->dropped;
  } else {
    b->spans.push_back(span);
  }
}

Tracer::Scope::Scope(Tracer& tracer, Name category, Name name) : tracer_(tracer.enabled() ? &tracer : nullptr) {
  if (tracer_ == nullptr) return;
  span_.category = category;
  span_.name = name;
  span_.begin_us = Now();
}

Tracer::Scope::~Scope() {
  if (tracer_ == nullptr) return;
  span_.end_us = Now();
  tracer_->Record(span_);
}

void Tracer::SetClockOffset(int rank, int64_t offset_us, int64_t rtt_us) {
  if (!enabled()) return;
  absl::MutexLock lock(&impl_->offsets_mu);
  auto [it, inserted] = impl_->offsets.try_emplace(rank, offset_us, rtt_us);
  if (!inserted && rtt_us < it->second.second) it->second = {offset_us, rtt_us};
}

absl::Status Tracer::Close() {
  if (!impl_ || !enabled_.exchange(false)) return absl::OkStatus();
  {
    absl::MutexLock lock(&impl_->stop_mu);
    impl_->stopping = true;
  }
  impl_->writer.join();
  impl_->Drain();
  std::string tail = "\n],\n\"displayTimeUnit\":\"ms\",\n\"gradwire\":{\"worker\":\"";
  AppendEscaped(tail, impl_->worker);
  absl::StrAppend(&tail, "\",\"rank\":", impl_->rank, ",\"clock_origin_us\":", impl_->origin_us,
                  ",\"clock_offsets_us\":{");
  {
    absl::MutexLock lock(&impl_->offsets_mu);
    bool first = true;
    for (const auto& [rank, o] : impl_->offsets) {
      absl::StrAppend(&tail, first ? "" : ",", "\"", rank, "\":{\"offset\":", o.first, ",\"rtt\":", o.second, "}");
      first = false;
    }
  }
  absl::MutexLock lock(&impl_->file_mu);
  absl::StrAppend(&tail, "},\"dropped_spans\":", impl_->dropped_total, "}}\n");
  // The names of this worker and its threads, as the trace format's metadata events.
  std::string meta;
  absl::StrAppend(&meta, impl_->first_event ? "" : ",\n",
                  "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":", impl_->rank, ",\"args\":{\"name\":\"");
  AppendEscaped(meta, impl_->worker);
  absl::StrAppend(&meta, "\"}},\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":", impl_->rank,
                  ",\"args\":{\"sort_index\":", impl_->rank, "}}");
  {
    absl::MutexLock buffers_lock(&impl_->buffers_mu);
    for (const auto& b : impl_->buffers) {
      absl::StrAppend(&meta, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":", impl_->rank, ",\"tid\":", b->tid,
                      ",\"args\":{\"name\":\"");
      AppendEscaped(meta, b->thread_name);
      meta += "\"}}";
    }
  }
  impl_->Write(meta);
  impl_->Write(tail);
  absl::Status status = impl_->write_error;
  if (impl_->file != nullptr && std::fclose(impl_->file) != 0 && status.ok()) {
    status = absl::DataLossError(absl::StrCat("cannot write the trace ", impl_->path, ": ", std::strerror(errno)));
  }
  impl_->file = nullptr;
  return status;
}

}  // namespace gw::rpc
