#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include "model/chat.h"
#include "session/kvcache.h"
#include "session/spec.h"
#include "base/log.h"
#include "base/safefile.h"
#include "sk_config.h"

enum key_type {
  T_PATH,      /* non-empty text; no control characters */
  T_U32,       /* decimal in [min, max] */
  T_U32_AUTO,  /* T_U32 or "auto" (stored as 0) */
  T_SIZE,      /* bytes with an optional K/M/G/T suffix (powers of 1024) */
  T_SIZE_AUTO, /* T_SIZE or "auto" (stored as 0) */
  T_POLICY,    /* a policy name */
  T_LOG_LEVEL, /* err, warning, notice, info, debug */
  T_KV_TYPE,   /* f32, f16 */
  T_CHAT,      /* a chat template family (chat.h), none or auto */
  T_SPEC,      /* auto, off, draft, lookup */
  T_BOOL,      /* yes/no, true/false, on/off, 1/0 (stored as 1/0 in a uint32_t) */
};

struct key_desc {
  const char *section;
  const char *name;
  const char *option; /* command-line flag */
  enum key_type type;
  size_t offset;      /* of the field in struct sk_config */
  uint64_t min, max;  /* numbers: max is the hard ceiling */
  bool reloadable;    /* SIGHUP applies it */
};

#define F(field) offsetof(struct sk_config, field)

/* One row per enum sk_config_key, in that order. The reasons of the
 * ceilings are at their SK_LIMIT_* definitions in config.h. */
static const struct key_desc keys[SK_CFG__COUNT] = {
    [SK_CFG_MODEL] = {"daemon", "model", "--model", T_PATH, F(model), 0, 0, false},
    [SK_CFG_SOCKET] = {"daemon", "socket", "--socket", T_PATH, F(socket), 0, 0, false},
    [SK_CFG_STATE_DIR] = {"daemon", "state_dir", "--state-dir", T_PATH, F(state_dir), 0, 0, false},
    [SK_CFG_THREADS] = {"daemon", "threads", "--threads", T_U32_AUTO, F(threads), 1,
                        SK_LIMIT_MAX_THREADS, false},
    [SK_CFG_BATCH] = {"daemon", "batch", "--batch", T_U32, F(batch), 1, SK_LIMIT_MAX_BATCH, false},
    [SK_CFG_STEP_TOKENS] = {"daemon", "step_tokens", "--step-tokens", T_U32, F(step_tokens), 1,
                            SK_LIMIT_MAX_BATCH, false},
    [SK_CFG_LOG_LEVEL] = {"daemon", "log_level", "--log-level", T_LOG_LEVEL, F(log_level), 0, 0,
                          true},
    /* fixed for the store's life (its new sessions' type; any type is adopted) */
    [SK_CFG_KV_TYPE] = {"daemon", "kv_type", "--kv-type", T_KV_TYPE, F(kv_type), 0, 0, false},
    /* resolved against the model at start */
    [SK_CFG_CHAT_TEMPLATE] = {"daemon", "chat_template", "--chat-template", T_CHAT,
                              F(chat_template), 0, 0, false},
    /* thresholds of the MLP sparsity levels, read once at start */
    [SK_CFG_SPARSITY_FILE] = {"daemon", "sparsity_file", "--sparsity-file", T_PATH,
                              F(sparsity_file), 0, 0, false},
    /* read once at start, its vocabulary checked against the model's */
    [SK_CFG_DRAFT_MODEL] = {"daemon", "draft_model", "--draft-model", T_PATH, F(draft_model), 0,
                            0, false},
    /* sizes every session's history, counted in its memory */
    [SK_CFG_LOOKUP_HISTORY] = {"daemon", "lookup_history", "--lookup-history", T_U32,
                               F(lookup_history), 0, SK_LIMIT_MAX_LOOKUP_HISTORY, false},
    [SK_CFG_POLICY] = {"session", "policy", "--policy", T_POLICY, F(policy), 0, 0, true},
    [SK_CFG_SINKS] = {"session", "sinks", "--sinks", T_U32, F(n_sink), 0, SK_LIMIT_MAX_CAPACITY,
                      true},
    [SK_CFG_WINDOW] = {"session", "window", "--window", T_U32_AUTO, F(window), 1,
                       SK_LIMIT_MAX_CAPACITY, true},
    [SK_CFG_CAPACITY] = {"session", "capacity", "--capacity", T_U32_AUTO, F(capacity), 1,
                         SK_LIMIT_MAX_CAPACITY, true},
    [SK_CFG_SPECULATION] = {"session", "speculation", "--speculation", T_SPEC, F(speculation),
                            0, 0, true},
    [SK_CFG_DRAFT_TOKENS] = {"session", "draft_tokens", "--draft-tokens", T_U32, F(draft_tokens),
                             1, SK_SPEC_MAX_TOKENS, true},
    [SK_CFG_MAX_CLIENTS] = {"limits", "max_clients", "--max-clients", T_U32, F(max_clients), 1,
                            SK_LIMIT_MAX_CLIENTS, true},
    [SK_CFG_MAX_SESSIONS] = {"limits", "max_sessions", "--max-sessions", T_U32, F(max_sessions),
                             1, SK_LIMIT_MAX_SESSIONS, true},
    [SK_CFG_MAX_CAPACITY] = {"limits", "max_capacity", "--max-capacity", T_U32_AUTO,
                             F(max_capacity), 1, SK_LIMIT_MAX_CAPACITY, true},
    [SK_CFG_MAX_MEMORY] = {"limits", "max_memory", "--max-memory", T_SIZE_AUTO, F(max_memory),
                           SK_LIMIT_MIN_MEMORY, 0 /* physical memory */, true},
    [SK_CFG_MAX_USER_SESSIONS] = {"limits", "max_user_sessions", "--max-user-sessions", T_U32,
                                  F(max_user_sessions), 1, SK_LIMIT_MAX_SESSIONS, true},
    [SK_CFG_MAX_USER_MEMORY] = {"limits", "max_user_memory", "--max-user-memory", T_SIZE_AUTO,
                                F(max_user_memory), SK_LIMIT_MIN_MEMORY,
                                0 /* physical memory */, true},
    [SK_CFG_MAX_FRAME] = {"limits", "max_frame", "--max-frame", T_SIZE, F(max_frame),
                          SK_LIMIT_MIN_FRAME, SK_LIMIT_MAX_FRAME, true},
    [SK_CFG_IDLE_TTL] = {"limits", "idle_ttl", "--idle-ttl", T_U32, F(idle_ttl), 0,
                         SK_LIMIT_MAX_IDLE_TTL, true},
    [SK_CFG_MAX_USER_CLIENTS] = {"limits", "max_user_clients", "--max-user-clients", T_U32,
                                 F(max_user_clients), 0, SK_LIMIT_MAX_CLIENTS, true},
    [SK_CFG_FRAME_TIMEOUT] = {"limits", "frame_timeout", "--frame-timeout", T_U32,
                              F(frame_timeout), 0, SK_LIMIT_MAX_FRAME_TIMEOUT, true},
    [SK_CFG_MAX_INPUT_MEMORY] = {"limits", "max_input_memory", "--max-input-memory",
                                 T_SIZE_AUTO, F(max_input_memory), SK_LIMIT_MIN_FRAME,
                                 0 /* physical memory */, true},
    [SK_CFG_MAX_USER_INPUT_MEMORY] = {"limits", "max_user_input_memory",
                                      "--max-user-input-memory", T_SIZE_AUTO,
                                      F(max_user_input_memory), SK_LIMIT_MIN_FRAME,
                                      0 /* physical memory */, true},
    [SK_CFG_HTTP_SOCKET] = {"daemon", "http_socket", "--http-socket", T_PATH, F(http_socket), 0, 0,
                            false},
    [SK_CFG_HTTP_LISTEN] = {"daemon", "http_listen", "--http-listen", T_PATH, F(http_listen), 0, 0,
                            false},
    [SK_CFG_HTTP_KEY_FILE] = {"daemon", "http_key_file", "--http-key-file", T_PATH, F(http_key_file), 0,
                              0, false},
    /* a uid: the kernel's uid_t, without (uid_t)-1, which means "none" */
    [SK_CFG_HTTP_UID] = {"daemon", "http_uid", "--http-uid", T_U32_AUTO, F(http_uid), 1,
                         UINT32_MAX - 1, false},
    [SK_CFG_HTTP_LISTEN_PUBLIC] = {"daemon", "http_listen_public", "--http-listen-public", T_BOOL,
                                   F(http_listen_public), 0, 1, false},
};

