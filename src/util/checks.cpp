#include "util/checks.hpp"

#include <sstream>

namespace reservoir::detail {

void invariant_failure(const char* condition, const char* file, int line,
                       const std::string& message) {
  std::ostringstream out;
  out << "reservoir invariant violated: " << condition << " (" << file << ":" << line << ")";
  if (!message.empty()) out << ": " << message;
  throw InvariantError(out.str());
}

}  // namespace reservoir::detail
