/* The configuration: defaults, the INI file (every kind of mistake named
 * by file, line and key), the command-line overlay, "auto" resolution
 * against a model, and --check-config's output read back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/chat.h"
#include "config.h"
#include "session/kvcache.h"
#include "base/log.h"
#include "testutil.h"

static char *g_dir;
static char g_path[512];

static int setup(void **state) {
  (void)state;
  g_dir = sk_test_tmpdir();
  snprintf(g_path, sizeof g_path, "%s/sinkd.conf", g_dir);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  unlink(g_path);
  rmdir(g_dir);
  free(g_dir);
  return 0;
}

static void write_file(const char *text, size_t len) {
  FILE *f = fopen(g_path, "w");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, len, f), len);
  fclose(f);
}

#define WRITE(text) write_file(text, sizeof(text) - 1)

/* Writes head, n bytes c, then tail (one line made long on purpose). */
static void write_filled(const char *head, char c, size_t n, const char *tail) {
  char text[4096];
  size_t w = (size_t)snprintf(text, sizeof text, "%s", head);
  assert_true(w + n + strlen(tail) < sizeof text);
  memset(text + w, c, n);
  w += n;
  w += (size_t)snprintf(text + w, sizeof text - w, "%s", tail);
  write_file(text, w);
}

/* Loads g_path into a fresh default config; returns sk_config_load's code. */
static int load(struct sk_config *c, struct sk_config_errors *errs) {
  assert_int_equal(sk_config_init(c), 0);
  return sk_config_load(c, g_path, true, errs);
}

/* The one error of a file holding `text`, without the "PATH:" prefix. */
static void expect_error(const char *text, const char *want) {
  write_file(text, strlen(text));
  struct sk_config c;
  struct sk_config_errors errs;
  assert_int_equal(load(&c, &errs), -SK_ERR_BAD_REQUEST);
  if (errs.n != 1) {
    for (uint32_t i = 0; i < errs.n; i++) print_message("error: %s\n", errs.e[i].message);
    fail_msg("%u errors for:\n%s", errs.n, text);
  }
  size_t plen = strlen(g_path);
  assert_memory_equal(errs.e[0].message, g_path, plen);
  assert_string_equal(errs.e[0].message + plen, want);
  sk_config_done(&c);
}

static void test_defaults(void **state) {
  (void)state;
  setenv("XDG_RUNTIME_DIR", "/tmp/xdg-test", 1);
  struct sk_config c;
  assert_int_equal(sk_config_init(&c), 0);
  if (getuid() == 0) {
    assert_string_equal(c.socket, "/run/sinkd/sinkd.sock");
    assert_string_equal(c.state_dir, "/run/sinkd/state");
  } else {
    assert_string_equal(c.socket, "/tmp/xdg-test/sinkd/sinkd.sock");
    assert_string_equal(c.state_dir, "/tmp/xdg-test/sinkd/state");
  }
  unsetenv("XDG_RUNTIME_DIR");
  assert_null(c.model);
  assert_null(c.file);
  assert_int_equal(c.threads, 0);
  assert_int_equal(c.batch, 64);
  assert_int_equal(c.step_tokens, 16);
  assert_int_equal(c.log_level, SK_LOG_INFO);
  assert_int_equal(c.kv_type, SK_KV_F16);
  assert_int_equal(c.chat_template, -1); /* auto: the model's */
  assert_int_equal(c.policy, SK_POLICY_STREAMING);
  assert_int_equal(c.n_sink, 4);
  assert_int_equal(c.window, 0);
  assert_int_equal(c.capacity, 0);
  assert_int_equal(c.max_clients, 1024);
  assert_int_equal(c.max_sessions, 64);
  assert_int_equal(c.max_capacity, 0);
  assert_int_equal(c.max_memory, 0);
  assert_int_equal(c.max_frame, 1u << 20);
  assert_int_equal(c.idle_ttl, 7 * 24 * 3600);
  assert_int_equal(c.max_user_clients, 128);
  assert_int_equal(c.frame_timeout, 30);
  for (int k = 0; k < SK_CFG__COUNT; k++) assert_int_equal(c.origin[k].from, SK_CONFIG_FROM_DEFAULT);
  /* The default file is optional, a named one is not. */
  struct sk_config_errors errs;
  assert_int_equal(sk_config_load(&c, "/nonexistent/sinkd.conf", false, &errs), 1);
  assert_null(c.file);
  assert_int_equal(sk_config_load(&c, "/nonexistent/sinkd.conf", true, &errs), -SK_ERR_IO);
  assert_int_equal(errs.n, 1);
  assert_string_equal(errs.e[0].message,
                      "/nonexistent/sinkd.conf: cannot read the configuration: No such file or "
                      "directory");
  /* A folder, a device, a FIFO: refused before a byte is read (a FIFO
   * would wait for a writer, /dev/zero never end). */
  char want[512];
  assert_int_equal(sk_config_load(&c, g_dir, true, &errs), -SK_ERR_IO);
  assert_int_equal(errs.n, 1);
  snprintf(want, sizeof want, "cannot read the configuration: %s is a directory, not a regular "
           "file", g_dir);
  assert_string_equal(errs.e[0].message, want);
  assert_int_equal(sk_config_load(&c, "/dev/zero", true, &errs), -SK_ERR_IO);
  assert_string_equal(errs.e[0].message, "cannot read the configuration: /dev/zero is a "
                                         "character device, not a regular file");
  char fifo[400];
  snprintf(fifo, sizeof fifo, "%s/fifo.conf", g_dir);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  assert_int_equal(sk_config_load(&c, fifo, true, &errs), -SK_ERR_IO);
  snprintf(want, sizeof want, "cannot read the configuration: %s is a FIFO, not a regular file",
           fifo);
  assert_string_equal(errs.e[0].message, want);
  unlink(fifo);
  sk_config_done(&c);
  sk_config_done(&c); /* twice is fine */
}