static const char *const log_level_names[] = {
    [SK_LOG_ERR] = "err", [SK_LOG_WARNING] = "warning", [SK_LOG_NOTICE] = "notice",
    [SK_LOG_INFO] = "info", [SK_LOG_DEBUG] = "debug",
};

const char *sk_config_log_level_name(uint32_t level) {
  if (level < SK_LOG_ERR || level > SK_LOG_DEBUG) return "?";
  return log_level_names[level];
}

const char *sk_config_key_name(enum sk_config_key key) { return keys[key].name; }
const char *sk_config_key_section(enum sk_config_key key) { return keys[key].section; }
const char *sk_config_key_option(enum sk_config_key key) { return keys[key].option; }
bool sk_config_key_reloadable(enum sk_config_key key) { return keys[key].reloadable; }

const char *sk_config_default_path(void) { return SK_SYSCONFDIR "/sinkd/sinkd.conf"; }

static char **field_str(struct sk_config *cfg, enum sk_config_key k) {
  return (char **)(void *)((char *)cfg + keys[k].offset);
}
static char *const *field_str_c(const struct sk_config *cfg, enum sk_config_key k) {
  return (char *const *)(const void *)((const char *)cfg + keys[k].offset);
}
/* max_memory and max_user_memory are 64-bit; the others are uint32_t. */
static bool is_u64(enum sk_config_key k) {
  return keys[k].offset == F(max_memory) || keys[k].offset == F(max_user_memory) ||
         keys[k].offset == F(max_input_memory) || keys[k].offset == F(max_user_input_memory);
}
static uint64_t field_num(const struct sk_config *cfg, enum sk_config_key k) {
  const char *p = (const char *)cfg + keys[k].offset;
  if (is_u64(k)) return *(const uint64_t *)(const void *)p;
  return *(const uint32_t *)(const void *)p;
}
static void field_num_set(struct sk_config *cfg, enum sk_config_key k, uint64_t v) {
  char *p = (char *)cfg + keys[k].offset;
  if (is_u64(k))
    *(uint64_t *)(void *)p = v;
  else
    *(uint32_t *)(void *)p = (uint32_t)v;
}

/* Physical memory in bytes: the ceiling of max_memory. */
static uint64_t physical_memory(void) {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return UINT64_MAX;
  /* Whole MiB, so that messages and --check-config show it readably. */
  return ((uint64_t)pages * (uint64_t)page) >> 20 << 20;
}

static uint64_t key_max(enum sk_config_key k) {
  return k == SK_CFG_MAX_MEMORY || k == SK_CFG_MAX_USER_MEMORY || k == SK_CFG_MAX_INPUT_MEMORY ||
                 k == SK_CFG_MAX_USER_INPUT_MEMORY
             ? physical_memory()
             : keys[k].max;
}

/* $XDG_RUNTIME_DIR/sinkd for users other than root when it is set, else
 * /run/sinkd. malloc'd. */
static char *runtime_dir(const char *leaf) {
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  char buf[PATH_MAX];
  int n;
  if (getuid() != 0 && xdg && *xdg)
    n = snprintf(buf, sizeof buf, "%s/sinkd%s%s", xdg, leaf ? "/" : "", leaf ? leaf : "");
  else
    n = snprintf(buf, sizeof buf, "/run/sinkd%s%s", leaf ? "/" : "", leaf ? leaf : "");
  if (n < 0 || (size_t)n >= sizeof buf) return NULL;
  return strdup(buf);
}

int sk_config_init(struct sk_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->socket = runtime_dir("sinkd.sock");
  cfg->state_dir = runtime_dir("state");
  if (!cfg->socket || !cfg->state_dir) {
    sk_config_done(cfg);
    return -SK_ERR_NO_MEMORY;
  }
  cfg->batch = SK_CONFIG_DEFAULT_BATCH;
  cfg->step_tokens = SK_CONFIG_DEFAULT_STEP_TOKENS;
  cfg->log_level = SK_LOG_INFO;
  cfg->kv_type = SK_KV_F16; /* llama.cpp's default cache type */
  cfg->chat_template = -1;  /* the model's own */
  cfg->policy = SK_POLICY_STREAMING;
  cfg->n_sink = SK_CONFIG_DEFAULT_N_SINK;
  cfg->max_clients = SK_CONFIG_DEFAULT_MAX_CLIENTS;
  cfg->max_sessions = SK_CONFIG_DEFAULT_MAX_SESSIONS;
  cfg->max_user_sessions = SK_CONFIG_DEFAULT_MAX_USER_SESSIONS;
  cfg->max_frame = SK_FRAME_MAX_DEFAULT;
  cfg->max_user_clients = SK_CONFIG_DEFAULT_MAX_USER_CLIENTS;
  cfg->frame_timeout = SK_CONFIG_DEFAULT_FRAME_TIMEOUT;
  cfg->idle_ttl = SK_CONFIG_DEFAULT_IDLE_TTL;
  cfg->lookup_history = SK_CONFIG_DEFAULT_LOOKUP_HISTORY;
  cfg->draft_tokens = SK_CONFIG_DEFAULT_DRAFT_TOKENS;
  return 0;
}

