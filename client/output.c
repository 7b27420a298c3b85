/* sinkctl's output: messages and errors (text on stderr, or JSON on
 * stdout with --json), and the figures of sessions and of the daemon as
 * text or JSON. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "sinkctl.h"

const char *const prog = "sinkctl";
bool g_json;
bool g_escape;

/* ---- the model's text ------------------------------------------------- */

void print_model_text(const char *text, size_t len) {
  if (!g_escape) {
    fwrite(text, 1, len, stdout);
    return;
  }
  const unsigned char *p = (const unsigned char *)text;
  size_t start = 0;
  for (size_t i = 0; i < len; i++) {
    bool c0 = (p[i] < 0x20 && p[i] != '\n' && p[i] != '\t') || p[i] == 0x7f;
    bool c1 = p[i] == 0xc2 && i + 1 < len && p[i + 1] >= 0x80 && p[i + 1] <= 0x9f;
    if (!c0 && !c1) continue;
    fwrite(text + start, 1, i - start, stdout);
    if (c0) {
      printf("\\x%02x", p[i]);
    } else {
      printf("\\u%04x", p[i + 1]);
      i++;
    }
    start = i + 1;
  }
  fwrite(text + start, 1, len - start, stdout);
}

/* ---- messages --------------------------------------------------------- */

/* The one wording for a dense session that holds all it can, whether a
 * generate stopped there or an append did not fit (the daemon's
 * context_full message starts the same). */
#define FULL_SESSION_WORDS "the dense session is full"
#define FULL_SESSION_HINT "open one with --policy streaming to keep going"

void say_session_full(uint64_t resident) {
  fprintf(stderr, "%s: " FULL_SESSION_WORDS " (%" PRIu64 " tokens): " FULL_SESSION_HINT "\n",
          prog, resident);
}

int report(const struct sk_client *c, const struct sk_error *e) {
  const char *hint = "";
  if (e->code == SK_ERR_CONTEXT_FULL)
    hint = FULL_SESSION_HINT;
  else if (e->code == SK_ERR_NO_SUCH_SESSION)
    hint = "sessions end when closed or after the idle TTL; a restart keeps them unless "
           "sinkd set them aside at start, e.g. for another model: see its log and "
           "invalid/ in its state directory; `sinkctl list` shows yours";
  else if (e->code == SK_ERR_FORBIDDEN)
    hint = "only its owner and root may use it";
  int status = sk_client_connected(c) ? EXIT_DAEMON_ERROR : EXIT_CONNECTION;
  if (g_json) {
    json_error(sk_error_name(e->code), e->message, hint, status);
    return status;
  }
  fprintf(stderr, "%s: %s: %s%s%s%s\n", prog, sk_error_name(e->code), e->message,
          *hint ? " (" : "", hint, *hint ? ")" : "");
  return status;
}

/* ---- JSON ----------------------------------------------------------- */

void json_error(const char *code, const char *message, const char *hint, int status) {
  fputs("{\"error\": {\"code\": ", stdout);
  sk_cli_json_cstr(stdout, code);
  fputs(", \"message\": ", stdout);
  sk_cli_json_cstr(stdout, message);
  if (hint && *hint) {
    fputs(", \"hint\": ", stdout);
    sk_cli_json_cstr(stdout, hint);
  }
  printf(", \"status\": %d}}\n", status);
  fflush(stdout);
}

void json_key(FILE *f, bool *first, const char *key) {
  if (!*first) fputs(", ", f);
  *first = false;
  sk_cli_json_cstr(f, key);
  fputs(": ", f);
}

void json_kv_u64(FILE *f, bool *first, const char *key, uint64_t v) {
  json_key(f, first, key);
  fprintf(f, "%" PRIu64, v);
}

void json_kv_str(FILE *f, bool *first, const char *key, const char *v) {
  json_key(f, first, key);
  sk_cli_json_cstr(f, v);
}

/* ---- session figures, shared by stats and chat's /stats ------------------------ */

/* 1327232 -> "1.3 MiB". */
void human_bytes(uint64_t v, char *buf, size_t size) {
  static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double d = (double)v;
  int u = 0;
  while (d >= 1024 && u < 4) {
    d /= 1024;
    u++;
  }
  if (u == 0)
    snprintf(buf, size, "%" PRIu64 " bytes", v);
  else
    snprintf(buf, size, "%.1f %s", d, units[u]);
}