static void test_full_file(void **state) {
  (void)state;
  WRITE("\xEF\xBB\xBF# every key\n"
        "[daemon]\n"
        "model = /models/m.gguf\n"
        "socket = /tmp/s.sock ; inline comment\n"
        "state_dir = /run/x\n"
        "  threads = 3\n"
        "batch = 32\n"
        "step_tokens = 8\n"
        "log_level = debug\n"
        "kv_type = f32\n"
        "chat_template = llama3\n"
        "\n"
        "[session]\n"
        "policy = dense\n"
        "sinks = 0\n"
        "window = auto\n"
        "capacity = 100\n"
        "; comment\n"
        "[limits]\n"
        "max_clients = 10\n"
        "max_sessions = 2\n"
        "max_capacity = 4096\n"
        "max_memory = 64M\n"
        "max_frame = 2KiB\n");
  struct sk_config c;
  struct sk_config_errors errs;
  assert_int_equal(load(&c, &errs), 0);
  assert_int_equal(errs.n, 0);
  assert_string_equal(c.file, g_path);
  assert_string_equal(c.model, "/models/m.gguf");
  assert_string_equal(c.socket, "/tmp/s.sock");
  assert_string_equal(c.state_dir, "/run/x");
  assert_int_equal(c.threads, 3);
  assert_int_equal(c.batch, 32);
  assert_int_equal(c.step_tokens, 8);
  assert_int_equal(c.log_level, SK_LOG_DEBUG);
  assert_int_equal(c.kv_type, SK_KV_F32);
  assert_int_equal(c.chat_template, SK_CHAT_LLAMA3);
  assert_int_equal(c.policy, SK_POLICY_DENSE);
  assert_int_equal(c.n_sink, 0);
  assert_int_equal(c.window, 0);
  assert_int_equal(c.capacity, 100);
  assert_int_equal(c.max_clients, 10);
  assert_int_equal(c.max_sessions, 2);
  assert_int_equal(c.max_capacity, 4096);
  assert_int_equal(c.max_memory, 64ull << 20);
  assert_int_equal(c.max_frame, 2048);
  assert_int_equal(c.origin[SK_CFG_MODEL].from, SK_CONFIG_FROM_FILE);
  assert_int_equal(c.origin[SK_CFG_MODEL].line, 3);
  assert_int_equal(c.origin[SK_CFG_THREADS].line, 6);
  assert_int_equal(c.origin[SK_CFG_STEP_TOKENS].line, 8);
  assert_int_equal(c.origin[SK_CFG_MAX_FRAME].line, 24);
  assert_int_equal(c.origin[SK_CFG_CHAT_TEMPLATE].line, 11);
  assert_int_equal(c.origin[SK_CFG_KV_TYPE].line, 10);

  /* The command line overrides the file, key by key. */
  struct sk_config cli;
  struct sk_error e;
  assert_int_equal(sk_config_init(&cli), 0);
  assert_int_equal(sk_config_set(&cli, SK_CFG_MAX_SESSIONS, "7", SK_CONFIG_FROM_COMMAND_LINE, 0, &e), 0);
  assert_int_equal(sk_config_set(&cli, SK_CFG_MODEL, "other.gguf", SK_CONFIG_FROM_COMMAND_LINE, 0, &e), 0);
  assert_int_equal(sk_config_overlay(&c, &cli), 0);
  assert_int_equal(c.max_sessions, 7);
  assert_string_equal(c.model, "other.gguf");
  assert_int_equal(c.origin[SK_CFG_MODEL].from, SK_CONFIG_FROM_COMMAND_LINE);
  assert_int_equal(c.max_clients, 10); /* not on the command line: the file's */
  assert_string_equal(c.socket, "/tmp/s.sock");
  assert_int_equal(c.origin[SK_CFG_SOCKET].from, SK_CONFIG_FROM_FILE);

  /* A copy is deep. */
  struct sk_config copy;
  assert_int_equal(sk_config_copy(&copy, &c), 0);
  assert_ptr_not_equal(copy.model, c.model);
  assert_string_equal(copy.model, c.model);
  for (int k = 0; k < SK_CFG__COUNT; k++) assert_true(sk_config_same(&copy, &c, (enum sk_config_key)k));
  sk_config_done(&copy);
  sk_config_done(&cli);
  sk_config_done(&c);
}