void sk_config_done(struct sk_config *cfg) {
  free(cfg->model);
  free(cfg->socket);
  free(cfg->state_dir);
  free(cfg->http_socket);
  free(cfg->http_listen);
  free(cfg->http_key_file);
  free(cfg->sparsity_file);
  free(cfg->draft_model);
  free(cfg->file);
  memset(cfg, 0, sizeof *cfg);
}

static int dup_opt(char **dst, const char *src) {
  *dst = NULL;
  if (!src) return 0;
  *dst = strdup(src);
  return *dst ? 0 : -SK_ERR_NO_MEMORY;
}

int sk_config_copy(struct sk_config *dst, const struct sk_config *src) {
  *dst = *src;
  dst->model = dst->socket = dst->state_dir = dst->file = NULL;
  dst->http_socket = dst->http_listen = dst->http_key_file = dst->sparsity_file = NULL;
  dst->draft_model = NULL;
  if (dup_opt(&dst->model, src->model) < 0 || dup_opt(&dst->socket, src->socket) < 0 ||
      dup_opt(&dst->state_dir, src->state_dir) < 0 || dup_opt(&dst->file, src->file) < 0 ||
      dup_opt(&dst->http_socket, src->http_socket) < 0 ||
      dup_opt(&dst->http_listen, src->http_listen) < 0 ||
      dup_opt(&dst->http_key_file, src->http_key_file) < 0 ||
      dup_opt(&dst->sparsity_file, src->sparsity_file) < 0 ||
      dup_opt(&dst->draft_model, src->draft_model) < 0) {
    sk_config_done(dst);
    return -SK_ERR_NO_MEMORY;
  }
  return 0;
}

/* ---- values ---------------------------------------------------------------- */

/* Strict decimal: digits only, no sign or spaces. */
static bool parse_dec(const char *s, uint64_t *ret) {
  if (*s < '0' || *s > '9') return false;
  errno = 0;
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end) return false;
  *ret = v;
  return true;
}

/* Digits with an optional K, M, G or T (powers of 1024, case-insensitive,
 * an optional trailing "B" or "iB"). */
static bool parse_size(const char *s, uint64_t *ret) {
  if (*s < '0' || *s > '9') return false;
  errno = 0;
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return false;
  unsigned shift = 0;
  switch (*end) {
  case 0: break;
  case 'k': case 'K': shift = 10; end++; break;
  case 'm': case 'M': shift = 20; end++; break;
  case 'g': case 'G': shift = 30; end++; break;
  case 't': case 'T': shift = 40; end++; break;
  default: return false;
  }
  if (shift && (*end == 'i' || *end == 'I')) end++;
  if (*end == 'b' || *end == 'B') end++;
  if (*end) return false;
  if (shift && v > (UINT64_MAX >> shift)) return false;
  *ret = (uint64_t)v << shift;
  return true;
}

static void format_size(uint64_t v, char *buf, size_t size) {
  static const char suffix[] = "KMGT";
  int i = -1;
  while (i < 3 && v && v % 1024 == 0) {
    v /= 1024;
    i++;
  }
  if (i < 0)
    snprintf(buf, size, "%" PRIu64, v);
  else
    snprintf(buf, size, "%" PRIu64 "%c", v, suffix[i]);
}

/* Path values: a file or a command line must not smuggle newlines or
 * other control bytes into paths that later appear in logs. */
static bool path_ok(const char *s) {
  if (!*s) return false;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    if (*p < 0x20 || *p == 0x7f) return false;
  return strlen(s) < PATH_MAX;
}

/* http listen: "ADDRESS:PORT" with a numeric IPv4 address, a bracketed
 * numeric IPv6 address or "localhost". */
static bool listen_ok(const char *s) {
  const char *colon = strrchr(s, ':');
  if (!colon || colon == s) return false;
  size_t host_len = (size_t)(colon - s);
  char host[64];
  if (host_len >= sizeof host) return false;
  memcpy(host, s, host_len);
  host[host_len] = 0;
  uint64_t port = 0;
  if (!parse_dec(colon + 1, &port) || port < 1 || port > 65535) return false;
  unsigned char addr[16];
  if (strcmp(host, "localhost") == 0) return true;
  if (host[0] == '[' && host[host_len - 1] == ']') {
    host[host_len - 1] = 0;
    return inet_pton(AF_INET6, host + 1, addr) == 1;
  }
  return inet_pton(AF_INET, host, addr) == 1;
}

bool sk_config_listen_loopback(const char *listen) {
  const char *colon = strrchr(listen, ':');
  if (!colon) return false;
  size_t n = (size_t)(colon - listen);
  char host[64];
  if (n >= sizeof host) return false;
  memcpy(host, listen, n);
  host[n] = 0;
  if (strcmp(host, "localhost") == 0) return true;
  unsigned char a[16];
  if (n > 2 && host[0] == '[' && host[n - 1] == ']') {
    host[n - 1] = 0;
    return inet_pton(AF_INET6, host + 1, a) == 1 && memcmp(a, &in6addr_loopback, 16) == 0;
  }
  return inet_pton(AF_INET, host, a) == 1 && a[0] == 127; /* 127.0.0.0/8 */
}

