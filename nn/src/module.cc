#include "gradwire/nn/module.h"

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/nn/safetensors.h"
#include "gradwire/nn/serialize.h"
#include "gradwire/tensor/kernels.h"

namespace gw::nn {

Tensor Module::Forward(const Tensor&) {
  throw Error(absl::StrCat(type_name_, "::Forward: this module does not take a single tensor"));
}

std::string Module::ToString() const { return absl::StrCat(type_name_, "(", ExtraRepr(), ")"); }

void Module::CheckNewName(const std::string& name) const {
  GW_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name_,
           "invalid member name '", name, "' (must be non-empty and contain no '.')");
  auto taken = [&](const auto& list) {
    for (const auto& [n, _] : list) {
      if (n == name) return true;
    }
    return false;
  };
  GW_CHECK(!taken(parameters_) && !taken(buffers_) && !taken(children_), type_name_,
           "a member named '", name, "' is already registered");
}

Tensor Module::RegisterParameter(const std::string& name, Tensor value, bool requires_grad) {
  CheckNewName(name);
  GW_CHECK(value.defined() && value.is_leaf(), type_name_, "parameter '", name,
           "' must be a defined leaf tensor");
  if (requires_grad) value.set_requires_grad(true);
  parameters_.emplace_back(name, value);
  return value;
}

Tensor Module::RegisterBuffer(const std::string& name, Tensor value) {
  CheckNewName(name);
  buffers_.emplace_back(name, value);
  return value;
}

void Module::RegisterChild(const std::string& name, std::shared_ptr<Module> module) {
  CheckNewName(name);
  GW_CHECK(module != nullptr, type_name_, "submodule '", name, "' is null");
  children_.emplace_back(name, std::move(module));
}

void Module::Collect(const std::string& prefix, bool recurse, Kinds kinds, NamedTensors* out) const {
  if (kinds != Kinds::kBuffers) {
    for (const auto& [name, t] : parameters_) out->emplace_back(prefix + name, t);
  }
  if (kinds != Kinds::kParameters) {
    for (const auto& [name, t] : buffers_) out->emplace_back(prefix + name, t);
  }
  if (!recurse) return;
  for (const auto& [name, child] : children_) {
    child->Collect(absl::StrCat(prefix, name, "."), true, kinds, out);
  }
}

NamedTensors Module::NamedParameters(bool recurse) const {
  NamedTensors all, out;
  Collect("", recurse, Kinds::kParameters, &all);
  absl::flat_hash_set<const TensorImpl*> seen;  // a shared module or tied weight counts once
  for (auto& [name, t] : all) {
    if (seen.insert(t.unsafe_impl()).second) out.emplace_back(std::move(name), std::move(t));
  }
  return out;
}

std::vector<Tensor> Module::Parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [_, t] : NamedParameters(recurse)) out.push_back(t);
  return out;
}

NamedTensors Module::NamedBuffers(bool recurse) const {
  NamedTensors out;
  Collect("", recurse, Kinds::kBuffers, &out);
  return out;
}

int64_t Module::NumParameters() const {
  int64_t n = 0;
  for (const Tensor& t : Parameters()) n += t.numel();
  return n;
}

void Module::Train(bool on) {
  training_ = on;
  for (auto& [_, child] : children_) child->Train(on);
}

void Module::ZeroGrad() {
  for (const Tensor& p : Parameters()) p.set_grad(Tensor());
}

void Module::To(Device device) {
  autograd::NoGradGuard no_grad;
  // Copy everything first, so that an error (no such device) leaves the module as it was.
  std::vector<std::pair<TensorImpl*, Tensor>> moves;
  for (const auto& [name, t] : StateDict()) {
    if (t.device() == device) continue;
    moves.emplace_back(t.unsafe_impl(), kernels::ToDevice(t, device));
    const Tensor grad = t.grad();
    if (grad.defined() && grad.device() != device)
      moves.emplace_back(grad.unsafe_impl(), kernels::ToDevice(grad, device));
  }
  for (auto& [impl, moved] : moves) {
    impl->storage = moved.storage();
    impl->offset = moved.storage_offset();
    impl->strides = moved.strides();
  }
}

Device Module::device() const {
  const NamedTensors state = StateDict();
  return state.empty() ? kCPU : state.front().second.device();
}

NamedTensors Module::StateDict() const {
  // PyTorch's order: each module's parameters, then its buffers, then its children's.
  NamedTensors all, out;
  Collect("", true, Kinds::kBoth, &all);
  absl::flat_hash_set<const TensorImpl*> seen;  // a shared module or tied weight counts once
  for (auto& [name, t] : all) {
    if (seen.insert(t.unsafe_impl()).second) out.emplace_back(std::move(name), std::move(t));
  }
  return out;
}

absl::Status Module::LoadStateDict(const NamedTensors& state, bool strict) {
  absl::flat_hash_map<std::string, const Tensor*> given;
  for (const auto& [name, t] : state) {
    if (!given.emplace(name, &t).second) {
      return absl::InvalidArgumentError(absl::StrCat(type_name_, "::LoadStateDict: entry '", name,
                                                     "' is given twice"));
    }
  }
  NamedTensors mine = StateDict();
  absl::flat_hash_set<std::string> used;
  // Validate everything first so that a failed load changes nothing.
  for (const auto& [name, t] : mine) {
    auto it = given.find(name);
    if (it == given.end()) {
      if (strict) {
        return absl::NotFoundError(absl::StrCat(type_name_, "::LoadStateDict: missing entry '",
                                                name, "'"));
      }
      continue;
    }
    const Tensor& src = *it->second;
    if (!src.defined() || src.sizes() != t.sizes() || src.dtype() != t.dtype()) {
      return absl::InvalidArgumentError(absl::StrCat(
          type_name_, "::LoadStateDict: entry '", name, "' has ",
          src.defined() ? absl::StrCat(DTypeName(src.dtype()), ShapeToString(src.sizes()))
                        : std::string("an undefined tensor"),
          " but the module expects ", DTypeName(t.dtype()), ShapeToString(t.sizes())));
    }
    used.insert(name);
  }
  if (strict && used.size() != given.size()) {
    for (const auto& [name, _] : state) {
      if (!used.contains(name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            type_name_, "::LoadStateDict: unexpected entry '", name, "'"));
      }
    }
  }
  autograd::NoGradGuard no_grad;
  for (const auto& [name, t] : mine) {
    if (used.contains(name)) kernels::CopyInPlace(t, *given[name]);
  }
  return absl::OkStatus();
}

absl::Status Module::Save(const std::string& path) const { return SaveTensors(path, StateDict()); }

absl::Status Module::Load(const std::string& path, bool strict) {
  absl::StatusOr<NamedTensors> state = LoadTensors(path);
  if (!state.ok()) return state.status();
  return LoadStateDict(*state, strict);
}

absl::Status Module::SaveSafetensors(const std::string& path,
                                     const std::map<std::string, std::string>& metadata) const {
  return nn::SaveSafetensors(path, StateDict(), metadata);
}

absl::Status Module::LoadSafetensors(const std::string& path, bool strict) {
  absl::StatusOr<NamedTensors> state = nn::LoadSafetensors(path);
  if (!state.ok()) return state.status();
  return LoadStateDict(*state, strict);
}

}  // namespace gw::nn
