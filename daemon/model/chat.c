/* Chat templates (chat.h). The formats and the detection rules follow
 * llama.cpp's src/llama-chat.cpp (llm_chat_detect_template,
 * llm_chat_apply_template), which derives them from each model's
 * published Jinja template; the references in
 * ../shared/reference/chat/templates.json pin the output byte for byte.
 */
#include "model/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const sk__names[SK_CHAT__COUNT] = {
    [SK_CHAT_NONE] = "none",
#define SK__CHAT_NAME(id, name) [SK_CHAT_##id] = name,
    SK_CHAT_LIST(SK__CHAT_NAME)
#undef SK__CHAT_NAME
};

const char *sk_chat_name(int tmpl) {
  if (tmpl < 0 || tmpl >= SK_CHAT__COUNT) return NULL;
  return sk__names[tmpl];
}

int sk_chat_from_name(const char *name, size_t len) {
  for (int i = 0; i < SK_CHAT__COUNT; i++)
    if (strlen(sk__names[i]) == len && memcmp(sk__names[i], name, len) == 0) return i;
  return -1;
}

void sk_chat_names(char *buf, size_t size) {
  size_t w = 0;
  if (size == 0) return;
  buf[0] = 0;
  for (int i = 1; i < SK_CHAT__COUNT; i++) {
    int n = snprintf(buf + w, size - w, "%s%s", i > 1 ? ", " : "", sk__names[i]);
    if (n < 0 || (size_t)n >= size - w) {
      buf[size - 1] = 0;
      return;
    }
    w += (size_t)n;
  }
}

/* ---- detection ---- */

struct sk__hay {
  const char *s;
  size_t n;
};

static bool sk__has(const struct sk__hay *h, const char *needle) {
  size_t m = strlen(needle);
  if (m > h->n) return false;
  for (size_t i = 0; i + m <= h->n; i++)
    if (h->s[i] == needle[0] && memcmp(h->s + i, needle, m) == 0) return true;
  return false;
}

