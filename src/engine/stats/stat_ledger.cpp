#include "engine/stats/stat_ledger.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

namespace reservoir::detail {

namespace {
__extension__ typedef __int128 int128;

// The stored kind a reported quantity is (or starts with, for the derived two).
constexpr int kFirstKind[kReportedKinds] = {
    kAllocation,      kSegment,        kAllocation,         kInactiveSplit,  kAllocatedBytes,
    kReservedBytes,   kAllocatedBytes, kInactiveSplitBytes, kRequestedBytes, kOversizeAllocations,
    kOversizeSegments};
// The second stored kind of a derived quantity, or -1.
constexpr int second_kind(int q) {
  return q == rActive ? kPending : q == rActiveBytes ? kPendingBytes : -1;
}

// The stored counters whose sum is quantity q in scope p, as flat indices into
// ShardCounters::current (kind * 2 + pool): a rebalance reads them with no switch.
struct Terms {
  int count = 0;
  int index[4] = {};
};
constexpr Terms terms_of(int q, int p) {
  Terms t;
  const int kinds[2] = {kFirstKind[q], second_kind(q)};
  for (int pool = 0; pool < 2; ++pool) {
    if (p != 0 && pool != p - 1) continue;
    for (int k : kinds)
      if (k >= 0) t.index[t.count++] = k * 2 + pool;
  }
  return t;
}
struct TermTable {
  Terms terms[kReportedKinds][3];
  constexpr TermTable() {
    for (int q = 0; q < kReportedKinds; ++q)
      for (int p = 0; p < 3; ++p) terms[q][p] = terms_of(q, p);
  }
};
constexpr TermTable kTerms;

// Quantity (terms) of shard s; N: the number of terms when known at compile time.
template <int N = -1>
RESERVOIR_INLINE std::int64_t value_of(const ShardCounters* s, const Terms& t) {
  const std::atomic<std::int64_t>* flat = &s->current[0][0];
  const int count = N >= 0 ? N : t.count;
  std::int64_t v = 0;
  for (int i = 0; i < count; ++i) v += flat[t.index[i]].load(std::memory_order_relaxed);
  return v;
}

// rebalance_one's reading pass over the live shards for a quantity of N counters:
// each shard's value into cur, its high-water mark updated (an idle shard's old one
// claims nothing), its claim (high - value) into want; returns the sum of the values.
template <int N>
std::int64_t gather(ShardCounters* const* live, std::size_t n, const Terms& terms, int q, int p,
                    std::uint64_t epoch, std::uint64_t lifetime, std::int64_t* cur,
                    std::int64_t* want, std::int64_t* wanted) {
  std::int64_t sum = 0, claims = 0;
  for (std::size_t i = 0; i < n; ++i) {
    ShardCounters* sh = live[i];
    const std::int64_t c = value_of<N>(sh, terms);
    cur[i] = c;
    sum += c;
    std::int64_t& high = sh->high[q][p];
    high = epoch - sh->last_trigger > lifetime ? c : std::max(high, c);
    want[i] = std::max<std::int64_t>(0, high - c);
    claims += want[i];
  }
  *wanted = claims;
  return sum;
}

bool counters_zero(const ShardCounters* s) {
  for (int k = 0; k < kStatKinds; ++k)
    for (int p = 0; p < 2; ++p)
      if (s->current[k][p].load(std::memory_order_relaxed) != 0) return false;
  return true;
}
}  // namespace

ShardCounters::ShardCounters() {
  for (int k = 0; k < kStatKinds; ++k)
    for (int p = 0; p < 2; ++p) {
      current[k][p].store(0, std::memory_order_relaxed);
      removed[k][p].store(0, std::memory_order_relaxed);
      base[k][p].store(0, std::memory_order_relaxed);
      removed_base[k][p].store(0, std::memory_order_relaxed);
    }
  for (int q = 0; q < kReportedKinds; ++q)
    for (int p = 0; p < 3; ++p) {
      limit[q][p].store(0, std::memory_order_relaxed);
      high[q][p] = 0;
    }
}

namespace {
// The headrooms a guard unit covers: the quantities of that unit that on_allocate
// raises (the second is -1 for requested bytes).
constexpr int kGuarded[kGuardUnits][2] = {{rAllocation, rActive},
                                          {rAllocatedBytes, rActiveBytes},
                                          {rRequestedBytes, -1},
                                          {rInactiveSplit, -1},
                                          {rInactiveSplitBytes, -1}};
}  // namespace

// limit - value over unit u's quantities in scope (0 all, 1 small, 2 large), the
// smallest of them.
static std::int64_t headroom(const ShardCounters& s, int u, int scope) {
  std::int64_t h = INT64_MAX;
  for (int q : kGuarded[u]) {
    if (q < 0) continue;
    const std::int64_t value =
        scope == 0 ? s.reported(q, 0) + s.reported(q, 1) : s.reported(q, scope - 1);
    h = std::min(h, s.limit[q][scope].load(std::memory_order_relaxed) - value);
  }
  return h;
}

// The guarded quantities, each with its unit, and their values in one pool: the
// refresh reads each counter once (it runs after every rebalance that touched the
// shard's limits).
constexpr int kGuardedQuantities = 7;
constexpr int kQuantity[kGuardedQuantities] = {rAllocation,        rActive,         rAllocatedBytes,
                                               rActiveBytes,       rRequestedBytes, rInactiveSplit,
                                               rInactiveSplitBytes};
constexpr int kUnitOf[kGuardedQuantities] = {kGuardBlocks,    kGuardBlocks,    kGuardBytes,
                                             kGuardBytes,     kGuardRequested, kGuardSplitBlocks,
                                             kGuardSplitBytes};
// Where each unit's stored kind (the value its ceilings bound) sits among them.
constexpr int kStoredIndex[kGuardUnits] = {0, 2, 4, 5, 6};
// The reported quantities of each unit, as bits of ShardCounters::over.
constexpr std::uint32_t kUnitQuantities[kGuardUnits] = {
    (1u << rAllocation) | (1u << rActive), (1u << rAllocatedBytes) | (1u << rActiveBytes),
    1u << rRequestedBytes, 1u << rInactiveSplit, 1u << rInactiveSplitBytes};
static void guarded_values(const ShardCounters& s, int pool, std::int64_t out[]) {
  const std::int64_t blocks = s.get(kAllocation, pool), bytes = s.get(kAllocatedBytes, pool);
  out[0] = blocks;
  out[1] = blocks + s.get(kPending, pool);
  out[2] = bytes;
  out[3] = bytes + s.get(kPendingBytes, pool);
  out[4] = s.get(kRequestedBytes, pool);
  out[5] = s.get(kInactiveSplit, pool);
  out[6] = s.get(kInactiveSplitBytes, pool);
}

void ShardCounters::unguarded(int pool) noexcept {
  // The exact check, as every raise does it (pool and overall, each guarded quantity),
  // then the ceilings of the pool and overall from the same headrooms (a stored kind's
  // value plus its unit's headroom: the limits less the pending parts).
  const std::uint64_t epoch = limits_epoch.load(std::memory_order_acquire);
  // A new epoch: a limit was lowered (by another shard's rebalance, from values of
  // this shard it read without its lock), possibly below this shard's value in the
  // other pool too. The other pool's ceilings are recomputed and checked as well, so no
  // scope is left below its limit unnoticed (guards_hold).
  const bool new_epoch = epoch != guard_epoch;
  if (new_epoch) guard_epoch = epoch;
  std::int64_t mine[kGuardedQuantities], other[kGuardedQuantities];
  guarded_values(*this, pool, mine);
  guarded_values(*this, pool ^ 1, other);
  std::int64_t in_pool[kGuardUnits], in_other[kGuardUnits], overall[kGuardUnits];
  // Unrolled: with several shards near their limits this runs on most requests.
#pragma GCC unroll 8
  for (int u = 0; u < kGuardUnits; ++u) in_pool[u] = in_other[u] = overall[u] = INT64_MAX;
#pragma GCC unroll 8
  for (int i = 0; i < kGuardedQuantities; ++i) {
    const int q = kQuantity[i], u = kUnitOf[i];
    in_pool[u] = std::min(in_pool[u], lim(q, 1 + pool) - mine[i]);
    in_other[u] = std::min(in_other[u], lim(q, 1 + (pool ^ 1)) - other[i]);
    overall[u] = std::min(overall[u], lim(q, 0) - mine[i] - other[i]);
  }
  std::uint32_t passed = 0;
#pragma GCC unroll 8
  for (int u = 0; u < kGuardUnits; ++u) {
    const int i = kStoredIndex[u];
    bool hit = in_pool[u] < 0 || overall[u] < 0;
    ceiling[u][1 + pool] = mine[i] + in_pool[u];
    ceiling[u][0] = mine[i] + other[i] + overall[u];
    if (new_epoch) {
      hit = hit || in_other[u] < 0;
      ceiling[u][1 + (pool ^ 1)] = other[i] + in_other[u];
    }
    if (hit) passed |= kUnitQuantities[u];
  }
  over |= passed;
}

bool ShardCounters::guards_hold() const noexcept {
  const std::uint64_t epoch = limits_epoch.load(std::memory_order_acquire);
  // Stale (recomputed before use), a limit being written (odd), or a rebalance due
  // (it makes them stale).
  if (epoch != guard_epoch || (epoch & 1) != 0 || over) return true;
  std::int64_t values[2][kGuardedQuantities];
  guarded_values(*this, 0, values[0]);
  guarded_values(*this, 1, values[1]);
  bool ok = true;
  for (int u = 0; u < kGuardUnits; ++u)
    for (int scope = 0; scope < 3; ++scope) {
      const int i = kStoredIndex[u];
      const std::int64_t value = scope == 0 ? values[0][i] + values[1][i] : values[scope - 1][i];
      // Within its ceiling, and the ceiling within the limits (value + headroom).
      ok &= value <= ceiling[u][scope] && ceiling[u][scope] <= value + headroom(*this, u, scope);
    }
  // A limit written meanwhile (another shard's rebalance) makes the check moot.
  std::atomic_thread_fence(std::memory_order_acquire);
  return ok || limits_epoch.load(std::memory_order_relaxed) != epoch;
}

// ---------------------------------------------------------------- thread shards

constinit thread_local StatHint tls_stat_hint;
ShardCounters unowned_shard;

namespace {
std::atomic<std::uint64_t> g_next_ledger{1};

void zero(ShardCounters* s) {
  for (int k = 0; k < kStatKinds; ++k)
    for (int p = 0; p < 2; ++p) {
      s->current[k][p].store(0, std::memory_order_relaxed);
      s->removed[k][p].store(0, std::memory_order_relaxed);
      s->base[k][p].store(0, std::memory_order_relaxed);
      s->removed_base[k][p].store(0, std::memory_order_relaxed);
    }
  for (int q = 0; q < kReportedKinds; ++q)
    for (int p = 0; p < 3; ++p) {
      s->limit[q][p].store(0, std::memory_order_relaxed);
      s->high[q][p] = 0;
    }
  s->over = 0;
  s->guard_epoch = ~std::uint64_t{0};
  s->last_trigger = 0;
}

// Adds a's counters and accumulation bases to into's (a thread's exit: sums unchanged).
void fold(ShardCounters* into, const ShardCounters* a) {
  auto add = [](std::atomic<std::int64_t>& to, const std::atomic<std::int64_t>& from) {
    to.store(to.load(std::memory_order_relaxed) + from.load(std::memory_order_relaxed),
             std::memory_order_relaxed);
  };
  for (int k = 0; k < kStatKinds; ++k)
    for (int p = 0; p < 2; ++p) {
      add(into->current[k][p], a->current[k][p]);
      add(into->removed[k][p], a->removed[k][p]);
      add(into->base[k][p], a->base[k][p]);
      add(into->removed_base[k][p], a->removed_base[k][p]);
    }
}
}  // namespace

// The shards this thread writes, one per ledger it has counted in; at the thread's
// exit each goes back to its ledger, if that still exists.
struct ThreadShards {
  struct Entry {
    std::uint64_t ledger;
    std::weak_ptr<StatLedger::Home> home;
    ShardCounters* shard;
  };
  std::vector<Entry> entries;
  ~ThreadShards();
};
namespace {
thread_local ThreadShards t_shards;
// Set once t_shards is destroyed (thread exit): later counting on this thread (a
// static destructor freeing memory) takes a shard that stays live until its ledger goes.
constinit thread_local bool t_shards_gone = false;
}  // namespace

ThreadShards::~ThreadShards() {
  t_shards_gone = true;
  tls_stat_hint = StatHint{};
  for (Entry& e : entries)
    if (std::shared_ptr<StatLedger::Home> home = e.home.lock()) {
      std::lock_guard<std::mutex> guard(home->mutex);
      if (home->ledger) home->ledger->retire_locked(e.shard);
    }
}

StatLedger::StatLedger()
    : id_(g_next_ledger.fetch_add(1, std::memory_order_relaxed)),
      home_(std::make_shared<Home>()),
      mutex_(home_->mutex) {
  home_->ledger = this;
}

StatLedger::~StatLedger() {
  std::lock_guard<std::mutex> guard(mutex_);
  home_->ledger = nullptr;  // threads that exit later leave their shard alone
}

ShardCounters* StatLedger::by_thread_group(std::uintptr_t tp) const noexcept {
  if (tp == 0) return nullptr;
  const std::size_t home = slot_of(tp);
  for (std::size_t k = 1; k < kProbe; ++k) {
    ShardCounters* s = by_thread_[home ^ k].load(std::memory_order_acquire);
    if (s && s->owner.load(std::memory_order_relaxed) == tp) return s;
  }
  return nullptr;
}

ShardCounters& StatLedger::mine_slow() {
  const std::uintptr_t tp = thread_pointer();
  auto remember = [&](ShardCounters* shard) -> ShardCounters& {
    tls_stat_hint = StatHint{id_, shard};
    // A slot held by a live thread stays its own (two threads taking one slot in turns
    // would write its line on every operation): the thread takes the first free slot of
    // its group, else uses the thread_local way.
    if (tp == 0 || shard->owner.load(std::memory_order_relaxed) != tp) return *shard;
    const std::size_t home = slot_of(tp);
    for (std::size_t k = 0; k < kProbe; ++k) {
      std::atomic<ShardCounters*>& slot = by_thread_[home ^ k];
      const ShardCounters* held = slot.load(std::memory_order_acquire);
      if (held == shard) return *shard;
      if (!held || held->owner.load(std::memory_order_relaxed) == 0) {
        slot.store(shard, std::memory_order_release);  // the shard made before it is seen
        return *shard;
      }
    }
    return *shard;
  };
  if (tls_stat_hint.ledger == id_) return remember(tls_stat_hint.shard);
  if (ShardCounters* known = find_mine()) return remember(known);
  ShardCounters* shard;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    shard = take_shard_locked();
    // A thread that is exiting keeps its shard unregistered (see t_shards_gone), so it
    // is never taken back: no owner, so that no later thread with its pointer finds it.
    shard->owner.store(t_shards_gone ? 0 : tp, std::memory_order_relaxed);
  }
  if (!t_shards_gone) {
    std::vector<ThreadShards::Entry>& entries = t_shards.entries;
    // Ledgers gone leave their entries: dropped here, so a thread that outlives many
    // allocators keeps only the live ones.
    std::erase_if(entries, [](const ThreadShards::Entry& e) { return e.home.expired(); });
    try {
      entries.push_back(ThreadShards::Entry{id_, home_, shard});
    } catch (...) {
      std::lock_guard<std::mutex> guard(mutex_);
      retire_locked(shard);
      throw;
    }
  }
  return remember(shard);
}