int sk_config_set(struct sk_config *cfg, enum sk_config_key key, const char *value,
                  enum sk_config_origin from, uint32_t line, struct sk_error *err) {
  const struct key_desc *d = &keys[key];
  uint64_t v = 0;
  switch (d->type) {
  case T_PATH: {
    if (!path_ok(value))
      return sk_error_set(err, SK_ERR_BAD_REQUEST,
                          "'%s' is not a path (must be non-empty, without control characters)",
                          value);
    /* inih reads ';' after the '=' or after a blank as a comment: such a
     * path could not be written back into sinkd.conf (--check-config) */
    if (value[0] == ';' || strstr(value, " ;") || strstr(value, "\t;"))
      return sk_error_set(err, SK_ERR_BAD_REQUEST,
                          "'%s': a path may not begin with ';' nor have one after a blank "
                          "(sinkd.conf reads it as a comment)",
                          value);
    if ((key == SK_CFG_SOCKET || key == SK_CFG_HTTP_SOCKET) && strlen(value) >= sizeof(((struct sockaddr_un *)0)->sun_path))
      return sk_error_set(err, SK_ERR_BAD_REQUEST,
                          "'%s' is longer than a socket path may be (%zu bytes)", value,
                          sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
    if (key == SK_CFG_HTTP_LISTEN && !listen_ok(value))
      return sk_error_set(err, SK_ERR_BAD_REQUEST,
                          "'%s' is not ADDRESS:PORT (a numeric IPv4 address, [IPv6] or "
                          "localhost; PORT 1 to 65535)",
                          value);
    if (key == SK_CFG_STATE_DIR && value[0] != '/')
      return sk_error_set(err, SK_ERR_BAD_REQUEST, "'%s' is not an absolute path", value);
    char *copy = strdup(value);
    if (!copy) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
    char **f = field_str(cfg, key);
    free(*f);
    *f = copy;
    break;
  }
  case T_U32:
  case T_U32_AUTO:
  case T_SIZE:
  case T_SIZE_AUTO: {
    bool is_auto = (d->type == T_U32_AUTO || d->type == T_SIZE_AUTO) && strcmp(value, "auto") == 0;
    bool size = d->type == T_SIZE || d->type == T_SIZE_AUTO;
    uint64_t max = key_max(key);
    if (!is_auto) {
      bool ok = size ? parse_size(value, &v) : parse_dec(value, &v);
      if (!ok || v < d->min || v > max) {
        char lo[32], hi[32];
        if (size) {
          format_size(d->min, lo, sizeof lo);
          format_size(max, hi, sizeof hi);
        } else {
          snprintf(lo, sizeof lo, "%" PRIu64, d->min);
          snprintf(hi, sizeof hi, "%" PRIu64, max);
        }
        return sk_error_set(err, SK_ERR_BAD_REQUEST, "'%s' is not %s in [%s, %s]%s", value,
                            size ? "a size (bytes, or with K, M, G, T)" : "a number", lo, hi,
                            is_auto || d->type == T_U32_AUTO || d->type == T_SIZE_AUTO
                                ? " or 'auto'"
                                : "");
      }
    }
    field_num_set(cfg, key, v);
    break;
  }
  case T_POLICY: {
    uint32_t p;
    struct sk_error pe;
    if (sk_policy_parse(value, strlen(value), &p, &pe) < 0)
      return sk_error_set(err, SK_ERR_BAD_REQUEST, "%s", pe.message);
    cfg->policy = p;
    break;
  }
  case T_KV_TYPE: {
    uint32_t t;
    struct sk_error te;
    if (sk_kv_type_parse(value, strlen(value), &t, &te) < 0)
      return sk_error_set(err, SK_ERR_BAD_REQUEST, "%s", te.message);
    cfg->kv_type = t;
    break;
  }
  case T_CHAT: {
    int t = strcmp(value, "auto") == 0 ? -1 : sk_chat_from_name(value, strlen(value));
    if (t < 0 && strcmp(value, "auto") != 0)
      return sk_error_set(err, SK_ERR_BAD_REQUEST,
                          "'%.64s' is not auto, none or a chat template family (chatml, llama2, "
                          "llama3, mistral-v7, phi3, gemma, ...: sinkd.conf(5) lists them)",
                          value);
    cfg->chat_template = t;
    break;
  }
  case T_SPEC: {
    int m = strcmp(value, "auto") == 0 ? SK_SPEC_DEFAULT
                                       : sk_spec_mode_parse(value, strlen(value));
    if (m < 0 || (m == SK_SPEC_DEFAULT && strcmp(value, "auto") != 0))
      return sk_error_set(err, SK_ERR_BAD_REQUEST,
                          "'%.64s' is not auto, off, draft or lookup", value);
    cfg->speculation = (uint32_t)m;
    break;
  }
  case T_BOOL: {
    static const char *const yes[] = {"yes", "true", "on", "1"}, *const no[] = {"no", "false",
                                                                               "off", "0"};
    int b = -1;
    for (size_t i = 0; i < 4; i++) {
      if (strcmp(value, yes[i]) == 0) b = 1;
      if (strcmp(value, no[i]) == 0) b = 0;
    }
    if (b < 0)
      return sk_error_set(err, SK_ERR_BAD_REQUEST, "'%.64s' is not yes or no", value);
    field_num_set(cfg, key, (uint64_t)b);
    break;
  }
  case T_LOG_LEVEL: {
    uint32_t level = 0;
    for (uint32_t l = SK_LOG_ERR; l <= SK_LOG_DEBUG; l++)
      if (strcmp(value, log_level_names[l]) == 0) level = l;
    if (!level)
      return sk_error_set(err, SK_ERR_BAD_REQUEST,
                          "'%s' is not a log level (err, warning, notice, info, debug)", value);
    cfg->log_level = level;
    break;
  }
  }
  cfg->origin[key].from = from;
  cfg->origin[key].line = line;
  cfg->origin[key].automatic = false;
  return 0;
}

int sk_config_overlay(struct sk_config *dst, const struct sk_config *src) {
  for (int k = 0; k < SK_CFG__COUNT; k++) {
    if (src->origin[k].from == SK_CONFIG_FROM_DEFAULT) continue;
    if (keys[k].type == T_PATH) {
      char *copy = strdup(*field_str_c(src, (enum sk_config_key)k));
      if (!copy) return -SK_ERR_NO_MEMORY;
      char **f = field_str(dst, (enum sk_config_key)k);
      free(*f);
      *f = copy;
    } else if (keys[k].type == T_POLICY) {
      dst->policy = src->policy;
    } else if (keys[k].type == T_LOG_LEVEL) {
      dst->log_level = src->log_level;
    } else if (keys[k].type == T_KV_TYPE) {
      dst->kv_type = src->kv_type;
    } else if (keys[k].type == T_CHAT) {
      dst->chat_template = src->chat_template;
    } else if (keys[k].type == T_SPEC) {
      dst->speculation = src->speculation;
    } else {
      field_num_set(dst, (enum sk_config_key)k, field_num(src, (enum sk_config_key)k));
    }
    dst->origin[k] = src->origin[k];
  }
  return 0;
}

void sk_config_format(const struct sk_config *cfg, enum sk_config_key key, char *buf,
                      size_t size) {
  const struct key_desc *d = &keys[key];
  switch (d->type) {
  case T_PATH: {
    const char *s = *field_str_c(cfg, key);
    snprintf(buf, size, "%s", s ? s : "");
    break;
  }
  case T_U32:
  case T_U32_AUTO: {
    uint64_t v = field_num(cfg, key);
    if (v == 0 && d->type == T_U32_AUTO)
      snprintf(buf, size, "auto");
    else
      snprintf(buf, size, "%" PRIu64, v);
    break;
  }
  case T_SIZE:
  case T_SIZE_AUTO: {
    uint64_t v = field_num(cfg, key);
    if (v == 0 && d->type == T_SIZE_AUTO)
      snprintf(buf, size, "auto");
    else
      format_size(v, buf, size);
    break;
  }
  case T_POLICY: {
    const char *n = sk_policy_name(cfg->policy);
    snprintf(buf, size, "%s", n ? n : "?");
    break;
  }
  case T_BOOL: snprintf(buf, size, "%s", field_num(cfg, key) ? "yes" : "no"); break;
  case T_LOG_LEVEL: snprintf(buf, size, "%s", sk_config_log_level_name(cfg->log_level)); break;
  case T_KV_TYPE: snprintf(buf, size, "%s", sk_kv_type_name(cfg->kv_type)); break;
  case T_CHAT:
    snprintf(buf, size, "%s", cfg->chat_template < 0 ? "auto" : sk_chat_name(cfg->chat_template));
    break;
  case T_SPEC:
    snprintf(buf, size, "%s",
             cfg->speculation == SK_SPEC_DEFAULT ? "auto" : sk_spec_mode_name(cfg->speculation));
    break;
  }
}

bool sk_config_same(const struct sk_config *a, const struct sk_config *b,
                    enum sk_config_key key) {
  char x[PATH_MAX + 32], y[PATH_MAX + 32];
  sk_config_format(a, key, x, sizeof x);
  sk_config_format(b, key, y, sizeof y);
  return strcmp(x, y) == 0;
}

/* ---- the file ------------------------------------------------------------- */

/* inih's default line buffer (INI_MAX_LINE): longer lines are refused here
 * rather than split by inih. */
#define LINE_MAX_BYTES 200u

struct load_state {
  struct sk_config *cfg;
  const char *path;
  FILE *f;
  uint32_t line;              /* number of the line inih is handling */
  uint32_t seen[SK_CFG__COUNT]; /* line where each key was set, 0 = not yet */
  char *buf;                  /* getline buffer */
  size_t buf_cap;
  struct sk_config_errors *errs;
  int fatal;                  /* -SK_ERR_NO_MEMORY / -SK_ERR_IO */
  int read_errno;             /* with fatal == -SK_ERR_IO */
  char bad_section[64];       /* last unknown section reported */
  uint32_t bad_section_line;
  char section[32];           /* the reader's view of the current section
                                 (a line "[name]"), for its own errors */
};

static void add_error(struct load_state *st, uint32_t line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void add_error(struct load_state *st, uint32_t line, const char *fmt, ...) {
  struct sk_config_errors *e = st->errs;
  if (e->n == SK_CONFIG_MAX_ERRORS) {
    e->dropped++;
    return;
  }
  char msg[SK_ERROR_MESSAGE_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  e->line[e->n] = line;
  sk_error_set(&e->e[e->n++], SK_ERR_BAD_REQUEST, "%s:%u: %s", st->path, line, msg);
}

static bool sk__name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* The name at s[*i] (letters, digits, '_'; at most 31 bytes) copied to
 * out[32], and the blanks after it skipped; *i is left past them. */
static void sk__line_name(const char *s, size_t len, size_t *i, char out[32]) {
  size_t n = 0;
  while (*i < len && sk__name_char(s[*i]) && n < 31) out[n++] = s[(*i)++];
  out[n] = 0;
  while (*i < len && (s[*i] == ' ' || s[*i] == '\t')) (*i)++;
}

/* The key of a line s of len bytes, "key = ..." or "key: ...", copied to
 * out[32]; "" when the line does not start so. */
static void sk__line_key(const char *s, size_t len, char out[32]) {
  size_t i = 0;
  sk__line_name(s, len, &i, out);
  if (i == len || (s[i] != '=' && s[i] != ':')) out[0] = 0;
}

/* Follows "[name]" lines so that the reader's errors name the section. */
static void sk__line_section(struct load_state *st, const char *s, size_t len) {
  if (len == 0 || s[0] != '[') return;
  char name[32];
  size_t i = 1;
  while (i < len && (s[i] == ' ' || s[i] == '\t')) i++;
  sk__line_name(s, len, &i, name);
  snprintf(st->section, sizeof st->section, "%s", i < len && s[i] == ']' ? name : "");
}

/* inih's reader: one whole line per call. Leading blanks are dropped so an
 * indented line is an ordinary line (not inih's continuation of the
 * previous value, which would make "key = a\n  b" mean two values). */
static char *reader(char *str, int num, void *stream) {
  struct load_state *st = stream;
  errno = 0;
  ssize_t n = getline(&st->buf, &st->buf_cap, st->f);
  if (n < 0) {
    if (errno == ENOMEM) {
      st->fatal = -SK_ERR_NO_MEMORY;
    } else if (ferror(st->f)) {
      st->fatal = -SK_ERR_IO;
      st->read_errno = errno;
    }
    return NULL;
  }
  st->line++;
  const char *s = st->buf;
  if ((size_t)n >= 3 && st->line == 1 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) s += 3;
  while (*s == ' ' || *s == '\t') s++;
  size_t len = strlen(s);
  size_t bytes = (size_t)(n - (s - st->buf));
  /* The limit is on the line's text: its newline is not passed on (inih
   * needs none), so a last line without one counts as one with it. */
  if (bytes && s[bytes - 1] == '\n' && len == bytes) {
    st->buf[(size_t)(s - st->buf) + bytes - 1] = '\0';
    len = --bytes;
  }
  if (len != bytes) {
    add_error(st, st->line, "the line holds a NUL byte");
    s = "\n";
    len = 1;
  } else if (len >= (size_t)num || len >= LINE_MAX_BYTES) {
    char key[32], where[sizeof st->section + sizeof key + 8] = "";
    sk__line_key(s, len, key);
    if (key[0])
      snprintf(where, sizeof where, "%s%s%s%s: ", st->section[0] ? "[" : "", st->section,
               st->section[0] ? "] " : "", key);
    add_error(st, st->line, "%sthe line is longer than %u bytes", where, LINE_MAX_BYTES - 1);
    s = "\n";
    len = 1;
  } else {
    sk__line_section(st, s, len);
  }
  memcpy(str, s, len + 1);
  return str;
}

/* Levenshtein distance of a and b, capped at 3 (enough to tell a typo
 * from another word); names longer than 63 bytes count as far. */
static uint32_t sk__edit_distance(const char *a, const char *b) {
  size_t n = strlen(a), m = strlen(b);
  if (n > 63 || m > 63) return 3;
  uint32_t row[64];
  for (size_t j = 0; j <= m; j++) row[j] = (uint32_t)j;
  for (size_t i = 1; i <= n; i++) {
    uint32_t diag = row[0];
    row[0] = (uint32_t)i;
    for (size_t j = 1; j <= m; j++) {
      uint32_t up = row[j];
      uint32_t v = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < v) v = up + 1;
      if (row[j - 1] + 1 < v) v = row[j - 1] + 1;
      row[j] = v;
      diag = up;
    }
  }
  return row[m] < 3 ? row[m] : 3;
}

static int handler(void *user, const char *section, const char *name, const char *value) {
  struct load_state *st = user;
  int key = -1;
  bool section_known = false;
  for (int k = 0; k < SK_CFG__COUNT; k++) {
    if (strcmp(keys[k].section, section) != 0) continue;
    section_known = true;
    if (strcmp(keys[k].name, name) == 0) key = k;
  }
  if (!*section) {
    add_error(st, st->line, "%s: keys must be in a section ([daemon], [session], [limits])",
              name);
    return 1;
  }
  if (!section_known) {
    /* Once per section, not once per key in it. */
    if (st->bad_section_line && strcmp(st->bad_section, section) == 0) return 1;
    snprintf(st->bad_section, sizeof st->bad_section, "%s", section);
    st->bad_section_line = st->line;
    add_error(st, st->line, "[%s]: unknown section (sections: [daemon], [session], [limits])",
              section);
    return 1;
  }
  if (key < 0) {
    /* A key of another section: name that section. */
    for (int k = 0; k < SK_CFG__COUNT; k++)
      if (strcmp(keys[k].name, name) == 0) {
        add_error(st, st->line, "[%s] %s: unknown key here (it belongs in [%s])", section, name,
                  keys[k].section);
        return 1;
      }
    /* A misspelt key: name the one meant (the whole list of [limits] no
     * longer fits one message). */
    int near = -1;
    uint32_t best = 3;
    for (int k = 0; k < SK_CFG__COUNT; k++) {
      if (strcmp(keys[k].section, section) != 0) continue;
      uint32_t d = sk__edit_distance(name, keys[k].name);
      if (d < best) {
        best = d;
        near = k;
      }
    }
    if (near >= 0) {
      add_error(st, st->line, "[%s] %s: unknown key (did you mean %s?)", section, name,
                keys[near].name);
      return 1;
    }
    char known[256];
    size_t w = 0;
    known[0] = 0;
    for (int k = 0; k < SK_CFG__COUNT; k++)
      if (strcmp(keys[k].section, section) == 0 && w < sizeof known)
        w += (size_t)snprintf(known + w, sizeof known - w, "%s%s", w ? ", " : "", keys[k].name);
    /* a list longer than one message: the manual lists the keys */
    if (w >= sizeof known ||
        (size_t)snprintf(NULL, 0, "%s:%u: [%s] %s: unknown key (keys of [%s]: %s)", st->path,
                         st->line, section, name, section, known) >= SK_ERROR_MESSAGE_MAX)
      add_error(st, st->line, "[%s] %s: unknown key (sinkd.conf(5) lists the keys of [%s])",
                section, name, section);
    else
      add_error(st, st->line, "[%s] %s: unknown key (keys of [%s]: %s)", section, name, section,
                known);
    return 1;
  }
  if (st->seen[key]) {
    add_error(st, st->line, "[%s] %s: given again (first on line %u)", section, name,
              st->seen[key]);
    return 1;
  }
  st->seen[key] = st->line;
  struct sk_error e;
  int rc = sk_config_set(st->cfg, (enum sk_config_key)key, value, SK_CONFIG_FROM_FILE, st->line,
                         &e);
  if (rc == -SK_ERR_NO_MEMORY) {
    st->fatal = rc;
    return 0;
  }
  if (rc < 0) {
    add_error(st, st->line, "[%s] %s: %s", section, name, e.message);
    return 1;
  }
  /* What --check-config writes back ("key = value") must fit a line too,
   * so "key=value" in 199 bytes does not become a line of 201. */
  char v[LINE_MAX_BYTES + 1];
  sk_config_format(st->cfg, (enum sk_config_key)key, v, sizeof v);
  size_t most = LINE_MAX_BYTES - 1 - strlen(name) - 3;
  if (strlen(v) > most)
    add_error(st, st->line, "[%s] %s: the value is longer than %zu bytes (the line '%s = "
              "VALUE' may hold at most %u)", section, name, most, name, LINE_MAX_BYTES - 1);
  return 1;
}

int sk_config_load(struct sk_config *cfg, const char *path, bool must_exist,
                   struct sk_config_errors *errs) {
  memset(errs, 0, sizeof *errs);
  /* Read whole before parsing, as a regular file of bounded size: a FIFO
   * or /dev/zero named as the configuration (or swapped in before a
   * reload) is refused at once instead of hanging the daemon. */
  char *text = NULL;
  size_t text_len = 0;
  struct sk_error fe;
  struct stat sb;
  int frc;
  if (stat(path, &sb) == 0 && S_ISCHR(sb.st_mode) && sb.st_rdev == makedev(1, 3)) {
    /* /dev/null: no configuration (sinkd --config /dev/null), read as
     * an empty file. */
    frc = (text = calloc(1, 1)) ? 0 : -SK_ERR_NO_MEMORY;
  } else {
    frc = sk_safefile_read(AT_FDCWD, path, 0, SK_LIMIT_CONFIG_BYTES, NULL, &text, &text_len,
                           &fe);
  }
  if (frc < 0) {
    int e = errno;
    if (frc == -SK_ERR_NO_MEMORY) return frc;
    if (e == ENOENT && !must_exist) return 1;
    errs->n = 1;
    if (e)
      return sk_error_set(&errs->e[0], SK_ERR_IO, "%s: cannot read the configuration: %s", path,
                          strerror(e));
    return sk_error_set(&errs->e[0], SK_ERR_IO, "cannot read the configuration: %s",
                        fe.message);
  }
  int rc = sk_config_load_text(cfg, path, text, text_len, errs);
  free(text);
  return rc;
}

int sk_config_load_text(struct sk_config *cfg, const char *path, const char *text, size_t len,
                        struct sk_config_errors *errs) {
  memset(errs, 0, sizeof *errs);
  struct load_state st = {.cfg = cfg, .path = path, .errs = errs};
  free(cfg->file);
  cfg->file = strdup(path);
  if (!cfg->file) return -SK_ERR_NO_MEMORY;
  int rc = 0;
  if (len) {
    st.f = fmemopen((void *)text, len, "r");
    if (!st.f) return -SK_ERR_NO_MEMORY;
    rc = ini_parse_stream(reader, &st, handler, &st);
    fclose(st.f);
  }
  free(st.buf);
  if (st.fatal == -SK_ERR_NO_MEMORY) return st.fatal;
  if (st.fatal == -SK_ERR_IO) {
    errs->n = 1;
    return sk_error_set(&errs->e[0], SK_ERR_IO, "%s: cannot read the configuration: %s", path,
                        strerror(st.read_errno));
  }
  /* inih reports syntax errors (a line that is neither "[section]" nor
   * "key = value") by the number of the first one. */
  if (rc > 0) {
    bool known = false;
    for (uint32_t i = 0; i < errs->n; i++) known |= errs->line[i] == (uint32_t)rc;
    if (!known)
      add_error(&st, (uint32_t)rc,
                "syntax error: expected '[section]', 'key = value' or a comment (; or #)");
  } else if (rc < 0) {
    return -SK_ERR_NO_MEMORY;
  }
  if (errs->n == 0) return 0;
  /* Line order: the syntax error comes last but may be on any line. */
  for (uint32_t i = 1; i < errs->n; i++)
    for (uint32_t j = i; j > 0 && errs->line[j - 1] > errs->line[j]; j--) {
      struct sk_error t = errs->e[j - 1];
      uint32_t tl = errs->line[j - 1];
      errs->e[j - 1] = errs->e[j];
      errs->line[j - 1] = errs->line[j];
      errs->e[j] = t;
      errs->line[j] = tl;
    }
  return -SK_ERR_BAD_REQUEST;
}

/* ---- resolution and printing --------------------------------------------- */

/* "FILE:LINE: [section] key: " or "--option: " for messages about a value. */
static void where(const struct sk_config *cfg, enum sk_config_key k, char *buf, size_t size) {
  switch (cfg->origin[k].from) {
  case SK_CONFIG_FROM_FILE:
    snprintf(buf, size, "%s:%u: [%s] %s: ", cfg->file ? cfg->file : "?", cfg->origin[k].line,
             keys[k].section, keys[k].name);
    break;
  case SK_CONFIG_FROM_COMMAND_LINE: snprintf(buf, size, "%s: ", keys[k].option); break;
  default: snprintf(buf, size, "[%s] %s (default): ", keys[k].section, keys[k].name); break;
  }
}

int sk_config_resolve_sockets(struct sk_config *cfg, struct sk_error *err) {
  if (cfg->http_socket || !cfg->socket) return 0;
  /* Beside the msgpack socket: the same folder, so the same access, and
   * its name, so that two daemons whose sockets share a folder do not
   * want the same one. */
  const char *slash = strrchr(cfg->socket, '/');
  const char *name = slash ? slash + 1 : cfg->socket;
  size_t stem = strlen(name);
  if (stem > 5 && strcmp(name + stem - 5, ".sock") == 0) stem -= 5;
  char path[PATH_MAX];
  int n = snprintf(path, sizeof path, "%.*s%.*s-http.sock", (int)(name - cfg->socket),
                   cfg->socket, (int)stem, name);
  if (n < 0 || (size_t)n >= sizeof(((struct sockaddr_un *)0)->sun_path))
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "[daemon] http_socket (default): '%s' would be longer than a socket "
                        "path may be; set http_socket or --http-socket",
                        path);
  cfg->http_socket = strdup(path);
  if (!cfg->http_socket) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  cfg->origin[SK_CFG_HTTP_SOCKET].automatic = true;
  return 0;
}

int sk_config_read_key(const char *path, char *ret, size_t size, struct sk_error *err) {
  /* base/safefile: a FIFO (or a device) there must not hang the start;
   * it is refused, before anything is read. */
  struct stat st;
  memset(&st, 0, sizeof st);
  struct sk_error fe;
  int fd = sk_safefile_open(AT_FDCWD, path, SK_SAFEFILE_NOFOLLOW, UINT64_MAX / 4, NULL, &st, &fe);
  if (fd < 0 && st.st_mode == 0) { /* not opened */
    int e = errno;
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "http_key_file %s: %s%s", path, strerror(e),
                        e == ELOOP ? " (a symbolic link: name the file itself)" : "");
  }
  if (fd < 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "http_key_file %s: must be a regular file of mode 0600 (it is not a "
                        "regular file: %s)",
                        path, sk_safefile_kind(st.st_mode));
  if (st.st_mode & 077) {
    close(fd);
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "http_key_file %s: must be a regular file of mode 0600 (it is %04o): "
                        "chmod 600 %s",
                        path, (unsigned)(st.st_mode & 07777), path);
  }
  const bool too_long = st.st_size >= (off_t)size; /* refused below, unread */
  ssize_t n = too_long ? 0 : read(fd, ret, size - 1);
  close(fd);
  if (n < 0) n = 0;
  ret[n] = 0;
  while (n > 0 && (ret[n - 1] == '\n' || ret[n - 1] == '\r' || ret[n - 1] == ' ')) ret[--n] = 0;
  bool ok = !too_long && n >= SK_CONFIG_MIN_KEY && (size_t)n < size - 1;
  for (ssize_t i = 0; i < n; i++)
    if ((unsigned char)ret[i] <= 0x20 || ret[i] == 0x7f) ok = false;
  if (!ok) {
    memset(ret, 0, size);
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "http_key_file %s: the key must be one line of %u to %zu printable "
                        "characters without spaces",
                        path, SK_CONFIG_MIN_KEY, size - 2);
  }
  return 0;
}