int sk_chat_detect(const char *text, size_t len) {
  int named = sk_chat_from_name(text, len);
  if (named > 0) return named;
  const struct sk__hay h = {text, len};
#define HAS(x) sk__has(&h, x)
  if (HAS("<|im_start|>")) {
    if (HAS("<|im_sep|>")) return SK_CHAT_PHI4;
    /* SmolVLM opens with <|im_start|> but is not ChatML */
    if (HAS("<end_of_utterance>")) return SK_CHAT_SMOLVLM;
    return SK_CHAT_CHATML;
  }
  if ((len >= 7 && memcmp(text, "mistral", 7) == 0) || HAS("[INST]")) {
    if (HAS("[SYSTEM_PROMPT]")) return SK_CHAT_MISTRAL_V7;
    /* mistralai's official v1 (system message concatenated after
     * " [INST] ") and v3/v3-tekken (tool definitions) */
    if (HAS("' [INST] ' + system_message") || HAS("[AVAILABLE_TOOLS]")) {
      if (HAS(" [INST]")) return SK_CHAT_MISTRAL_V1;
      if (HAS("\"[INST]\"")) return SK_CHAT_MISTRAL_V3_TEKKEN;
      return SK_CHAT_MISTRAL_V3;
    }
    /* Llama 2 and its variants */
    if (HAS("content.strip()")) return SK_CHAT_LLAMA2_SYS_STRIP;
    if (HAS("bos_token + '[INST]")) return SK_CHAT_LLAMA2_SYS_BOS;
    if (HAS("<<SYS>>")) return SK_CHAT_LLAMA2_SYS;
    return SK_CHAT_LLAMA2;
  }
  if (HAS("<|assistant|>") && HAS("<|end|>")) return SK_CHAT_PHI3;
  if (HAS("[gMASK]<sop>")) return SK_CHAT_CHATGLM4;
  if (HAS("<|assistant|>") && HAS("<|user|>")) {
    if (HAS("<|tool_declare|>")) return -1; /* exaone-moe: not built in here */
    return HAS("</s>") ? SK_CHAT_FALCON3 : SK_CHAT_GLMEDGE;
  }
  if (HAS("<|{{ item['role'] }}|>") && HAS("<|begin_of_image|>")) return SK_CHAT_GLMEDGE;
  if (HAS("<|user|>") && HAS("<|endoftext|>")) return SK_CHAT_ZEPHYR;
  if (HAS("bos_token + message['role']")) return SK_CHAT_MONARCH;
  if (HAS("<start_of_turn>")) return SK_CHAT_GEMMA;
  if (HAS("'\\n\\nAssistant: ' + eos_token")) return SK_CHAT_ORION;
  if (HAS("GPT4 Correct ")) return SK_CHAT_OPENCHAT;
  if (HAS("USER: ") && HAS("ASSISTANT: "))
    return HAS("SYSTEM: ") ? SK_CHAT_VICUNA_ORCA : SK_CHAT_VICUNA;
  if (HAS("### Instruction:") && HAS("<|EOT|>")) return SK_CHAT_DEEPSEEK;
  if (HAS("<|START_OF_TURN_TOKEN|>") && HAS("<|USER_TOKEN|>")) return SK_CHAT_COMMAND_R;
  if (HAS("<|start_header_id|>") && HAS("<|end_header_id|>")) return SK_CHAT_LLAMA3;
  if (HAS("[gMASK]sop")) return SK_CHAT_CHATGLM3;
  if (HAS("<\xe7\x94\xa8\xe6\x88\xb7>")) return SK_CHAT_MINICPM; /* <用户> */
  if (HAS("'Assistant: ' + message['content'] + eos_token")) return SK_CHAT_DEEPSEEK2;
  /* <｜Assistant｜>, <｜User｜>, <｜end▁of▁sentence｜> */
  if (HAS("<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>") && HAS("<\xef\xbd\x9cUser\xef\xbd\x9c>") &&
      HAS("<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"))
    return SK_CHAT_DEEPSEEK3;
  if (HAS("[|system|]") && HAS("[|assistant|]") && HAS("[|endofturn|]"))
    return HAS("[|tool|]") ? SK_CHAT_EXAONE4 : SK_CHAT_EXAONE3;
  if (HAS("rwkv-world") || HAS("{{- 'User: ' + message['content']|trim + '\\n\\n' -}}"))
    return SK_CHAT_RWKV_WORLD;
  if (HAS("<|start_of_role|>")) {
    if (HAS("<tool_call>") || HAS("<tools>"))
      return HAS("g4_default_system_message") ? SK_CHAT_GRANITE_4_0 : SK_CHAT_GRANITE_4_1;
    return SK_CHAT_GRANITE;
  }
  if (HAS("message['role'] + additional_special_tokens[0] + message['content'] + "
          "additional_special_tokens[1]"))
    return SK_CHAT_GIGACHAT;
  if (HAS("<|role_start|>")) return SK_CHAT_MEGREZ;
  if (HAS(" \xd0\x90\xd1\x81\xd1\x81\xd0\xb8\xd1\x81\xd1\x82\xd0\xb5\xd0\xbd\xd1\x82:"))
    return SK_CHAT_YANDEX; /* " Ассистент:" */
  if (HAS("<role>ASSISTANT</role>") && HAS("'HUMAN'")) return SK_CHAT_BAILING;
  if (HAS("<role>ASSISTANT</role>") && HAS("\"HUMAN\"") && HAS("<think>"))
    return SK_CHAT_BAILING_THINK;
  if (HAS("<role>ASSISTANT</role>") && HAS("<role>HUMAN</role>") && HAS("<|role_end|>"))
    return SK_CHAT_BAILING2;
  if (HAS("<|header_start|>") && HAS("<|header_end|>")) return SK_CHAT_LLAMA4;
  if (HAS("<seed:bos>")) return SK_CHAT_SEED_OSS;
#undef HAS
  return -1;
}

int sk_chat_resolve(const char *text, size_t len, const char *what, int *ret,
                    struct sk_error *err) {
  int t = sk_chat_detect(text, len);
  if (t < 0)
    /* The common families; an error message holds 255 bytes, the whole
     * list is in sinkd.conf(5) and `sinkd --help`. */
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "%s: unrecognised chat template; set chat_template to one of chatml, "
                        "llama2, llama3, mistral-v1, mistral-v3, mistral-v7, phi3, phi4, gemma, "
                        "zephyr, deepseek3, command-r, granite (all: sinkd.conf(5))",
                        what);
  *ret = t;
  return 0;
}

/* ---- rendering ---- */

void sk_chat_text_init(struct sk_chat_text *t) { memset(t, 0, sizeof *t); }

void sk_chat_text_free(struct sk_chat_text *t) {
  if (!t) return;
  free(t->text);
  free(t->segs);
  memset(t, 0, sizeof *t);
}