void print_spec(const char *label, const struct sk_spec_info *sp) {
  printf("%-17s %s", label, sp->mode[0] ? sp->mode : "off");
  if (sp->draft_tokens)
    printf(", up to %" PRIu32 " tokens a step%s", sp->draft_tokens,
           sp->draft_fixed ? " (fixed)" : "");
  if (sp->draft_model[0]) printf(", draft model %s", sp->draft_model);
  if (sp->lookup_history) printf(", history %" PRIu32 " tokens", sp->lookup_history);
  printf("; %" PRIu64 " drafted, %" PRIu64 " accepted, %" PRIu64 " rejected", sp->drafted,
         sp->accepted, sp->rejected);
  if (sp->drafted) printf(" (%.1f%% accepted)", 100.0 * sp->acceptance);
  putchar('\n');
}

void json_spec(bool *first, const struct sk_spec_info *sp) {
  bool f = true;
  json_key(stdout, first, "speculation");
  fputc('{', stdout);
  json_kv_str(stdout, &f, "mode", sp->mode);
  json_kv_u64(stdout, &f, "draft_tokens", sp->draft_tokens);
  json_key(stdout, &f, "draft_fixed");
  fputs(sp->draft_fixed ? "true" : "false", stdout);
  json_kv_str(stdout, &f, "draft_model", sp->draft_model);
  json_kv_u64(stdout, &f, "lookup_history", sp->lookup_history);
  json_kv_u64(stdout, &f, "drafted", sp->drafted);
  json_kv_u64(stdout, &f, "accepted", sp->accepted);
  json_kv_u64(stdout, &f, "rejected", sp->rejected);
  json_key(stdout, &f, "acceptance");
  printf("%.6g", sp->acceptance);
  fputc('}', stdout);
}

void print_session_stats(const struct sk_session_stats *s) {
  char kv[32], obj[32];
  human_bytes(s->kv_bytes, kv, sizeof kv);
  human_bytes(s->object_bytes, obj, sizeof obj);
  printf("%-10s %" PRIu64 "\n", "session", s->session);
  printf("%-10s %s\n", "policy", s->policy);
  const unsigned parts = sk_policy_parts(s->policy, strlen(s->policy));
  if (parts & SK_PART_SINKS) printf("%-10s %" PRIu64 "\n", "sinks", s->n_sink);
  if (parts & SK_PART_WINDOW) printf("%-10s %" PRIu64 "\n", "window", s->window);
  if (parts & SK_PART_HEAVY) {
    printf("%-10s %" PRIu64 "\n", "heavy", s->heavy);
    printf("%-10s %" PRIu64 "\n", "recent", s->recent);
  }
  if (s->pinned) printf("%-10s %" PRIu64 " tokens\n", "pinned", s->pinned);
  if (s->rope_scale != 1 || s->model_rope_scale != 1)
    printf("%-10s %g (model %g)\n", "rope scale", s->rope_scale, s->model_rope_scale);
  printf("%-10s %" PRIu64 " tokens\n", "capacity", s->capacity);
  printf("%-10s %" PRIu64 " tokens\n", "resident", s->resident);
  printf("%-10s %" PRIu64 " tokens\n", "seen", s->seen);
  printf("%-10s %" PRIu64 " tokens\n", "evicted", s->evicted);
  if (s->kv_type[0])
    printf("%-10s %s (%" PRIu64 " bytes, %s)\n", "kv cache", kv, s->kv_bytes, s->kv_type);
  else
    printf("%-10s %s (%" PRIu64 " bytes)\n", "kv cache", kv, s->kv_bytes);
  printf("%-10s %s (%" PRIu64 " bytes)\n", "object", obj, s->object_bytes);
  printf("%-10s %" PRIu64 "\n", "commit", s->commit);
  printf("%-10s %s\n", "adopted", s->adopted ? "yes" : "no");
  printf("%-10s %" PRIu64 " s\n", "idle", s->idle_s);
  /* Only what the daemon sent (both are optional fields of the reply);
   * positions stays the last line. */
  if (s->busy) {
    printf("%-10s (busy)\n", "indices");
  } else if (s->n_resident_ranges) {
    /* the stream indices of the resident tokens, in cache order */
    printf("%-10s", "indices");
    for (size_t i = 0; i < s->n_resident_ranges; i++) {
      if (s->resident_ranges[i].first == s->resident_ranges[i].last)
        printf(" %" PRIu64, s->resident_ranges[i].first);
      else
        printf(" %" PRIu64 "-%" PRIu64, s->resident_ranges[i].first, s->resident_ranges[i].last);
    }
    putchar('\n');
  }
  if (s->sparsity != 0) {
    printf("%-10s %g (MLP neurons skipped per token", "sparsity", s->sparsity);
    if (s->sparse_tokens && s->n_sparse_layers) {
      printf("; measured over %" PRIu64 " tokens, per layer:", s->sparse_tokens);
      for (size_t l = 0; l < s->n_sparse_layers; l++) printf(" %.3f", s->sparsity_measured[l]);
    }
    printf(")\n");
    if (s->weight_bytes_per_token > 0)
      printf("%-10s %.1f MB of weights read per token\n", "reads", s->weight_bytes_per_token / 1e6);
  }
  if (s->speculation.mode[0]) {
    const struct sk_spec_info *sp = &s->speculation;
    printf("%-10s %s", "speculate", sp->mode);
    if (sp->draft_tokens)
      printf(", up to %" PRIu32 " tokens a step%s", sp->draft_tokens,
             sp->draft_fixed ? " (fixed)" : "");
    printf("; %" PRIu64 " drafted, %" PRIu64 " accepted, %" PRIu64 " rejected", sp->drafted,
           sp->accepted, sp->rejected);
    if (sp->drafted) printf(" (%.1f%% accepted)", 100.0 * sp->acceptance);
    putchar('\n');
  }
  if (s->attn_steps)
    printf("%-10s over the last %" PRIu64 " steps; sinks = the first %" PRIu64 " positions\n",
           "attention", s->attn_steps, s->sink_tokens);
  for (size_t l = 0; l < s->n_layers; l++)
    printf("  layer %-3zu sink mass %.4f, entropy %.4f nats\n", l, s->sink_mass[l],
           s->entropy[l]);
  if (s->has_positions)
    printf("%-10s %" PRIu64 "-%" PRIu64 "\n", "positions", s->position_first, s->position_last);
  else
    printf("%-10s none\n", "positions");
}

