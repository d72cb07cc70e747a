// reservoir::Allocator's tags: a thread's tag scopes (push_tag, pop_tag, TagScope),
// and sleep and wake of a tag's memory on a device (the engine's, tag_pools.cpp).
#include "engine/tags/tags.hpp"

#include <string>
#include <vector>

#include "front/allocator_impl.hpp"

namespace reservoir {

namespace {
// The thread's tags that its open scopes replaced, innermost last.
std::vector<detail::ThreadTag>& replaced_tags() {
  thread_local std::vector<detail::ThreadTag> replaced;
  return replaced;
}

// The id of an existing tag (InvalidArgumentError when there is none of that name).
detail::TagId existing_tag(std::string_view tag, const char* action) {
  const detail::TagId id = detail::TagNames::find(tag);
  if (id != detail::kNoTag) return id;
  std::string why = detail::TagNames::invalid_name(tag);
  if (why.empty())
    why =
        "no memory was ever tagged so (a tag is made by its first scope: TagScope, push_tag, "
        "reservoir.tag)";
  throw InvalidArgumentError("reservoir: cannot " + std::string(action) + " tag '" +
                             std::string(tag.substr(0, 80)) + "': " + why);
}
// A capture on any device forbids sleep and wake: their synchronous copies and unmaps
// are calls a capture in CUDA's global mode refuses from every thread of the process.
void refuse_during_captures(detail::CachingAllocator& core, std::string_view tag,
                            const char* action) {
  for (int d = 0; d < core.device_count(); ++d)
    if (const detail::DeviceEngine* e = core.engine_if_made(d); e && e->capture_underway())
      throw InvalidArgumentError("reservoir: cannot " + std::string(action) + " tag '" +
                                 std::string(tag) + "' during a CUDA graph capture (on device " +
                                 std::to_string(d) + "): end the capture first");
}
}  // namespace

std::string tag_name_problem(std::string_view name) {
  return detail::TagNames::invalid_name(name);
}

void Allocator::push_tag(std::string_view tag) {
  Impl& im = *impl_;
  const std::string_view refusal = im.base->traits().pool_refusal;
  if (!refusal.empty())
    throw InvalidArgumentError("reservoir: cannot tag memory: " + std::string(refusal));
  const detail::TagId id = detail::TagNames::intern(tag);
  detail::ThreadTag& now = detail::thread_tag();
  replaced_tags().push_back(now);
  now = detail::ThreadTag{&im.core->hooks(), id};
  im.core->tag_scope(true);
}

void Allocator::pop_tag() {
  Impl& im = *impl_;
  detail::ThreadTag& now = detail::thread_tag();
  std::vector<detail::ThreadTag>& replaced = replaced_tags();
  if (replaced.empty() || now.owner != &im.core->hooks())
    throw InvalidArgumentError(
        "reservoir: pop_tag without a tag scope of this allocator open on this thread");
  now = replaced.back();
  replaced.pop_back();
  im.core->tag_scope(false);
}

std::string Allocator::current_tag() const {
  return detail::TagNames::name(detail::thread_tag_for(&impl_->core->hooks()));
}

void Allocator::sleep(std::string_view tag, SleepMode mode, int device) {
  if (mode != SleepMode::offload && mode != SleepMode::discard)
    throw InvalidArgumentError("reservoir: sleep mode " + std::to_string(static_cast<int>(mode)) +
                               " is neither offload nor discard");
  const detail::TagId id = existing_tag(tag, "put to sleep");
  detail::DeviceEngine& e = impl_->pool_engine(device);
  refuse_during_captures(*impl_->core, tag, "put to sleep");
  impl_->recorded([&] { e.sleep(id, mode); },
                  [&](detail::TraceRecorder& r) { r.on_sleep(id, mode); });
}

void Allocator::wake(std::string_view tag, int device) {
  const detail::TagId id = existing_tag(tag, "wake");
  detail::DeviceEngine& e = impl_->pool_engine(device);
  refuse_during_captures(*impl_->core, tag, "wake");
  impl_->recorded([&] { e.wake(id); }, [&](detail::TraceRecorder& r) { r.on_wake(id, nullptr); });
}

void Allocator::wake_async(std::string_view tag, StreamHandle stream, int device) {
  const detail::TagId id = existing_tag(tag, "wake");
  detail::DeviceEngine& e = impl_->pool_engine(device);
  refuse_during_captures(*impl_->core, tag, "wake");
  impl_->recorded([&] { e.wake(id, &stream); },
                  [&](detail::TraceRecorder& r) { r.on_wake(id, &stream); });
}

void Allocator::empty_host_cache() {
  Impl& im = *impl_;
  if (!im.base->traits().pool_refusal.empty()) return;  // no pools, nothing offloaded
  for (int d = 0; d < im.device_count; ++d)
    if (detail::DeviceEngine* e = im.core->engine_if_made(d)) (void)e->empty_host_cache();
}

TagState Allocator::tag_state(std::string_view tag, int device) {
  const detail::TagId id = existing_tag(tag, "read the state of");
  return impl_->pool_engine(device).tag_state(id);
}

std::vector<TagState> Allocator::tag_states(int device) {
  Impl& im = *impl_;
  if (!im.base->traits().pool_refusal.empty()) return {};
  const int d = im.resolve(device);
  detail::DeviceEngine* e = im.core->engine_if_made(d);  // never makes an engine
  return e ? e->tag_states() : std::vector<TagState>{};
}

}  // namespace reservoir