int sk_config_resolve(struct sk_config *cfg, const struct sk_model_config *mc,
                      struct sk_error *err) {
  char at[PATH_MAX + 64];
  if (!cfg->model)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "no model: set 'model' in [daemon] of %s or pass --model FILE",
                        cfg->file ? cfg->file : sk_config_default_path());
  int rc = sk_config_resolve_sockets(cfg, err);
  if (rc < 0) return rc;
  if (cfg->http_listen && !cfg->http_key_file) {
    where(cfg, SK_CFG_HTTP_LISTEN, at, sizeof at);
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "%sa TCP listener needs an API key: set http_key_file (or "
                        "--http-key-file) to a file of mode 0600 holding it",
                        at);
  }
  if (cfg->speculation == SK_SPEC_DRAFT && !cfg->draft_model) {
    where(cfg, SK_CFG_SPECULATION, at, sizeof at);
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "%sspeculation draft needs a draft model: set draft_model (or "
                        "--draft-model) in [daemon], or speculation lookup or off",
                        at);
  }
  if (cfg->speculation == SK_SPEC_LOOKUP && cfg->lookup_history == 0) {
    where(cfg, SK_CFG_SPECULATION, at, sizeof at);
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "%sspeculation lookup needs a history: lookup_history is 0", at);
  }
  if (cfg->http_listen && !cfg->http_listen_public && !sk_config_listen_loopback(cfg->http_listen)) {
    where(cfg, SK_CFG_HTTP_LISTEN, at, sizeof at);
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "%shttp_listen %s is not a loopback address: other machines could reach "
                        "it; set http_listen_public = yes (or --http-listen-public yes) to mean it",
                        at, cfg->http_listen);
  }
  if (cfg->http_uid == 0) {
    /* TCP requests carry no uid: they act as sinkd's own, never as root
     * (who may use every session); as root, as nobody. */
    uid_t self = getuid();
    if (self == 0) {
      struct passwd *pw = getpwnam("nobody");
      self = pw && pw->pw_uid != 0 ? pw->pw_uid : SK_CONFIG_NOBODY_UID;
    }
    cfg->http_uid = (uint32_t)self;
    cfg->origin[SK_CFG_HTTP_UID].automatic = true;
  }
  if (cfg->threads == 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > (long)SK_LIMIT_MAX_THREADS) n = SK_LIMIT_MAX_THREADS;
    cfg->threads = (uint32_t)n;
    cfg->origin[SK_CFG_THREADS].automatic = true;
  }
  if (cfg->max_memory == 0) {
    uint64_t phys = physical_memory();
    cfg->max_memory = phys == UINT64_MAX ? (1ull << 34) : phys / 2 >> 20 << 20;
    if (cfg->max_memory < SK_LIMIT_MIN_MEMORY) cfg->max_memory = SK_LIMIT_MIN_MEMORY;
    cfg->origin[SK_CFG_MAX_MEMORY].automatic = true;
  }
  /* auto: as much as everyone together; set it lower on a machine shared
   * by several users, so that one cannot take all (max_user_sessions,
   * 16 of 64 by default, already keeps some sessions for others). */
  if (cfg->max_user_memory == 0) {
    cfg->max_user_memory = cfg->max_memory;
    cfg->origin[SK_CFG_MAX_USER_MEMORY].automatic = true;
  }
  /* Input memory: a whole frame of max_frame (and its header) must fit. */
  if (cfg->max_input_memory == 0) {
    cfg->max_input_memory = (uint64_t)SK_CONFIG_INPUT_FRAMES * cfg->max_frame;
    cfg->origin[SK_CFG_MAX_INPUT_MEMORY].automatic = true;
  }
  if (cfg->max_user_input_memory == 0) {
    cfg->max_user_input_memory = (uint64_t)SK_CONFIG_USER_INPUT_FRAMES * cfg->max_frame;
    if (cfg->max_user_input_memory > cfg->max_input_memory)
      cfg->max_user_input_memory = cfg->max_input_memory;
    cfg->origin[SK_CFG_MAX_USER_INPUT_MEMORY].automatic = true;
  }
  static const enum sk_config_key input_keys[] = {SK_CFG_MAX_INPUT_MEMORY,
                                                  SK_CFG_MAX_USER_INPUT_MEMORY};
  for (size_t i = 0; i < 2; i++) {
    enum sk_config_key k = input_keys[i];
    uint64_t v = field_num(cfg, k);
    if (v < (uint64_t)cfg->max_frame + SK_FRAME_HEADER_SIZE) {
      where(cfg, k, at, sizeof at);
      return sk_error_set(err, SK_ERR_BAD_REQUEST,
                          "%s%" PRIu64 " bytes is less than one whole request frame "
                          "(max_frame %u + %u bytes of header)",
                          at, v, cfg->max_frame, (unsigned)SK_FRAME_HEADER_SIZE);
    }
  }
  if (!mc) return 0;
  uint32_t ctx = mc->n_ctx_train ? mc->n_ctx_train : 1;
  if (cfg->max_capacity == 0) {
    cfg->max_capacity = ctx > SK_CONFIG_DEFAULT_MAX_CAPACITY ? ctx : SK_CONFIG_DEFAULT_MAX_CAPACITY;
    if (cfg->max_capacity > SK_LIMIT_MAX_CAPACITY) cfg->max_capacity = SK_LIMIT_MAX_CAPACITY;
    cfg->origin[SK_CFG_MAX_CAPACITY].automatic = true;
  }
  if (cfg->window == 0) {
    uint32_t span = ctx < SK_CONFIG_DEFAULT_WINDOW_SPAN ? ctx : SK_CONFIG_DEFAULT_WINDOW_SPAN;
    /* Sinks that fill the whole span would leave an automatic window of
     * nothing: say so rather than quietly making it 1. */
    if (cfg->n_sink >= span) {
      where(cfg, SK_CFG_SINKS, at, sizeof at);
      return sk_error_set(err, SK_ERR_BAD_REQUEST,
                          "%s%u sinks leave no room for the automatic window: it is min(model "
                          "context %u, %u) - sinks = %u - %u; give fewer sinks than %u, or set "
                          "window",
                          at, cfg->n_sink, ctx, SK_CONFIG_DEFAULT_WINDOW_SPAN, span, cfg->n_sink,
                          span);
    }
    cfg->window = span - cfg->n_sink;
    cfg->origin[SK_CFG_WINDOW].automatic = true;
  }
  if (cfg->capacity == 0) {
    cfg->capacity = ctx < cfg->max_capacity ? ctx : cfg->max_capacity;
    cfg->origin[SK_CFG_CAPACITY].automatic = true;
  }
  /* The defaults must themselves open, for every policy: within the
   * largest capacity and the positions the model handles (as `open`
   * checks them). */
  struct sk_kv_params p = {.n_sink = cfg->n_sink, .window = cfg->window, .capacity = cfg->capacity,
                           .rope_scale = 1.0f};
  struct sk_error e;
  p.policy = SK_POLICY_STREAMING;
  if (sk_kv_params_check(&p, cfg->max_capacity, &e) < 0 ||
      sk_kv_params_check_context(&p, mc->n_ctx_train, &e) < 0) {
    enum sk_config_key k = cfg->origin[SK_CFG_WINDOW].from >= cfg->origin[SK_CFG_SINKS].from
                               ? SK_CFG_WINDOW
                               : SK_CFG_SINKS;
    where(cfg, k, at, sizeof at);
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "%sdefault streaming session: %s", at,
                        e.message);
  }
  p.policy = SK_POLICY_DENSE;
  if (sk_kv_params_check(&p, cfg->max_capacity, &e) < 0 ||
      sk_kv_params_check_context(&p, mc->n_ctx_train, &e) < 0) {
    where(cfg, SK_CFG_CAPACITY, at, sizeof at);
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "%sdefault dense session: %s", at, e.message);
  }
  return 0;
}

