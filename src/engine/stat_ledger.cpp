#include "engine/stat_ledger.hpp"

#include <algorithm>

namespace reservoir::detail {

ShardCounters::ShardCounters() {
  for (int k = 0; k < kStatKinds; ++k) {
    for (int p = 0; p < 2; ++p) {
      current[k][p].store(0, std::memory_order_relaxed);
      removed[k][p].store(0, std::memory_order_relaxed);
      base[k][p].store(0, std::memory_order_relaxed);
    }
    for (int q = 0; q < 3; ++q) {
      limit[k][q].store(0, std::memory_order_relaxed);
      high[k][q] = 0;
    }
  }
}

namespace {
__extension__ typedef __int128 int128;

std::int64_t current_of(const ShardCounters* s, int kind, int q) {
  if (q == 0) return s->get(kind, 0) + s->get(kind, 1);
  return s->get(kind, q - 1);
}
}  // namespace

void StatLedger::attach(ShardCounters* shard) {
  std::lock_guard<std::mutex> guard(mutex_);
  shards_.push_back(shard);
  rebalance_locked();
}

void StatLedger::rebalance(ShardCounters* trigger) {
  std::lock_guard<std::mutex> guard(mutex_);
  trigger->over = false;
  trigger->last_trigger = ++epoch_;
  rebalance_locked();
}

void StatLedger::rebalance_locked() {
  const std::size_t n = shards_.size();
  if (n == 0) return;
  std::vector<std::int64_t> cur(n), want(n);
  for (int k = 0; k < kStatKinds; ++k) {
    for (int q = 0; q < 3; ++q) {
      std::int64_t sum = 0;
      for (std::size_t i = 0; i < n; ++i) {
        ShardCounters* sh = shards_[i];
        cur[i] = current_of(sh, k, q);
        sum += cur[i];
        if (epoch_ - sh->last_trigger > kClaimLifetime)
          sh->high[k][q] = cur[i];  // idle: its old high-water mark claims nothing
        else
          sh->high[k][q] = std::max(sh->high[k][q], cur[i]);
      }
      std::int64_t& peak = peak_[k][q];
      peak = std::max(peak, sum);
      std::int64_t headroom = peak - sum;
      std::int64_t wanted = 0;
      for (std::size_t i = 0; i < n; ++i) {
        want[i] = std::max<std::int64_t>(0, shards_[i]->high[k][q] - cur[i]);
        wanted += want[i];
      }
      for (std::size_t i = 0; i < n; ++i) {
        std::int64_t extra;
        if (wanted <= headroom) {
          extra = want[i] + (headroom - wanted) / static_cast<std::int64_t>(n);
        } else {
          extra = static_cast<std::int64_t>(static_cast<int128>(want[i]) * headroom / wanted);
        }
        shards_[i]->limit[k][q].store(cur[i] + extra, std::memory_order_relaxed);
      }
    }
  }
}

void StatLedger::reset_peaks() {
  std::lock_guard<std::mutex> guard(mutex_);
  for (int k = 0; k < kStatKinds; ++k) {
    for (int q = 0; q < 3; ++q) {
      std::int64_t sum = 0;
      for (ShardCounters* s : shards_) {
        std::int64_t c = current_of(s, k, q);
        s->high[k][q] = c;
        sum += c;
      }
      peak_[k][q] = sum;
    }
  }
  rebalance_locked();
}

void StatLedger::reset_accumulated(ShardCounters* shard) {
  for (int k = 0; k < kStatKinds; ++k)
    for (int p = 0; p < 2; ++p) {
      shard->base[k][p].store(shard->current[k][p].load(std::memory_order_relaxed),
                              std::memory_order_relaxed);
      shard->removed[k][p].store(0, std::memory_order_relaxed);
    }
}

void StatLedger::read(DeviceStats* out) {
  std::lock_guard<std::mutex> guard(mutex_);
  StatArray* arrays[] = {
      &out->allocation,      &out->segment,        &out->active,       &out->inactive_split,
      &out->allocated_bytes, &out->reserved_bytes, &out->active_bytes, &out->inactive_split_bytes,
      &out->requested_bytes};
  for (int k = 0; k < kStatKinds; ++k) {
    Stat stat[3];
    for (int q = 0; q < 3; ++q) {
      for (ShardCounters* s : shards_) {
        stat[q].current += current_of(s, k, q);
        int p0 = q == 0 ? 0 : q - 1, p1 = q == 0 ? 1 : q - 1;
        for (int p = p0; p <= p1; ++p) {
          std::int64_t removed = s->removed[k][p].load(std::memory_order_relaxed);
          stat[q].allocated += s->current[k][p].load(std::memory_order_relaxed) -
                               s->base[k][p].load(std::memory_order_relaxed) + removed;
          stat[q].freed += removed;
        }
      }
      stat[q].peak = std::max(peak_[k][q], stat[q].current);
    }
    if (k < 9) {
      for (int q = 0; q < 3; ++q) arrays[k]->pool[q] = stat[q];
    } else if (k == kOversizeAllocations) {
      out->oversize_allocations = stat[0];
    } else {
      out->oversize_segments = stat[0];
    }
  }
}

}  // namespace reservoir::detail
