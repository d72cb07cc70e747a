/* A C program on the process-wide allocator (the simulated device: no GPU, or
 * RESERVOIR_ALLOC_CONF=device:sim): 50 times, a 64 MiB block allocated on stream 0,
 * used on stream 1 and freed, then the host waits for stream 1 and stream 0. The
 * simulated device completes a stream's work at a host wait the program reports
 * (notify_host_wait), so each pending free completes: nothing stays active, and one
 * 64 MiB segment serves every round (before: 50 segments, all of them active).
 * Exits 0 when that holds, 1 (with the figures) when not, 2 on an API error. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reservoir/reservoir.h"

#define CHECK(call)                                                      \
  do {                                                                   \
    if ((call) != RESERVOIR_OK) {                                        \
      fprintf(stderr, "%s failed: %s\n", #call, reservoir_last_error()); \
      return 2;                                                          \
    }                                                                    \
  } while (0)

/* A statistic of device 0 by its memory_stats() key, or -1. */
static long long stat(const char* key) {
  static char text[1 << 16];
  size_t needed = 0;
  if (reservoir_stats_text(0, text, sizeof text, &needed) != RESERVOIR_OK) return -1;
  const size_t length = strlen(key);
  for (const char* line = text; *line != '\0';) {
    if (strncmp(line, key, length) == 0 && line[length] == ' ') return atoll(line + length + 1);
    const char* next = strchr(line, '\n');
    if (next == NULL) break;
    line = next + 1;
  }
  return -1;
}

int main(void) {
  const int64_t kBlock = (int64_t)64 << 20;
  for (int i = 0; i < 50; ++i) {
    void* p = NULL;
    CHECK(reservoir_allocate(&p, kBlock, 0, 0));
    CHECK(reservoir_record_stream(p, 1));
    CHECK(reservoir_free(p));
    CHECK(reservoir_notify_host_wait(1, 0));
    CHECK(reservoir_notify_host_wait(0, 0));
  }
  const long long active = stat("active_bytes.all.current");
  const long long reserved = stat("reserved_bytes.all.current");
  if (active != 0 || reserved != kBlock) {
    fprintf(stderr, "after 50 rounds: %lld bytes active (want 0), %lld reserved (want %lld)\n",
            active, reserved, (long long)kBlock);
    return 1;
  }
  CHECK(reservoir_validate());
  return 0;
}
