/* Pre-tokenizer regexes evaluated by PCRE2; see pretok.h. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/pretok.h"

#include <pcre2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"

/* Pieces of the expressions, as tokenizer.json files spell them. The
 * contractions are written with explicit case classes instead of (?i:),
 * as llama.cpp adapted them: with Unicode case folding (?i) would also
 * take U+017F (long s) and U+212A (Kelvin sign) for 's' and 'k'. */
#define SK__CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

/* GPT-2's own expression (openai/gpt-2 encoder.py). */
#define SK__RE_GPT2 \
  "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"

/* Llama 3's (tiktoken cl100k_base): digits in groups of up to three. */
#define SK__RE_LLAMA3                                                              \
  SK__CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"                    \
  "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* Qwen2's: as Llama 3's, but single digits. */
#define SK__RE_QWEN2                                                               \
  SK__CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"                         \
  "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* Qwen3.5's: marks go with letters. */
#define SK__RE_QWEN35                                                              \
  SK__CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"                 \
  "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* Mistral's Tekken and OpenAI's o200k (GPT-4o, Llama 4): case-aware
 * words. PCRE2 has the \p{Lu}.. classes, so the original expressions are
 * used (llama.cpp rewrites them for std::regex). */
#define SK__RE_UPPER "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define SK__RE_LOWER "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define SK__RE_TEKKEN                                                              \
  "[^\\r\\n\\p{L}\\p{N}]?" SK__RE_UPPER "*" SK__RE_LOWER "+"                      \
  "|[^\\r\\n\\p{L}\\p{N}]?" SK__RE_UPPER "+" SK__RE_LOWER "*"                     \
  "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define SK__RE_GPT4O                                                               \
  "[^\\r\\n\\p{L}\\p{N}]?" SK__RE_UPPER "*" SK__RE_LOWER "+" SK__CONTRACTIONS "?" \
  "|[^\\r\\n\\p{L}\\p{N}]?" SK__RE_UPPER "+" SK__RE_LOWER "*" SK__CONTRACTIONS "?"\
  "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* BLOOM-style: words up to punctuation. */
#define SK__RE_BLOOM " ?[^(\\s|.,!?\xe2\x80\xa6\xe3\x80\x82\xef\xbc\x8c\xe3\x80\x81\xe0\xa5\xa4\xdb\x94\xd8\x8c)]+"

#define SK__MAX_EXPRS 6

/* One family of names sharing expressions and flags. */
struct sk__pretok_def {
  const char *names[10]; /* NULL-terminated */
  const char *exprs[SK__MAX_EXPRS + 1]; /* NULL-terminated, applied in order */
  struct sk_pretok_info info;
};