ShardCounters* StatLedger::find_mine() noexcept {
  if (t_shards_gone) return nullptr;
  for (const ThreadShards::Entry& e : t_shards.entries)
    if (e.ledger == id_) return e.shard;
  return nullptr;
}

void StatLedger::make_room_locked(std::size_t n) {
  // Room for every shard in the live list and the scratch, so that a rebalance never
  // allocates; reserved first, so a failure changes nothing.
  auto room = [n](auto& v) {
    if (v.capacity() < n) v.reserve(std::max(n, 2 * v.capacity()));
  };
  room(live_);
  room(cur_);
  room(want_);
}

ShardCounters* StatLedger::take_shard_locked() {
  make_room_locked(live_.size() + 1);
  ShardCounters* shard;
  if (!spare_.empty()) {
    shard = spare_.back();
    spare_.pop_back();
  } else {
    made_.reserve(made_.size() + 1);
    spare_.reserve(made_.size() + 1);  // so that retire_locked() never allocates
    made_.push_back(std::make_unique<ShardCounters>());
    shard = made_.back().get();
    shard->ledger = this;
  }
  // It joins with zero limits and values (the invariant's sum is unchanged), so its
  // first rise rebalances what it passed; no rebalance of every quantity now, which
  // would rewrite every live shard's limits while their threads count (threads that
  // start together would each do it, one after another, under the mutex).
  live_.push_back(shard);
  return shard;
}

