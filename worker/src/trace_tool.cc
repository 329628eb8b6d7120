#include "trace_tool.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "gradwire/rpc/trace.h"
#include "nlohmann/json.hpp"

namespace gw::worker {
namespace {

using nlohmann::json;

// What a worker's tracer writes while it runs (rpc/trace.h), turned into JSON when it closes.
constexpr std::string_view kSpill = ".trace.spill";

struct WorkerTrace {
  std::string path;
  std::string worker;
  int rank = -1;
  double origin_us = 0;
  double offset_us = 0;  // onto rank 0's clock
  bool closed = false;
  std::vector<json> events;
};

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  return text.str();
}

absl::StatusOr<WorkerTrace> ReadTrace(const std::string& path, std::vector<std::string>* notes) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  WorkerTrace t;
  t.path = path;
  json whole = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (whole.is_discarded() || !whole.is_object() || !whole.contains("traceEvents") || !whole.contains("gradwire") ||
      !whole.at("traceEvents").is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a trace written by gradwire (no \"traceEvents\" and \"gradwire\" sections)"));
  }
  t.events = std::move(whole.at("traceEvents").get_ref<json::array_t&>());
  const json& meta = whole.at("gradwire");
  t.closed = meta.value("closed", true);
  if (meta.contains("clock_offsets_us") && meta.at("clock_offsets_us").contains("0")) {
    t.offset_us = meta.at("clock_offsets_us").at("0").at("offset").get<double>();
  }
  for (const json& e : t.events) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "gradwire_clock_origin") {
      t.origin_us = e.at("args").at("us").get<double>();
      t.worker = e.at("args").at("worker").get<std::string>();
      t.rank = e.at("pid").get<int>();
    }
  }
  if (t.rank < 0) return absl::InvalidArgumentError(absl::StrCat(path, " has no clock origin: not a gradwire trace"));
  if (t.rank != 0 && t.offset_us == 0) {
    notes->push_back(absl::StrCat(t.worker, " measured no clock offset to rank 0: its times are taken as they are"));
  }
  return t;
}

// Where the JSON of the spill DIR/<worker>.trace.spill goes: DIR/<worker>.trace.json.
std::string JsonOfSpill(const std::string& spill) {
  return spill.substr(0, spill.size() - kSpill.size()) + ".trace.json";
}

// The JSON of a worker's spill (its worker did not close its trace: it was killed), next
// to it; the spill is kept.
absl::StatusOr<std::string> ConvertSpill(const std::string& spill, std::vector<std::string>* notes) {
  const std::string json_path = JsonOfSpill(spill);
  bool closed = false;
  if (absl::Status s = rpc::Tracer::ConvertSpill(spill, json_path, &closed); !s.ok()) return s;
  notes->push_back(
      absl::StrCat(spill, closed ? " was closed but not converted" : " was not closed (its worker did not shut down)",
                   ": its spans up to the last whole record are now in ", json_path));
  return json_path;
}

}  // namespace