static const struct sk__pretok_def sk__defs[] = {
  {{"default", NULL},
   {"[\\p{P}\\$\\+<=>\\^~\\|]+", SK__RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL},
   {false, false, false}},
  {{"llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
    "lfm2", NULL},
   {SK__RE_LLAMA3, NULL},
   {true, true, false}},
  {{"dbrx", "smaug-bpe", NULL}, {SK__RE_LLAMA3, NULL}, {false, false, false}},
  {{"chatglm-bpe", "glm4", NULL}, {SK__RE_LLAMA3, NULL}, {false, false, true}},
  {{"deepseek-llm", NULL},
   {"[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~\xef\xbc\x81-\xef\xbc\x8f\xef\xbc\x9a-\xef\xbd\x9e\xe2\x80\x98-\xe2\x80\x9f\xe3\x80\x80-\xe3\x80\x82]+",
    "\\s+$",
    "[\xe4\xb8\x80-\xe9\xbe\xa5\xe0\xa0\x80-\xe4\xb8\x80\xea\xb0\x80-\xed\x9f\xbf]+",
    "\\p{N}+", NULL},
   {false, false, false}},
  {{"deepseek-coder", NULL},
   {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+",
    "[\xe4\xb8\x80-\xe9\xbe\xa5\xe0\xa0\x80-\xe4\xb8\x80\xea\xb0\x80-\xed\x9f\xbf]+",
    "\\p{N}", NULL},
   {false, false, false}},
  {{"deepseek-v3", NULL},
   {"\\p{N}{1,3}",
    "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*"
    "|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    NULL},
   {false, false, false}},
  {{"falcon", NULL},
   {"[\\p{P}\\$\\+<=>\\^~\\|`]+", SK__RE_GPT2, "[0-9][0-9][0-9]", NULL},
   {false, false, false}},
  {{"starcoder", "codeshell", "exaone", "minerva-7b", NULL},
   {"\\p{N}", SK__RE_GPT2, NULL},
   {false, false, false}},
  {{"refact", NULL}, {"\\p{N}", SK__RE_GPT2, NULL}, {false, false, false}},
  {{"smollm", NULL}, {"\\p{N}", SK__RE_GPT2, NULL}, {false, false, false}},
  {{"command-r", NULL}, {"\\p{N}", SK__RE_GPT2, NULL}, {false, false, false}},
  {{"gpt-2", "olmo", "jais", "phi-2", "exaone4", "trillion", "granite-docling", NULL},
   {SK__RE_GPT2, NULL},
   {false, false, false}},
  {{"mpt", NULL}, {SK__RE_GPT2, NULL}, {false, false, false}},
  {{"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", "hunyuan", "kormo", NULL},
   {SK__RE_QWEN2, NULL},
   {false, false, false}},
  {{"qwen35", NULL}, {SK__RE_QWEN35, NULL}, {false, false, false}},
  {{"bloom", "poro-chat", "gpt3-finnish", NULL}, {SK__RE_BLOOM, NULL}, {false, false, false}},
  {{"viking", NULL}, {SK__RE_BLOOM, "\\p{N}", NULL}, {false, false, false}},
  {{"tekken", NULL}, {SK__RE_TEKKEN, NULL}, {true, true, false}},
  {{"gpt-4o", "llama4", NULL}, {SK__RE_GPT4O, NULL}, {false, false, false}},
};

#define SK__N_DEFS (sizeof sk__defs / sizeof sk__defs[0])

struct sk_pretok {
  size_t n;
  pcre2_code *code[SK__MAX_EXPRS];
  bool jit[SK__MAX_EXPRS];
};

void sk_pretok_names(char *buf, size_t size) {
  size_t o = 0;
  if (size == 0) return;
  for (size_t d = 0; d < SK__N_DEFS; d++) {
    const char *n = sk__defs[d].names[0];
    size_t l = strlen(n);
    if (o + l + 3 > size) break;
    if (o) {
      memcpy(buf + o, ", ", 2);
      o += 2;
    }
    memcpy(buf + o, n, l);
    o += l;
  }
  buf[o] = 0;
}

/* Copies expression e to out with \s and \S spelled as the Unicode
 * White_Space property: PCRE2's \s also takes U+180E (Mongolian vowel
 * separator, a format character since Unicode 6.3), which the tokenizers'
 * engines (and llama.cpp's tables) do not count as a space. Returns 0, or
 * -1 if out is too small. */
static int sk__white_space(const char *e, char *out, size_t size) {
  size_t o = 0;
  for (size_t i = 0; e[i]; i++) {
    const char *add = NULL;
    char two[3] = {e[i], 0, 0};
    if (e[i] == '\\' && e[i + 1]) {
      i++;
      two[1] = e[i];
      add = e[i] == 's' ? "\\p{White_Space}" : e[i] == 'S' ? "\\P{White_Space}" : two;
    } else {
      add = two;
    }
    size_t l = strlen(add);
    if (o + l + 1 > size) return -1;
    memcpy(out + o, add, l);
    o += l;
  }
  out[o] = 0;
  return 0;
}

void sk_pretok_free(struct sk_pretok *p) {
  if (!p) return;
  for (size_t i = 0; i < p->n; i++) pcre2_code_free(p->code[i]);
  free(p);
}

int sk_pretok_new(const char *name, size_t len, struct sk_pretok **ret,
                  struct sk_pretok_info *info, struct sk_error *err) {
  const struct sk__pretok_def *def = NULL;
  for (size_t d = 0; d < SK__N_DEFS && !def; d++)
    for (const char *const *n = sk__defs[d].names; *n && !def; n++)
      if (strlen(*n) == len && memcmp(*n, name, len) == 0) def = &sk__defs[d];
  if (!def) {
    char names[256], q[44];
    sk_pretok_names(names, sizeof names);
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "tokenizer.ggml.pre: '%s' is not a pre-tokenizer sinkd knows"
                        " (%s, and their aliases)",
                        sk_gguf_quote(q, sizeof q, name, len), names);
  }
  struct sk_pretok *p = calloc(1, sizeof *p);
  if (!p) return sk_error_set(err, SK_ERR_NO_MEMORY, "pre-tokenizer: out of memory");
  /* UCP: \s, \d and [[:classes:]] by Unicode properties, as the
   * tokenizers' Rust and Python regex engines have them. DOLLAR_ENDONLY:
   * "$" is the end of the piece only, not also before a final newline. */
  const uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | PCRE2_DOLLAR_ENDONLY;
  for (const char *const *e = def->exprs; *e; e++) {
    int ec;
    PCRE2_SIZE eo;
    char expr[2048];
    if (sk__white_space(*e, expr, sizeof expr) < 0) {
      sk_pretok_free(p);
      return sk_error_set(err, SK_ERR_INTERNAL, "pre-tokenizer '%.*s': expression %zu too long",
                          (int)len, name, p->n);
    }
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)expr, PCRE2_ZERO_TERMINATED, opts, &ec, &eo, NULL);
    if (!c) {
      PCRE2_UCHAR msg[120];
      pcre2_get_error_message(ec, msg, sizeof msg);
      sk_pretok_free(p);
      return sk_error_set(err, SK_ERR_INTERNAL,
                          "pre-tokenizer '%.*s': PCRE2 refuses expression %zu at offset %zu: %s",
                          (int)len, name, p->n, (size_t)eo, (const char *)msg);
    }
    p->code[p->n] = c;
    p->jit[p->n] = pcre2_jit_compile(c, PCRE2_JIT_COMPLETE) == 0;
    p->n++;
  }
  if (info) *info = def->info;
  *ret = p;
  return 0;
}