static void test_errors(void **state) {
  (void)state;
  expect_error("[daemon]\nthreads = 0\n",
               ":2: [daemon] threads: '0' is not a number in [1, 256] or 'auto'");
  expect_error("[daemon]\nthreads = 257\n",
               ":2: [daemon] threads: '257' is not a number in [1, 256] or 'auto'");
  expect_error("[daemon]\nbatch = -1\n", ":2: [daemon] batch: '-1' is not a number in [1, 4096]");
  expect_error("[daemon]\nbatch = 12x\n", ":2: [daemon] batch: '12x' is not a number in [1, 4096]");
  expect_error("[daemon]\nbatch = auto\n",
               ":2: [daemon] batch: 'auto' is not a number in [1, 4096]");
  expect_error("[daemon]\nbatch =\n", ":2: [daemon] batch: '' is not a number in [1, 4096]");
  expect_error("[daemon]\nmodel =\n",
               ":2: [daemon] model: '' is not a path (must be non-empty, without control "
               "characters)");
  expect_error("[daemon]\nstate_dir = run/x\n",
               ":2: [daemon] state_dir: 'run/x' is not an absolute path");
  expect_error("[daemon]\nkv_type = q8_0\n",
               ":2: [daemon] kv_type: unknown KV type \"q8_0\" (expected f32 or f16)");
  expect_error("[daemon]\nchat_template = {{ jinja }}\n",
               ":2: [daemon] chat_template: '{{ jinja }}' is not auto, none or a chat template "
               "family (chatml, llama2, llama3, mistral-v7, phi3, gemma, ...: sinkd.conf(5) lists "
               "them)");
  expect_error("[daemon]\nlog_level = loud\n",
               ":2: [daemon] log_level: 'loud' is not a log level (err, warning, notice, info, "
               "debug)");
  expect_error("[daemon]\nmodel = /a\nbogus = 1\n",
               ":3: [daemon] bogus: unknown key (sinkd.conf(5) lists the keys of [daemon])");
  /* A section whose keys fit in the message lists them. */
  expect_error("[session]\nbogus = 1\n", ":2: [session] bogus: unknown key (keys of [session]: "
                                          "policy, sinks, window, capacity, speculation, "
                                          "draft_tokens)");
  /* A path inih would read back as a comment (--check-config's output). */
  expect_error("[daemon]\nsocket =;/run/x\n",
               ":2: [daemon] socket: ';/run/x': a path may not begin with ';' nor have one after "
               "a blank (sinkd.conf reads it as a comment)");
  /* A key of another section names it. */
  expect_error("[daemon]\nmax_memory = 1G\n",
               ":2: [daemon] max_memory: unknown key here (it belongs in [limits])");
  expect_error("[limits]\nsinks = 4\n",
               ":2: [limits] sinks: unknown key here (it belongs in [session])");
  expect_error("[daemon]\nmodel = /a\nmodel = /b\n",
               ":3: [daemon] model: given again (first on line 2)");
  /* An indented line is a line of its own, not a continuation. */
  expect_error("[daemon]\nmodel = /a\n   model = /b\n",
               ":3: [daemon] model: given again (first on line 2)");
  expect_error("model = /a\n", ":1: model: keys must be in a section ([daemon], [session], [limits])");
  expect_error("[demon]\nmodel = /a\nsocket = /b\n",
               ":2: [demon]: unknown section (sections: [daemon], [session], [limits])");
  /* The policy list is kvcache's; only the start of the message is ours. */
  WRITE("[session]\npolicy = lru\n");
  struct sk_config c;
  struct sk_config_errors errs;
  assert_int_equal(load(&c, &errs), -SK_ERR_BAD_REQUEST);
  assert_int_equal(errs.n, 1);
  assert_non_null(strstr(errs.e[0].message, ":2: [session] policy: unknown policy \"lru\""));
  sk_config_done(&c);
  expect_error("[session]\nwindow = 2000000\n",
               ":2: [session] window: '2000000' is not a number in [1, 1048576] or 'auto'");
  expect_error("[limits]\nmax_sessions = 65537\n",
               ":2: [limits] max_sessions: '65537' is not a number in [1, 65536]");
  expect_error("[limits]\nmax_clients = 0\n",
               ":2: [limits] max_clients: '0' is not a number in [1, 65536]");
  expect_error("[limits]\nmax_user_clients = 65537\n",
               ":2: [limits] max_user_clients: '65537' is not a number in [0, 65536]");
  expect_error("[limits]\nframe_timeout = 3601\n",
               ":2: [limits] frame_timeout: '3601' is not a number in [0, 3600]");
  expect_error("[limits]\nmax_frame = 17M\n",
               ":2: [limits] max_frame: '17M' is not a size (bytes, or with K, M, G, T) in [64, "
               "16M]");
  expect_error("[limits]\nmax_frame = 1Q\n",
               ":2: [limits] max_frame: '1Q' is not a size (bytes, or with K, M, G, T) in [64, "
               "16M]");
  expect_error("[limits]\nmax_frame = 99999999999999999999T\n",
               ":2: [limits] max_frame: '99999999999999999999T' is not a size (bytes, or with K, "
               "M, G, T) in [64, 16M]");
  expect_error("[limits]\nmax_capacity = 0\n",
               ":2: [limits] max_capacity: '0' is not a number in [1, 1048576] or 'auto'");
}

