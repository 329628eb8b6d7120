#include "observe/trace_spill.h"

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gradwire/rpc/global_id.h"

namespace gw::rpc::internal {
namespace {

constexpr char kMagic[8] = {'G', 'W', 'S', 'P', 'I', 'L', 'L', '1'};
// The longest name or worker a reader accepts (a longer length is a corrupt file).
constexpr uint32_t kMostText = 1 << 20;
// The most spans in one batch (a thread's buffer holds at most 64k between drains).
constexpr uint32_t kMostSpans = 1 << 20;

enum Kind : char { kName = 'N', kThread = 'T', kSpans = 'S', kOffset = 'O', kDropped = 'D', kEnd = 'E' };

template <typename T>
void Put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

void PutText(std::string& out, std::string_view text) {
  Put(out, static_cast<uint32_t>(text.size()));
  out.append(text);
}

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

// Reads a spill record by record; false at the end of the file or of its last whole record.
class SpillReader {
 public:
  explicit SpillReader(FILE* f) : f_(f) {}
  bool Read(void* p, size_t n) { return std::fread(p, 1, n, f_) == n; }
  template <typename T>
  bool Get(T& v) {
    return Read(&v, sizeof(v));
  }
  bool GetText(std::string& s) {
    uint32_t n = 0;
    if (!Get(n) || n > kMostText) return false;
    s.resize(n);
    return Read(s.data(), n);
  }

 private:
  FILE* f_;
};

// The JSON being written, flushed to its file every megabyte.
class JsonOut {
 public:
  JsonOut(FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  std::string& text() { return text_; }
  void MaybeFlush() {
    if (text_.size() >= (1 << 20)) Flush();
  }
  void Flush() {
    if (status_.ok() && !text_.empty() && std::fwrite(text_.data(), 1, text_.size(), f_) != text_.size()) {
      status_ = absl::DataLossError(absl::StrCat("cannot write the trace ", path_, ": ", std::strerror(errno)));
    }
    text_.clear();
  }
  const absl::Status& status() const { return status_; }

 private:
  FILE* f_;
  std::string path_;
  std::string text_;
  absl::Status status_;
};

struct Converter {
  int rank = -1;
  int64_t origin_us = 0;
  std::vector<std::string> names{std::string()};  // by Name; 0 is ""
  bool first = true;

  const std::string& NameOf(Tracer::Name id) const { return id < names.size() ? names[id] : names[0]; }

  void BeginEvent(std::string& out, char phase, std::string_view category, int tid, int64_t ts) {
    out += first ? "\n{\"ph\":\"" : ",\n{\"ph\":\"";
    first = false;
    out += phase;
    out += "\",\"cat\":\"";
    AppendEscaped(out, category);
    out += "\",\"pid\":";
    AppendInt(out, rank);
    out += ",\"tid\":";
    AppendInt(out, tid);
    out += ",\"ts\":";
    AppendInt(out, ts - origin_us);
  }

  void AppendNameAndArgs(std::string& out, const Tracer::Span& s) {
    out += ",\"name\":\"";
    AppendEscaped(out, NameOf(s.name));
    out += '"';
    if (s.arg_names[0] == 0 && s.arg_names[1] == 0 && s.note == 0 && s.context == 0) return;
    out += ",\"args\":{";
    bool first_arg = true;
    for (int i = 0; i < 2; ++i) {
      if (s.arg_names[i] == 0) continue;
      out += first_arg ? "\"" : ",\"";
      AppendEscaped(out, NameOf(s.arg_names[i]));
      out += "\":";
      AppendInt(out, s.arg_values[i]);
      first_arg = false;
    }
    if (s.note != 0) {
      out += first_arg ? "\"note\":\"" : ",\"note\":\"";
      AppendEscaped(out, NameOf(s.note));
      out += '"';
      first_arg = false;
    }
    if (std::optional<GlobalId> context = GlobalId::FromBits(s.context); s.context != 0 && context.has_value()) {
      absl::StrAppend(&out, first_arg ? "" : ",", "\"context\":\"", context->ToString(), "\"");
    }
    out += '}';
  }

