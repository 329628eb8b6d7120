#include "gradwire/autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/tensor/kernels.h"

namespace gw::autograd {

GradCheckResult GradCheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, double eps, double atol,
                          double rtol) {
  Generator gen(12345);
  Tensor out = fn(inputs);
  const Tensor weights = Tensor::Randn(out.sizes(), gen, out.dtype());
  auto objective = [&](const Tensor& y) { return Sum(Mul(y, weights)); };

  std::vector<Tensor> analytic = Grad({objective(out)}, inputs, {}, false, /*allow_unused=*/true);
  GradCheckResult result;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    GW_CHECK(x.dtype() == DType::kFloat64 && x.is_contiguous(), "GradCheck",
             "inputs must be contiguous float64 tensors");
    double* p = x.data<double>();
    for (int64_t j = 0; j < x.numel(); ++j) {
      double numeric;
      {
        NoGradGuard no_grad;
        const double saved = p[j];
        p[j] = saved + eps;
        const double plus = objective(fn(inputs)).item();
        p[j] = saved - eps;
        const double minus = objective(fn(inputs)).item();
        p[j] = saved;
        numeric = (plus - minus) / (2 * eps);
      }
      const double got = analytic[i].defined()
                             ? kernels::Contiguous(analytic[i]).data<double>()[j]
                             : 0.0;
      const double err = std::abs(got - numeric);
      result.max_abs_error = std::max(result.max_abs_error, err);
      if (!(err <= atol + rtol * std::abs(numeric)) && result.ok) {
        std::ostringstream os;
        os << "input " << i << " element " << j << ": analytic " << got << " vs numeric "
           << numeric;
        result.ok = false;
        result.message = os.str();
      }
    }
  }
  return result;
}

}  // namespace gw::autograd
