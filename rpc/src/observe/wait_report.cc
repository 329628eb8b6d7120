// WhoWaitsOnWhom (waits.h): the report of a job's waits.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gradwire/rpc/waits.h"
#include "nlohmann/json.hpp"

namespace gw::rpc {
namespace {

std::string Seconds(double s) { return s < 10 ? absl::StrFormat("%.1f s", s) : absl::StrFormat("%.0f s", s); }

class Report {
 public:
  explicit Report(const std::vector<WorkerWaits>& workers) {
    for (const WorkerWaits& w : workers) by_rank_[w.rank] = &w;
  }

  std::string Name(int rank) const {
    auto it = by_rank_.find(rank);
    return it != by_rank_.end() && !it->second->worker.empty() ? it->second->worker : absl::StrCat("rank ", rank);
  }

  std::string Names(const std::vector<int>& ranks) const {
    std::vector<std::string> names;
    for (int r : ranks) names.push_back(Name(r));
    return absl::StrJoin(names, ", ");
  }

  // "worker3 waits on worker1 for allreduce #812 of group 'ddp' (4.2 s; ready: ...)"
  std::string Line(const WorkerWaits& w, const Wait& wait) const {
    std::string line = absl::StrCat(w.worker, " waits on ", wait.on.empty() ? "its own code" : Names(wait.on), " for ",
                                    wait.what, " (", Seconds(wait.seconds));
    if (!wait.ready.empty()) absl::StrAppend(&line, "; done by ", Names(wait.ready));
    if (!wait.note.empty()) absl::StrAppend(&line, "; ", wait.note);
    return line + ")";
  }

  // What a worker is doing; `blamed`: others wait on it (it is at the root of waits).
  std::string Root(int rank, bool blamed = true) const {
    auto it = by_rank_.find(rank);
    if (it == by_rank_.end()) return absl::StrCat("  ", Name(rank), " was not asked (not a member of the job now)\n");
    const WorkerWaits& w = *it->second;
    if (!w.answered) {
      return absl::StrCat("  ", w.worker, " did not answer (", w.error.empty() ? "no reply" : w.error,
                          "): it is frozen (stopped, or stuck where its I/O thread cannot run), or it is gone\n");
    }
    std::string out;
    std::vector<const Wait*> runs, last, own;
    for (const Wait& x : w.waits) {
      if (x.state == "runs") runs.push_back(&x);
      if (x.state == "last") last.push_back(&x);
      if (x.state == "waits" && x.on.empty()) own.push_back(&x);
    }
    if (blamed && runs.empty() && own.empty()) {
      absl::StrAppend(&out, "  ", w.worker,
                      " waits on no one and runs no handler: the wait is in its own code "
                      "(a trainer's loop, or a thread outside gradwire)\n");
    }
    for (const Wait* x : own)
      absl::StrAppend(&out, "  ", w.worker, " waits for ", x->what, " (", Seconds(x->seconds), ")\n");
    for (const Wait* x : runs) {
      absl::StrAppend(&out, "  ", w.worker, " runs ", x->what, " for ", Seconds(x->seconds),
                      x->note.empty() ? "" : absl::StrCat(" (", x->note, ")"), "\n");
    }
    for (const Wait* x : last) {
      absl::StrAppend(&out, "  ", w.worker, "'s last: ", x->what,
                      x->seconds >= 0 ? absl::StrCat(", ", Seconds(x->seconds), " ago") : "",
                      x->note.empty() ? "" : absl::StrCat(" (", x->note, ")"), "\n");
    }
    return out;
  }

