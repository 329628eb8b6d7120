#include "algorithms.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "gradwire/tensor/kernels.h"

namespace gw::collectives::internal {
namespace {

// Step numbers: a ring step's pieces are step * kPieces + piece.
constexpr int64_t kPieces = int64_t{1} << 32;
constexpr int64_t kResultStep = int64_t{1} << 40;

char* Bytes(const Tensor& t) { return static_cast<char*>(t.raw_data()); }

struct Range {
  int64_t begin;
  int64_t length;
};

// The tensor of n elements in `parts` chunks (the first n % parts one element longer),
// each cut in pieces of at most `piece` elements (at least one piece, maybe empty, so
// every step carries a message and the members' signatures meet).
class Chunks {
 public:
  Chunks(int64_t n, int parts, int64_t piece) : n_(n), parts_(parts), piece_(std::max<int64_t>(1, piece)) {}
  Range chunk(int c) const {
    const int64_t b = n_ * c / parts_;
    return {b, n_ * (c + 1) / parts_ - b};
  }
  int64_t pieces(int c) const { return std::max<int64_t>(1, (chunk(c).length + piece_ - 1) / piece_); }
  Range piece(int c, int64_t j) const {
    const Range r = chunk(c);
    const int64_t b = std::min(r.length, j * piece_);
    return {r.begin + b, std::min(piece_, r.length - b)};
  }

 private:
  int64_t n_;
  int parts_;
  int64_t piece_;
};

Tensor Slice(const Tensor& flat, Range r) { return kernels::Narrow(flat, 0, r.begin, r.length); }

}  // namespace

absl::Status AllReduceRecursiveDoubling(Op& op, const Tensor& flat, ReduceOp reduce) {
  const int n = op.size();
  const int r = op.rank();
  if (n == 1) return absl::OkStatus();
  const int64_t numel = flat.numel();
  const DType dtype = flat.dtype();
  int p = 1;
  while (p * 2 <= n) p *= 2;
  if (r >= p) {  // folded in: hand over, get the result
    op.Send(r - p, 0, flat);
    absl::StatusOr<Tensor> result = op.Recv(r - p, kResultStep, numel);  // r - p has used `flat`
    if (!result.ok()) return result.status();
    if (numel > 0) std::memcpy(Bytes(flat), Bytes(*result), flat.nbytes());
    return absl::OkStatus();
  }
  // What is sent is never written again (a copy of `flat`, then fresh sums), so the
  // caller's tensor is free as soon as the result is in: no need to wait for answers.
  Tensor cur = kernels::Clone(flat);
  // The lower rank's operand first on both partners: max/min of NaN or of +0 and -0
  // depend on the order, and both must get the same bits.
  auto combine = [&](const Tensor& theirs, int partner) {
    Tensor next = Tensor::Empty({numel}, dtype);
    const Tensor& a = partner < r ? theirs : cur;
    const Tensor& b = partner < r ? cur : theirs;
    Reduce(next.raw_data(), a.raw_data(), b.raw_data(), static_cast<size_t>(numel), dtype, reduce);
    cur = next;
  };
  if (r < n - p) {
    absl::StatusOr<Tensor> extra = op.Recv(r + p, 0, numel);
    if (!extra.ok()) return extra.status();
    combine(*extra, r + p);
  }
  int64_t step = 1;
  for (int k = 1; k < p; k <<= 1, ++step) {
    const int partner = r ^ k;
    op.Send(partner, step, cur);
    absl::StatusOr<Tensor> theirs = op.Recv(partner, step, numel);
    if (!theirs.ok()) return theirs.status();
    combine(*theirs, partner);
  }
  if (reduce == ReduceOp::kAvg) ScaleForAverage(cur.raw_data(), static_cast<size_t>(numel), dtype, n);
  if (r < n - p) op.Send(r + p, kResultStep, cur);
  if (numel > 0) std::memcpy(Bytes(flat), Bytes(cur), flat.nbytes());
  return absl::OkStatus();
}

absl::Status AllReduceRing(Op& op, const Tensor& flat, ReduceOp reduce) {
  const int n = op.size();
  const int r = op.rank();
  if (n == 1) return absl::OkStatus();
  const DType dtype = flat.dtype();
  const size_t esize = ElementSize(dtype);
  const Chunks chunks(flat.numel(), n, static_cast<int64_t>(op.options().piece_bytes / esize));
  const int next = (r + 1) % n;
  const int prev = (r + n - 1) % n;
  auto at = [&](Range x) { return Bytes(flat) + x.begin * static_cast<int64_t>(esize); };
  // Reduce-scatter. Step s: chunk r - s goes to `next`, chunk r - s - 1 comes from `prev`.
  for (int64_t j = 0; j < chunks.pieces(r); ++j) op.Send(next, j, Slice(flat, chunks.piece(r, j)));
  for (int s = 0; s < n - 1; ++s) {
    const int c = (r - s - 1 + 2 * n) % n;
    for (int64_t j = 0; j < chunks.pieces(c); ++j) {
      const Range x = chunks.piece(c, j);
      absl::StatusOr<Tensor> in = op.Recv(prev, s * kPieces + j, x.length);
      if (!in.ok()) return in.status();
      ReduceInto(at(x), in->raw_data(), static_cast<size_t>(x.length), dtype, reduce);
      if (s == n - 2 && reduce == ReduceOp::kAvg) ScaleForAverage(at(x), static_cast<size_t>(x.length), dtype, n);
      // Forwarded at once: the next reduce-scatter step, or after the last one (the piece
      // is complete) the first allgather step.
      op.Send(next, (s + 1) * kPieces + j, Slice(flat, x));
    }
  }
  // Allgather. Step n - 1 + s: chunk r - s comes from `prev` (complete there) and goes on.
  for (int s = 0; s < n - 1; ++s) {
    const int c = (r - s + n) % n;
    const int64_t step = n - 1 + s;
    for (int64_t j = 0; j < chunks.pieces(c); ++j) {
      const Range x = chunks.piece(c, j);
      absl::StatusOr<Tensor> in = op.Recv(prev, step * kPieces + j, x.length);
      if (!in.ok()) return in.status();
      if (x.length > 0) std::memcpy(at(x), in->raw_data(), static_cast<size_t>(x.length) * esize);
      if (s < n - 2) op.Send(next, (step + 1) * kPieces + j, Slice(flat, x));
    }
  }
  return absl::OkStatus();
}

absl::Status BroadcastTree(Op& op, const Tensor& flat, int root) {
  const int n = op.size();
  const int vr = (op.rank() - root + n) % n;
  auto real = [&](int v) { return (v + root) % n; };
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      absl::StatusOr<Tensor> in = op.Recv(real(vr - mask), 0, flat.numel());
      if (!in.ok()) return in.status();
      if (flat.numel() > 0) std::memcpy(Bytes(flat), Bytes(*in), flat.nbytes());
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n) op.Send(real(vr + mask), 0, flat);
  }
  return absl::OkStatus();
}