struct sk__ends {
  size_t *v;
  size_t n, cap;
};

static int sk__ends_push(struct sk__ends *e, size_t x) {
  if (e->n == e->cap) {
    size_t cap = e->cap ? e->cap * 2 : 64;
    if (cap > SIZE_MAX / sizeof *e->v) return -SK_ERR_NO_MEMORY;
    size_t *v = realloc(e->v, cap * sizeof *v);
    if (!v) return -SK_ERR_NO_MEMORY;
    e->v = v;
    e->cap = cap;
  }
  e->v[e->n++] = x;
  return 0;
}

/* Byte length of the UTF-8 character whose lead byte is c (valid text). */
static size_t sk__char_len(unsigned char c) {
  return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
}

int sk_pretok_split(const struct sk_pretok *p, const char *text, size_t len,
                    size_t **ret_ends, size_t *ret_n, struct sk_error *err) {
  struct sk__ends cur = {0}, next = {0};
  pcre2_match_data *md = NULL;
  pcre2_jit_stack *js = NULL;
  pcre2_match_context *mc = NULL;
  int r = 0;
  *ret_ends = NULL;
  *ret_n = 0;
  if (len == 0) return 0;
  if ((r = sk__ends_push(&cur, len)) < 0) goto fail;
  md = pcre2_match_data_create(1, NULL);
  mc = pcre2_match_context_create(NULL);
  /* Long runs of one class (whitespace before a lookahead) backtrack
   * deeper than JIT's default 32 KiB stack allows. */
  js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
  if (!md || !mc || !js) {
    r = -SK_ERR_NO_MEMORY;
    goto fail;
  }
  pcre2_jit_stack_assign(mc, NULL, js);
  for (size_t k = 0; k < p->n; k++) {
    next.n = 0;
    size_t start = 0;
    for (size_t s = 0; s < cur.n; s++) {
      const char *piece = text + start;
      size_t plen = cur.v[s] - start, prev = 0, at = 0;
      while (at < plen) {
        int rc = p->jit[k]
                     ? pcre2_jit_match(p->code[k], (PCRE2_SPTR)piece, plen, at, 0, md, mc)
                     : pcre2_match(p->code[k], (PCRE2_SPTR)piece, plen, at,
                                   PCRE2_NO_UTF_CHECK, md, mc);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          PCRE2_UCHAR msg[120];
          pcre2_get_error_message(rc, msg, sizeof msg);
          sk_error_set(err, SK_ERR_INTERNAL, "pre-tokenizer: expression %zu on %zu bytes: %s",
                       k, plen, (const char *)msg);
          r = -SK_ERR_INTERNAL;
          goto fail_set;
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: no piece; go on one character later */
          at = ms + sk__char_len((unsigned char)piece[ms]);
          continue;
        }
        if (ms > prev && (r = sk__ends_push(&next, start + ms)) < 0) goto fail;
        if ((r = sk__ends_push(&next, start + me)) < 0) goto fail;
        prev = at = me;
      }
      if (prev < plen && (r = sk__ends_push(&next, start + plen)) < 0) goto fail;
      start = cur.v[s];
    }
    struct sk__ends t = cur;
    cur = next;
    next = t;
  }
  free(next.v);
  pcre2_match_data_free(md);
  pcre2_match_context_free(mc);
  pcre2_jit_stack_free(js);
  *ret_ends = cur.v;
  *ret_n = cur.n;
  return 0;
fail:
  sk_error_set(err, SK_ERR_NO_MEMORY, "pre-tokenizer: out of memory for %zu bytes", len);
fail_set:
  free(cur.v);
  free(next.v);
  pcre2_match_data_free(md);
  pcre2_match_context_free(mc);
  pcre2_jit_stack_free(js);
  return r;
}
