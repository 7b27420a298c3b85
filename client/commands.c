/* sinkctl's commands of one request each: tokenize, detokenize, open,
 * close, list, stats, resume, fork, save, load, ping, hello. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sinkctl.h"

int cmd_tokenize(struct sk_client *c, const struct opts *o, int argc, char **argv) {
  size_t len;
  char *text = text_from_args(argc, argv, &len);
  struct sk_error e;
  int32_t *ids = NULL;
  size_t n = 0;
  enum sk_bos bos = o->no_bos ? SK_BOS_FALSE : SK_BOS_DEFAULT;
  if (o->gen.parse_special) bos |= SK_TEXT_SPECIAL;
  int rc = sk_client_tokenize(c, text, len, bos, &ids, &n, &e);
  free(text);
  if (rc < 0) return report(c, &e);
  if (o->json) fputs("{\"tokens\": [", stdout);
  for (size_t i = 0; i < n; i++)
    printf("%s%" PRId32, i ? (o->json ? ", " : " ") : "", ids[i]);
  fputs(o->json ? "]}\n" : "\n", stdout);
  free(ids);
  return 0;
}

int cmd_detokenize(struct sk_client *c, const struct opts *o, int argc, char **argv) {
  int32_t *ids = malloc((size_t)argc * sizeof *ids);
  if (!ids) sk_cli_die(EXIT_FAILURE, "out of memory");
  for (int i = 0; i < argc; i++)
    ids[i] = (int32_t)sk_cli_parse_u64("detokenize", argv[i], 0, INT32_MAX);
  struct sk_error e;
  char *text = NULL;
  size_t len = 0;
  int rc = sk_client_detokenize(c, ids, (size_t)argc, &text, &len, &e);
  free(ids);
  if (rc < 0) return report(c, &e);
  if (o->json) {
    fputs("{\"text\": ", stdout);
    sk_cli_json_str(stdout, text, len);
    fputs("}\n", stdout);
  } else {
    print_model_text(text, len);
    /* On a terminal the next prompt must not start after the text; in a
     * pipe the bytes stay exactly the text's. */
    if (isatty(STDOUT_FILENO) && len > 0 && text[len - 1] != '\n') fputc('\n', stdout);
  }
  free(text);
  return 0;
}

int cmd_open(struct sk_client *c, const struct opts *o) {
  struct sk_error e;
  struct sk_open_result r;
  if (sk_client_open(c, &o->open, &r, &e) < 0) return report(c, &e);
  if (o->json) {
    bool first = true;
    fputc('{', stdout);
    json_kv_u64(stdout, &first, "session", r.session);
    json_kv_str(stdout, &first, "policy", r.policy);
    json_kv_u64(stdout, &first, "capacity", r.capacity);
    json_kv_u64(stdout, &first, "kv_bytes", r.kv_bytes);
    json_kv_u64(stdout, &first, "object_bytes", r.object_bytes);
    if (r.kv_type[0]) json_kv_str(stdout, &first, "kv_type", r.kv_type);
    json_kv_u64(stdout, &first, "n_sink", r.n_sink);
    json_kv_u64(stdout, &first, "window", r.window);
    json_kv_u64(stdout, &first, "heavy", r.heavy);
    json_kv_u64(stdout, &first, "recent", r.recent);
    json_key(stdout, &first, "rope_scale");
    printf("%g", r.rope_scale);
    json_kv_u64(stdout, &first, "pinned", r.pinned);
    fputs("}\n", stdout);
  } else {
    printf("%" PRIu64 "\n", r.session);
  }
  return 0;
}

int cmd_close(struct sk_client *c, const struct opts *o, uint64_t id) {
  struct sk_error e;
  if (sk_client_close_session(c, id, &e) < 0) return report(c, &e);
  if (o->json) printf("{\"session\": %" PRIu64 ", \"closed\": true}\n", id);
  return 0;
}

