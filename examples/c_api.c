/* Reservoir from C: every call returns a status code, and reservoir_last_error()
 * says what went wrong. Runs on the GPU when there is one, else on the simulated
 * device.
 *
 *   build/release/examples/example_c_api
 */
#include <reservoir/reservoir.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Prints the failed call and the library's message; returns the status. */
static reservoir_status check(reservoir_status status, const char* call) {
  if (status != RESERVOIR_OK)
    fprintf(stderr, "%s: %s: %s\n", call, reservoir_status_name(status), reservoir_last_error());
  return status;
}

int main(void) {
  const char* backend = NULL;
  if (check(reservoir_backend_name(&backend), "reservoir_backend_name")) return 1;
  printf("Reservoir %s on the %s device\n", reservoir_version(), backend);

  /* device -1: the current device; stream 0: the default stream (a cudaStream_t
   * converted to uintptr_t names any other). */
  void* p = NULL;
  if (check(reservoir_allocate(&p, 32 << 20, -1, 0), "reservoir_allocate")) return 1;

  /* The statistics as "name value" lines, with torch.cuda.memory_stats() names. A
   * first call with no buffer says how large one must be. */
  size_t needed = 0;
  if (check(reservoir_stats_text(-1, NULL, 0, &needed), "reservoir_stats_text")) return 1;
  char* stats = malloc(needed);
  if (stats == NULL ||
      check(reservoir_stats_text(-1, stats, needed, &needed), "reservoir_stats_text"))
    return 1;
  long long allocated = -1;
  const char* line = strstr(stats, "allocated_bytes.all.current ");
  if (line != NULL) sscanf(line, "allocated_bytes.all.current %lld", &allocated);
  free(stats);
  printf("allocated_bytes.all.current %lld\n", allocated);
  const int counted = allocated == 32 << 20;

  /* Errors are codes, never crashes: a negative size, and more memory than exists. */
  void* q = NULL;
  const reservoir_status negative = reservoir_allocate(&q, -1, -1, 0);
  printf("size -1: %s (%s)\n", reservoir_status_name(negative), reservoir_last_error());
  const reservoir_status huge = reservoir_allocate(&q, (int64_t)1 << 50, -1, 0);
  printf("1 PiB: %s\n", reservoir_status_name(huge));

  if (check(reservoir_free(p), "reservoir_free")) return 1;
  if (check(reservoir_empty_cache(), "reservoir_empty_cache")) return 1;
  return counted && negative == RESERVOIR_ERROR_INVALID_ARGUMENT &&
                 huge == RESERVOIR_ERROR_OUT_OF_MEMORY
             ? 0
             : 1;
}