absl::StatusOr<std::string> MergeTraces(const std::vector<std::string>& paths, std::vector<std::string>* notes) {
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      std::set<std::string> found, spills;
      for (const auto& entry : std::filesystem::directory_iterator(p, ec)) {
        const std::string name = entry.path().string();
        if (name.ends_with(".trace.json")) found.insert(name);
        if (name.ends_with(kSpill)) spills.insert(name);
      }
      if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", p, ": ", ec.message()));
      for (const std::string& spill : spills) {
        const std::string json_path = JsonOfSpill(spill);
        // Converted already (its worker stopped between writing the JSON and removing the spill).
        if (found.contains(json_path)) continue;
        absl::StatusOr<std::string> converted = ConvertSpill(spill, notes);
        if (!converted.ok()) return converted.status();
        found.insert(*converted);
      }
      if (found.empty()) return absl::NotFoundError(absl::StrCat(p, " holds no *.trace.json or *.trace.spill files"));
      files.insert(files.end(), found.begin(), found.end());
    } else if (p.ends_with(kSpill)) {
      absl::StatusOr<std::string> converted = ConvertSpill(p, notes);
      if (!converted.ok()) return converted.status();
      files.push_back(*converted);
    } else {
      files.push_back(p);
    }
  }
  std::vector<WorkerTrace> traces;
  for (const std::string& f : files) {
    absl::StatusOr<WorkerTrace> t = ReadTrace(f, notes);
    if (!t.ok()) return t.status();
    traces.push_back(*std::move(t));
  }
  if (traces.empty()) return absl::InvalidArgumentError("no trace files given");
  // Rank 0's clock: each worker's time plus its offset; the merged times start at 0.
  double base = INFINITY;
  for (const WorkerTrace& t : traces) {
    for (const json& e : t.events) {
      if (e.value("ph", "") != "M" && e.contains("ts"))
        base = std::min(base, t.origin_us + t.offset_us + e.at("ts").get<double>());
    }
  }
  if (!std::isfinite(base)) base = 0;
  struct Keyed {
    double ts;
    int pid;
    int tid;
    size_t order;
    json event;
  };
  std::vector<Keyed> all;
  json workers = json::array();
  for (const WorkerTrace& t : traces) {
    workers.push_back(
        {{"worker", t.worker}, {"rank", t.rank}, {"offset_us", t.offset_us}, {"closed", t.closed}, {"file", t.path}});
    for (const json& e : t.events) {
      if (e.value("name", "") == "gradwire_clock_origin") continue;
      json moved = e;
      double ts = 0;
      if (e.contains("ts")) {
        ts = t.origin_us + t.offset_us + e.at("ts").get<double>() - base;
        moved["ts"] = std::round(ts * 1000) / 1000;
      }
      const bool meta = e.value("ph", "") == "M";
      all.push_back({meta ? -1.0 : ts, e.value("pid", 0), e.value("tid", 0), all.size(), std::move(moved)});
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const Keyed& a, const Keyed& b) {
    return std::tie(a.ts, a.pid, a.tid, a.order) < std::tie(b.ts, b.pid, b.tid, b.order);
  });
  json events = json::array();
  for (Keyed& k : all) events.push_back(std::move(k.event));
  json merged = {{"traceEvents", std::move(events)},
                 {"displayTimeUnit", "ms"},
                 {"gradwire", {{"merged", std::move(workers)}, {"clock", "rank 0's"}, {"origin_us", base}}}};
  return merged.dump() + "\n";
}

namespace {

std::string Escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// A colour per category, stable across runs.
std::string Colour(const std::string& category) {
  static const std::map<std::string, std::string> kKnown = {
      {"rpc.send", "#4e79a7"},    {"rpc.handler", "#f28e2b"},   {"rpc.reply", "#76b7b2"},
      {"collectives", "#e15759"}, {"dist_autograd", "#59a14f"}, {"param_server", "#edc948"},
      {"pipeline", "#b07aa1"},    {"serve", "#ff9da7"},         {"train", "#9c755f"}};
  auto it = kKnown.find(category);
  if (it != kKnown.end()) return it->second;
  const size_t h = std::hash<std::string>()(category);
  return absl::StrFormat("hsl(%d,55%%,60%%)", static_cast<int>(h % 360));
}

}  // namespace