void StatLedger::retire_locked(ShardCounters* shard) {
  // The shard's value goes to retired_, at most its limits: the invariant's left side
  // does not grow.
  fold(&retired_, shard);
  zero(shard);
  shard->owner.store(0, std::memory_order_relaxed);  // before its thread's pointer is reused
  // Its slots go too: a spare taken by a new thread would otherwise hold, as a live
  // thread's, a slot of the old thread's group (threads that come and go would fill
  // the table with such aliases and push later threads to the slow way).
  for (std::atomic<ShardCounters*>& slot : by_thread_)
    if (slot.load(std::memory_order_relaxed) == shard)
      slot.store(nullptr, std::memory_order_relaxed);
  // Limits zeroed while no one can read them for guards: the owner is gone.
  shard->limits_epoch.store(shard->limits_epoch.load(std::memory_order_relaxed) + 2,
                            std::memory_order_relaxed);
  std::erase(live_, shard);
  spare_.push_back(shard);
}

void StatLedger::attach(ShardCounters* shard) {
  std::lock_guard<std::mutex> guard(mutex_);
  make_room_locked(live_.size() + 1);
  fixed_.reserve(fixed_.size() + 1);
  fixed_.push_back(shard);
  live_.push_back(shard);
  shard->ledger = this;
  rebalance_locked();
}