/* Closes every session the caller may see (--all), or those idle for at
 * least o->idle_s seconds and not busy (--idle). Prints the closed ids, a
 * line each (JSON: {"closed": [IDS]}). A session that went away in the
 * meantime is skipped. */
int cmd_close_many(struct sk_client *c, const struct opts *o) {
  struct sk_error e;
  struct sk_session_info *s = NULL;
  size_t n = 0;
  if (sk_client_list(c, &s, &n, &e) < 0) return report(c, &e);
  if (o->json) fputs("{\"closed\": [", stdout);
  size_t n_closed = 0;
  int status = 0;
  for (size_t i = 0; i < n; i++) {
    if (!o->close_all && (s[i].busy || s[i].idle_s < o->idle_s)) continue;
    if (sk_client_close_session(c, s[i].session, &e) < 0) {
      if (e.code == SK_ERR_NO_SUCH_SESSION) continue;
      status = report(c, &e);
      break;
    }
    if (o->json)
      printf("%s%" PRIu64, n_closed ? ", " : "", s[i].session);
    else
      printf("%" PRIu64 "\n", s[i].session);
    n_closed++;
  }
  if (o->json) fputs("]}\n", stdout);
  free(s);
  return status;
}

int cmd_list(struct sk_client *c, const struct opts *o) {
  struct sk_error e;
  struct sk_session_info *s = NULL;
  size_t n = 0;
  if (sk_client_list(c, &s, &n, &e) < 0) return report(c, &e);
  if (o->json) {
    fputs("{\"sessions\": [", stdout);
    for (size_t i = 0; i < n; i++) {
      bool first = true;
      fputs(i ? ", {" : "{", stdout);
      json_kv_u64(stdout, &first, "session", s[i].session);
      json_kv_u64(stdout, &first, "owner_uid", s[i].owner_uid);
      json_kv_str(stdout, &first, "policy", s[i].policy);
      json_kv_u64(stdout, &first, "capacity", s[i].capacity);
      json_kv_u64(stdout, &first, "resident", s[i].resident);
      json_kv_u64(stdout, &first, "seen", s[i].seen);
      json_kv_u64(stdout, &first, "kv_bytes", s[i].kv_bytes);
      json_kv_u64(stdout, &first, "object_bytes", s[i].object_bytes);
      json_kv_u64(stdout, &first, "age_s", s[i].age_s);
      json_kv_u64(stdout, &first, "idle_s", s[i].idle_s);
      json_key(stdout, &first, "busy");
      fputs(s[i].busy ? "true" : "false", stdout);
      json_key(stdout, &first, "temporary");
      fputs(s[i].temporary ? "true" : "false", stdout);
      json_key(stdout, &first, "adopted");
      fputs(s[i].adopted ? "true" : "false", stdout);
      if (s[i].kv_type[0]) json_kv_str(stdout, &first, "kv_type", s[i].kv_type);
      fputc('}', stdout);
    }
    fputs("]}\n", stdout);
  } else {
    printf("%-10s %-6s %-12s %10s %10s %14s %8s %-8s %-8s %-7s %s\n", "SESSION", "OWNER",
           "POLICY", "CAPACITY", "RESIDENT", "SEEN", "MEMORY", "AGE", "IDLE", "ADOPTED", "KV");
    for (size_t i = 0; i < n; i++) {
      char mem[16], age[24], idle[24];
      format_bytes(s[i].object_bytes, mem, sizeof mem);
      format_duration(s[i].age_s, age, sizeof age);
      if (s[i].busy)
        snprintf(idle, sizeof idle, "busy");
      else
        format_duration(s[i].idle_s, idle, sizeof idle);
      printf("%-10" PRIu64 " %-6" PRIu64 " %-12s %10" PRIu64 " %10" PRIu64 " %14" PRIu64
             " %8s %-8s %-8s %-7s %s%s\n",
             s[i].session, s[i].owner_uid, s[i].policy, s[i].capacity, s[i].resident,
             s[i].seen, mem, age, idle, s[i].adopted ? "yes" : "no",
             s[i].kv_type[0] ? s[i].kv_type : "-", s[i].temporary ? " (temporary)" : "");
    }
  }
  free(s);
  return 0;
}