void sk_chat_text_reset(struct sk_chat_text *t) {
  t->len = 0;
  t->n_segs = 0;
  if (t->text) t->text[0] = 0;
}

/* Appends s[0..n) as template text (content false) or content; adjacent
 * pieces of one kind share a segment. */
static int sk__put(struct sk_chat_text *t, const char *s, size_t n, bool content) {
  if (n == 0) return 0;
  if (t->len + n + 1 > t->cap) {
    size_t cap = t->cap ? t->cap : 256;
    while (cap < t->len + n + 1) {
      if (cap > SIZE_MAX / 2) return -SK_ERR_NO_MEMORY;
      cap *= 2;
    }
    char *p = realloc(t->text, cap);
    if (!p) return -SK_ERR_NO_MEMORY;
    t->text = p;
    t->cap = cap;
  }
  if (t->n_segs && t->segs[t->n_segs - 1].content == content) {
    t->segs[t->n_segs - 1].len += n;
  } else {
    if (t->n_segs == t->seg_cap) {
      size_t cap = t->seg_cap ? 2 * t->seg_cap : 16;
      struct sk_chat_seg *p = realloc(t->segs, cap * sizeof *p);
      if (!p) return -SK_ERR_NO_MEMORY;
      t->segs = p;
      t->seg_cap = cap;
    }
    t->segs[t->n_segs++] = (struct sk_chat_seg){.off = t->len, .len = n, .content = content};
  }
  memcpy(t->text + t->len, s, n);
  t->len += n;
  t->text[t->len] = 0;
  return 0;
}

/* The renderer's state: the output and the first error. */
struct sk__r {
  struct sk_chat_text *out;
  int rc;
};

static void sk__tpl(struct sk__r *r, const char *s) {
  if (r->rc == 0) r->rc = sk__put(r->out, s, strlen(s), false);
}
static void sk__tpln(struct sk__r *r, const char *s, size_t n) {
  if (r->rc == 0) r->rc = sk__put(r->out, s, n, false);
}
static void sk__body(struct sk__r *r, const char *s, size_t n) {
  if (r->rc == 0) r->rc = sk__put(r->out, s, n, true);
}

/* White space as C's isspace in the "C" locale. */
static bool sk__space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* A message's content, optionally trimmed of white space at both ends
 * (the formats whose Jinja applies `| trim` or `.strip()`). */
static void sk__content(struct sk__r *r, const struct sk_chat_msg *m, bool trim) {
  const char *s = m->content;
  size_t n = m->content_len;
  if (trim) {
    while (n && sk__space(s[0])) s++, n--;
    while (n && sk__space(s[n - 1])) n--;
  }
  sk__body(r, s, n);
}

static bool sk__role_is(const struct sk_chat_msg *m, const char *role) {
  return m->role_len == strlen(role) && memcmp(m->role, role, m->role_len) == 0;
}

/* The role as given (a role is template text: the client chooses it among
 * the names the model knows; it is never content). */
static void sk__role(struct sk__r *r, const struct sk_chat_msg *m) {
  sk__tpln(r, m->role, m->role_len);
}

/* "<|" role "|>" + sep, content, end: the ChatML-like families. */
static void sk__simple(struct sk__r *r, const struct sk_chat_msg *msgs, size_t n,
                       const char *open, const char *mid, const char *end, bool trim) {
  for (size_t i = 0; i < n; i++) {
    sk__tpl(r, open);
    sk__role(r, &msgs[i]);
    sk__tpl(r, mid);
    sk__content(r, &msgs[i], trim);
    sk__tpl(r, end);
  }
}

/* One row of a family's framing by role: the message of role `role`
 * (NULL: any role the rows before did not name) goes out as pre, its
 * content (trimmed of white space if trim), post. */
struct sk__turn {
  const char *role;
  const char *pre, *post;
  bool trim;
};

/* The families that frame each message by its role alone: the first row
 * naming the message's role (or the NULL row) frames it; a message no
 * row takes is left out. */
