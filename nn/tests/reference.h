// Test helper: reads PyTorch reference values produced by make_reference.py.
#ifndef GRADWIRE_NN_TESTS_REFERENCE_H_
#define GRADWIRE_NN_TESTS_REFERENCE_H_

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "gradwire/tensor/tensor.h"

namespace gw::testing {

inline std::map<std::string, std::vector<double>> ReadReference(const std::string& path) {
  std::map<std::string, std::vector<double>> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string name;
    ls >> name;
    double v;
    while (ls >> v) out[name].push_back(v);
  }
  return out;
}

// sin(0.37 * i + k) for element i, as in make_reference.py.
inline Tensor Det(const Shape& shape, double k) {
  std::vector<double> v(static_cast<size_t>(NumElements(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37 * static_cast<double>(i) + k);
  return Tensor::FromVector<double>(v, shape);
}

}  // namespace gw::testing

#endif  // GRADWIRE_NN_TESTS_REFERENCE_H_