/* max_memory's ceiling is the machine's memory; its message says so. */
static void test_memory_ceiling(void **state) {
  (void)state;
  WRITE("[limits]\nmax_memory = 1T\n");
  struct sk_config c;
  struct sk_config_errors errs;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  uint64_t phys = (uint64_t)pages * (uint64_t)page;
  int rc = load(&c, &errs);
  if (phys >= (1ull << 40)) {
    assert_int_equal(rc, 0);
  } else {
    assert_int_equal(rc, -SK_ERR_BAD_REQUEST);
    assert_int_equal(errs.n, 1);
    assert_non_null(strstr(errs.e[0].message, ":2: [limits] max_memory: '1T' is not a size"));
    assert_non_null(strstr(errs.e[0].message, " in [1M, "));
  }
  sk_config_done(&c);
  WRITE("[limits]\nmax_memory = 1023K\n");
  assert_int_equal(load(&c, &errs), -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(errs.e[0].message, ":2: [limits] max_memory: '1023K' is not a size"));
  sk_config_done(&c);
  WRITE("[limits]\nmax_memory = 1048576\n");
  assert_int_equal(load(&c, &errs), 0);
  assert_int_equal(c.max_memory, 1u << 20);
  sk_config_done(&c);
}

static void test_many_errors(void **state) {
  (void)state;
  /* All problems of a file at once, in line order; the syntax error
   * (reported by inih) sorted among them. */
  WRITE("[daemon]\n"
        "threads = x\n"
        "this line is wrong\n"
        "batch = 0\n"
        "[x]\n"
        "a = 1\n"
        "b = 2\n");
  struct sk_config c;
  struct sk_config_errors errs;
  assert_int_equal(load(&c, &errs), -SK_ERR_BAD_REQUEST);
  assert_int_equal(errs.n, 4);
  assert_int_equal(errs.line[0], 2);
  assert_int_equal(errs.line[1], 3);
  assert_int_equal(errs.line[2], 4);
  assert_int_equal(errs.line[3], 6);
  assert_non_null(strstr(errs.e[1].message,
                         ":3: syntax error: expected '[section]', 'key = value' or a comment"));
  sk_config_done(&c);

  /* More than SK_CONFIG_MAX_ERRORS: the rest are counted. */
  char text[4096];
  size_t w = (size_t)snprintf(text, sizeof text, "[limits]\n");
  for (int i = 0; i < 20; i++) w += (size_t)snprintf(text + w, sizeof text - w, "k%d = 1\n", i);
  write_file(text, w);
  assert_int_equal(load(&c, &errs), -SK_ERR_BAD_REQUEST);
  assert_int_equal(errs.n, SK_CONFIG_MAX_ERRORS);
  assert_int_equal(errs.dropped, 4);
  sk_config_done(&c);

  /* A line longer than inih's buffer and a NUL byte are refused whole. */
  write_filled("[daemon]\nmodel = /", 'a', 300, "\nbatch = 8\n");
  assert_int_equal(load(&c, &errs), -SK_ERR_BAD_REQUEST);
  assert_int_equal(errs.n, 1);
  assert_non_null(
      strstr(errs.e[0].message, ":2: [daemon] model: the line is longer than 199 bytes"));
  assert_null(c.model);
  assert_int_equal(c.batch, 8);
  sk_config_done(&c);
  /* The message names the key when the line starts as one, in the section
   * of the last "[name]" line; a long comment is a line, no key. */
  char comment[256];
  snprintf(comment, sizeof comment, "\n# %0200d\n", 0);
  write_filled("[daemon]\n[ limits ]\n max_sessions\t= ", '1', 200, comment);
  assert_int_equal(load(&c, &errs), -SK_ERR_BAD_REQUEST);
  assert_int_equal(errs.n, 2);
  assert_non_null(
      strstr(errs.e[0].message, ":3: [limits] max_sessions: the line is longer than 199 bytes"));
  assert_non_null(strstr(errs.e[1].message, ":4: the line is longer than 199 bytes"));
  sk_config_done(&c);
  /* The limit is on the text of a line, with or without its newline. */
  for (int last = 0; last < 2; last++) {
    for (size_t bytes = 199; bytes <= 200; bytes++) {
      write_filled("[daemon]\nbatch = 8\nmodel = /", 'b', bytes - strlen("model = /"),
                   last ? "" : "\n");
      int rc = load(&c, &errs);
      if (bytes == 199) {
        assert_int_equal(rc, 0);
        assert_int_equal(strlen(c.model), 199 - strlen("model = "));
      } else {
        assert_int_equal(rc, -SK_ERR_BAD_REQUEST);
        assert_non_null(
            strstr(errs.e[0].message, ":3: [daemon] model: the line is longer than 199 bytes"));
      }
      sk_config_done(&c);
    }
  }
  /* "key=value" within 199 bytes whose "key = value" would not be: the
   * value may be 199 - strlen("model = ") = 191 bytes, not 192. */
  for (size_t value = 191; value <= 192; value++) {
    write_filled("[daemon]\nmodel=/", 'c', value - 1, "\n");
    int rc = load(&c, &errs);
    if (value == 191) {
      assert_int_equal(rc, 0);
      assert_int_equal(strlen(c.model), 191);
    } else {
      assert_int_equal(rc, -SK_ERR_BAD_REQUEST);
      assert_int_equal(errs.n, 1);
      assert_non_null(strstr(errs.e[0].message, ":2: [daemon] model: the value is longer than "
                                                "191 bytes"));
    }
    sk_config_done(&c);
  }
  write_file("[daemon]\nbatch = 8\0 9\n", 22);
  assert_int_equal(load(&c, &errs), -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(errs.e[0].message, ":2: the line holds a NUL byte"));
  sk_config_done(&c);
}

