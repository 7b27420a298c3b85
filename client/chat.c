/* sinkctl chat: a conversation with the model, line by line, in one
 * session. With a chat template (the model's, or the daemon's
 * --chat-template) each line is the user's message of the chat op and
 * the reply the assistant's; without one the text simply continues. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "sinkctl.h"

/* A chat in progress. */
struct chat {
  struct sk_client *c;
  const struct opts *o;
  uint64_t session;
  bool opened;    /* the session was opened here: closed (or kept) at the end */
  bool tty;       /* stdin is a terminal: prompts and hints */
  bool roles;     /* a chat template: the chat op with roles; none: plain
                     continuation */
  char *system;   /* the system prompt still to send with the first message
                     (--session's --system, or /system), or NULL; owned */
  bool system_set; /* the session holds a system prompt or a conversation
                      already: a new system prompt needs a new session */
  unsigned turn;  /* messages sent */
  int status;     /* the exit status so far */
};

static void chat_help(void) {
  fputs("Type a line and press Enter: it is appended to the session and the\n"
        "reply streams back. The session keeps the conversation, within its\n"
        "policy's budget (streaming: sinks + window; dense: capacity).\n"
        "With a chat template, a line is the user's message and the reply the\n"
        "assistant's; without one, the text simply continues.\n"
        "  Ctrl-C      stop the reply (a second Ctrl-C quits)\n"
        "  Ctrl-D      quit (also /bye)\n"
        "  /system T   the system prompt: before the first message, or it starts\n"
        "              a new conversation (a new session)\n"
        "  /stats      the session's figures\n"
        "  /help       this text\n"
        "  //text      send a line that starts with '/'\n",
        stderr);
}

/* Opens a session for the chat with the options' policy, and system as
 * its system prompt (pinned at open; NULL: none). Returns 0, or the exit
 * status of a reported error. */
static int chat_open(struct chat *ch, const char *system) {
  const struct opts *o = ch->o;
  struct sk_error e;
  struct sk_open_result r;
  struct sk_open_params op = o->open;
  op.temporary = !o->given[OPT_KEEP]; /* closed by the daemon even if we die */
  op.system = system;
  if (sk_client_open(ch->c, &op, &r, &e) < 0) return report(ch->c, &e);
  ch->session = r.session;
  ch->opened = true;
  ch->system_set = system != NULL;
  if (ch->tty || system)
    fprintf(stderr, "%s: session %" PRIu64 " (%s, %" PRIu64 " tokens%s%" PRIu64 "%s)\n", prog,
            ch->session, r.policy, r.capacity, system ? ", the system prompt " : "",
            system ? r.pinned : 0, system ? " of them" : "");
  return 0;
}

/* Opens the chat's session (a new one, or --session's), learns whether a
 * chat template gives roles and says so. Returns 0, or the exit status
 * of a reported error. */
static int chat_start(struct chat *ch) {
  struct sk_client *c = ch->c;
  const struct opts *o = ch->o;
  struct sk_error e;
  /* A template (the model's, or the daemon's --chat-template): the chat
   * op with roles; none: plain continuation. */
  char tmpl[SK_CLIENT_NAME_MAX] = "none";
  char tmpl_error[256] = "";
  if (!o->has_session) {
    struct sk_hello h;
    if (sk_client_hello(c, &h, &e) < 0) return report(c, &e);
    snprintf(tmpl, sizeof tmpl, "%s", h.chat_template[0] ? h.chat_template : "none");
    snprintf(tmpl_error, sizeof tmpl_error, "%s", h.chat_template_error);
    int rc = chat_open(ch, strcmp(tmpl, "none") != 0 ? o->system : NULL);
    if (rc != 0) return rc;
    if (ch->tty) fprintf(stderr, "%s: Ctrl-C stops a reply; Ctrl-D or /bye quits; /help.\n", prog);
  } else {
    struct sk_session_stats st;
    if (sk_client_session_stats(c, ch->session, &st, &e) < 0) return report(c, &e);
    snprintf(tmpl, sizeof tmpl, "%s", st.chat_template[0] ? st.chat_template : "none");
    ch->system_set = st.seen > 0;
    if (ch->tty)
      fprintf(stderr, "%s: session %" PRIu64 " (%s, %" PRIu64 " of %" PRIu64
              " tokens in the cache). Ctrl-D or /bye quits; /help.\n",
              prog, ch->session, st.policy, st.resident, st.capacity);
  }
  ch->roles = strcmp(tmpl, "none") != 0;
  if (!ch->roles) {
    fprintf(stderr, "%s: no chat template%s%s: plain text continuation (sinkd --chat-template "
            "NAME gives one)\n", prog, tmpl_error[0] ? ": " : "", tmpl_error);
    if (o->system) sk_cli_die(EXIT_USAGE, "--system needs a chat template");
  } else if (ch->tty) {
    fprintf(stderr, "%s: chat template %s\n", prog, tmpl);
  }
  /* The system prompt of a --session chat, or /system's: it goes first in
   * the first message sent. */
  ch->system = o->has_session && o->system ? strdup(o->system) : NULL;
  return 0;
}

