#include "gradwire/rpc/device_map.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace gw::rpc {
namespace {

// Debian's Abseil has its own string_view.
absl::string_view View(std::string_view s) { return absl::string_view(s.data(), s.size()); }
std::string_view Std(absl::string_view s) { return std::string_view(s.data(), s.size()); }

std::string Pair(std::string_view from, std::string_view to) {
  return absl::StrCat("device map ", View(from), " -> ", View(to), ": ");
}

}  // namespace

absl::StatusOr<DeviceMap> DeviceMap::Make(std::string_view from, std::string_view to, Entries entries) {
  const std::string where = Pair(from, to);
  for (size_t i = 0; i < entries.size(); ++i) {
    for (const Device d : {entries[i].first, entries[i].second}) {
      if (d.index < 0 || (d.is_cpu() && d.index != 0)) {
        return absl::InvalidArgumentError(absl::StrCat(where, "device ", d.ToString(), " cannot exist"));
      }
    }
    for (size_t j = 0; j < i; ++j) {
      if (entries[j].first == entries[i].first) {
        return absl::InvalidArgumentError(absl::StrCat(where, entries[i].first.ToString(), " is mapped twice (to ",
                                                       entries[j].second.ToString(), " and ",
                                                       entries[i].second.ToString(), ")"));
      }
      if (entries[j].second == entries[i].second) {
        return absl::InvalidArgumentError(absl::StrCat(where, entries[j].first.ToString(), " and ",
                                                       entries[i].first.ToString(), " both map to ",
                                                       entries[i].second.ToString(), " (a map is one-to-one)"));
      }
    }
  }
  DeviceMap map;
  map.from_ = std::string(from);
  map.to_ = std::string(to);
  map.entries_ = std::move(entries);
  return map;
}

Device DeviceMap::Forward(Device local) const {
  for (const auto& [l, r] : entries_) {
    if (l == local) return r;
  }
  return kCPU;
}

Device DeviceMap::Inverse(Device remote) const {
  for (const auto& [l, r] : entries_) {
    if (r == remote) return l;
  }
  return kCPU;
}

absl::Status DeviceMap::CheckDevices(int local_gpus, int remote_gpus) const {
  for (const auto& [l, r] : entries_) {
    if (l.is_cuda() && l.index >= local_gpus) {
      return absl::InvalidArgumentError(absl::StrCat(Pair(from_, to_), l.ToString(), " is not a device of ", from_,
                                                     " (it has ", local_gpus, local_gpus == 1 ? " GPU)" : " GPUs)"));
    }
    if (r.is_cuda() && r.index >= remote_gpus) {
      return absl::InvalidArgumentError(absl::StrCat(Pair(from_, to_), r.ToString(), " is not a device of ", to_,
                                                     " (it has ", remote_gpus, remote_gpus == 1 ? " GPU)" : " GPUs)"));
    }
  }
  return absl::OkStatus();
}

std::string DeviceMap::ToString() const {
  return absl::StrJoin(entries_, ",", [](std::string* out, const std::pair<Device, Device>& e) {
    absl::StrAppend(out, e.first.ToString(), "->", e.second.ToString());
  });
}

void DeviceMaps::Set(DeviceMap map) {
  std::string peer = map.to();
  maps_.insert_or_assign(std::move(peer), std::move(map));
}

const DeviceMap& DeviceMaps::Toward(std::string_view peer) const {
  static const DeviceMap* const kNone = new DeviceMap();
  auto it = maps_.find(peer);
  return it == maps_.end() ? *kNone : it->second;
}

std::string DeviceMaps::ToString() const {
  return absl::StrJoin(maps_, ";", [](std::string* out, const auto& entry) {
    absl::StrAppend(out, entry.first, "=", entry.second.ToString());
  });
}

absl::StatusOr<DeviceMaps> DeviceMaps::Parse(std::string_view self, std::string_view text) {
  DeviceMaps maps;
  const auto bad = [&](absl::string_view part, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("device maps '", View(text), "': '", part, "' ", why,
                                                   " (expected PEER=LOCAL->REMOTE,...;PEER=..., e.g. "
                                                   "worker1=cuda:0->cuda:1)"));
  };
  for (absl::string_view peer_part : absl::StrSplit(View(text), ';', absl::SkipWhitespace())) {
    peer_part = absl::StripAsciiWhitespace(peer_part);
    const std::vector<absl::string_view> kv = absl::StrSplit(peer_part, absl::MaxSplits('=', 1));
    if (kv.size() != 2 || absl::StripAsciiWhitespace(kv[0]).empty()) return bad(peer_part, "names no peer");
    const absl::string_view peer = absl::StripAsciiWhitespace(kv[0]);
    if (maps.maps_.contains(Std(peer))) return bad(peer_part, "names a peer twice");
    DeviceMap::Entries entries;
    for (absl::string_view entry : absl::StrSplit(kv[1], ',', absl::SkipWhitespace())) {
      const std::vector<absl::string_view> ends = absl::StrSplit(entry, "->");
      if (ends.size() != 2) return bad(entry, "is not LOCAL->REMOTE");
      absl::StatusOr<Device> local = ParseDevice(Std(absl::StripAsciiWhitespace(ends[0])));
      absl::StatusOr<Device> remote = ParseDevice(Std(absl::StripAsciiWhitespace(ends[1])));
      if (!local.ok()) return bad(entry, local.status().message());
      if (!remote.ok()) return bad(entry, remote.status().message());
      entries.emplace_back(*local, *remote);
    }
    absl::StatusOr<DeviceMap> map = DeviceMap::Make(self, Std(peer), std::move(entries));
    if (!map.ok()) return map.status();
    maps.Set(*std::move(map));
  }
  return maps;
}

std::string_view TensorPathName(TensorPath path) {
  switch (path) {
    case TensorPath::kHost:
      return "host";
    case TensorPath::kCudaIpc:
      return "cuda-ipc";
    case TensorPath::kStaged:
      return "staged";
  }
  return "unknown";
}

TensorPath ChoosePath(Device sender, Device receiver, bool same_host, bool ipc_available) {
  if (sender.is_cpu() && receiver.is_cpu()) return TensorPath::kHost;
  if (sender.is_cuda() && receiver.is_cuda() && same_host && ipc_available) return TensorPath::kCudaIpc;
  return TensorPath::kStaged;
}

}  // namespace gw::rpc