/* ---- figures as text ------------------------------------------------- */

/* Seconds as "3d", "2h", "1h30m", "45m", "90s" or "30" for --idle. */
void format_duration(uint64_t s, char *buf, size_t size) {
  if (s >= 86400)
    snprintf(buf, size, "%" PRIu64 "d%" PRIu64 "h", s / 86400, s % 86400 / 3600);
  else if (s >= 3600)
    snprintf(buf, size, "%" PRIu64 "h%" PRIu64 "m", s / 3600, s % 3600 / 60);
  else if (s >= 60)
    snprintf(buf, size, "%" PRIu64 "m%" PRIu64 "s", s / 60, s % 60);
  else
    snprintf(buf, size, "%" PRIu64 "s", s);
}

/* Bytes as "12K", "3.5M", "1.2G" (powers of 1024). */
void format_bytes(uint64_t b, char *buf, size_t size) {
  if (b < 1024)
    snprintf(buf, size, "%" PRIu64, b);
  else if (b < (1u << 20))
    snprintf(buf, size, "%.1fK", (double)b / 1024.0);
  else if (b < (1u << 30))
    snprintf(buf, size, "%.1fM", (double)b / (1024.0 * 1024.0));
  else
    snprintf(buf, size, "%.1fG", (double)b / (1024.0 * 1024.0 * 1024.0));
}

/* 3725 -> "1h 2m 5s". */
void human_duration(uint64_t s, char *buf, size_t size) {
  if (s >= 86400)
    snprintf(buf, size, "%" PRIu64 "d %" PRIu64 "h %" PRIu64 "m", s / 86400, s % 86400 / 3600,
             s % 3600 / 60);
  else if (s >= 3600)
    snprintf(buf, size, "%" PRIu64 "h %" PRIu64 "m %" PRIu64 "s", s / 3600, s % 3600 / 60, s % 60);
  else if (s >= 60)
    snprintf(buf, size, "%" PRIu64 "m %" PRIu64 "s", s / 60, s % 60);
  else
    snprintf(buf, size, "%" PRIu64 "s", s);
}

void print_bytes_of(const char *label, uint64_t used, uint64_t max, const char *none) {
  char u[32], m[32];
  human_bytes(used, u, sizeof u);
  human_bytes(max, m, sizeof m);
  if (max)
    printf("%-17s %s of %s\n", label, u, m);
  else
    printf("%-17s %s, %s\n", label, u, none);
}

