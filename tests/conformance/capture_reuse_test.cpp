// graph_capture_record_stream_reuse (CTest label "pools"): a block freed during a CUDA
// graph capture while other captured streams use it (record_stream) serves its stream
// again in the same capture once the capture orders that stream's work after every
// use (the program joined those streams back), not before; without the setting, or
// with a use from before the capture, it waits for the capture's end. Modelled on the
// simulated device (its capture order: stream positions and device-side waits);
// PyTorch's own tests of the setting run on the GPU (test_graph_capture_reclaim_*).
#include <vector>

#include "conformance/fixture.hpp"
#include "reservoir/sim_backend.hpp"

namespace reservoir::testing {
namespace {

class CaptureReuse : public Conformance {
 protected:
  void SetUp() override {
    Conformance::SetUp();
    if (IsSkipped()) return;
    PYTORCH_POLICY_ONLY();
    if (!sim()) GTEST_SKIP() << "the capture order is modelled on the simulated device";
    make("graph_capture_record_stream_reuse:True");
    pool_ = a().create_pool({}, 0);
  }
  void TearDown() override {
    if (capturing_ != 0) end();
    if (alloc_) a().release_pool(pool_, 0);
    Conformance::TearDown();
  }
  void begin(StreamHandle s) {
    a().begin_capture_to_pool(pool_, s, 0);
    ASSERT_TRUE(harness_->begin_capture(s));
    capturing_ = s;
  }
  void end() {
    harness_->end_capture(capturing_);
    a().end_allocate_to_pool(pool_, 0);
    capturing_ = 0;
  }
  // waiter.wait_stream(waited): an event recorded on waited, waited for on waiter.
  void join(StreamHandle waiter, StreamHandle waited) {
    EventHandle e = 0;
    ASSERT_EQ(sim()->create_event(0, &e), DeviceStatus::ok);
    ASSERT_EQ(sim()->record_event(0, e, waited), DeviceStatus::ok);
    ASSERT_EQ(sim()->stream_wait_event(0, waiter, e), DeviceStatus::ok);
    events_.push_back(e);
  }
  // A kernel on s that reads p (p.record_stream(s) when s is not p's stream).
  void use(void* p, StreamHandle s) {
    a().record_stream(p, s);
    sim()->submit_work(s);
  }
  // In a capture on s1: a block of s1 read on s2, freed, then s1 joined s2 back.
  void* freed_after_a_use_then_joined(StreamHandle s1, StreamHandle s2) {
    begin(s1);
    void* data1 = alloc_on(32, s1);
    join(s2, s1);
    use(data1, s2);
    free(data1);
    join(s1, s2);
    return data1;
  }
  PoolId pool_{};
  StreamHandle capturing_ = 0;
  std::vector<EventHandle> events_;
};

// PyTorch's test_graph_capture_reclaim_2_streams.
TEST_P(CaptureReuse, ABlockUsedOnAnotherStreamServesAgainOnceThatStreamJoinedBack) {
  StreamHandle s1 = harness_->new_stream(), s2 = harness_->new_stream();
  begin(s1);
  void* sink = alloc_on(32, s1);
  void* data1 = alloc_on(32, s1);
  join(s2, s1);
  use(data1, s2);
  free(data1);
  void* data2 = alloc_on(32, s1);
  EXPECT_NE(data2, data1) << "reused before the capture ordered s1 after s2's use";
  join(s1, s2);
  sim()->submit_work(s1);
  void* data3 = alloc_on(32, s1);
  EXPECT_EQ(data3, data1) << "not reused once s1 joined s2 back";
  a().validate();
  end();
  EXPECT_EQ(sim()->capture_violations(), 0u);
  for (void* p : {sink, data2, data3}) free(p);
}

// PyTorch's test_graph_capture_reclaim_4_streams: a join through a third stream counts,
// a partial one does not.
TEST_P(CaptureReuse, JoinsThroughOtherStreamsCountOnlyWhenComplete) {
  StreamHandle s1 = harness_->new_stream(), s2 = harness_->new_stream(),
               s3 = harness_->new_stream(), s4 = harness_->new_stream();
  begin(s1);
  void* data1 = alloc_on(32, s1);
  void* sink = alloc_on(32, s1);
  for (StreamHandle s : {s2, s3, s4}) {
    join(s, s1);
    use(data1, s);
  }
  free(data1);
  join(s1, s2);
  join(s3, s4);
  sim()->submit_work(s3);
  void* data2 = alloc_on(32, s1);
  EXPECT_NE(data2, data1) << "reused before s1 was ordered after s3 and s4";
  join(s1, s3);  // s3 had waited for s4: s1 now follows all three
  void* data3 = alloc_on(32, s1);
  EXPECT_EQ(data3, data1);
  end();
  for (void* p : {sink, data2, data3}) free(p);
}

TEST_P(CaptureReuse, WithoutTheSettingTheBlockWaitsForTheCapturesEnd) {
  a().update_config("graph_capture_record_stream_reuse:False");
  StreamHandle s1 = harness_->new_stream(), s2 = harness_->new_stream();
  void* data1 = freed_after_a_use_then_joined(s1, s2);
  void* data2 = alloc_on(32, s1);
  EXPECT_NE(data2, data1);
  EXPECT_EQ(stats().active.all().current, 2) << "the freed block is still active";
  end();
  EXPECT_EQ(stats().active.all().current, 1) << "freed at the capture's end";
  free(data2);
}

TEST_P(CaptureReuse, AUseFromBeforeTheCaptureWaitsForItsEvent) {
  StreamHandle s1 = harness_->new_stream(), s2 = harness_->new_stream();
  void* data1 = alloc_on(32, s1);
  use(data1, s2);  // eager work on s2, outside any graph
  harness_->hold_stream(s2);
  begin(s1);
  free(data1);
  join(s1, s2);
  void* data2 = alloc_on(32, s1);
  EXPECT_NE(data2, data1) << "reused in the graph while eager work may still read it";
  end();
  harness_->release_stream(s2);
  free(data2);
  EXPECT_EQ(sim()->capture_violations(), 0u);
}

// The device calls of the setting fail: nothing is reused early, nothing is lost.
TEST_P(CaptureReuse, AFailedCaptureQueryLeavesTheBlockToTheCapturesEnd) {
  for (SimOp op : {SimOp::capture_point, SimOp::capture_follows}) {
    SCOPED_TRACE(to_string(op));
    StreamHandle s1 = harness_->new_stream(), s2 = harness_->new_stream();
    sim()->fail_operation(op, DeviceStatus::error);
    void* data1 = freed_after_a_use_then_joined(s1, s2);
    void* data2 = alloc_on(32, s1);
    EXPECT_NE(data2, data1);
    a().validate();
    end();
    sim()->clear_faults();
    EXPECT_EQ(stats().active.all().current, 1) << "the deferred free did not complete";
    free(data2);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, CaptureReuse, ::testing::ValuesIn(harness_names()),
                         harness_test_name);

}  // namespace
}  // namespace reservoir::testing