absl::Status AllGatherDirect(Op& op, const Tensor& flat, std::vector<Tensor>* out) {
  const int n = op.size();
  const int r = op.rank();
  out->assign(static_cast<size_t>(n), Tensor());
  for (int p = 0; p < n; ++p) {
    if (p != r) op.Send(p, 0, flat);
  }
  (*out)[static_cast<size_t>(r)] = kernels::Clone(flat);
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    absl::StatusOr<Tensor> in = op.Recv(p, 0, flat.numel());
    if (!in.ok()) return in.status();
    (*out)[static_cast<size_t>(p)] = *std::move(in);
  }
  return absl::OkStatus();
}

absl::Status AllGatherRing(Op& op, const Tensor& flat, std::vector<Tensor>* out) {
  const int n = op.size();
  const int r = op.rank();
  out->assign(static_cast<size_t>(n), Tensor());
  (*out)[static_cast<size_t>(r)] = kernels::Clone(flat);
  const int next = (r + 1) % n;
  const int prev = (r + n - 1) % n;
  for (int s = 0; s < n - 1; ++s) {
    op.Send(next, s, (*out)[static_cast<size_t>((r - s + n) % n)]);
    absl::StatusOr<Tensor> in = op.Recv(prev, s, flat.numel());
    if (!in.ok()) return in.status();
    (*out)[static_cast<size_t>((r - s - 1 + n) % n)] = *std::move(in);
  }
  return absl::OkStatus();
}

absl::Status ReduceScatterRing(Op& op, const std::vector<Tensor>& inputs, ReduceOp reduce, Tensor* out) {
  const int n = op.size();
  const int r = op.rank();
  const int next = (r + 1) % n;
  const int prev = (r + n - 1) % n;
  Tensor acc = n == 1 ? kernels::Clone(inputs[0]) : Tensor();
  // Step s: the partial sum of block r - s - 1 goes to `next`; block r - s - 2 comes in.
  if (n > 1) op.Send(next, 0, inputs[static_cast<size_t>((r + n - 1) % n)]);
  for (int s = 0; s < n - 1; ++s) {
    const auto b = static_cast<size_t>((r - s - 2 + 2 * n) % n);
    const Tensor& mine = inputs[b];
    absl::StatusOr<Tensor> in = op.Recv(prev, s, mine.numel());
    if (!in.ok()) return in.status();
    acc = Tensor::Empty({mine.numel()}, mine.dtype());
    Reduce(acc.raw_data(), mine.raw_data(), in->raw_data(), static_cast<size_t>(mine.numel()), mine.dtype(), reduce);
    if (s < n - 2) op.Send(next, s + 1, acc);
  }
  if (reduce == ReduceOp::kAvg) ScaleForAverage(acc.raw_data(), static_cast<size_t>(acc.numel()), acc.dtype(), n);
  *out = acc;
  return absl::OkStatus();
}

absl::Status AllToAllDirect(Op& op, const std::vector<Tensor>& inputs, std::vector<Tensor>* out) {
  const int n = op.size();
  const int r = op.rank();
  out->assign(static_cast<size_t>(n), Tensor());
  for (int p = 0; p < n; ++p) {
    if (p != r) op.Send(p, 0, inputs[static_cast<size_t>(p)]);
  }
  (*out)[static_cast<size_t>(r)] = kernels::Clone(inputs[static_cast<size_t>(r)]);
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    absl::StatusOr<Tensor> in = op.Recv(p, 0, /*numel=*/-1);
    if (!in.ok()) return in.status();
    (*out)[static_cast<size_t>(p)] = *std::move(in);
  }
  return absl::OkStatus();
}

absl::Status BarrierDissemination(Op& op) {
  const int n = op.size();
  const int r = op.rank();
  int64_t round = 0;
  for (int k = 1; k < n; k <<= 1, ++round) {
    op.Send((r + k) % n, round, Tensor::Empty({0}, DType::kInt64));
    absl::StatusOr<Tensor> in = op.Recv((r - k + n) % n, round, 0);
    if (!in.ok()) return in.status();
  }
  return absl::OkStatus();
}

}  // namespace gw::collectives::internal
