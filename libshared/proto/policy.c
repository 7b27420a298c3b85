/* Which parts each eviction policy's cache has, and the names of the ops
 * (both lists are in sinkd/protocol.h): the one table the daemon's `open`,
 * sinkctl's and eval's option checks read. */
#include "sinkd/protocol.h"

#include <string.h>

static const struct {
  const char *name;
  unsigned parts;
} sk__policy_parts[] = {
#define SK__POLICY_ROW(NAME, value, wire, parts) {wire, parts},
    SK_POLICY_LIST(SK__POLICY_ROW)
#undef SK__POLICY_ROW
};

unsigned sk_policy_parts(const char *name, size_t len) {
  if (!name) return 0;
  for (size_t i = 0; i < sizeof sk__policy_parts / sizeof sk__policy_parts[0]; i++)
    if (strlen(sk__policy_parts[i].name) == len && memcmp(sk__policy_parts[i].name, name, len) == 0)
      return sk__policy_parts[i].parts;
  return 0;
}

static const char *const sk__op_names[] = {
#define SK__OP_NAME(NAME, wire) wire,
    SK_OP_LIST(SK__OP_NAME)
#undef SK__OP_NAME
};

const char *sk_op_name(int op) {
  return op >= 0 && op < SK_OP__COUNT ? sk__op_names[op] : NULL;
}

int sk_op_from_name(const char *name, size_t len) {
  if (!name) return -1;
  for (int i = 0; i < SK_OP__COUNT; i++)
    if (strlen(sk__op_names[i]) == len && memcmp(sk__op_names[i], name, len) == 0) return i;
  return -1;
}
