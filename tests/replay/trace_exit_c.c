/* A C program on the C API: THREADS threads each allocate and free COUNT blocks on
 * their own stream, with record_trace set in RESERVOIR_ALLOC_CONF; main returns
 * without stopping the recording. trace_exit_test.cpp checks that the trace holds
 * every event (it once ended early: the recorder was never closed).
 *
 *   trace_exit_c THREADS COUNT
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "reservoir/reservoir.h"

static int g_count;

static void* worker(void* arg) {
  uintptr_t stream = (uintptr_t)arg;
  for (int i = 0; i < g_count; ++i) {
    void* p = NULL;
    if (reservoir_allocate(&p, 256 + 32 * (i % 64), 0, stream) != RESERVOIR_OK) {
      fprintf(stderr, "allocate failed: %s\n", reservoir_last_error());
      exit(3);
    }
    if (i % 10 == 0) reservoir_notify_host_wait(stream, 0);
    if (reservoir_free(p) != RESERVOIR_OK) {
      fprintf(stderr, "free failed: %s\n", reservoir_last_error());
      exit(3);
    }
  }
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: trace_exit_c THREADS COUNT\n");
    return 2;
  }
  int threads = atoi(argv[1]);
  g_count = atoi(argv[2]);
  pthread_t ids[64];
  if (threads < 1 || threads > 64) return 2;
  for (int t = 0; t < threads; ++t)
    pthread_create(&ids[t], NULL, worker, (void*)(uintptr_t)(0x1000 + t));
  for (int t = 0; t < threads; ++t) pthread_join(ids[t], NULL);
  return 0;
}
