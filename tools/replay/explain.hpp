// Results in words, for someone reading reservoir-replay's report: why the first
// OOM of a setting happened, and why a setting reserves far more than it was asked
// for. Both are derived from the allocator's statistics (ReplayResult), never from
// knowledge of a particular trace, and the advice names the tool's own options.
#pragma once

#include <string>

#include "replay.hpp"

namespace reservoir::replay {

// A setting is explained when peak reserved / peak requested reaches this.
inline constexpr double kExplainRatio = 2.0;

// One sentence on the first OOM: the trace's event and stream, what was asked,
// what the device and the allocator held, and what to try in the tool.
std::string describe_oom(const OomFacts& oom);

// One line saying why r reserves r.ratio times its requested memory; "" when the
// ratio is below kExplainRatio.
std::string explain_ratio(const ReplayResult& r);

}  // namespace reservoir::replay