static void test_sizes(void **state) {
  (void)state;
  static const struct {
    const char *text;
    uint32_t want;
  } ok[] = {
      {"64", 64}, {"1K", 1024}, {"1k", 1024}, {"1KiB", 1024}, {"1kb", 1024},
      {"16M", 16u << 20}, {"1048576", 1u << 20}, {"3m", 3u << 20},
  };
  static const char *const bad[] = {"63", "1G", "K", "-1", " 1", "1 K", "1KK", "0x40", "1.5M"};
  struct sk_config c;
  struct sk_error e;
  assert_int_equal(sk_config_init(&c), 0);
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    assert_int_equal(sk_config_set(&c, SK_CFG_MAX_FRAME, ok[i].text, SK_CONFIG_FROM_COMMAND_LINE, 0, &e), 0);
    assert_int_equal(c.max_frame, ok[i].want);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    assert_int_equal(sk_config_set(&c, SK_CFG_MAX_FRAME, bad[i], SK_CONFIG_FROM_COMMAND_LINE, 0, &e),
                     -SK_ERR_BAD_REQUEST);
  /* Printed back in the largest exact unit. */
  char buf[64];
  assert_int_equal(sk_config_set(&c, SK_CFG_MAX_FRAME, "1536K", SK_CONFIG_FROM_COMMAND_LINE, 0, &e), 0);
  sk_config_format(&c, SK_CFG_MAX_FRAME, buf, sizeof buf);
  assert_string_equal(buf, "1536K");
  assert_int_equal(sk_config_set(&c, SK_CFG_MAX_FRAME, "2097152", SK_CONFIG_FROM_COMMAND_LINE, 0, &e), 0);
  sk_config_format(&c, SK_CFG_MAX_FRAME, buf, sizeof buf);
  assert_string_equal(buf, "2M");
  assert_int_equal(sk_config_set(&c, SK_CFG_MAX_FRAME, "1000", SK_CONFIG_FROM_COMMAND_LINE, 0, &e), 0);
  sk_config_format(&c, SK_CFG_MAX_FRAME, buf, sizeof buf);
  assert_string_equal(buf, "1000");
  /* Control characters never reach a path. */
  assert_int_equal(sk_config_set(&c, SK_CFG_MODEL, "a\nb", SK_CONFIG_FROM_COMMAND_LINE, 0, &e),
                   -SK_ERR_BAD_REQUEST);
  char longpath[200];
  memset(longpath, 'a', sizeof longpath - 1);
  longpath[0] = '/';
  longpath[sizeof longpath - 1] = 0;
  assert_int_equal(sk_config_set(&c, SK_CFG_SOCKET, longpath, SK_CONFIG_FROM_COMMAND_LINE, 0, &e),
                   -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(e.message, "is longer than a socket path may be (107 bytes)"));
  sk_config_done(&c);
}