void sk_config_print(FILE *f, const struct sk_config *cfg) {
  fprintf(f, "# sinkd %s: effective configuration\n", SK_VERSION);
  fprintf(f, "# file: %s\n", cfg->file ? cfg->file : "(none)");
  const char *section = "";
  for (int k = 0; k < SK_CFG__COUNT; k++) {
    if (strcmp(section, keys[k].section) != 0) {
      section = keys[k].section;
      fprintf(f, "\n[%s]\n", section);
    }
    char value[PATH_MAX + 32];
    sk_config_format(cfg, (enum sk_config_key)k, value, sizeof value);
    if (keys[k].type == T_PATH && !*field_str_c(cfg, (enum sk_config_key)k)) {
      fprintf(f, "; %s = (not set)\n", keys[k].name);
      continue;
    }
    fprintf(f, "%s = %s", keys[k].name, value);
    switch (cfg->origin[k].from) {
    case SK_CONFIG_FROM_FILE:
      fprintf(f, " ; %s:%u", cfg->file ? cfg->file : "?", cfg->origin[k].line);
      break;
    case SK_CONFIG_FROM_COMMAND_LINE: fprintf(f, " ; command line %s", keys[k].option); break;
    default: fprintf(f, " ; default"); break;
    }
    if (cfg->origin[k].automatic) fprintf(f, " (auto)");
    fputc('\n', f);
  }
}
