#include "wire/codec.h"

#include "absl/strings/str_cat.h"
#include "gradwire/proto/rpc.pb.h"
#include "gradwire/rpc/internal/rref_state.h"
#include "gradwire/tensor/error.h"
#include "gradwire/tensor/kernels.h"

#include <algorithm>
#include <optional>

namespace gw::rpc::internal {
namespace {

namespace pb = ::gradwire::proto;
constexpr int kMaxDepth = 64;

absl::Status ToProto(const Value& v, std::vector<Tensor>* tensors, pb::Value* out, int depth) {
  if (depth > kMaxDepth) return absl::InvalidArgumentError("value nested more than 64 levels deep");
  struct Visitor {
    std::vector<Tensor>* tensors;
    pb::Value* out;
    int depth;
    absl::Status operator()(std::monostate) {
      out->set_none(true);
      return absl::OkStatus();
    }
    absl::Status operator()(int64_t x) {
      out->set_int_value(x);
      return absl::OkStatus();
    }
    absl::Status operator()(double x) {
      out->set_double_value(x);
      return absl::OkStatus();
    }
    absl::Status operator()(bool x) {
      out->set_bool_value(x);
      return absl::OkStatus();
    }
    absl::Status operator()(const std::string& x) {
      out->set_string_value(x);
      return absl::OkStatus();
    }
    absl::Status operator()(const Tensor& t) {
      if (!t.defined()) return absl::InvalidArgumentError("cannot send an undefined tensor");
      out->set_tensor(static_cast<uint32_t>(tensors->size()));
      tensors->push_back(t);
      return absl::OkStatus();
    }
    absl::Status operator()(const ValueList& l) {
      auto* list = out->mutable_list();
      for (const Value& e : l) {
        if (absl::Status s = ToProto(e, tensors, list->add_items(), depth + 1); !s.ok()) return s;
      }
      return absl::OkStatus();
    }
    absl::Status operator()(const RRefPtr& r) {
      if (!r || r->attached()) {
        return absl::InternalError("an RRef must be turned into a fork before it is encoded");
      }
      const RRefDescriptor& d = r->descriptor();
      pb::RRef* out_ref = out->mutable_rref();
      out_ref->set_rref_id(d.rref_id.bits());
      out_ref->set_fork_id(d.fork_id.bits());
      out_ref->set_owner(d.owner);
      out_ref->set_parent(d.parent);
      out_ref->set_parent_fork(d.parent_fork.bits());
      out_ref->set_type(d.type);
      return absl::OkStatus();
    }
    absl::Status operator()(const Object& o) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot send an object of type ", o.type,
                       ": objects stay on the worker that made them; send an RRef to it (Agent::Own / Agent::Remote)"));
    }
    absl::Status operator()(const ValueMap& m) {
      auto* map = out->mutable_map()->mutable_entries();
      for (const auto& [k, e] : m) {
        if (absl::Status s = ToProto(e, tensors, &(*map)[k], depth + 1); !s.ok()) return s;
      }
      return absl::OkStatus();
    }
  };
  return std::visit(Visitor{tensors, out, depth}, v.storage());
}

