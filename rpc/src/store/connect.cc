// ConnectStore (store.h): an etcd cluster for "etcd://HOST:PORT/JOB" addresses
// (etcd_store.h), else the built-in store rank 0 hosts (builtin_store.h).
#include <memory>
#include <string>
#include <utility>

#include "gradwire/rpc/store.h"
#include "store/builtin_store.h"
#include "store/etcd_store.h"

namespace gw::rpc {

absl::StatusOr<std::unique_ptr<Store>> ConnectStore(const std::string& address, absl::Time deadline,
                                                    const Security& security) {
  if (!internal::IsEtcdUrl(address)) return internal::ConnectBuiltinStore(address, deadline, security);
  absl::StatusOr<std::unique_ptr<internal::EtcdStore>> etcd =
      internal::ConnectEtcdStore(address, deadline, security.tls);
  if (!etcd.ok()) return etcd.status();
  return std::unique_ptr<Store>(*std::move(etcd));
}

}  // namespace gw::rpc
