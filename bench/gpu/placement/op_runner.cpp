#include "op_runner.hpp"

namespace reservoir_bench::placement {

namespace {

constexpr int kDevice = 0;

struct Reservation {
  void* ptr;
  std::size_t size;
};

}  // namespace

OpRun run_ops(const OpList& list, Backend& backend) {
  validate(list);
  LoggingBackend log(backend);  // borrows the caller's backend
  std::size_t granularity = 0;
  if (log.granularity(kDevice, &granularity) != DeviceStatus::ok || granularity == 0)
    granularity = 2 * kMiB;

  struct Live {
    void* ptr = nullptr;
    std::size_t size = 0;
  };
  std::vector<Live> allocs;
  std::vector<Reservation> reservations;
  for (const Op& op : list.ops) {
    switch (op.kind) {
      case OpKind::alloc: {
        Live a{nullptr, op.value};
        if (log.allocate(kDevice, op.value, &a.ptr) != DeviceStatus::ok) a.ptr = nullptr;
        allocs.push_back(a);
        break;
      }
      case OpKind::free: {
        Live& a = allocs[op.value];
        if (a.ptr != nullptr) (void)log.deallocate(kDevice, a.ptr, a.size);
        a.ptr = nullptr;
        break;
      }
      case OpKind::reserve: {
        const std::size_t size = (op.value + granularity - 1) / granularity * granularity;
        void* p = nullptr;
        if (log.reserve_address_range(kDevice, size, granularity, &p) == DeviceStatus::ok)
          reservations.push_back({p, size});
        break;
      }
    }
  }
  OpRun run;
  run.end_of_sequence = log.calls().size();
  for (Live& a : allocs)
    if (a.ptr != nullptr) (void)log.deallocate(kDevice, a.ptr, a.size);
  for (const Reservation& r : reservations) (void)log.release_address_range(kDevice, r.ptr, r.size);
  run.calls = log.calls();
  return run;
}

std::string format_run(const OpList& list, const OpRun& run) {
  std::string out;
  for (const std::string& n : list.notes) out += "# " + n + "\n";
  const std::vector<PlacementCall> seq(run.calls.begin(),
                                       run.calls.begin() + static_cast<long>(run.end_of_sequence));
  const std::vector<PlacementCall> rest(run.calls.begin() + static_cast<long>(run.end_of_sequence),
                                        run.calls.end());
  out += format_calls(seq);
  out += "# end of sequence: what is still live is freed\n";
  out += format_calls(rest);
  return out;
}

}  // namespace reservoir_bench::placement
