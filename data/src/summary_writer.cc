#include "gradwire/data/summary_writer.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gradwire/nn/crc32c.h"
#include "gradwire/nn/file_io.h"
#include "gradwire/proto/tensorboard.pb.h"

namespace gw::data {
namespace {

namespace tensorboard = ::gradwire::tensorboard;

constexpr char kFileVersion[] = "brain.Event:2";

// TFRecord's masked CRC: a CRC of data that holds CRCs is itself a poor CRC, so the stored
// one is rotated and offset.
uint32_t MaskedCrc(const void* data, size_t n) {
  const uint32_t crc = nn::Crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

void PutLittleEndian(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetLittleEndian(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::atomic<int> files_opened{0};

}  // namespace

absl::StatusOr<std::unique_ptr<SummaryWriter>> SummaryWriter::Open(const std::string& logdir) {
  std::error_code ec;
  std::filesystem::create_directories(logdir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("SummaryWriter: cannot create the log directory ", logdir, ": ", ec.message()));
  }
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  const std::string path = absl::StrCat(logdir, "/events.out.tfevents.", absl::ToUnixSeconds(absl::Now()), ".", host,
                                        ".", ::getpid(), ".", files_opened.fetch_add(1));
  std::FILE* file = std::fopen(path.c_str(), "wbx");  // never an existing file
  if (file == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("SummaryWriter: cannot create ", path));
  }
  std::unique_ptr<SummaryWriter> writer(new SummaryWriter(path, file));
  tensorboard::Event first;
  first.set_wall_time(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  first.set_file_version(kFileVersion);
  if (absl::Status s = writer->WriteRecord(first.SerializeAsString()); !s.ok()) return s;
  if (absl::Status s = writer->Flush(); !s.ok()) return s;
  return writer;
}

SummaryWriter::~SummaryWriter() { (void)Close(); }

absl::Status SummaryWriter::Fail(const std::string& what) {
  if (error_.ok()) error_ = absl::ErrnoToStatus(errno, absl::StrCat("SummaryWriter: cannot ", what, " ", path_));
  return error_;
}

absl::Status SummaryWriter::WriteRecord(const std::string& data) {
  if (!error_.ok()) return error_;
  if (file_ == nullptr) return absl::FailedPreconditionError(absl::StrCat("SummaryWriter: ", path_, " is closed"));
  std::string record;
  PutLittleEndian(record, data.size(), 8);
  PutLittleEndian(record, MaskedCrc(record.data(), 8), 4);
  record += data;
  PutLittleEndian(record, MaskedCrc(data.data(), data.size()), 4);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) return Fail("write to");
  return absl::OkStatus();
}

absl::Status SummaryWriter::AddScalar(std::string_view tag, double value, int64_t step, absl::Time wall_time) {
  tensorboard::Event event;
  event.set_wall_time(absl::ToDoubleSeconds(wall_time - absl::UnixEpoch()));
  event.set_step(step);
  tensorboard::SummaryValue* v = event.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  v->set_simple_value(static_cast<float>(value));
  if (absl::Status s = WriteRecord(event.SerializeAsString()); !s.ok()) return s;
  if (absl::Now() - last_flush_ >= absl::Seconds(1)) return Flush();
  return absl::OkStatus();
}

absl::Status SummaryWriter::Flush() {
  if (!error_.ok()) return error_;
  if (file_ == nullptr) return absl::OkStatus();
  last_flush_ = absl::Now();
  if (std::fflush(file_) != 0) return Fail("write to");
  return absl::OkStatus();
}

absl::Status SummaryWriter::Close() {
  if (file_ == nullptr) return error_;
  (void)Flush();
  if (std::fclose(file_) != 0 && error_.ok()) (void)Fail("close");
  file_ = nullptr;
  return error_;
}

absl::StatusOr<std::vector<ScalarEvent>> ReadScalarEvents(const std::string& path) {
  absl::StatusOr<std::string> bytes = nn::ReadWholeFile(path, "ReadScalarEvents");
  if (!bytes.ok()) return bytes.status();
  const std::string& b = *bytes;
  std::vector<ScalarEvent> out;
  bool versioned = false;
  for (size_t at = 0; at < b.size();) {
    auto loss = [&](const std::string& what) {
      return absl::DataLossError(absl::StrCat("ReadScalarEvents: ", path, ": the record at byte ", at, " ", what));
    };
    if (b.size() - at < 12) return loss("is cut short in its length");
    const uint64_t n = GetLittleEndian(&b[at], 8);
    if (GetLittleEndian(&b[at + 8], 4) != MaskedCrc(&b[at], 8)) return loss("has a length whose CRC does not match");
    if (n > b.size() - at - 12 || b.size() - at - 12 - n < 4) return loss("is cut short");
    const char* data = &b[at + 12];
    if (GetLittleEndian(data + n, 4) != MaskedCrc(data, n)) return loss("has data whose CRC does not match");
    tensorboard::Event event;
    if (!event.ParseFromArray(data, static_cast<int>(n))) {
      return absl::InvalidArgumentError(
          absl::StrCat("ReadScalarEvents: ", path, ": the record at byte ", at, " is not a TensorBoard event"));
    }
    if (event.has_file_version()) {
      if (event.file_version() != kFileVersion) {
        return absl::InvalidArgumentError(absl::StrCat("ReadScalarEvents: ", path, " is of version '",
                                                       event.file_version(), "', not ", kFileVersion));
      }
      versioned = true;
    }
    for (const tensorboard::SummaryValue& v : event.summary().value()) {
      out.push_back({v.tag(), event.step(), event.wall_time(), v.simple_value()});
    }
    at += 12 + n + 4;
  }
  if (!versioned) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReadScalarEvents: ", path, " has no file-version event: not a TensorBoard event file"));
  }
  return out;
}

}  // namespace gw::data