/* ---- key and value, as text or JSON ---------------------------------- */

void out_u64(struct kv_out *k, const char *key, uint64_t v) {
  if (k->json)
    json_kv_u64(stdout, &k->first, key, v);
  else
    printf("%-10s %" PRIu64 "\n", key, v);
}

void out_str(struct kv_out *k, const char *key, const char *v) {
  if (k->json)
    json_kv_str(stdout, &k->first, key, v);
  else
    printf("%-10s %s\n", key, v);
}

void out_bool(struct kv_out *k, const char *key, bool v) {
  if (k->json) {
    json_key(stdout, &k->first, key);
    fputs(v ? "true" : "false", stdout);
  } else {
    printf("%-10s %s\n", key, v ? "yes" : "no");
  }
}

void out_f64(struct kv_out *k, const char *key, double v) {
  if (k->json) {
    json_key(stdout, &k->first, key);
    printf("%g", v);
  } else {
    printf("%s: %g\n", key, v);
  }
}

void out_begin(struct kv_out *k) {
  if (k->json) fputc('{', stdout);
}

void out_end(struct kv_out *k) {
  if (k->json) fputs("}\n", stdout);
}

/* ---- a session's figures as JSON ------------------------------------- */

void json_session_stats_members(struct kv_out *k, const struct sk_session_stats *s) {
  out_u64(k, "session", s->session);
  out_str(k, "policy", s->policy);
  out_u64(k, "n_sink", s->n_sink);
  out_u64(k, "window", s->window);
  out_u64(k, "heavy", s->heavy);
  out_u64(k, "recent", s->recent);
  out_u64(k, "pinned", s->pinned);
  out_f64(k, "rope_scale", s->rope_scale);
  out_f64(k, "model_rope_scale", s->model_rope_scale);
  out_u64(k, "capacity", s->capacity);
  out_u64(k, "resident", s->resident);
  out_u64(k, "seen", s->seen);
  out_u64(k, "evicted", s->evicted);
  out_u64(k, "kv_bytes", s->kv_bytes);
  out_u64(k, "object_bytes", s->object_bytes);
  if (s->kv_type[0]) out_str(k, "kv_type", s->kv_type);
  json_key(stdout, &k->first, "positions");
  if (s->has_positions)
    printf("[%" PRIu64 ", %" PRIu64 "]", s->position_first, s->position_last);
  else
    fputs("[]", stdout);
  out_u64(k, "commit", s->commit);
  out_bool(k, "adopted", s->adopted);
  out_u64(k, "idle_s", s->idle_s);
  out_bool(k, "busy", s->busy);
  json_key(stdout, &k->first, "resident_ranges");
  fputc('[', stdout);
  for (size_t i = 0; i < s->n_resident_ranges; i++)
    printf("%s[%" PRIu64 ", %" PRIu64 "]", i ? ", " : "", s->resident_ranges[i].first,
           s->resident_ranges[i].last);
  fputc(']', stdout);
  out_f64(k, "sparsity", s->sparsity);
  out_u64(k, "sparse_tokens", s->sparse_tokens);
  out_f64(k, "weight_bytes_per_token", s->weight_bytes_per_token);
  json_key(stdout, &k->first, "sparsity_measured");
  fputc('[', stdout);
  for (size_t l = 0; l < s->n_sparse_layers; l++)
    printf("%s%.6g", l ? ", " : "", s->sparsity_measured[l]);
  fputc(']', stdout);
  json_key(stdout, &k->first, "attention");
  printf("{\"steps\": %" PRIu64 ", \"sink_tokens\": %" PRIu64 ", \"sink_mass\": [",
         s->attn_steps, s->sink_tokens);
  for (size_t l = 0; l < s->n_layers; l++) printf("%s%.6g", l ? ", " : "", s->sink_mass[l]);
  fputs("], \"entropy\": [", stdout);
  for (size_t l = 0; l < s->n_layers; l++) printf("%s%.6g", l ? ", " : "", s->entropy[l]);
  fputs("]}", stdout);
  if (s->speculation.mode[0]) json_spec(&k->first, &s->speculation);
}

void json_session_stats(const struct sk_session_stats *s) {
  struct kv_out k = {.json = true, .first = true};
  out_begin(&k);
  json_session_stats_members(&k, s);
  out_end(&k);
}