int cmd_stats(struct sk_client *c, const struct opts *o, bool has_id, uint64_t id) {
  struct sk_error e;
  struct kv_out k = {.json = true, .first = true};
  if (!has_id) {
    struct sk_daemon_stats s;
    if (sk_client_stats(c, &s, &e) < 0) return report(c, &e);
    if (o->json) {
      out_begin(&k);
      out_u64(&k, "sessions", s.sessions);
      out_u64(&k, "clients", s.clients);
      out_u64(&k, "uptime_s", s.uptime_s);
      out_u64(&k, "tokens_prefilled", s.tokens_prefilled);
      out_u64(&k, "tokens_generated", s.tokens_generated);
      out_u64(&k, "max_sessions", s.max_sessions);
      out_u64(&k, "memory_bytes", s.memory_bytes);
      out_u64(&k, "max_memory", s.max_memory);
      out_u64(&k, "adopted", s.adopted);
      out_u64(&k, "set_aside", s.set_aside);
      out_u64(&k, "idle_ttl_s", s.idle_ttl_s);
      if (s.has_user) {
        out_u64(&k, "user_sessions", s.user_sessions);
        out_u64(&k, "user_memory_bytes", s.user_memory_bytes);
        out_u64(&k, "max_user_sessions", s.max_user_sessions);
        out_u64(&k, "max_user_memory", s.max_user_memory);
      }
      if (s.compute.kernel[0]) { /* daemons before 0.2 do not report these */
        out_u64(&k, "steps", s.steps);
        out_str(&k, "kernel", s.compute.kernel);
        out_u64(&k, "threads", s.compute.threads);
        out_u64(&k, "max_batch", s.compute.max_batch);
        if (s.compute.kv_type[0]) out_str(&k, "kv_type", s.compute.kv_type);
      }
      out_u64(&k, "weights_mapped_bytes", s.weights_mapped_bytes);
      out_u64(&k, "weights_repacked_bytes", s.weights_repacked_bytes);
      if (s.speculation.mode[0]) json_spec(&k.first, &s.speculation);
      out_end(&k);
      return 0;
    }
    char up[64];
    human_duration(s.uptime_s, up, sizeof up);
    printf("%-17s %" PRIu64 "\n", "sessions", s.sessions);
    printf("%-17s %" PRIu64 "\n", "clients", s.clients);
    printf("%-17s %s\n", "uptime", up);
    printf("%-17s %" PRIu64 "\n", "tokens prefilled", s.tokens_prefilled);
    printf("%-17s %" PRIu64 "\n", "tokens generated", s.tokens_generated);
    if (s.compute.kernel[0]) {
      printf("%-17s %s kernels, %" PRIu32 " threads, %" PRIu32 " tokens per pass\n", "compute",
             s.compute.kernel, s.compute.threads, s.compute.max_batch);
      if (s.compute.kv_type[0]) printf("%-17s %s\n", "new sessions' KV", s.compute.kv_type);
      printf("%-17s %" PRIu64 "\n", "forward passes", s.steps);
    }
    if (s.weights_mapped_bytes || s.weights_repacked_bytes) {
      char mapped[32], repacked[32];
      human_bytes(s.weights_mapped_bytes, mapped, sizeof mapped);
      human_bytes(s.weights_repacked_bytes, repacked, sizeof repacked);
      printf("%-17s %s mapped from the file, %s repacked\n", "weights", mapped, repacked);
    }
    print_bytes_of("session memory", s.memory_bytes, s.max_memory, "no limit");
    printf("%-17s %" PRIu64 "\n", "max sessions", s.max_sessions);
    if (s.has_user) { /* the caller's uid against its limits */
      if (s.max_user_sessions)
        printf("%-17s %" PRIu64 " of %" PRIu64 "\n", "your sessions", s.user_sessions,
               s.max_user_sessions);
      else
        printf("%-17s %" PRIu64 ", no limit of your own\n", "your sessions", s.user_sessions);
      print_bytes_of("your memory", s.user_memory_bytes, s.max_user_memory,
                     "no limit of your own");
    }
    printf("%-17s %" PRIu64 " adopted, %" PRIu64 " set aside\n", "at start", s.adopted,
           s.set_aside);
    if (s.idle_ttl_s)
      printf("%-17s %" PRIu64 " s\n", "idle ttl", s.idle_ttl_s);
    else
      printf("%-17s never\n", "idle ttl");
    if (s.speculation.mode[0]) print_spec("speculation", &s.speculation);
    return 0;
  }
  struct sk_session_stats s;
  if (sk_client_session_stats(c, id, &s, &e) < 0) return report(c, &e);
  if (!o->json) {
    print_session_stats(&s);
    if (o->tokens) {
      int32_t *toks = NULL;
      size_t n = 0;
      if (sk_client_session_tokens(c, id, &toks, &n, &e) < 0) return report(c, &e);
      printf("%-10s", "tokens");
      for (size_t i = 0; i < n; i++) printf(" %" PRId32, toks[i]);
      putchar('\n');
      free(toks);
    }
    return 0;
  }
  out_begin(&k);
  json_session_stats_members(&k, &s);
  if (o->tokens) {
    int32_t *toks = NULL;
    size_t n = 0;
    if (sk_client_session_tokens(c, id, &toks, &n, &e) < 0) {
      out_end(&k);
      return report(c, &e);
    }
    json_key(stdout, &k.first, "tokens");
    fputc('[', stdout);
    for (size_t i = 0; i < n; i++) printf("%s%" PRId32, i ? ", " : "", toks[i]);
    fputc(']', stdout);
    free(toks);
  }
  out_end(&k);
  return 0;
}