static void sk__turns(struct sk__r *r, const struct sk_chat_msg *msgs, size_t n,
                      const struct sk__turn *rows, size_t n_rows) {
  for (size_t i = 0; i < n; i++) {
    const struct sk_chat_msg *m = &msgs[i];
    for (size_t k = 0; k < n_rows; k++) {
      if (rows[k].role && !sk__role_is(m, rows[k].role)) continue;
      sk__tpl(r, rows[k].pre);
      sk__content(r, m, rows[k].trim);
      sk__tpl(r, rows[k].post);
      break;
    }
  }
}
#define SK__TURNS(r, msgs, n, ...)                                                        \
  do {                                                                                    \
    static const struct sk__turn rows_[] = {__VA_ARGS__};                                 \
    sk__turns((r), (msgs), (n), rows_, sizeof rows_ / sizeof rows_[0]);                  \
  } while (0)

static void sk__mistral(struct sk__r *r, int tmpl, const struct sk_chat_msg *msgs, size_t n) {
  const char *lead = tmpl == SK_CHAT_MISTRAL_V1 ? " " : "";
  const char *trail = tmpl == SK_CHAT_MISTRAL_V3_TEKKEN ? "" : " ";
  bool in_turn = false;
  for (size_t i = 0; i < n; i++) {
    const struct sk_chat_msg *m = &msgs[i];
    if (!in_turn) {
      sk__tpl(r, lead);
      sk__tpl(r, "[INST]");
      sk__tpl(r, trail);
      in_turn = true;
    }
    if (sk__role_is(m, "system")) {
      sk__content(r, m, false);
      sk__tpl(r, "\n\n");
    } else if (sk__role_is(m, "user")) {
      sk__content(r, m, false);
      sk__tpl(r, lead);
      sk__tpl(r, "[/INST]");
    } else {
      sk__tpl(r, trail);
      sk__content(r, m, tmpl == SK_CHAT_MISTRAL_V3);
      sk__tpl(r, "</s>");
      in_turn = false;
    }
  }
}

static void sk__llama2(struct sk__r *r, int tmpl, const struct sk_chat_msg *msgs, size_t n) {
  const bool sys = tmpl != SK_CHAT_LLAMA2;
  const bool bos_inside = tmpl == SK_CHAT_LLAMA2_SYS_BOS;
  const bool strip = tmpl == SK_CHAT_LLAMA2_SYS_STRIP;
  bool in_turn = true; /* the first turn opens without BOS */
  sk__tpl(r, "[INST] ");
  for (size_t i = 0; i < n; i++) {
    const struct sk_chat_msg *m = &msgs[i];
    if (!in_turn) {
      in_turn = true;
      sk__tpl(r, bos_inside ? "<s>[INST] " : "[INST] ");
    }
    if (sk__role_is(m, "system")) {
      if (sys) {
        sk__tpl(r, "<<SYS>>\n");
        sk__content(r, m, strip);
        sk__tpl(r, "\n<</SYS>>\n\n");
      } else { /* no system role: it leads the first message, unmarked */
        sk__content(r, m, strip);
        sk__tpl(r, "\n");
      }
    } else if (sk__role_is(m, "user")) {
      sk__content(r, m, strip);
      sk__tpl(r, " [/INST]");
    } else {
      sk__content(r, m, strip);
      sk__tpl(r, "</s>");
      in_turn = false;
    }
  }
}

/* Gemma and Orion have no system role: the system text goes at the start
 * of the next user turn. */
static void sk__gemma(struct sk__r *r, const struct sk_chat_msg *msgs, size_t n, bool add_ass) {
  const struct sk_chat_msg *sys[64];
  size_t n_sys = 0;
  for (size_t i = 0; i < n; i++) {
    const struct sk_chat_msg *m = &msgs[i];
    if (sk__role_is(m, "system")) {
      if (n_sys < sizeof sys / sizeof sys[0]) sys[n_sys++] = m;
      continue;
    }
    bool model = sk__role_is(m, "assistant");
    sk__tpl(r, "<start_of_turn>");
    if (model) sk__tpl(r, "model"); else sk__role(r, m);
    sk__tpl(r, "\n");
    if (n_sys && !model) {
      for (size_t k = 0; k < n_sys; k++) sk__content(r, sys[k], true);
      sk__tpl(r, "\n\n");
      n_sys = 0;
    }
    sk__content(r, m, true);
    sk__tpl(r, "<end_of_turn>\n");
  }
  if (add_ass) sk__tpl(r, "<start_of_turn>model\n");
}