// Only the quantities the trigger passed are rebalanced: the invariant (limits sum to
// at most the peak) holds for each quantity and pool on its own, and with several
// threads near a peak a shard passes a limit often (one thread's rise is another's
// fall), so a rebalance of all 33 would cost ~30x more than the one that moved.
void StatLedger::rebalance(ShardCounters* trigger) {
  std::lock_guard<std::mutex> guard(mutex_);
  std::uint32_t passed = trigger->over;
  trigger->over = 0;
  trigger->last_trigger = ++epoch_;
  // The trigger's ceilings were passed during the operation: they are recomputed from
  // the limits below, whether or not one changes.
  trigger->limits_epoch.store(trigger->limits_epoch.load(std::memory_order_relaxed) + 2,
                              std::memory_order_release);  // stays even
  for (; passed != 0; passed &= passed - 1) {
    const int q = __builtin_ctz(passed);
    for (int p = 0; p < 3; ++p)
      if (value_of(trigger, kTerms.terms[q][p]) >
          trigger->limit[q][p].load(std::memory_order_relaxed))
        rebalance_one(q, p, trigger);
  }
}

void StatLedger::rebalance_locked() {
  if (live_.empty()) return;
  for (int q = 0; q < kReportedKinds; ++q)
    for (int p = 0; p < 3; ++p) rebalance_one(q, p, nullptr);
}