absl::StatusOr<std::string> RenderTrace(const std::string& merged_text, const RenderOptions& options) {
  json merged = json::parse(merged_text, nullptr, false);
  if (merged.is_discarded() || !merged.is_object() || !merged.contains("traceEvents")) {
    return absl::InvalidArgumentError("not a merged trace (gradwire trace merge writes one)");
  }
  struct Slice {
    double ts, dur;
    int pid, tid;
    std::string name, cat;
    int depth = 0;  // slices of its lane it lies within
  };
  std::vector<Slice> slices;
  std::map<std::pair<int, int>, std::string> thread_names;
  std::map<int, std::string> process_names;
  std::map<std::string, std::pair<int, int>> lane_of_flow_start, lane_of_flow_end;
  std::map<std::string, double> flow_start_ts, flow_end_ts;
  // Async spans ('b' ... 'e', begun and ended on any threads): a lane of their own per
  // worker and category, below the worker's threads.
  std::map<std::tuple<int, std::string, std::string>, double> async_begun;  // (pid, cat, id) -> ts
  std::vector<Slice> async_spans;
  double end = 0;
  for (const json& e : merged.at("traceEvents")) {
    const std::string ph = e.value("ph", "");
    const int pid = e.value("pid", 0), tid = e.value("tid", 0);
    if (ph == "M") {
      if (e.value("name", "") == "thread_name") thread_names[{pid, tid}] = e.at("args").value("name", "");
      if (e.value("name", "") == "process_name") process_names[pid] = e.at("args").value("name", "");
      continue;
    }
    const double ts = e.value("ts", 0.0) / 1000.0;  // ms
    if (ph == "X") {
      const double dur = e.value("dur", 0.0) / 1000.0;
      slices.push_back({ts, dur, pid, tid, e.value("name", ""), e.value("cat", "")});
      end = std::max(end, ts + dur);
    } else if (ph == "b") {
      async_begun[{pid, e.value("cat", ""), e.value("id", "")}] = ts;
    } else if (ph == "e") {
      auto begun = async_begun.find({pid, e.value("cat", ""), e.value("id", "")});
      if (begun == async_begun.end()) continue;
      const std::string cat = e.value("cat", "");
      async_spans.push_back({begun->second, ts - begun->second, pid, 0, e.value("name", ""), cat});
      end = std::max(end, ts);
      async_begun.erase(begun);
    } else if (ph == "s" || ph == "f") {
      const std::string id = e.value("id", "");
      (ph == "s" ? lane_of_flow_start : lane_of_flow_end)[id] = {pid, tid};
      (ph == "s" ? flow_start_ts : flow_end_ts)[id] = ts;
    }
  }
  // Async spans may overlap: each goes to the first lane of its worker and category whose
  // last span ended before it begins ("pipeline (async)", "pipeline (async 2)", ...).
  std::sort(async_spans.begin(), async_spans.end(), [](const Slice& a, const Slice& b) { return a.ts < b.ts; });
  std::map<std::pair<int, std::string>, std::vector<double>> async_lane_ends;  // (pid, cat) -> each lane's end
  int next_async_tid = 1'000'000;                                              // after the threads
  std::map<std::tuple<int, std::string, size_t>, int> async_tids;
  for (Slice& s : async_spans) {
    std::vector<double>& ends = async_lane_ends[{s.pid, s.cat}];
    size_t k = 0;
    while (k < ends.size() && ends[k] > s.ts) ++k;
    if (k == ends.size()) ends.push_back(0);
    ends[k] = s.ts + s.dur;
    auto [it, added] = async_tids.try_emplace({s.pid, s.cat, k}, 0);
    if (added) {
      it->second = next_async_tid++;
      thread_names[{s.pid, it->second}] = k == 0 ? s.cat + " (async)" : absl::StrCat(s.cat, " (async ", k + 1, ")");
    }
    s.tid = it->second;
    slices.push_back(s);
  }
  // Slices of one thread nest: each is drawn inside those it lies within, thinner.
  std::stable_sort(slices.begin(), slices.end(), [](const Slice& a, const Slice& b) {
    if (std::tie(a.pid, a.tid, a.ts) != std::tie(b.pid, b.tid, b.ts)) {
      return std::tie(a.pid, a.tid, a.ts) < std::tie(b.pid, b.tid, b.ts);
    }
    return a.dur > b.dur;  // the enclosing one first
  });
  std::vector<double> open_ends;
  for (size_t i = 0; i < slices.size(); ++i) {
    if (i == 0 || slices[i].pid != slices[i - 1].pid || slices[i].tid != slices[i - 1].tid) open_ends.clear();
    while (!open_ends.empty() && open_ends.back() <= slices[i].ts) open_ends.pop_back();
    slices[i].depth = static_cast<int>(open_ends.size());
    open_ends.push_back(slices[i].ts + slices[i].dur);
  }
  const double from = std::max(0.0, options.from_ms);
  const double to = options.to_ms < 0 ? end : options.to_ms;
  if (!(to > from)) return absl::InvalidArgumentError(absl::StrCat("the window [", from, ", ", to, "] ms is empty"));
  // Lanes: the threads that have a slice in the window, by worker then thread.
  std::set<std::pair<int, int>> used;
  for (const Slice& s : slices) {
    if (s.ts + s.dur >= from && s.ts <= to) used.insert({s.pid, s.tid});
  }
  if (used.empty()) return absl::InvalidArgumentError(absl::StrCat("nothing happens in [", from, ", ", to, "] ms"));
  std::map<std::pair<int, int>, int> lane;
  for (const auto& key : used) lane.emplace(key, static_cast<int>(lane.size()));
  constexpr int kLabel = 190, kLaneHeight = 22, kTop = 40, kAxis = 30;
  const int plot = std::max(200, options.width_px - kLabel - 10);
  const int height = kTop + static_cast<int>(lane.size()) * kLaneHeight + kAxis;
  auto x_of = [&](double ms) { return kLabel + (ms - from) / (to - from) * plot; };
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      options.width_px, height);
  absl::StrAppendFormat(&svg, "<text x=\"8\" y=\"20\" font-size=\"14\">%s</text>\n",
                        Escape(options.title.empty() ? absl::StrFormat("%.3f-%.3f ms", from, to) : options.title));
  int previous_pid = -1;
  for (const auto& [key, index] : lane) {
    const int y = kTop + index * kLaneHeight;
    if (index % 2 == 0) {
      absl::StrAppendFormat(&svg, "<rect x=\"0\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#f4f4f4\"/>\n", y,
                            options.width_px, kLaneHeight);
    }
    if (key.first != previous_pid) {
      absl::StrAppendFormat(&svg, "<line x1=\"0\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"#999\"/>\n", options.width_px,
                            y, y);
      previous_pid = key.first;
    }
    const std::string& process =
        process_names.contains(key.first) ? process_names[key.first] : absl::StrCat("rank ", key.first);
    const std::string& thread = thread_names.contains(key) ? thread_names[key] : absl::StrCat("thread ", key.second);
    absl::StrAppendFormat(&svg, "<text x=\"6\" y=\"%d\">%s %s</text>\n", y + 15, Escape(process), Escape(thread));
  }
  std::set<std::string> categories;
  std::string labels;  // drawn over every slice
  for (const Slice& s : slices) {
    if (s.ts + s.dur < from || s.ts > to) continue;
    // Nested slices are drawn thinner, inside their parents, and unlabelled.
    const int inset = std::min(s.depth, 2) * 4;
    const int y = kTop + lane.at({s.pid, s.tid}) * kLaneHeight + 3 + inset;
    const double x0 = std::max<double>(kLabel, x_of(s.ts)), x1 = std::min<double>(kLabel + plot, x_of(s.ts + s.dur));
    const double w = std::max(0.8, x1 - x0);
    categories.insert(s.cat);
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"%s><title>%s (%s) %.3f ms"
                          "</title></rect>\n",
                          x0, y, w, kLaneHeight - 6 - 2 * inset, Colour(s.cat), s.depth > 0 ? " stroke=\"white\"" : "",
                          Escape(s.name), Escape(s.cat), s.dur);
    if (s.depth == 0 && w > 6.5 * static_cast<double>(s.name.size()) + 4) {
      absl::StrAppendFormat(&labels, "<text x=\"%.1f\" y=\"%d\" fill=\"black\">%s</text>\n", x0 + 2, y + 12,
                            Escape(s.name));
    }
  }
  svg += labels;
  // Flows whose two ends are in the window, as arrows.
  svg +=
      "<defs><marker id=\"arrow\" markerWidth=\"6\" markerHeight=\"6\" refX=\"5\" refY=\"3\" orient=\"auto\">"
      "<path d=\"M0,0 L6,3 L0,6 z\" fill=\"#333\"/></marker></defs>\n";
  for (const auto& [id, start] : flow_start_ts) {
    auto end_it = flow_end_ts.find(id);
    if (end_it == flow_end_ts.end() || start < from || end_it->second > to) continue;
    auto a = lane.find(lane_of_flow_start[id]), b = lane.find(lane_of_flow_end[id]);
    if (a == lane.end() || b == lane.end()) continue;
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#333\" stroke-width=\"0.7\" "
                          "marker-end=\"url(#arrow)\"/>\n",
                          x_of(start), kTop + a->second * kLaneHeight + kLaneHeight / 2, x_of(end_it->second),
                          kTop + b->second * kLaneHeight + kLaneHeight / 2);
  }
  // The time axis: about ten ticks at round numbers of milliseconds.
  const int axis_y = kTop + static_cast<int>(lane.size()) * kLaneHeight + 12;
  const double span = to - from;
  const double raw = span / 10, magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / magnitude < 2 ? 2 * magnitude : raw / magnitude < 5 ? 5 * magnitude : 10 * magnitude;
  for (double t = std::ceil(from / step) * step; t <= to; t += step) {
    absl::StrAppendFormat(&svg, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#ccc\"/>\n", x_of(t),
                          x_of(t), kTop, axis_y - 10);
    absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g ms</text>\n", x_of(t), axis_y + 2,
                          std::round(t * 1000) / 1000);
  }
  // The legend.
  double lx = kLabel;
  for (const std::string& c : categories) {
    absl::StrAppendFormat(&svg, "<rect x=\"%.0f\" y=\"28\" width=\"10\" height=\"10\" fill=\"%s\"/>", lx, Colour(c));
    absl::StrAppendFormat(&svg, "<text x=\"%.0f\" y=\"37\">%s</text>\n", lx + 13, Escape(c));
    lx += 20 + 7 * static_cast<double>(c.size());
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace gw::worker