static void sk__orion(struct sk__r *r, const struct sk_chat_msg *msgs, size_t n) {
  const struct sk_chat_msg *sys[64];
  size_t n_sys = 0;
  for (size_t i = 0; i < n; i++) {
    const struct sk_chat_msg *m = &msgs[i];
    if (sk__role_is(m, "system")) {
      if (n_sys < sizeof sys / sizeof sys[0]) sys[n_sys++] = m;
    } else if (sk__role_is(m, "user")) {
      sk__tpl(r, "Human: ");
      if (n_sys) {
        for (size_t k = 0; k < n_sys; k++) sk__content(r, sys[k], false);
        sk__tpl(r, "\n\n");
        n_sys = 0;
      }
      sk__content(r, m, false);
      sk__tpl(r, "\n\nAssistant: </s>");
    } else {
      sk__content(r, m, false);
      sk__tpl(r, "</s>");
    }
  }
}

/* Upper-cases ASCII letters of the role into buf (bailing's roles). */
static void sk__role_upper(struct sk__r *r, const struct sk_chat_msg *m) {
  for (size_t i = 0; i < m->role_len; i++) {
    char c = m->role[i];
    if (c >= 'a' && c <= 'z') c = (char)(c - 'a' + 'A');
    sk__tpln(r, &c, 1);
  }
}

/* Monarch: BOS before every message but the first. */
static void sk__monarch(struct sk__r *r, const struct sk_chat_msg *msgs, size_t n, bool add_ass) {
  for (size_t i = 0; i < n; i++) {
    if (i > 0) sk__tpl(r, "<s>"); /* BOS inside the history */
    sk__role(r, &msgs[i]);
    sk__tpl(r, "\n");
    sk__content(r, &msgs[i], false);
    sk__tpl(r, "</s>\n");
  }
  if (add_ass) sk__tpl(r, "<s>assistant\n");
}

/* OpenChat: "GPT4 Correct " and the role capitalised, except for the
 * system message. */
static void sk__openchat(struct sk__r *r, const struct sk_chat_msg *msgs, size_t n,
                         bool add_ass) {
  for (size_t i = 0; i < n; i++) {
    const struct sk_chat_msg *m = &msgs[i];
    if (!sk__role_is(m, "system")) {
      sk__tpl(r, "GPT4 Correct ");
      if (m->role_len) {
        char c = m->role[0];
        if (c >= 'a' && c <= 'z') c = (char)(c - 'a' + 'A');
        sk__tpln(r, &c, 1);
        sk__tpln(r, m->role + 1, m->role_len - 1);
      }
      sk__tpl(r, ": ");
    }
    sk__content(r, m, false);
    sk__tpl(r, "<|end_of_turn|>");
  }
  if (add_ass) sk__tpl(r, "GPT4 Correct Assistant:");
}

/* Granite: the role framed, "<|tool_call|>" for tool calls (Granite 4
 * names their role assistant). */
static void sk__granite(struct sk__r *r, int tmpl, const struct sk_chat_msg *msgs, size_t n,
                        bool add_ass) {
  for (size_t i = 0; i < n; i++) {
    const struct sk_chat_msg *m = &msgs[i];
    if (tmpl != SK_CHAT_GRANITE && sk__role_is(m, "assistant_tool_call")) {
      sk__tpl(r, "<|start_of_role|>assistant<|end_of_role|><|tool_call|>");
    } else {
      sk__tpl(r, "<|start_of_role|>");
      sk__role(r, m);
      sk__tpl(r, "<|end_of_role|>");
      if (tmpl == SK_CHAT_GRANITE && sk__role_is(m, "assistant_tool_call"))
        sk__tpl(r, "<|tool_call|>");
    }
    sk__content(r, m, false);
    sk__tpl(r, "<|end_of_text|>\n");
  }
  if (add_ass) sk__tpl(r, "<|start_of_role|>assistant<|end_of_role|>");
}

/* GigaChat: BOS, the system text alone, then the turns. */
static void sk__gigachat(struct sk__r *r, const struct sk_chat_msg *msgs, size_t n,
                         bool add_ass) {
  const bool has_sys = n && sk__role_is(&msgs[0], "system");
  sk__tpl(r, "<s>");
  if (has_sys) {
    sk__content(r, &msgs[0], false);
    sk__tpl(r, "<|message_sep|>");
  }
  const size_t from = has_sys ? 1 : 0;
  SK__TURNS(r, msgs + from, n - from,
            {"user", "user<|role_sep|>",
             "<|message_sep|>available functions<|role_sep|>[]<|message_sep|>", false},
            {"assistant", "assistant<|role_sep|>", "<|message_sep|>", false});
  if (add_ass) sk__tpl(r, "assistant<|role_sep|>");
}

