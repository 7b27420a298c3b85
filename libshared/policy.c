/* Which parts each eviction policy's cache has (see sinkd/protocol.h):
 * the one table the daemon's `open`, sinkctl's and eval's option checks
 * read. */
#include "sinkd/protocol.h"

#include <string.h>

static const struct {
  const char *name;
  unsigned parts;
} sk__policy_parts[] = {
    {"streaming", SK_PART_SINKS | SK_PART_WINDOW | SK_PART_PIN},
    {"window", SK_PART_WINDOW},
    {"h2o", SK_PART_HEAVY},
    {"sink_h2o", SK_PART_SINKS | SK_PART_HEAVY | SK_PART_PIN},
    {"dense", SK_PART_CAPACITY | SK_PART_PIN},
};

unsigned sk_policy_parts(const char *name, size_t len) {
  if (!name) return 0;
  for (size_t i = 0; i < sizeof sk__policy_parts / sizeof sk__policy_parts[0]; i++)
    if (strlen(sk__policy_parts[i].name) == len && memcmp(sk__policy_parts[i].name, name, len) == 0)
      return sk__policy_parts[i].parts;
  return 0;
}
