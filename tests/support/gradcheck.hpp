// tests/support/gradcheck.hpp — F64 central-difference gradient checks.
//
// The one idea: every analytic gradient element is compared with
//   numeric = (f(x + h e_j) - f(x - h e_j)) / 2h
// where each f is a fresh forward pass on its own fresh Tape, so the check sees
// exactly what a user's training step would compute (and dropout draws the same mask
// in every pass: a fresh tape's generator starts from the same state). An element
// passes when |analytic - numeric| <= atol + rtol * max(|analytic|, |numeric|); the
// result names the worst element, so a failing check says where to look.
//
// Usage (inputs must be F64; non-floating data such as labels is captured instead):
//
//   using namespace trainmem;
//   auto r = testing::check_gradients(
//       [&](Tape<cpu::Backend>& tape, const std::vector<Var<cpu::Backend>>& in) {
//         return testing::weighted_sum(tape, matmul(in[0], in[1]));
//       },
//       {testing::random_tensor({3, 4}, 1), testing::random_tensor({4, 5}, 2)});
//   INFO(r.report());
//   CHECK(r.ok);
//
// check_parameter_gradients does the same for existing parameters (leaves on no tape,
// e.g. a module's weights): it perturbs them in place and restores them afterwards.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "test_data.hpp"
#include "trainmem/trainmem.hpp"

namespace trainmem::testing {

struct GradCheckOptions {
  double step = 1e-6;  // h
  double rtol = 1e-5;
  double atol = 1e-6;
};

struct GradCheckResult {
  bool ok = true;
  std::size_t checked = 0;   // gradient elements compared
  std::size_t failures = 0;  // elements outside tolerance
  /// max over elements of |analytic - numeric| / (atol + rtol * max(|analytic|, |numeric|)); <= 1 passes.
  double worst_excess = 0.0;
  std::string worst;  // where the worst element is and its two values

  std::string report() const {
    std::ostringstream out;
    out << "gradcheck: " << (ok ? "ok" : "MISMATCH") << ", " << failures << " of " << checked
        << " elements outside tolerance; worst (error/tolerance = " << worst_excess << "): " << worst;
    return out.str();
  }
};

namespace detail {

inline std::string index_string(const Shape& shape, std::size_t flat) {
  std::vector<std::int64_t> index(shape.rank());
  auto rest = static_cast<std::int64_t>(flat);
  for (std::size_t axis = shape.rank(); axis-- > 0;) {
    index[axis] = rest % shape[axis];
    rest /= shape[axis];
  }
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < index.size(); ++i) out << (i ? ", " : "") << index[i];
  out << ']';
  return out.str();
}

/// Compares analytic against central differences of `evaluate`, which runs a fresh
/// forward pass with the given host values of every input and returns the loss.
inline GradCheckResult compare_with_central_differences(
    const std::vector<std::string>& names, const std::vector<Shape>& shapes,
    const std::vector<std::vector<double>>& values, const std::vector<std::vector<double>>& analytic,
    const std::function<double(const std::vector<std::vector<double>>&)>& evaluate, const GradCheckOptions& options) {
  GradCheckResult result;
  result.worst = "(nothing compared)";
  std::vector<std::vector<double>> probe = values;
  for (std::size_t i = 0; i < values.size(); ++i) {
    for (std::size_t j = 0; j < values[i].size(); ++j) {
      const double x = values[i][j];
      probe[i][j] = x + options.step;
      const double plus = evaluate(probe);
      probe[i][j] = x - options.step;
      const double minus = evaluate(probe);
      probe[i][j] = x;
      const double numeric = (plus - minus) / (2.0 * options.step);
      const double a = analytic[i][j];
      const double tolerance = options.atol + options.rtol * std::max(std::abs(a), std::abs(numeric));
      const double error = std::abs(a - numeric);
      const double excess = std::isfinite(error) ? error / tolerance : INFINITY;
      ++result.checked;
      if (!(excess <= 1.0)) {
        result.ok = false;
        ++result.failures;
      }
      if (!(excess <= result.worst_excess) || result.checked == 1) {
        result.worst_excess = excess;
        std::ostringstream where;
        where << "input '" << names[i] << "' " << shapes[i] << " at " << index_string(shapes[i], j) << " (flat " << j
              << "): analytic " << a << ", numeric " << numeric;
        result.worst = where.str();
      }
    }
  }
  return result;
}

template <class B>
std::vector<double> grad_or_zeros(const Var<B>& v) {
  const Tensor<B>& g = v.grad();
  if (!g.defined()) return std::vector<double>(static_cast<std::size_t>(v.numel()), 0.0);
  trainmem::detail::check(g.shape() == v.shape(), "gradcheck: grad of '", v.name(), "' is ", g.shape(), ", value is ",
                          v.shape());
  return g.template to_host<double>();
}

template <class B>
double scalar_value(const Var<B>& loss) {
  trainmem::detail::check(loss.numel() == 1, "gradcheck: the loss function must return a scalar, got ", loss.shape());
  return loss.value().template to_host<double>()[0];
}

}  // namespace detail