void StatLedger::rebalance_one(int q, int p, const ShardCounters* trigger) {
  const Terms& terms = kTerms.terms[q][p];
  const std::size_t n = live_.size();
  if (cur_.size() < n) {
    cur_.resize(n);
    want_.resize(n);
  }
  std::int64_t wanted = 0;
  auto read = [&](auto count) {
    return gather<decltype(count)::value>(live_.data(), n, terms, q, p, epoch_, kClaimLifetime,
                                          cur_.data(), want_.data(), &wanted);
  };
  // The counters per quantity are fixed (1, 2 or 4): loops of known length.
  const std::int64_t sum =
      value_of(&retired_, terms) + (terms.count == 1   ? read(std::integral_constant<int, 1>{})
                                    : terms.count == 2 ? read(std::integral_constant<int, 2>{})
                                                       : read(std::integral_constant<int, 4>{}));
  std::int64_t& peak = peak_[q][p];
  peak = std::max(peak, sum);
  std::int64_t headroom = peak - sum;
  const std::int64_t even =
      wanted <= headroom ? (headroom - wanted) / static_cast<std::int64_t>(n) : 0;
  // Short of headroom: the trigger, the shard rising now, is served first, and with
  // half the headroom at least. Its own claim (high - current) is zero while it rises
  // past its high-water mark, and shares in proportion to the others' claims left it a
  // sliver: with six threads near a peak it passed a limit again on nearly every request.
  std::int64_t first = 0;
  if (wanted > headroom && trigger != nullptr) {
    for (std::size_t i = 0; i < n; ++i)
      if (live_[i] == trigger) {
        first = std::max(std::min(want_[i], headroom), headroom / 2);
        headroom -= first;
        wanted -= want_[i];
        want_[i] = -1;  // marks the trigger
        break;
      }
  }
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t extra;
    if (want_[i] < 0) {
      extra = first;
    } else if (wanted <= headroom) {
      extra = want_[i] + even;
    } else {
      // want * headroom / wanted, in 64 bits unless the product overflows.
      std::int64_t product;
      if (!__builtin_mul_overflow(want_[i], headroom, &product))
        extra = product / wanted;
      else
        extra = static_cast<std::int64_t>(static_cast<int128>(want_[i]) * headroom / wanted);
    }
    // A lower limit makes the shard's guards stale: its epoch is odd while the limit
    // is being written (as a sequence lock's), so a guard computed meanwhile is stale
    // at the second increment and guards_hold() does not judge a pair of limit and
    // value it may have read half-way; a shard that sees the new (even) epoch sees the
    // new limit (release). A higher one leaves them valid (they fit the old headroom),
    // so most rebalances cost the other shards no recomputation.
    ShardCounters* shard = live_[i];
    const std::int64_t next = cur_[i] + extra;
    if (next < shard->limit[q][p].load(std::memory_order_relaxed)) {
      // Only the ledger writes epochs (under mutex_): plain stores, no locked RMW.
      const std::uint64_t epoch = shard->limits_epoch.load(std::memory_order_relaxed);
      shard->limits_epoch.store(epoch + 1, std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_release);
      shard->limit[q][p].store(next, std::memory_order_relaxed);
      shard->limits_epoch.store(epoch + 2, std::memory_order_release);
    } else {
      shard->limit[q][p].store(next, std::memory_order_relaxed);
    }
  }
}