 private:
  std::map<int, const WorkerWaits*> by_rank_;
};

}  // namespace

std::string WhoWaitsOnWhom(const std::vector<WorkerWaits>& workers) {
  Report report(workers);
  // Edges: a worker's waits on others, oldest first.
  struct Edge {
    const WorkerWaits* from;
    const Wait* wait;
  };
  std::vector<Edge> edges;
  std::map<int, std::vector<int>> out;  // rank -> ranks it waits on
  std::set<int> answered;
  for (const WorkerWaits& w : workers) {
    if (w.answered) answered.insert(w.rank);
    for (const Wait& x : w.waits) {
      if (x.state != "waits" || x.on.empty()) continue;
      edges.push_back({&w, &x});
      for (int r : x.on) {
        if (r != w.rank) out[w.rank].push_back(r);
      }
    }
  }
  std::stable_sort(edges.begin(), edges.end(), [](const Edge& a, const Edge& b) {
    if (a.wait->seconds != b.wait->seconds) return a.wait->seconds > b.wait->seconds;
    return a.from->rank < b.from->rank;
  });
  std::string text = absl::StrCat(workers.size(), " workers, ", answered.size(), " answered.\n");
  std::vector<std::string> silent;
  for (const WorkerWaits& w : workers) {
    if (!w.answered) silent.push_back(absl::StrCat(w.worker, " (", w.error, ")"));
  }
  if (!silent.empty()) absl::StrAppend(&text, "Did not answer: ", absl::StrJoin(silent, "; "), ".\n");
  if (edges.empty()) {
    absl::StrAppend(&text, "No worker waits on another.\n");
    for (const WorkerWaits& w : workers) {
      if (w.answered) absl::StrAppend(&text, report.Root(w.rank, /*blamed=*/false));
    }
    return text;
  }
  // Roots: workers that others wait on and that wait on no one (or did not answer).
  std::set<int> roots;
  for (const Edge& e : edges) {
    for (int r : e.wait->on) {
      if (r != e.from->rank && (!out.contains(r) || !answered.contains(r))) roots.insert(r);
    }
  }
  // Follows a worker's waits to the roots it leads to (the path, for chains).
  auto path_to_root = [&](int start) {
    std::vector<int> path = {start};
    std::set<int> seen = {start};
    int at = start;
    while (out.contains(at) && answered.contains(at)) {
      const int next = out.at(at).front();
      if (seen.contains(next)) {
        path.push_back(next);
        break;  // a cycle
      }
      path.push_back(next);
      seen.insert(next);
      at = next;
    }
    return path;
  };
  absl::StrAppend(&text, "\nWho waits on whom (longest first):\n");
  for (const Edge& e : edges) absl::StrAppend(&text, "  ", report.Line(*e.from, *e.wait), "\n");
  if (roots.empty()) {
    const std::vector<int> cycle = path_to_root(edges.front().from->rank);
    std::vector<std::string> names;
    for (int r : cycle) names.push_back(report.Name(r));
    absl::StrAppend(&text, "\nNo root: the waits form a cycle (a deadlock): ", absl::StrJoin(names, " -> "), "\n");
    return text;
  }
  for (int root : roots) {
    std::set<int> waiting;
    for (const Edge& e : edges) {
      const std::vector<int> path = path_to_root(e.from->rank);
      if (path.back() == root) waiting.insert(e.from->rank);
    }
    std::vector<int> ranks(waiting.begin(), waiting.end());
    absl::StrAppend(&text, "\nAt the root: ", report.Name(root), " (", ranks.size(),
                    ranks.size() == 1 ? " worker waits" : " workers wait", " on it: ", report.Names(ranks), ")\n",
                    report.Root(root));
  }
  return text;
}

std::string WaitsToJson(const WorkerWaits& worker) {
  nlohmann::json waits = nlohmann::json::array();
  for (const Wait& w : worker.waits) {
    waits.push_back({{"layer", w.layer},
                     {"state", w.state},
                     {"what", w.what},
                     {"on", w.on},
                     {"ready", w.ready},
                     {"seconds", w.seconds},
                     {"note", w.note}});
  }
  nlohmann::json j = {{"worker", worker.worker}, {"rank", worker.rank}, {"waits", std::move(waits)}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

absl::StatusOr<WorkerWaits> WaitsFromJson(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("the waits are not a JSON object");
  try {
    WorkerWaits out;
    out.worker = j.at("worker").get<std::string>();
    out.rank = j.at("rank").get<int>();
    out.answered = true;
    for (const nlohmann::json& w : j.at("waits")) {
      out.waits.push_back({.layer = w.at("layer").get<std::string>(),
                           .state = w.at("state").get<std::string>(),
                           .what = w.at("what").get<std::string>(),
                           .on = w.at("on").get<std::vector<int>>(),
                           .ready = w.at("ready").get<std::vector<int>>(),
                           .seconds = w.at("seconds").get<double>(),
                           .note = w.at("note").get<std::string>()});
    }
    return out;
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("the waits are not as /waits writes them: ", e.what()));
  }
}

}  // namespace gw::rpc
