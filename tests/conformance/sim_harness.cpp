#include "conformance/harness.hpp"

namespace reservoir::testing {

std::vector<std::pair<std::string, HarnessFactory>>& harness_registry() {
  static std::vector<std::pair<std::string, HarnessFactory>> registry;
  return registry;
}

namespace {

class SimHarness : public Harness {
 public:
  std::string name() const override { return "sim"; }
  std::shared_ptr<Backend> make_backend() override {
    SimOptions options;
    options.capacity = std::size_t{80} << 30;
    backend_ = std::make_shared<SimBackend>(options);
    return backend_;
  }
  StreamHandle new_stream() override { return next_stream_++; }
  void hold_stream(StreamHandle stream) override { backend_->submit_work(stream); }
  void release_stream(StreamHandle stream) override { backend_->advance(stream); }
  SimBackend* sim() override { return backend_.get(); }
  bool begin_capture(StreamHandle stream) override {
    backend_->begin_capture(stream);
    return true;
  }
  void end_capture(StreamHandle stream) override { backend_->end_capture(stream); }

 private:
  std::shared_ptr<SimBackend> backend_;
  StreamHandle next_stream_ = 0x100;
};

RegisterHarness register_sim("sim", [] { return std::make_unique<SimHarness>(); });

}  // namespace
}  // namespace reservoir::testing