/* The session this chat opened: kept (--keep, with how to go on) or
 * closed. */
static void chat_end(struct chat *ch) {
  struct sk_error e;
  if (!ch->opened || !sk_client_connected(ch->c)) return;
  if (ch->o->given[OPT_KEEP]) {
    fprintf(stderr, "%s: session %" PRIu64 " kept; continue with: %s chat --session %" PRIu64
              "\n", prog, ch->session, prog, ch->session);
  } else if (sk_client_close_session(ch->c, ch->session, &e) < 0 && ch->status == 0) {
    ch->status = report(ch->c, &e);
  }
}

/* One of chat's commands (a line starting with '/', not "//"). Returns
 * false to end the chat: /bye, or the connection gone. */
static bool chat_command(struct chat *ch, const char *line) {
  struct sk_error e;
  if (!strcmp(line, "/bye") || !strcmp(line, "/exit") || !strcmp(line, "/quit")) return false;
  if (!strncmp(line, "/system", 7) && (line[7] == ' ' || line[7] == 0)) {
    const char *t = line + 7;
    while (*t == ' ') t++;
    if (!ch->roles) {
      fprintf(stderr, "%s: /system: no chat template (plain continuation)\n", prog);
    } else if (!*t) {
      fprintf(stderr, "%s: /system TEXT\n", prog);
    } else if (ch->turn == 0 && !ch->system_set) {
      /* nothing sent yet: it goes first in the first message */
      free(ch->system);
      ch->system = strdup(t);
    } else if (!ch->opened) {
      fprintf(stderr, "%s: /system: session %" PRIu64 " holds a conversation already, and a "
              "system prompt starts one; for a new conversation: %s chat --system TEXT\n",
              prog, ch->session, prog);
    } else {
      /* A new conversation: this one's session ends (or is kept), a new
       * one opens with the system prompt pinned. */
      chat_end(ch);
      if (!sk_client_connected(ch->c)) return false;
      fprintf(stderr, "%s: /system: a new conversation\n", prog);
      free(ch->system);
      ch->system = NULL;
      ch->turn = 0;
      int rc = chat_open(ch, t);
      if (rc != 0) {
        ch->status = rc;
        ch->opened = false;
        return false;
      }
    }
    return true;
  }
  if (!strcmp(line, "/help") || !strcmp(line, "/?")) {
    chat_help();
  } else if (!strcmp(line, "/stats")) {
    struct sk_session_stats st;
    if (sk_client_session_stats(ch->c, ch->session, &st, &e) < 0) {
      ch->status = report(ch->c, &e);
      if (!sk_client_connected(ch->c)) return false;
    } else if (ch->o->json) {
      json_session_stats(&st);
    } else {
      print_session_stats(&st);
    }
  } else {
    fprintf(stderr, "%s: unknown command '%s' (/help lists them)\n", prog, line);
  }
  return true;
}

/* The generation parameters of a turn: the options', without a prompt. */
static struct sk_generate_params chat_params(const struct chat *ch) {
  struct sk_generate_params p = ch->o->gen;
  p.stop = ch->o->stops;
  p.n_stop = ch->o->n_stop;
  p.prompt = NULL;
  p.prompt_len = 0;
  return p;
}

/* A turn with roles: the chat op, the line the user's message (after the
 * system prompt, if one is still to send), the template the daemon's;
 * the reply is the assistant's, shown as such. */
static void chat_turn_roles(struct chat *ch, const char *text, size_t text_len) {
  struct sk_client *c = ch->c;
  const struct opts *o = ch->o;
  struct sk_error e;
  struct sk_generate_params p = chat_params(ch);
  struct gen_state g = {.json = o->json, .ends_with_newline = true};
  struct sk_generate_result res;
  struct sk_chat_message m[2];
  size_t nm = 0;
  if (ch->system) m[nm++] = (struct sk_chat_message){"system", ch->system, 0};
  m[nm++] = (struct sk_chat_message){"user", text, text_len};
  if (ch->tty && !o->json) {
    fputs("assistant: ", stdout);
    fflush(stdout);
  }
  int rc = sk_client_chat(c, ch->session, m, nm, &p, on_token, &g, &res, &e);
  if (ch->system) {
    /* sent once: taken, or refused with the message (later lines go
     * without it) */
    if (rc < 0 && sk_client_connected(c))
      fprintf(stderr, "%s: the system prompt was not taken: /system TEXT gives another\n",
              prog);
    free(ch->system);
    ch->system = NULL;
    ch->system_set = rc == 0;
  }
  if (rc < 0) {
    if (g.printed && !g.ends_with_newline) fputc('\n', stdout);
    fflush(stdout);
    ch->status = report(c, &e);
  } else {
    if (o->json) json_generate(ch->session, ch->turn, &g, &res);
    else if (!g.printed || !g.ends_with_newline) fputc('\n', stdout);
    fflush(stdout);
    if (strcmp(res.stop, "cancelled") == 0 && interrupted)
      fprintf(stderr, "%s: reply stopped (%" PRIu64 " tokens kept)\n", prog, res.n_tokens);
    else if (strcmp(res.stop, "context_full") == 0)
      fprintf(stderr, "%s: the session is full (%" PRIu64 " tokens, dense policy): "
              "open one with --policy streaming to keep going\n", prog, res.resident);
  }
  gen_state_free(&g);
}