/* resume, fork, load: a session summary; text mode prints only the id for
 * fork and load (for scripts), everything for resume. */
static void print_summary(const struct opts *o, const struct sk_session_summary *s,
                          bool id_only, const char *file, size_t bytes) {
  if (id_only && !o->json) {
    printf("%" PRIu64 "\n", s->session);
    return;
  }
  struct kv_out k = {.json = o->json, .first = true};
  out_begin(&k);
  out_u64(&k, "session", s->session);
  if (s->from) out_u64(&k, "from", s->from);
  if (file) {
    out_str(&k, "file", file);
    out_u64(&k, "bytes", bytes);
  }
  out_str(&k, "policy", s->policy);
  out_u64(&k, "capacity", s->capacity);
  out_u64(&k, "kv_bytes", s->kv_bytes);
  out_u64(&k, "object_bytes", s->object_bytes);
  if (s->kv_type[0]) out_str(&k, "kv_type", s->kv_type);
  out_u64(&k, "resident", s->resident);
  out_u64(&k, "seen", s->seen);
  out_u64(&k, "evicted", s->evicted);
  out_u64(&k, "commit", s->commit);
  out_bool(&k, "adopted", s->adopted);
  out_end(&k);
}

int cmd_resume(struct sk_client *c, const struct opts *o, uint64_t id) {
  struct sk_error e;
  struct sk_session_summary s;
  if (sk_client_resume(c, id, &s, &e) < 0) return report(c, &e);
  print_summary(o, &s, false, NULL, 0);
  return 0;
}

int cmd_fork(struct sk_client *c, const struct opts *o, uint64_t id) {
  struct sk_error e;
  struct sk_session_summary s;
  if (sk_client_fork(c, id, &s, &e) < 0) return report(c, &e);
  print_summary(o, &s, true, NULL, 0);
  return 0;
}