absl::StatusOr<Value> FromProto(const pb::Value& v, const std::vector<Tensor>& tensors, int depth, bool* has_rrefs) {
  if (depth > kMaxDepth) return absl::InvalidArgumentError("value nested more than 64 levels deep");
  switch (v.kind_case()) {
    case pb::Value::kNone:
    case pb::Value::KIND_NOT_SET:
      return Value();
    case pb::Value::kIntValue:
      return Value(v.int_value());
    case pb::Value::kDoubleValue:
      return Value(v.double_value());
    case pb::Value::kBoolValue:
      return Value(v.bool_value());
    case pb::Value::kStringValue:
      return Value(v.string_value());
    case pb::Value::kTensor:
      if (v.tensor() >= tensors.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("value refers to tensor ", v.tensor(), " but the frame carries ", tensors.size()));
      }
      return Value(tensors[v.tensor()]);
    case pb::Value::kList: {
      ValueList out;
      out.reserve(static_cast<size_t>(v.list().items_size()));
      for (const auto& e : v.list().items()) {
        absl::StatusOr<Value> x = FromProto(e, tensors, depth + 1, has_rrefs);
        if (!x.ok()) return x.status();
        out.push_back(std::move(*x));
      }
      return Value(std::move(out));
    }
    case pb::Value::kRref: {
      const pb::RRef& r = v.rref();
      // Ids are checked here; whether they fit together is AdoptIncoming's business.
      auto id = [](uint64_t bits, bool may_be_null) -> std::optional<GlobalId> {
        if (bits == 0) return may_be_null ? std::optional<GlobalId>(GlobalId()) : std::nullopt;
        return GlobalId::FromBits(bits);
      };
      std::optional<GlobalId> rref = id(r.rref_id(), false), fork = id(r.fork_id(), true),
                              parent_fork = id(r.parent_fork(), true);
      if (!rref || !fork || !parent_fork || r.owner() < 0 || r.parent() < 0) {
        return absl::InvalidArgumentError("malformed RRef (bad id or negative rank)");
      }
      *has_rrefs = true;
      return Value(
          std::make_shared<RRefState>(RRefDescriptor{*rref, *fork, r.owner(), r.parent(), *parent_fork, r.type()}));
    }
    case pb::Value::kMap: {
      ValueMap out;
      for (const auto& [k, e] : v.map().entries()) {
        absl::StatusOr<Value> x = FromProto(e, tensors, depth + 1, has_rrefs);
        if (!x.ok()) return x.status();
        out.emplace(k, std::move(*x));
      }
      return Value(std::move(out));
    }
  }
  return absl::InvalidArgumentError("unknown value kind");
}

// The wire's form of a device (rpc.proto, Envelope.devices).
int32_t DeviceTag(Device d) { return d.is_cuda() ? d.index : -1; }

// Stages the frame's GPU tensors through host memory and says where each arrives (a
// request) or was (a response). Nothing is added for a frame of CPU tensors going to CPUs.
absl::Status PlaceOutgoing(Kind kind, const DeviceMap* map, std::vector<Tensor>& tensors, pb::Envelope& env) {
  auto named = [&](const Tensor& t) {
    return kind == Kind::kRequest ? (map != nullptr ? map->Forward(t.device()) : kCPU) : t.device();
  };
  if (std::all_of(tensors.begin(), tensors.end(),
                  [&](const Tensor& t) { return t.device().is_cpu() && named(t).is_cpu(); })) {
    return absl::OkStatus();
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    env.add_devices(DeviceTag(named(tensors[i])));
    if (tensors[i].device().is_cpu()) continue;
    try {
      tensors[i] = kernels::ToDevice(tensors[i], kCPU);
    } catch (const Error& e) {
      return absl::InternalError(absl::StrCat("cannot stage tensor ", i, " (on ", tensors[i].device().ToString(),
                                              ") through host memory: ", e.what()));
    }
  }
  return absl::OkStatus();
}