/* A turn of plain continuation: the line and a newline appended (with a
 * progress bar if long), then a generate. */
static void chat_turn_plain(struct chat *ch, const char *text, size_t text_len) {
  struct sk_client *c = ch->c;
  const struct opts *o = ch->o;
  struct sk_error e;
  char *prompt = malloc(text_len + 2);
  if (!prompt) sk_cli_die(EXIT_FAILURE, "out of memory");
  memcpy(prompt, text, text_len);
  prompt[text_len] = '\n';
  prompt[text_len + 1] = 0;
  struct sk_generate_params p = chat_params(ch);
  p.prompt = prompt;
  p.prompt_len = text_len + 1;
  uint64_t prefilled = 0;
  int rc = 0;
  if (want_progress(o, p.prompt_len)) {
    rc = prefill(c, ch->session, session_is_empty(c, ch->session), false, prompt, p.prompt_len,
                 &prefilled);
    p.prompt = NULL;
    p.prompt_len = 0;
  }
  struct gen_state g = {.json = o->json, .ends_with_newline = true};
  struct sk_generate_result res;
  if (rc == 0) {
    rc = sk_client_generate(c, ch->session, &p, on_token, &g, &res, &e);
    if (rc < 0) {
      if (g.printed && !g.ends_with_newline) fputc('\n', stdout);
      fflush(stdout);
      ch->status = report(c, &e);
    }
  } else if (rc < 0) {
    fprintf(stderr, "%s: prefill stopped (%" PRIu64 " tokens appended)\n", prog, prefilled);
  } else {
    ch->status = rc;
    rc = -1;
  }
  free(prompt);
  if (rc == 0) {
    res.prompt_tokens += prefilled;
    if (o->json) {
      json_generate(ch->session, ch->turn, &g, &res);
    } else if (g.printed && !g.ends_with_newline) {
      fputc('\n', stdout);
    }
    fflush(stdout);
    if (strcmp(res.stop, "cancelled") == 0 && interrupted)
      fprintf(stderr, "%s: reply stopped (%" PRIu64 " tokens kept)\n", prog, res.n_tokens);
    else if (strcmp(res.stop, "context_full") == 0)
      say_session_full(res.resident);
  }
  gen_state_free(&g);
}

int cmd_chat(struct sk_client *c, const struct opts *o) {
  struct chat ch = {.c = c, .o = o, .session = o->session, .tty = isatty(STDIN_FILENO)};
  int rc = chat_start(&ch);
  if (rc != 0) return rc;
  char *line = NULL;
  size_t line_cap = 0;
  for (;;) {
    catch_sigint();
    if (ch.tty) {
      fputs(ch.roles ? "user: " : ">>> ", stdout);
      fflush(stdout);
    }
    errno = 0;
    ssize_t n = getline(&line, &line_cap, stdin);
    if (n < 0) {
      if (errno == EINTR && !feof(stdin)) { /* Ctrl-C at the prompt: a new prompt */
        clearerr(stdin);
        fputc('\n', stdout);
        continue;
      }
      if (ch.tty) fputc('\n', stdout);
      break;
    }
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    if (n == 0) continue;
    if (line[0] == '/' && line[1] != '/') {
      if (!chat_command(&ch, line)) break;
      continue;
    }
    const char *text = line[0] == '/' ? line + 1 : line; /* "//x" sends "/x" */
    /* One turn: the line and a newline go into the session, the reply
     * comes out of it; both stay in the cache for the next turn. */
    ch.turn++;
    if (ch.roles) chat_turn_roles(&ch, text, strlen(text));
    else chat_turn_plain(&ch, text, strlen(text));
    if (!sk_client_connected(c)) break;
  }
  signal(SIGINT, SIG_DFL);
  free(line);
  free(ch.system);
  chat_end(&ch);
  return ch.status;
}