int cmd_save(struct sk_client *c, const struct opts *o, uint64_t id, const char *path) {
  struct sk_error e;
  size_t bytes = 0;
  if (sk_client_save(c, id, path, &bytes, &e) < 0) {
    if (e.code == SK_ERR_IO && sk_client_connected(c)) {
      fprintf(stderr, "%s: %s\n", prog, e.message);
      return EXIT_FAILURE;
    }
    return report(c, &e);
  }
  if (o->json) {
    printf("{\"session\": %" PRIu64 ", \"file\": ", id);
    sk_cli_json_cstr(stdout, path);
    printf(", \"bytes\": %zu}\n", bytes);
  } else {
    printf("session %" PRIu64 " saved to %s (%zu bytes)\n", id, path, bytes);
  }
  return 0;
}

int cmd_load(struct sk_client *c, const struct opts *o, const char *path) {
  struct sk_error e;
  struct sk_session_summary s;
  if (sk_client_load(c, path, &s, &e) < 0) {
    if (e.code == SK_ERR_IO && sk_client_connected(c)) {
      fprintf(stderr, "%s: %s\n", prog, e.message);
      return EXIT_FAILURE;
    }
    return report(c, &e);
  }
  print_summary(o, &s, true, NULL, 0);
  return 0;
}

int cmd_ping(struct sk_client *c, const struct opts *o) {
  struct sk_error e;
  double t0 = now_ms();
  if (sk_client_ping(c, &e) < 0) return report(c, &e);
  double ms = now_ms() - t0;
  if (o->json)
    printf("{\"pong\": true, \"ms\": %.3f}\n", ms);
  else
    printf("pong (%.1f ms)\n", ms);
  return 0;
}