/* Bailing: upper-case roles (the user is HUMAN); Bailing 2 ends each
 * turn and gives a default system message. */
static void sk__bailing(struct sk__r *r, int tmpl, const struct sk_chat_msg *msgs, size_t n,
                        bool add_ass) {
  const bool v2 = tmpl == SK_CHAT_BAILING2;
  if (v2 && !(n && sk__role_is(&msgs[0], "system")))
    sk__tpl(r, "<role>SYSTEM</role>detailed thinking off<|role_end|>");
  for (size_t i = 0; i < n; i++) {
    const struct sk_chat_msg *m = &msgs[i];
    sk__tpl(r, "<role>");
    if (sk__role_is(m, "user")) sk__tpl(r, "HUMAN"); else sk__role_upper(r, m);
    sk__tpl(r, "</role>");
    sk__content(r, m, false);
    if (v2) sk__tpl(r, "<|role_end|>");
  }
  if (add_ass) {
    sk__tpl(r, "<role>ASSISTANT</role>");
    if (tmpl == SK_CHAT_BAILING_THINK) sk__tpl(r, "<think>");
  }
}

/* Seed-OSS: each message framed by its own BOS and EOS; the assistant's
 * content trimmed. */
static void sk__seed_oss(struct sk__r *r, const struct sk_chat_msg *msgs, size_t n,
                         bool add_ass) {
  for (size_t i = 0; i < n; i++) {
    const struct sk_chat_msg *m = &msgs[i];
    sk__tpl(r, "<seed:bos>");
    sk__role(r, m);
    sk__tpl(r, "\n");
    sk__content(r, m, sk__role_is(m, "assistant"));
    sk__tpl(r, "<seed:eos>");
  }
  if (add_ass) sk__tpl(r, "<seed:bos>assistant\n");
}

/* The ChatML-like families: lead, then per message open, role, mid,
 * content (trimmed if trim), end; the generation prompt last. */
static const struct sk__simple_family {
  int tmpl;
  const char *lead, *open, *mid, *end;
  bool trim;
  const char *gen;
} sk__simple_families[] = {
    {SK_CHAT_CHATML, "", "<|im_start|>", "\n", "<|im_end|>\n", false, "<|im_start|>assistant\n"},
    {SK_CHAT_PHI3, "", "<|", "|>\n", "<|end|>\n", false, "<|assistant|>\n"},
    {SK_CHAT_PHI4, "", "<|im_start|>", "<|im_sep|>", "<|im_end|>", false, "<|im_start|>assistant<|im_sep|>"},
    {SK_CHAT_FALCON3, "", "<|", "|>\n", "\n", false, "<|assistant|>\n"},
    {SK_CHAT_ZEPHYR, "", "<|", "|>\n", "<|endoftext|>\n", false, "<|assistant|>\n"},
    {SK_CHAT_LLAMA3, "", "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>", true, "<|start_header_id|>assistant<|end_header_id|>\n\n"},
    {SK_CHAT_CHATGLM3, "[gMASK]sop", "<|", "|>\n ", "", false, "<|assistant|>"},
    {SK_CHAT_CHATGLM4, "[gMASK]<sop>", "<|", "|>\n", "", false, "<|assistant|>\n"},
    {SK_CHAT_GLMEDGE, "", "<|", "|>\n", "", false, "<|assistant|>"},
    {SK_CHAT_MEGREZ, "", "<|role_start|>", "<|role_end|>", "<|turn_end|>", false, "<|role_start|>assistant<|role_end|>"},
    {SK_CHAT_LLAMA4, "", "<|header_start|>", "<|header_end|>\n\n", "<|eot|>", true, "<|header_start|>assistant<|header_end|>\n\n"},
};

