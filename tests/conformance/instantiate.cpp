// Instantiates the conformance suite once per registered backend harness.
#include "conformance/fixture.hpp"

namespace reservoir::testing {

std::vector<std::string> harness_names() {
  std::vector<std::string> names;
  for (auto& entry : harness_registry()) {
    names.push_back(entry.first);
    names.push_back(entry.first + "+expandable");
    names.push_back(entry.first + "+async");    // backend:cudaMallocAsync: its subset
    names.push_back(entry.first + "+compact");  // policy:compact: what holds for any policy
  }
  return names;
}

std::string harness_test_name(const ::testing::TestParamInfo<std::string>& param) {
  std::string name = param.param;
  for (char& c : name)
    if (c == '+') c = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(harness_names()),
                         harness_test_name);

}  // namespace reservoir::testing