std::size_t StatLedger::live_shards() {
  std::lock_guard<std::mutex> guard(mutex_);
  return live_.size();
}

std::size_t StatLedger::thread_shards_made() {
  std::lock_guard<std::mutex> guard(mutex_);
  return made_.size();
}

std::uint64_t StatLedger::rebalances() {
  std::lock_guard<std::mutex> guard(mutex_);
  return epoch_;
}

std::int64_t StatLedger::pooled_total(int kind, int pool) {
  std::lock_guard<std::mutex> guard(mutex_);
  std::int64_t sum = retired_.get(kind, pool);
  for (const auto& s : made_) sum += s->get(kind, pool);  // spares hold zero
  return sum;
}

std::string StatLedger::problem() {
  std::string out;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    for (int q = 0; q < kReportedKinds && out.empty(); ++q)
      for (int p = 0; p < 3; ++p) {
        std::int64_t limits = value_of(&retired_, kTerms.terms[q][p]);
        for (const ShardCounters* s : live_)
          limits += s->limit[q][p].load(std::memory_order_relaxed);
        if (limits > peak_[q][p]) {
          out =
              "statistics ledger: the retired counters and the live shards' limits of "
              "quantity " +
              std::to_string(q) + " (scope " + std::to_string(p) + ") sum to " +
              std::to_string(limits) + ", above its peak " + std::to_string(peak_[q][p]);
          break;
        }
      }
    for (const ShardCounters* s : spare_)
      if (out.empty() &&
          (!counters_zero(s) || std::find(live_.begin(), live_.end(), s) != live_.end()))
        out = "statistics ledger: a spare shard holds counters or is in the budget";
    if (out.empty() && live_.size() + spare_.size() != made_.size() + fixed_.size())
      out = "statistics ledger: the live and spare shards do not make up the shards";
  }
  if (out.empty() && tls_stat_hint.ledger == id_ && !tls_stat_hint.shard->guards_hold())
    out = "statistics guards allow more than the limits' headroom (stat_ledger.hpp)";
  return out;
}