/* The families of their own shape; false for a family it does not know. */
static bool sk__render_family(struct sk__r *r, int tmpl, const struct sk_chat_msg *msgs, size_t n,
                              bool add_ass) {
  switch (tmpl) {
  case SK_CHAT_MISTRAL_V7:
    SK__TURNS(r, msgs, n, {"system", "[SYSTEM_PROMPT] ", "[/SYSTEM_PROMPT]", false},
              {"user", "[INST] ", "[/INST]", false}, {NULL, " ", "</s>", false});
    break;
  case SK_CHAT_MISTRAL_V7_TEKKEN:
    SK__TURNS(r, msgs, n, {"system", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", false},
              {"user", "[INST]", "[/INST]", false}, {NULL, "", "</s>", false});
    break;
  case SK_CHAT_MISTRAL_V1:
  case SK_CHAT_MISTRAL_V3:
  case SK_CHAT_MISTRAL_V3_TEKKEN:
    sk__mistral(r, tmpl, msgs, n);
    break;
  case SK_CHAT_LLAMA2:
  case SK_CHAT_LLAMA2_SYS:
  case SK_CHAT_LLAMA2_SYS_BOS:
  case SK_CHAT_LLAMA2_SYS_STRIP:
    sk__llama2(r, tmpl, msgs, n);
    break;
  case SK_CHAT_MONARCH:
    sk__monarch(r, msgs, n, add_ass);
    break;
  case SK_CHAT_GEMMA:
    sk__gemma(r, msgs, n, add_ass);
    break;
  case SK_CHAT_ORION:
    sk__orion(r, msgs, n);
    break;
  case SK_CHAT_OPENCHAT:
    sk__openchat(r, msgs, n, add_ass);
    break;
  case SK_CHAT_VICUNA:
  case SK_CHAT_VICUNA_ORCA:
    if (tmpl == SK_CHAT_VICUNA_ORCA)
      SK__TURNS(r, msgs, n, {"system", "SYSTEM: ", "\n", false}, {"user", "USER: ", "\n", false},
                {"assistant", "ASSISTANT: ", "</s>\n", false});
    else
      SK__TURNS(r, msgs, n, {"system", "", "\n\n", false}, {"user", "USER: ", "\n", false},
                {"assistant", "ASSISTANT: ", "</s>\n", false});
    if (add_ass) sk__tpl(r, "ASSISTANT:");
    break;
  case SK_CHAT_DEEPSEEK:
    SK__TURNS(r, msgs, n, {"system", "", "", false},
              {"user", "### Instruction:\n", "\n", false},
              {"assistant", "### Response:\n", "\n<|EOT|>\n", false});
    if (add_ass) sk__tpl(r, "### Response:\n");
    break;
  case SK_CHAT_COMMAND_R:
    SK__TURNS(r, msgs, n,
              {"system", "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", "<|END_OF_TURN_TOKEN|>", true},
              {"user", "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>", "<|END_OF_TURN_TOKEN|>", true},
              {"assistant", "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>",
               true});
    if (add_ass) sk__tpl(r, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
    break;
  case SK_CHAT_MINICPM: /* no generation prompt: "<AI>" ends each user turn */
    SK__TURNS(r, msgs, n, {"user", "<\xe7\x94\xa8\xe6\x88\xb7>", "<AI>", true},
              {NULL, "", "", true});
    break;
  case SK_CHAT_DEEPSEEK2:
  case SK_CHAT_DEEPSEEK3: {
#define SK__DS_EOS "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define SK__DS_ASS3 "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
    if (tmpl == SK_CHAT_DEEPSEEK3)
      SK__TURNS(r, msgs, n, {"system", "", "\n\n", false},
                {"user", "<\xef\xbd\x9cUser\xef\xbd\x9c>", "", false},
                {"assistant", SK__DS_ASS3, SK__DS_EOS, false});
    else
      SK__TURNS(r, msgs, n, {"system", "", "\n\n", false}, {"user", "User: ", "\n\n", false},
                {"assistant", "Assistant: ", SK__DS_EOS, false});
    if (add_ass) sk__tpl(r, tmpl == SK_CHAT_DEEPSEEK3 ? SK__DS_ASS3 : "Assistant:");
#undef SK__DS_EOS
#undef SK__DS_ASS3
    break;
  }
  case SK_CHAT_EXAONE3:
  case SK_CHAT_EXAONE4: {
    static const struct sk__turn rows[] = {
        {"system", "[|system|]", "[|endofturn|]\n", true},
        {"user", "[|user|]", "\n", true},
        {"assistant", "[|assistant|]", "[|endofturn|]\n", true},
        {"tool", "[|tool|]", "[|endofturn|]\n", true}, /* exaone4's only */
    };
    sk__turns(r, msgs, n, rows, tmpl == SK_CHAT_EXAONE4 ? 4 : 3);
    if (add_ass) sk__tpl(r, "[|assistant|]");
    break;
  }
  case SK_CHAT_RWKV_WORLD: /* "\n\n" ends a turn; "Assistant:" follows the last user */
    SK__TURNS(r, msgs, n, {"system", "System: ", "\n\n", true},
              {"user", "User: ", "\n\n", true}, {"assistant", "Assistant: ", "\n\n", true});
    if (n && sk__role_is(&msgs[n - 1], "user")) sk__tpl(r, "Assistant:");
    break;
  case SK_CHAT_GRANITE:
  case SK_CHAT_GRANITE_4_0:
  case SK_CHAT_GRANITE_4_1:
    sk__granite(r, tmpl, msgs, n, add_ass);
    break;
  case SK_CHAT_GIGACHAT:
    sk__gigachat(r, msgs, n, add_ass);
    break;
  case SK_CHAT_YANDEX: { /* "\n\n" ends a turn; no system role */
#define SK__YA_USER " \xd0\x9f\xd0\xbe\xd0\xbb\xd1\x8c\xd0\xb7\xd0\xbe\xd0\xb2\xd0\xb0" \
                    "\xd1\x82\xd0\xb5\xd0\xbb\xd1\x8c: " /* " Пользователь: " */
#define SK__YA_ASS " \xd0\x90\xd1\x81\xd1\x81\xd0\xb8\xd1\x81\xd1\x82\xd0\xb5\xd0\xbd" \
                   "\xd1\x82:" /* " Ассистент:" */
    SK__TURNS(r, msgs, n, {"user", SK__YA_USER, "\n\n", false},
              {"assistant", SK__YA_ASS " ", "\n\n", false});
    if (add_ass) sk__tpl(r, SK__YA_ASS "[SEP]");
#undef SK__YA_USER
#undef SK__YA_ASS
    break;
  }
  case SK_CHAT_BAILING:
  case SK_CHAT_BAILING_THINK:
  case SK_CHAT_BAILING2:
    sk__bailing(r, tmpl, msgs, n, add_ass);
    break;
  case SK_CHAT_SMOLVLM:
    sk__tpl(r, "<|im_start|>");
    SK__TURNS(r, msgs, n, {"system", "", "\n\n", false},
              {"user", "User: ", "<end_of_utterance>\n", false},
              {NULL, "Assistant: ", "<end_of_utterance>\n", false});
    if (add_ass) sk__tpl(r, "Assistant:");
    break;
  case SK_CHAT_SEED_OSS:
    sk__seed_oss(r, msgs, n, add_ass);
    break;
  default:
    return false;
  }
  return true;
}

int sk_chat_render(int tmpl, const struct sk_chat_msg *msgs, size_t n, bool add_ass,
                   struct sk_chat_text *out, struct sk_error *err) {
  struct sk__r rr = {.out = out, .rc = 0}, *r = &rr;
  const struct sk__simple_family *sf = NULL;
  for (size_t i = 0; i < sizeof sk__simple_families / sizeof sk__simple_families[0]; i++)
    if (sk__simple_families[i].tmpl == tmpl) sf = &sk__simple_families[i];
  if (sf) {
    sk__tpl(r, sf->lead);
    sk__simple(r, msgs, n, sf->open, sf->mid, sf->end, sf->trim);
    if (add_ass) sk__tpl(r, sf->gen);
  } else if (!sk__render_family(r, tmpl, msgs, n, add_ass)) {
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "no chat template (family %d)", tmpl);
  }
  if (rr.rc < 0) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory rendering a chat");
  return 0;
}

int sk_chat_end_of_turn(int tmpl, struct sk_chat_text *scratch, const char **ret,
                        size_t *ret_len, struct sk_error *err) {
  /* An assistant message whose content is a byte no template adds or
   * trims, after a user turn: what follows it closes the turn. */
  static const char mark = '\x01';
  const struct sk_chat_msg m[2] = {
      {.role = "user", .role_len = 4, .content = "u", .content_len = 1},
      {.role = "assistant", .role_len = 9, .content = &mark, .content_len = 1},
  };
  sk_chat_text_reset(scratch);
  int rc = sk_chat_render(tmpl, m, 2, false, scratch, err);
  if (rc < 0) return rc;
  const char *at = memchr(scratch->text, mark, scratch->len);
  *ret = "";
  *ret_len = 0;
  if (!at) return 0;
  const char *s = at + 1, *e = scratch->text + scratch->len;
  while (s < e && sk__space(*s)) s++;
  const char *q = s;
  while (q < e && !sk__space(*q)) q++;
  *ret = s;
  *ret_len = (size_t)(q - s);
  return 0;
}