// Moves each received tensor to its device (see PlaceOutgoing).
absl::Status PlaceIncoming(Kind kind, const pb::Envelope& env, Placement placement, std::vector<Tensor>& tensors) {
  if (env.devices_size() == 0) return absl::OkStatus();
  if (static_cast<size_t>(env.devices_size()) != tensors.size()) {
    return absl::DataLossError(
        absl::StrCat("the frame names the devices of ", env.devices_size(), " tensors but carries ", tensors.size()));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int32_t tag = env.devices(static_cast<int>(i));
    if (tag < -1 || tag > INT16_MAX) {
      return absl::DataLossError(absl::StrCat("tensor ", i, " of the frame names no device (", tag, ")"));
    }
    const Device named = tag < 0 ? kCPU : Cuda(static_cast<int16_t>(tag));
    Device arrival = named;
    if (kind != Kind::kRequest) arrival = placement.map != nullptr ? placement.map->Inverse(named) : kCPU;
    if (arrival.is_cpu()) continue;
    if (arrival.index >= placement.gpus) {
      return absl::DataLossError(absl::StrCat("the frame puts tensor ", i, " on ", arrival.ToString(),
                                              ", but this worker has ", placement.gpus,
                                              placement.gpus == 1 ? " GPU" : " GPUs"));
    }
    try {
      tensors[i] = kernels::ToDevice(tensors[i], arrival);
    } catch (const Error& e) {
      return absl::InternalError(absl::StrCat("cannot place tensor ", i, " on ", arrival.ToString(), ": ", e.what()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

Envelope ReplyEnvelope(uint64_t id, const absl::StatusOr<Value>& result) {
  Envelope e;
  e.kind = Kind::kResponse;
  e.id = id;
  if (result.ok()) {
    e.payload = *result;
  } else {
    e.status = result.status();
  }
  return e;
}

absl::StatusOr<Message> EncodeEnvelope(const Envelope& e, const DeviceMap* map) {
  pb::Envelope env;
  env.set_id(e.id);
  env.set_kind(static_cast<pb::Envelope::Kind>(e.kind));
  env.set_function(e.function);
  env.set_timeout_ms(e.timeout_ms);
  env.set_status_code(static_cast<int32_t>(e.status.code()));
  env.set_status_message(std::string(e.status.message()));
  Message m;
  if (absl::Status s = ToProto(e.payload, &m.tensors, env.mutable_payload(), 0); !s.ok()) return s;
  if (!e.meta.is<std::monostate>()) {
    if (absl::Status s = ToProto(e.meta, &m.tensors, env.mutable_meta(), 0); !s.ok()) return s;
  }
  if (absl::Status s = PlaceOutgoing(e.kind, map, m.tensors, env); !s.ok()) return s;
  if (!env.SerializeToString(&m.header)) return absl::InternalError("cannot serialize envelope");
  return m;
}

absl::StatusOr<Envelope> DecodeEnvelope(Message m, Placement placement) {
  pb::Envelope env;
  if (!env.ParseFromString(m.header)) return absl::DataLossError("envelope is not a valid protobuf");
  Envelope e;
  e.id = env.id();
  switch (env.kind()) {
    case pb::Envelope::REQUEST:
      e.kind = Kind::kRequest;
      break;
    case pb::Envelope::RESPONSE:
      e.kind = Kind::kResponse;
      break;
    case pb::Envelope::HELLO:
      e.kind = Kind::kHello;
      break;
    case pb::Envelope::PING:
      e.kind = Kind::kPing;
      break;
    case pb::Envelope::PONG:
      e.kind = Kind::kPong;
      break;
    default:
      return absl::DataLossError(absl::StrCat("unknown envelope kind ", env.kind()));
  }
  e.function = env.function();
  e.timeout_ms = env.timeout_ms();
  const int code = env.status_code();
  if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::DataLossError(absl::StrCat("unknown status code ", code));
  }
  e.status = absl::Status(static_cast<absl::StatusCode>(code), env.status_message());
  if (absl::Status s = PlaceIncoming(e.kind, env, placement, m.tensors); !s.ok()) return s;
  absl::StatusOr<Value> payload = FromProto(env.payload(), m.tensors, 0, &e.has_rrefs);
  if (!payload.ok()) return absl::DataLossError(payload.status().message());
  e.payload = std::move(*payload);
  if (env.has_meta()) {
    bool meta_rrefs = false;
    absl::StatusOr<Value> meta = FromProto(env.meta(), m.tensors, 0, &meta_rrefs);
    if (!meta.ok()) return absl::DataLossError(meta.status().message());
    if (meta_rrefs) return absl::DataLossError("envelope meta carries an RRef");
    e.meta = std::move(*meta);
  }
  return e;
}

}  // namespace gw::rpc::internal