int cmd_hello(struct sk_client *c, const struct opts *o) {
  struct sk_error e;
  struct sk_hello h;
  if (sk_client_hello(c, &h, &e) < 0) return report(c, &e);
  if (o->json) {
    bool first = true, f2 = true;
    fputc('{', stdout);
    json_kv_u64(stdout, &first, "protocol", h.protocol);
    json_kv_str(stdout, &first, "server", h.server);
    json_kv_str(stdout, &first, "version", h.version);
    json_key(stdout, &first, "model");
    fputc('{', stdout);
    json_kv_str(stdout, &f2, "name", h.model.name);
    json_kv_u64(stdout, &f2, "n_vocab", h.model.n_vocab);
    json_kv_u64(stdout, &f2, "n_ctx_train", h.model.n_ctx_train);
    json_kv_u64(stdout, &f2, "n_layer", h.model.n_layer);
    json_kv_u64(stdout, &f2, "dim", h.model.dim);
    json_kv_u64(stdout, &f2, "n_head", h.model.n_head);
    json_kv_u64(stdout, &f2, "n_kv_head", h.model.n_kv_head);
    json_key(stdout, &f2, "rope_scale");
    printf("%g", h.model.rope_scale);
    json_kv_u64(stdout, &f2, "max_capacity", h.model.max_capacity);
    if (h.model.weight_type[0]) {
      json_kv_str(stdout, &f2, "weight_type", h.model.weight_type);
      json_kv_u64(stdout, &f2, "weight_bytes", h.model.weight_bytes);
    }
    fputc('}', stdout);
    if (h.compute.kernel[0]) {
      json_key(stdout, &first, "compute");
      f2 = true;
      fputc('{', stdout);
      json_kv_str(stdout, &f2, "kernel", h.compute.kernel);
      json_kv_u64(stdout, &f2, "threads", h.compute.threads);
      json_kv_u64(stdout, &f2, "max_batch", h.compute.max_batch);
      if (h.compute.kv_type[0]) json_kv_str(stdout, &f2, "kv_type", h.compute.kv_type);
      fputc('}', stdout);
    }
    json_key(stdout, &first, "defaults");
    f2 = true;
    fputc('{', stdout);
    json_kv_str(stdout, &f2, "policy", h.defaults.policy);
    json_kv_u64(stdout, &f2, "n_sink", h.defaults.n_sink);
    json_kv_u64(stdout, &f2, "window", h.defaults.window);
    json_kv_u64(stdout, &f2, "heavy", h.defaults.heavy);
    json_kv_u64(stdout, &f2, "recent", h.defaults.recent);
    json_kv_u64(stdout, &f2, "capacity", h.defaults.capacity);
    json_key(stdout, &f2, "rope_scale");
    printf("%g", h.defaults.rope_scale);
    fputc('}', stdout);
    if (h.chat_template[0]) {
      json_key(stdout, &first, "chat_template");
      f2 = true;
      fputc('{', stdout);
      json_kv_str(stdout, &f2, "name", h.chat_template);
      if (h.chat_template_error[0]) json_kv_str(stdout, &f2, "error", h.chat_template_error);
      fputc('}', stdout);
    }
    if (h.speculation.mode[0]) json_spec(&first, &h.speculation);
    fputs("}\n", stdout);
    return 0;
  }
  printf("protocol: %" PRIu32 "\n", h.protocol);
  printf("server: %s\n", h.server);
  printf("version: %s\n", h.version);
  printf("model: %s\n", h.model.name);
  printf("model.n_vocab: %" PRIu32 "\n", h.model.n_vocab);
  printf("model.n_ctx_train: %" PRIu32 "\n", h.model.n_ctx_train);
  printf("model.n_layer: %" PRIu32 "\n", h.model.n_layer);
  printf("model.dim: %" PRIu32 "\n", h.model.dim);
  printf("model.n_head: %" PRIu32 "\n", h.model.n_head);
  printf("model.n_kv_head: %" PRIu32 "\n", h.model.n_kv_head);
  printf("model.rope_scale: %g\n", h.model.rope_scale);
  printf("model.max_capacity: %" PRIu32 "\n", h.model.max_capacity);
  if (h.model.weight_type[0]) {
    printf("model.weight_type: %s\n", h.model.weight_type);
    printf("model.weight_bytes: %" PRIu64 "\n", h.model.weight_bytes);
  }
  if (h.compute.kernel[0]) {
    printf("compute.kernel: %s\n", h.compute.kernel);
    printf("compute.threads: %" PRIu32 "\n", h.compute.threads);
    printf("compute.max_batch: %" PRIu32 "\n", h.compute.max_batch);
    if (h.compute.kv_type[0]) printf("compute.kv_type: %s\n", h.compute.kv_type);
  }
  printf("defaults.policy: %s\n", h.defaults.policy);
  printf("defaults.n_sink: %" PRIu32 "\n", h.defaults.n_sink);
  printf("defaults.window: %" PRIu32 "\n", h.defaults.window);
  printf("defaults.heavy: %" PRIu32 "\n", h.defaults.heavy);
  printf("defaults.recent: %" PRIu32 "\n", h.defaults.recent);
  printf("defaults.capacity: %" PRIu32 "\n", h.defaults.capacity);
  printf("defaults.rope_scale: %g\n", h.defaults.rope_scale);
  if (h.chat_template[0]) printf("chat_template: %s\n", h.chat_template);
  if (h.chat_template_error[0]) printf("chat_template.error: %s\n", h.chat_template_error);
  if (h.speculation.mode[0]) {
    const struct sk_spec_info *sp = &h.speculation;
    printf("speculation.mode: %s\n", sp->mode);
    printf("speculation.draft_tokens: %" PRIu32 "\n", sp->draft_tokens);
    printf("speculation.draft_fixed: %s\n", sp->draft_fixed ? "true" : "false");
    if (sp->draft_model[0]) printf("speculation.draft_model: %s\n", sp->draft_model);
    printf("speculation.lookup_history: %" PRIu32 "\n", sp->lookup_history);
    printf("speculation.drafted: %" PRIu64 "\n", sp->drafted);
    printf("speculation.accepted: %" PRIu64 "\n", sp->accepted);
    printf("speculation.rejected: %" PRIu64 "\n", sp->rejected);
    printf("speculation.acceptance: %.4f\n", sp->acceptance);
  }
  return 0;
}