static struct sk_model_config model_with_context(uint32_t n_ctx) {
  struct sk_model_config mc;
  memset(&mc, 0, sizeof mc);
  mc.n_ctx_train = n_ctx;
  snprintf(mc.name, sizeof mc.name, "test");
  return mc;
}

static void test_resolve(void **state) {
  (void)state;
  struct sk_config c;
  struct sk_error e;
  assert_int_equal(sk_config_init(&c), 0);
  /* No model anywhere. */
  assert_int_equal(sk_config_resolve(&c, NULL, &e), -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(e.message, "no model: set 'model' in [daemon] of "));
  assert_non_null(strstr(e.message, " or pass --model FILE"));
  assert_int_equal(sk_config_set(&c, SK_CFG_MODEL, "/m.gguf", SK_CONFIG_FROM_COMMAND_LINE, 0, &e), 0);

  struct sk_config c2;
  assert_int_equal(sk_config_copy(&c2, &c), 0);
  struct sk_model_config mc = model_with_context(2048);
  assert_int_equal(sk_config_resolve(&c, &mc, &e), 0);
  assert_true(c.threads >= 1);
  assert_true(c.origin[SK_CFG_THREADS].automatic);
  assert_int_equal(c.max_capacity, 8192);
  assert_int_equal(c.window, 1020);
  assert_int_equal(c.capacity, 2048);
  assert_true(c.max_memory >= (1u << 20));
  assert_int_equal(c.max_memory % (1u << 20), 0);
  /* Input memory: 64 and 16 frames of max_frame. */
  assert_int_equal(c.max_input_memory, 64u << 20);
  assert_int_equal(c.max_user_input_memory, 16u << 20);
  assert_true(c.origin[SK_CFG_MAX_INPUT_MEMORY].automatic);
  sk_config_done(&c);
  /* ... which must hold one whole frame. */
  assert_int_equal(sk_config_copy(&c, &c2), 0);
  assert_int_equal(sk_config_set(&c, SK_CFG_MAX_USER_INPUT_MEMORY, "1M",
                                 SK_CONFIG_FROM_COMMAND_LINE, 0, &e), 0);
  assert_int_equal(sk_config_resolve(&c, &mc, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "--max-user-input-memory: 1048576 bytes is less than one whole "
                                 "request frame (max_frame 1048576 + 4 bytes of header)");
  sk_config_done(&c);
  /* Speculation: a draft needs a draft model, a look-up a history. */
  assert_int_equal(sk_config_copy(&c, &c2), 0);
  assert_int_equal(c.speculation, 0); /* auto */
  assert_int_equal(c.draft_tokens, 8);
  assert_int_equal(c.lookup_history, 16384);
  assert_int_equal(sk_config_set(&c, SK_CFG_SPECULATION, "draft", SK_CONFIG_FROM_COMMAND_LINE, 0,
                                 &e), 0);
  assert_int_equal(sk_config_resolve(&c, &mc, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "--speculation: speculation draft needs a draft model: set "
                                 "draft_model (or --draft-model) in [daemon], or speculation "
                                 "lookup or off");
  assert_int_equal(sk_config_set(&c, SK_CFG_DRAFT_MODEL, "/d.gguf", SK_CONFIG_FROM_COMMAND_LINE,
                                 0, &e), 0);
  assert_int_equal(sk_config_resolve(&c, &mc, &e), 0);
  assert_int_equal(sk_config_set(&c, SK_CFG_SPECULATION, "lookup", SK_CONFIG_FROM_COMMAND_LINE, 0,
                                 &e), 0);
  assert_int_equal(sk_config_set(&c, SK_CFG_LOOKUP_HISTORY, "0", SK_CONFIG_FROM_COMMAND_LINE, 0,
                                 &e), 0);
  assert_int_equal(sk_config_resolve(&c, &mc, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "--speculation: speculation lookup needs a history: "
                                 "lookup_history is 0");
  assert_int_equal(sk_config_set(&c, SK_CFG_SPECULATION, "fast", SK_CONFIG_FROM_COMMAND_LINE, 0,
                                 &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "'fast' is not auto, off, draft or lookup");
  assert_int_equal(sk_config_set(&c, SK_CFG_DRAFT_TOKENS, "16", SK_CONFIG_FROM_COMMAND_LINE, 0,
                                 &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "'16' is not a number in [1, 15]");
  sk_config_done(&c);

  /* A long-context model: max_capacity follows it, the window stays 1024. */
  mc = model_with_context(32768);
  assert_int_equal(sk_config_copy(&c, &c2), 0);
  assert_int_equal(sk_config_resolve(&c, &mc, &e), 0);
  assert_int_equal(c.max_capacity, 32768);
  assert_int_equal(c.window, 1020);
  assert_int_equal(c.capacity, 32768);
  sk_config_done(&c);

  /* A short model: window = context - sinks. */
  mc = model_with_context(100);
  assert_int_equal(sk_config_copy(&c, &c2), 0);
  assert_int_equal(sk_config_resolve(&c, &mc, &e), 0);
  assert_int_equal(c.window, 96);
  assert_int_equal(c.capacity, 100);
  sk_config_done(&c);

  /* More sinks than the automatic window's span: refused with the counts. */
  mc = model_with_context(2048);
  assert_int_equal(sk_config_copy(&c, &c2), 0);
  assert_int_equal(sk_config_set(&c, SK_CFG_SINKS, "2000", SK_CONFIG_FROM_COMMAND_LINE, 0, &e),
                   0);
  assert_int_equal(sk_config_resolve(&c, &mc, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "--sinks: 2000 sinks leave no room for the automatic window: it "
                                 "is min(model context 2048, 1024) - sinks = 1024 - 2000; give "
                                 "fewer sinks than 1024, or set window");
  sk_config_done(&c);
  mc = model_with_context(100);

  /* Defaults that cannot open are named with their line. */
  WRITE("[session]\nsinks = 10\nwindow = 100\n[limits]\nmax_capacity = 64\n");
  struct sk_config_errors errs;
  assert_int_equal(load(&c, &errs), 0);
  assert_int_equal(sk_config_overlay(&c, &c2), 0);
  assert_int_equal(sk_config_resolve(&c, &mc, &e), -SK_ERR_BAD_REQUEST);
  char want[600];
  snprintf(want, sizeof want, "%s:3: [session] window: default streaming session: ", g_path);
  assert_memory_equal(e.message, want, strlen(want));
  sk_config_done(&c);
  WRITE("[session]\ncapacity = 100\n[limits]\nmax_capacity = 64\n");
  assert_int_equal(load(&c, &errs), 0);
  assert_int_equal(sk_config_overlay(&c, &c2), 0);
  assert_int_equal(sk_config_set(&c, SK_CFG_WINDOW, "10", SK_CONFIG_FROM_COMMAND_LINE, 0, &e), 0);
  assert_int_equal(sk_config_resolve(&c, &mc, &e), -SK_ERR_BAD_REQUEST);
  snprintf(want, sizeof want, "%s:2: [session] capacity: default dense session: ", g_path);
  assert_memory_equal(e.message, want, strlen(want));
  sk_config_done(&c);
  /* ... also when they fit max_capacity but not the model's context
   * (mc: 100 positions), which every open would refuse */
  assert_int_equal(sk_config_copy(&c, &c2), 0);
  assert_int_equal(sk_config_set(&c, SK_CFG_WINDOW, "97", SK_CONFIG_FROM_COMMAND_LINE, 0, &e), 0);
  assert_int_equal(sk_config_resolve(&c, &mc, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "--window: default streaming session: n_sink + window = 4 + 97 = "
                                 "101 exceeds the model's context: n_ctx_train 100 x rope_scale 1 "
                                 "= 100 positions");
  sk_config_done(&c);
  assert_int_equal(sk_config_copy(&c, &c2), 0);
  assert_int_equal(sk_config_set(&c, SK_CFG_CAPACITY, "101", SK_CONFIG_FROM_COMMAND_LINE, 0, &e),
                   0);
  assert_int_equal(sk_config_resolve(&c, &mc, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "--capacity: default dense session: capacity 101 exceeds the "
                                 "model's context: n_ctx_train 100 x rope_scale 1 = 100 positions");
  sk_config_done(&c);
  sk_config_done(&c2);
}

/* --check-config's output is a configuration file that reads back to the
 * same values. */
static void test_print_round_trip(void **state) {
  (void)state;
  WRITE("[daemon]\nmodel = /models/m.gguf\nlog_level = notice\n"
        "[session]\npolicy = dense\n[limits]\nmax_frame = 1536K\nmax_memory = 32M\n");
  struct sk_config c;
  struct sk_config_errors errs;
  struct sk_error e;
  assert_int_equal(load(&c, &errs), 0);
  assert_int_equal(sk_config_set(&c, SK_CFG_MAX_SESSIONS, "9", SK_CONFIG_FROM_COMMAND_LINE, 0, &e), 0);
  struct sk_model_config mc = model_with_context(2048);
  assert_int_equal(sk_config_resolve(&c, &mc, &e), 0);

  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  assert_non_null(f);
  sk_config_print(f, &c);
  fclose(f);
  char want[600];
  snprintf(want, sizeof want, "model = /models/m.gguf ; %s:2\n", g_path);
  assert_non_null(strstr(text, want));
  assert_non_null(strstr(text, "\n[limits]\nmax_clients = 1024 ; default\n"));
  assert_non_null(strstr(text, "\nmax_sessions = 9 ; command line --max-sessions\n"));
  assert_non_null(strstr(text, "\nwindow = 1020 ; default (auto)\n"));
  assert_non_null(strstr(text, "\nmax_frame = 1536K ; "));
  assert_non_null(strstr(text, "\nlog_level = notice ; "));

  write_file(text, len);
  struct sk_config back;
  assert_int_equal(load(&back, &errs), 0);
  for (int k = 0; k < SK_CFG__COUNT; k++)
    if (!sk_config_same(&back, &c, (enum sk_config_key)k))
      fail_msg("%s differs after the round trip", sk_config_key_name((enum sk_config_key)k));
  free(text);
  sk_config_done(&back);
  sk_config_done(&c);
}

static void test_key_table(void **state) {
  (void)state;
  /* Every key has a section, an option named after it, and the keys SIGHUP
   * cannot change are exactly those fixed when the daemon starts. */
  for (int k = 0; k < SK_CFG__COUNT; k++) {
    const char *name = sk_config_key_name((enum sk_config_key)k);
    const char *opt = sk_config_key_option((enum sk_config_key)k);
    assert_non_null(name);
    assert_non_null(sk_config_key_section((enum sk_config_key)k));
    assert_int_equal(strncmp(opt, "--", 2), 0);
    for (size_t i = 0; name[i]; i++) assert_int_equal(opt[2 + i] == '-' ? '_' : opt[2 + i], name[i]);
  }
  static const enum sk_config_key fixed[] = {
      SK_CFG_MODEL,       SK_CFG_SOCKET,      SK_CFG_STATE_DIR,     SK_CFG_THREADS, SK_CFG_BATCH,
      SK_CFG_STEP_TOKENS,
      SK_CFG_KV_TYPE,     SK_CFG_HTTP_SOCKET, SK_CFG_HTTP_LISTEN,   SK_CFG_HTTP_KEY_FILE,
      SK_CFG_HTTP_UID,    SK_CFG_HTTP_LISTEN_PUBLIC, SK_CFG_CHAT_TEMPLATE, SK_CFG_SPARSITY_FILE,
      SK_CFG_DRAFT_MODEL, SK_CFG_LOOKUP_HISTORY};
  const size_t n = sizeof fixed / sizeof fixed[0];
  size_t n_fixed = 0;
  for (int k = 0; k < SK_CFG__COUNT; k++)
    if (!sk_config_key_reloadable((enum sk_config_key)k)) n_fixed++;
  assert_int_equal(n_fixed, n);
  for (size_t i = 0; i < n; i++) assert_false(sk_config_key_reloadable(fixed[i]));
  assert_string_equal(sk_config_log_level_name(SK_LOG_WARNING), "warning");
  assert_string_equal(sk_config_log_level_name(99), "?");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_full_file),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_memory_ceiling),
      cmocka_unit_test(test_many_errors),
      cmocka_unit_test(test_sizes),
      cmocka_unit_test(test_resolve),
      cmocka_unit_test(test_print_round_trip),
      cmocka_unit_test(test_key_table),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
