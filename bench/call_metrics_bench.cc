// bench_call_metrics: what the always-on call records (rpc/src/observe/call_metrics.h)
// cost per call, without the network: one call's records on both sides, as the agent
// makes them (the client: its series found, two clock reads, the bytes, the result; the
// server: the same for the request), in a loop on one thread, then on two threads at
// once (a caller and an I/O thread of one process recording into the same series).
// Then what the waits' record of each running handler costs per request (the callee's
// thread entering and leaving its slot, observe/handler_slots.h), and what a traced call adds (rpc/trace.h,
// GRADWIRE_TRACE): its three spans, recorded as the agent records them, into a tracer writing a temporary directory.
// Prints harness lines (bench/run): ns per call.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gradwire/rpc/frame.h"
#include "gradwire/rpc/trace.h"
#include "observe/call_metrics.h"
#include "observe/handler_slots.h"

namespace {

using gw::rpc::internal::CallMetrics;
using Clock = std::chrono::steady_clock;

// One call's records on both sides, as agent.cc, call_table.cc and dispatcher.cc make them.
void RecordOneCall(CallMetrics& metrics, const gw::rpc::Message& request, const gw::rpc::Message& reply) {
  CallMetrics::Series& client = metrics.For(CallMetrics::Side::kClient, 1, "train_step");
  const auto sent_at = Clock::now();
  client.Sent(gw::rpc::internal::MessageBytes(request));
  CallMetrics::Series& server = metrics.For(CallMetrics::Side::kServer, 0, "train_step");
  server.Received(gw::rpc::internal::MessageBytes(request));
  const auto arrived = Clock::now();
  server.Sent(gw::rpc::internal::MessageBytes(reply));
  server.Record(std::chrono::duration<double>(Clock::now() - arrived).count(), true);
  client.Received(gw::rpc::internal::MessageBytes(reply));
  client.Record(std::chrono::duration<double>(Clock::now() - sent_at).count(), true);
}

double NsPerCall(int threads, int64_t calls) {
  CallMetrics metrics;
  gw::rpc::Message request{std::string(64, 'h'), {}}, reply{std::string(32, 'r'), {}};
  for (int i = 0; i < 16; ++i) metrics.For(CallMetrics::Side::kClient, i, absl::StrCat("f", i));  // a fuller table
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  const auto start = Clock::now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      while (!go.load()) {
      }
      for (int64_t i = 0; i < calls; ++i) RecordOneCall(metrics, request, reply);
    });
  }
  go.store(true);
  for (std::thread& t : pool) t.join();
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
  return ns / static_cast<double>(calls);  // per call of one thread: the wall time each call adds
}

// One traced call's spans, as agent.cc (the send: the function's name interned and the
// context taken once, shared with the call table), dispatcher.cc (the handler, its name
// interned when registered) and call_table.cc (the completion) record them: six clock
// reads.
void TraceOneCall(gw::rpc::Tracer& tracer, uint64_t id, const std::string& function) {
  using gw::rpc::Tracer;
  static const Tracer::Name send = tracer.Intern("rpc.send"), handler = tracer.Intern("rpc.handler"),
                            reply = tracer.Intern("rpc.reply"), peer = tracer.Intern("peer"),
                            registered = tracer.Intern(function);
  auto slice = [&](Tracer::Name category, Tracer::Name name, int64_t begin, uint64_t context, uint64_t flow_in,
                   uint64_t flow_out, int64_t peer_rank) {
    tracer.Record({.category = category,
                   .name = name,
                   .begin_us = begin,
                   .end_us = tracer.Now(),
                   .flow_in = flow_in,
                   .flow_out = flow_out,
                   .arg_names = {peer, 0},
                   .arg_values = {peer_rank, 0},
                   .context = context});
  };
  const int64_t sent = tracer.Now();
  const Tracer::Name name = tracer.Intern(function);
  const uint64_t context = tracer.CurrentContext();
  slice(send, name, sent, context, 0, Tracer::CallFlow(0, id), 1);
  slice(handler, registered, tracer.Now(), context, Tracer::CallFlow(0, id), Tracer::ReplyFlow(0, id), 0);
  slice(reply, name, tracer.Now(), context, Tracer::ReplyFlow(0, id), 0, 1);
}

double HandlerSlotNsPerRequest(int64_t requests) {
  gw::rpc::internal::HandlerSlots slots;
  const std::string function = "train_step";
  const auto start = Clock::now();
  for (int64_t i = 0; i < requests; ++i) gw::rpc::internal::HandlerSlots::Running running(slots, function, 1);
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / static_cast<double>(requests);
}

double TracedNsPerCall(int64_t calls) {
  char dir[] = "/tmp/gw-trace-bench-XXXXXX";
  if (::mkdtemp(dir) == nullptr) return 0;
  auto tracer = gw::rpc::Tracer::Open(dir, "worker0", 0);
  const std::string function = "train_step";
  const auto start = Clock::now();
  for (int64_t i = 0; i < calls; ++i) TraceOneCall(*tracer, static_cast<uint64_t>(i), function);
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
  (void)tracer->Close();
  std::filesystem::remove_all(dir);
  return ns / static_cast<double>(calls);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int64_t calls = quick ? 200000 : 2000000;
  NsPerCall(1, calls / 10);  // warm-up
  std::printf("workload=call_metrics impl=gradwire metric=records_ns_per_call value=%.1f unit=ns\n",
              NsPerCall(1, calls));
  std::printf("workload=call_metrics impl=gradwire metric=records_ns_per_call_two_threads value=%.1f unit=ns\n",
              NsPerCall(2, calls));
  std::printf("workload=call_metrics impl=gradwire metric=handler_slot_ns_per_request value=%.1f unit=ns\n",
              HandlerSlotNsPerRequest(calls));
  std::printf("workload=call_metrics impl=gradwire metric=trace_ns_per_call value=%.1f unit=ns\n",
              TracedNsPerCall(calls / 4));
  return 0;
}