/// Checks d loss / d input for every element of every input. `loss(tape, vars)` gets
/// each input as a grad-requiring leaf ("in0", "in1", ...) on a fresh tape and returns
/// a scalar Var. Inputs must be F64 tensors; they are not modified.
template <class Loss, class B = cpu::Backend>
GradCheckResult check_gradients(Loss&& loss, const std::vector<Tensor<B>>& inputs, GradCheckOptions options = {}) {
  trainmem::detail::check(!inputs.empty(), "check_gradients: no inputs");
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  std::vector<std::vector<double>> values;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    trainmem::detail::check(inputs[i].dtype() == DType::F64, "check_gradients: input ", i, " is ", inputs[i].dtype(),
                            "; central differences need f64");
    names.push_back("in" + std::to_string(i));
    shapes.push_back(inputs[i].shape());
    values.push_back(inputs[i].template to_host<double>());
  }
  B& backend = inputs[0].backend();
  auto run = [&](const std::vector<std::vector<double>>& host, bool backward) {
    Tape<B> tape(backend);
    std::vector<Var<B>> vars;
    for (std::size_t i = 0; i < host.size(); ++i)
      vars.push_back(tape.input(Tensor<B>::from_host(shapes[i], host[i], DType::F64, MemCategory::Temporary, backend),
                                true, names[i]));
    Var<B> l = loss(tape, vars);
    const double value = detail::scalar_value(l);
    std::vector<std::vector<double>> grads;
    if (backward) {
      tape.backward(l);
      for (const auto& v : vars) grads.push_back(detail::grad_or_zeros(v));
    }
    return std::make_pair(value, grads);
  };
  const auto analytic = run(values, true).second;
  return detail::compare_with_central_differences(
      names, shapes, values, analytic, [&](const auto& host) { return run(host, false).first; }, options);
}

/// Checks d loss / d parameter for existing parameters (leaves on no tape, e.g. module
/// weights; F64). `loss(tape)` runs a forward on a fresh tape and returns a scalar Var.
/// The parameters are perturbed in place and restored; their .grad is left cleared.
template <class Loss, class B = cpu::Backend>
GradCheckResult check_parameter_gradients(Loss&& loss, const std::vector<Var<B>>& parameters,
                                          GradCheckOptions options = {}) {
  trainmem::detail::check(!parameters.empty(), "check_parameter_gradients: no parameters");
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  std::vector<std::vector<double>> values;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const Var<B>& p = parameters[i];
    trainmem::detail::check(p.dtype() == DType::F64 && p.is_leaf() && p.requires_grad(), "check_parameter_gradients: '",
                            p.name(), "' must be an f64 leaf that requires grad");
    names.push_back(p.name().empty() ? "param" + std::to_string(i) : p.name());
    shapes.push_back(p.shape());
    values.push_back(p.value().template to_host<double>());
  }
  B& backend = parameters[0].value().backend();
  auto set_values = [&](const std::vector<std::vector<double>>& host) {
    for (std::size_t i = 0; i < parameters.size(); ++i)
      parameters[i].value().copy_from(
          Tensor<B>::from_host(shapes[i], host[i], DType::F64, MemCategory::Temporary, backend));
  };
  auto forward = [&](bool backward) {
    Tape<B> tape(backend);
    Var<B> l = loss(tape);
    const double value = detail::scalar_value(l);
    if (backward) tape.backward(l);
    return value;
  };
  for (const auto& p : parameters) p.zero_grad();
  forward(true);
  std::vector<std::vector<double>> analytic;
  for (const auto& p : parameters) analytic.push_back(detail::grad_or_zeros(p));
  for (const auto& p : parameters) p.zero_grad();
  GradCheckResult result = detail::compare_with_central_differences(
      names, shapes, values, analytic,
      [&](const auto& host) {
        set_values(host);
        return forward(false);
      },
      options);
  set_values(values);
  return result;
}

/// sum(y * w) for a fixed pseudo-random w of y's shape and dtype, |w| in [0.5, 1.5):
/// a scalar that depends on every element of y with a different weight (a plain sum
/// would hide errors, e.g. in softmax, whose rows always sum to one).
template <class B>
Var<B> weighted_sum(Tape<B>& tape, const Var<B>& y, std::uint64_t seed = 12345) {
  const auto w = random_signed_away_from_zero(static_cast<std::size_t>(y.numel()), seed, 0.5, 1.5);
  Var<B> weights =
      tape.input(Tensor<B>::from_host(y.shape(), w, y.dtype(), MemCategory::Temporary, tape.backend()), false, "w");
  return sum(mul(y, weights));
}

}  // namespace trainmem::testing