  void Format(std::string& out, int tid, const Tracer::Span& s) {
    const std::string& category = NameOf(s.category);
    const int64_t end = std::max(s.end_us, s.begin_us);
    if (s.async) {
      BeginEvent(out, 'b', category, tid, s.begin_us);
      AppendNameAndArgs(out, s);
      absl::StrAppend(&out, ",\"id\":\"0x", absl::Hex(s.async_id), "\"}");
      BeginEvent(out, 'e', category, tid, end);
      out += ",\"name\":\"";
      AppendEscaped(out, NameOf(s.name));
      absl::StrAppend(&out, "\",\"id\":\"0x", absl::Hex(s.async_id), "\"}");
      return;
    }
    BeginEvent(out, 'X', category, tid, s.begin_us);
    out += ",\"dur\":";
    AppendInt(out, end - s.begin_us);
    AppendNameAndArgs(out, s);
    out += '}';
    // Flow steps bind to the slice enclosing their time on the same thread. Both are put
    // at the slice's start: what the slice starts (a request it sends, the reply of the
    // request it handles) cannot have been received before that, so every arrow points
    // forward in time.
    if (s.flow_in != 0) {
      BeginEvent(out, 'f', "flow", tid, s.begin_us);
      absl::StrAppend(&out, ",\"bp\":\"e\",\"name\":\"flow\",\"id\":\"0x", absl::Hex(s.flow_in), "\"}");
    }
    if (s.flow_out != 0) {
      BeginEvent(out, 's', "flow", tid, s.begin_us);
      absl::StrAppend(&out, ",\"name\":\"flow\",\"id\":\"0x", absl::Hex(s.flow_out), "\"}");
    }
  }
};

}  // namespace

void AppendSpillHeader(std::string& out, std::string_view worker, int rank, int64_t origin_us) {
  out.append(kMagic, sizeof(kMagic));
  Put(out, static_cast<uint32_t>(sizeof(Tracer::Span)));
  Put(out, static_cast<int32_t>(rank));
  Put(out, origin_us);
  PutText(out, worker);
}

void AppendSpillName(std::string& out, Tracer::Name id, std::string_view text) {
  out += kName;
  Put(out, id);
  PutText(out, text);
}

void AppendSpillThread(std::string& out, int tid, std::string_view name) {
  out += kThread;
  Put(out, static_cast<int32_t>(tid));
  PutText(out, name);
}

void AppendSpillSpansHeader(std::string& out, int tid, size_t count) {
  out += kSpans;
  Put(out, static_cast<int32_t>(tid));
  Put(out, static_cast<uint32_t>(count));
}

std::string_view SpillBytesOf(std::span<const Tracer::Span> spans) {
  return std::string_view(reinterpret_cast<const char*>(spans.data()), spans.size_bytes());
}

void AppendSpillOffset(std::string& out, int rank, int64_t offset_us, int64_t rtt_us) {
  out += kOffset;
  Put(out, static_cast<int32_t>(rank));
  Put(out, offset_us);
  Put(out, rtt_us);
}

void AppendSpillDropped(std::string& out, uint64_t dropped) {
  out += kDropped;
  Put(out, dropped);
}

void AppendSpillEnd(std::string& out) { out += kEnd; }

absl::Status SpillToJson(const std::string& spill_path, const std::string& json_path, bool* complete) {
  *complete = false;
  std::unique_ptr<FILE, int (*)(FILE*)> in(std::fopen(spill_path.c_str(), "rb"), &std::fclose);
  if (in == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot open the trace spill ", spill_path, ": ", std::strerror(errno)));
  }
  SpillReader reader(in.get());
  char magic[sizeof(kMagic)];
  uint32_t span_size = 0;
  int32_t rank = -1;
  int64_t origin_us = 0;
  std::string worker;
  if (!reader.Read(magic, sizeof(magic)) || std::memcmp(magic, kMagic, sizeof(kMagic)) != 0 || !reader.Get(span_size) ||
      !reader.Get(rank) || !reader.Get(origin_us) || !reader.GetText(worker)) {
    return absl::InvalidArgumentError(absl::StrCat(spill_path, " is not a trace spill written by gradwire"));
  }
  if (span_size != sizeof(Tracer::Span)) {
    return absl::InvalidArgumentError(absl::StrCat(spill_path, " was written by a gradwire build whose spans take ",
                                                   span_size, " bytes, not ", sizeof(Tracer::Span),
                                                   ": convert it with the gradwire that wrote it"));
  }
  const std::string tmp_path = json_path + ".tmp";
  std::unique_ptr<FILE, int (*)(FILE*)> out_file(std::fopen(tmp_path.c_str(), "w"), &std::fclose);
  if (out_file == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat("cannot write the trace ", tmp_path, ": ", std::strerror(errno)));
  }
  Converter c;
  c.rank = rank;
  c.origin_us = origin_us;
  JsonOut out(out_file.get(), tmp_path);
  // The clock's origin first: `gradwire trace merge` places the worker by it.
  absl::StrAppend(&out.text(), "{\"traceEvents\":[\n{\"ph\":\"M\",\"name\":\"gradwire_clock_origin\",\"pid\":", rank,
                  ",\"args\":{\"us\":", origin_us, ",\"worker\":\"");
  AppendEscaped(out.text(), worker);
  out.text() += "\"}}";
  c.first = false;
  std::map<int, std::string> threads;
  std::map<int, std::pair<int64_t, int64_t>> offsets;  // rank -> (offset, rtt) us
  uint64_t dropped = 0;
  std::vector<Tracer::Span> spans;
  for (char kind; reader.Get(kind) && !*complete;) {
    bool whole = false;
    switch (kind) {
      case kName: {
        Tracer::Name id = 0;
        std::string text;
        whole = reader.Get(id) && reader.GetText(text) && id < kMostText;
        if (whole) {
          if (c.names.size() <= id) c.names.resize(id + 1);
          c.names[id] = std::move(text);
        }
        break;
      }
      case kThread: {
        int32_t tid = 0;
        std::string name;
        whole = reader.Get(tid) && reader.GetText(name);
        if (whole) threads[tid] = std::move(name);
        break;
      }
      case kSpans: {
        int32_t tid = 0;
        uint32_t count = 0;
        whole = reader.Get(tid) && reader.Get(count) && count <= kMostSpans;
        if (!whole) break;
        spans.resize(count);
        whole = reader.Read(spans.data(), count * sizeof(Tracer::Span));
        if (!whole) break;
        for (const Tracer::Span& s : spans) {
          c.Format(out.text(), tid, s);
          out.MaybeFlush();
        }
        break;
      }
      case kOffset: {
        int32_t peer = 0;
        int64_t offset = 0, rtt = 0;
        whole = reader.Get(peer) && reader.Get(offset) && reader.Get(rtt);
        if (whole) offsets[peer] = {offset, rtt};
        break;
      }
      case kDropped: {
        uint64_t n = 0;
        whole = reader.Get(n);
        dropped += whole ? n : 0;
        break;
      }
      case kEnd:
        whole = true;
        *complete = true;
        break;
    }
    if (!whole) break;  // a record cut short, or not a record: the spill ends here
  }
  if (std::ferror(in.get())) {
    return absl::DataLossError(absl::StrCat("cannot read the trace spill ", spill_path, ": ", std::strerror(errno)));
  }
  // The names of this worker and its threads, as the trace format's metadata events.
  std::string& text = out.text();
  absl::StrAppend(&text, ",\n{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":", rank, ",\"args\":{\"name\":\"");
  AppendEscaped(text, worker);
  absl::StrAppend(&text, "\"}},\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":", rank,
                  ",\"args\":{\"sort_index\":", rank, "}}");
  for (const auto& [tid, name] : threads) {
    absl::StrAppend(&text, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":", rank, ",\"tid\":", tid,
                    ",\"args\":{\"name\":\"");
    AppendEscaped(text, name);
    text += "\"}}";
  }
  text += "\n],\n\"displayTimeUnit\":\"ms\",\n\"gradwire\":{\"worker\":\"";
  AppendEscaped(text, worker);
  absl::StrAppend(&text, "\",\"rank\":", rank, ",\"clock_origin_us\":", origin_us, ",\"clock_offsets_us\":{");
  bool first = true;
  for (const auto& [peer, o] : offsets) {
    absl::StrAppend(&text, first ? "" : ",", "\"", peer, "\":{\"offset\":", o.first, ",\"rtt\":", o.second, "}");
    first = false;
  }
  absl::StrAppend(&text, "},\"dropped_spans\":", dropped, ",\"closed\":", *complete ? "true" : "false", "}}\n");
  out.Flush();
  if (!out.status().ok()) return out.status();
  if (std::fclose(out_file.release()) != 0) {
    return absl::DataLossError(absl::StrCat("cannot write the trace ", tmp_path, ": ", std::strerror(errno)));
  }
  std::error_code ec;
  std::filesystem::rename(tmp_path, json_path, ec);
  if (ec) return absl::DataLossError(absl::StrCat("cannot rename ", tmp_path, " to ", json_path, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace gw::rpc::internal