void StatLedger::reset_peaks() {
  std::lock_guard<std::mutex> guard(mutex_);
  for (int q = 0; q < kReportedKinds; ++q) {
    for (int p = 0; p < 3; ++p) {
      std::int64_t sum = value_of(&retired_, kTerms.terms[q][p]);
      for (ShardCounters* s : live_) {
        std::int64_t c = value_of(s, kTerms.terms[q][p]);
        s->high[q][p] = c;
        sum += c;
      }
      peak_[q][p] = sum;
    }
  }
  rebalance_locked();
}

void StatLedger::reset_accumulated() {
  std::lock_guard<std::mutex> guard(mutex_);
  auto reset = [](ShardCounters* s) {
    for (int k = 0; k < kStatKinds; ++k)
      for (int p = 0; p < 2; ++p) {
        s->base[k][p].store(s->get(k, p), std::memory_order_relaxed);
        s->removed_base[k][p].store(s->removed[k][p].load(std::memory_order_relaxed),
                                    std::memory_order_relaxed);
      }
  };
  reset(&retired_);
  for (ShardCounters* s : live_) reset(s);
}

void StatLedger::read(DeviceStats* out) {
  std::lock_guard<std::mutex> guard(mutex_);
  StatArray* arrays[] = {
      &out->allocation,      &out->segment,        &out->active,       &out->inactive_split,
      &out->allocated_bytes, &out->reserved_bytes, &out->active_bytes, &out->inactive_split_bytes,
      &out->requested_bytes};
  for (int q = 0; q < kReportedKinds; ++q) {
    const int first = kFirstKind[q], second = second_kind(q);
    Stat stat[3];
    for (int p = 0; p < 3; ++p) {
      const int p0 = p == 0 ? 0 : p - 1, p1 = p == 0 ? 1 : p - 1;
      auto add_shard = [&](const ShardCounters* s) {
        for (int pool = p0; pool <= p1; ++pool) {
          auto base_of = [&](int k) { return s->base[k][pool].load(std::memory_order_relaxed); };
          const std::int64_t current = s->reported(q, pool);
          // Every increase of a derived quantity is an increase of its first kind
          // (the second only receives transfers from the first).
          const std::int64_t added = s->get(first, pool) - base_of(first) +
                                     s->removed[first][pool].load(std::memory_order_relaxed) -
                                     s->removed_base[first][pool].load(std::memory_order_relaxed);
          std::int64_t base = base_of(first);
          if (second >= 0) base += base_of(second);
          stat[p].current += current;
          stat[p].allocated += added;
          stat[p].freed += added - (current - base);
        }
      };
      add_shard(&retired_);
      for (const ShardCounters* s : live_) add_shard(s);
      stat[p].peak = std::max(peak_[q][p], stat[p].current);
    }
    if (q < 9) {
      for (int p = 0; p < 3; ++p) arrays[q]->pool[p] = stat[p];
    } else if (q == rOversizeAllocations) {
      out->oversize_allocations = stat[0];
    } else {
      out->oversize_segments = stat[0];
    }
  }
}

}  // namespace reservoir::detail
