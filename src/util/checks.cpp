#include "util/checks.hpp"

namespace reservoir::detail {

void invariant_failure(const char* condition, const char* file, int line,
                       const std::string& message) {
  std::string out = std::string("reservoir invariant violated: ") + condition + " (" + file + ":" +
                    std::to_string(line) + ")";
  if (!message.empty()) out += ": " + message;
  throw InvariantError(out);
}

}  // namespace reservoir::detail
