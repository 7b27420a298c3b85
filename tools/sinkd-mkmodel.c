/* sinkd-mkmodel: writes a valid GGUF file (v3) with random weights and
 * the shape of a real model, for benchmarks and tests: decode speed
 * depends on the shapes and the weight type, not on the values.
 *
 * Architectures (--arch), with the tensors and keys llama.cpp's files
 * of that family carry:
 *   llama   separate output.weight, rope.freq_base 10000 (Llama 2)
 *   llama3  tied embeddings (no output.weight), rope_freqs.weight with
 *           the Llama 3.1 factors (factor 8, low 1, high 4, original
 *           context 8192), rope.freq_base 500000
 *   qwen2   attn_{q,k,v}.bias, rope.freq_base 1e6, RMS eps 1e-6
 *   qwen3   attn_{q,k}_norm.weight (one head wide), attention.key_length
 *           and value_length, rope.freq_base 1e6, RMS eps 1e-6
 * --head-dim sets a head size other than dim / heads (Qwen3-0.6B: 1024
 * wide, 16 heads of 128).
 *
 * Shapes (karpathy's llama2.c stories models, TinyLlama):
 *   260K  dim 64,   5 layers,  8 heads, 4 KV heads, hidden 172,  vocab 512
 *   15M   dim 288,  6 layers,  6 heads,             hidden 768,  vocab 32000
 *   110M  dim 768, 12 layers, 12 heads,             hidden 2048, vocab 32000
 *   1B    dim 2048, 22 layers, 32 heads, 4 KV heads, hidden 5632, vocab 32000
 *
 * Weight types: every type sinkd runs (quant.h), by its ggml name. F32,
 * F16 and BF16 hold the random values; Q8_0 and Q4_0 quantize them with
 * ggml's reference quantizers (quant.c); the other types are random
 * valid blocks (sk_quant_random_row: finite scales, random quants), as
 * decode speed does not depend on the values. The presets q4_K_M and
 * q5_K_M mix types as llama-quantize does: Q6_K for attn_v and ffn_down
 * in the layers its use_more_bits rule picks (the first and last eighth,
 * and every third in between). As llama.cpp's quantizer does, a matrix
 * whose rows are not a multiple of the type's block falls back (K-quants
 * to Q5_0, Q5_1, Q8_0 or IQ4_NL, then F16), and the output matrix of a
 * 2- to 5-bit file is Q6_K (Q8_0 where the width is not a multiple of
 * 256; --output-type changes that). Norm weights are 1 and F32. The vocabulary is a SentencePiece-style one the
 * daemon loads and tokenizes with: <unk>, <s>, </s>, the 256 byte tokens
 * <0x00>..<0xFF>, then pieces built from letters (with and without the
 * leading U+2581), shorter pieces scoring higher.
 *
 * --vocab-from FILE copies every tokenizer.* key of another GGUF instead
 * (its vocabulary, merges, special tokens and chat template; the vocabulary
 * size follows), so the daemon runs on a real tokenizer with random
 * weights; --chat-template-text sets tokenizer.chat_template.
 *
 * Tensors are streamed to the file row by row, so a 1B-class F32 file
 * (4.4 GB) needs no more memory than one row.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "tool.h"

#define ALIGN 32u /* general.alignment default */
/* Every vocabulary has 3 control tokens and 256 byte tokens first. */
#define N_FIXED_TOKENS (3u + 256u)

struct shape {
  const char *name;
  uint32_t dim, n_layer, n_head, n_kv_head, hidden, vocab, ctx;
};

static const struct shape shapes[] = {
    {"260K", 64, 5, 8, 4, 172, 512, 2048},
    {"15M", 288, 6, 6, 6, 768, 32000, 256},
    {"110M", 768, 12, 12, 12, 2048, 32000, 1024},
    {"1B", 2048, 22, 32, 4, 5632, 32000, 2048},
};

/* splitmix64: a seedable stream of 64-bit values. */
static uint64_t rng_state;
static uint64_t rng_next(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* Uniform in [-a, a). */
static float rng_uniform(float a) {
  return a * (float)((double)(rng_next() >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}



/* ---- output --------------------------------------------------------- */

struct out {
  FILE *f;
  const char *path;
  uint64_t pos;
};

static void put(struct out *o, const void *p, size_t n) {
  if (n && fwrite(p, 1, n, o->f) != n) sk_cli_die(1, "write %s: %s", o->path, strerror(errno));
  o->pos += n;
}
static void put_u32(struct out *o, uint32_t v) { put(o, &v, 4); } /* little-endian hosts */
static void put_u64(struct out *o, uint64_t v) { put(o, &v, 8); }
static void put_str(struct out *o, const char *s, size_t n) {
  put_u64(o, n);
  put(o, s, n);
}
static void put_pad(struct out *o) {
  static const uint8_t zero[ALIGN];
  put(o, zero, (ALIGN - o->pos % ALIGN) % ALIGN);
}
static void kv_u32(struct out *o, const char *key, uint32_t v) {
  put_str(o, key, strlen(key));
  put_u32(o, SK_GGUF_UINT32);
  put_u32(o, v);
}
static void kv_f32(struct out *o, const char *key, float v) {
  put_str(o, key, strlen(key));
  put_u32(o, SK_GGUF_FLOAT32);
  put(o, &v, 4);
}
static void kv_str(struct out *o, const char *key, const char *v) {
  put_str(o, key, strlen(key));
  put_u32(o, SK_GGUF_STRING);
  put_str(o, v, strlen(v));
}

/* ---- a vocabulary from another GGUF ---------------------------------- */

/* Bytes of one metadata value of type t at p (gguf.md), or 0 if it runs
 * past end. The file was checked by sk_gguf_open. */
static size_t value_size(const uint8_t *p, const uint8_t *end, uint32_t t) {
  static const uint8_t fixed[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  if (t > 12) return 0;
  if (t == SK_GGUF_STRING) {
    uint64_t n;
    if (end - p < 8) return 0;
    memcpy(&n, p, 8);
    return (uint64_t)(end - p - 8) < n ? 0 : 8 + (size_t)n;
  }
  if (t != SK_GGUF_ARRAY) return (size_t)(end - p) < fixed[t] ? 0 : fixed[t];
  uint32_t et;
  uint64_t n;
  if (end - p < 12) return 0;
  memcpy(&et, p, 4);
  memcpy(&n, p + 4, 8);
  size_t off = 12;
  for (uint64_t i = 0; i < n; i++) {
    size_t z = value_size(p + off, end, et);
    if (!z) return 0;
    off += z;
  }
  return off;
}

/* Whether the key/value pair at p has the key `key`. */
static bool kv_is(const uint8_t *p, const char *key) {
  uint64_t kl;
  memcpy(&kl, p, 8);
  return kl == strlen(key) && memcmp(p + 8, key, kl) == 0;
}

/* The tokenizer.* key/value pairs of a GGUF, as their raw bytes. */
struct kv_copy {
  struct sk_gguf *g;
  const uint8_t **at; /* (n) start of each pair (its key) */
  size_t *len;        /* (n) bytes of each pair */
  uint64_t n;
  uint32_t n_vocab;   /* entries of tokenizer.ggml.tokens */
  bool has_template;  /* tokenizer.chat_template among them */
};

static void read_vocab_from(const char *path, struct kv_copy *kc) {
  struct sk_error err = {0};
  memset(kc, 0, sizeof *kc);
  if (sk_gguf_open(path, &kc->g, &err) < 0) sk_cli_die(1, "--vocab-from %s: %s", path, err.message);
  const struct sk_gguf_str *toks = NULL;
  uint64_t n_tok = 0;
  if (sk_gguf_get_str_array(kc->g, "tokenizer.ggml.tokens", &toks, &n_tok, &err) != 1 ||
      n_tok > (1u << 22))
    sk_cli_die(1, "--vocab-from %s: no usable tokenizer.ggml.tokens", path);
  kc->n_vocab = (uint32_t)n_tok;
  size_t size = 0;
  const uint8_t *base = sk_gguf_bytes(kc->g, &size), *end = base + size;
  const uint64_t n_kv = sk_gguf_n_kv(kc->g);
  kc->at = calloc(n_kv ? n_kv : 1, sizeof *kc->at);
  kc->len = calloc(n_kv ? n_kv : 1, sizeof *kc->len);
  if (!kc->at || !kc->len) sk_cli_die(1, "out of memory");
  const uint8_t *p = base + 24; /* magic, version, n_tensors, n_kv */
  for (uint64_t i = 0; i < n_kv; i++) {
    uint64_t kl;
    uint32_t t;
    memcpy(&kl, p, 8);
    const uint8_t *key = p + 8;
    memcpy(&t, key + kl, 4);
    size_t z = value_size(key + kl + 4, end, t);
    if (!z) sk_cli_die(1, "--vocab-from %s: metadata %" PRIu64 " runs past the file", path, i);
    const size_t len = 8 + (size_t)kl + 4 + z;
    if (kl > 10 && memcmp(key, "tokenizer.", 10) == 0) {
      kc->at[kc->n] = p;
      kc->len[kc->n++] = len;
      if (kv_is(p, "tokenizer.chat_template")) kc->has_template = true;
    }
    p += len;
  }
}

/* ---- vocabulary ----------------------------------------------------- */

#define SPM_SPACE "\xe2\x96\x81" /* U+2581, SentencePiece's space */

struct vocab {
  char **text;
  uint32_t n;
};

/* Piece number k of the letter pieces: lengths 1, 2, 3... in turn, each
 * length first bare then with the leading space, in order of letter
 * frequency. Returns false past the last one we can spell (never for
 * real vocabulary sizes). */
static bool letter_piece(uint64_t k, char *buf, size_t cap) {
  static const char letters[] = "etaoinshrdlcumwfgypbvkjxqz";
  uint64_t count = 26; /* pieces of the current length, per variant */
  for (unsigned len = 1; len <= 6; len++, count *= 26) {
    if (k < 2 * count) {
      bool space = k >= count;
      uint64_t idx = k % count;
      size_t pos = 0;
      if (space) {
        memcpy(buf, SPM_SPACE, 3);
        pos = 3;
      }
      char tmp[8];
      for (unsigned i = 0; i < len; i++) {
        tmp[len - 1 - i] = letters[idx % 26];
        idx /= 26;
      }
      if (pos + len + 1 > cap) return false;
      memcpy(buf + pos, tmp, len);
      buf[pos + len] = 0;
      return true;
    }
    k -= 2 * count;
  }
  return false;
}

static void make_vocab(struct vocab *v, uint32_t n) {
  v->n = n;
  v->text = calloc(n, sizeof *v->text);
  if (!v->text) sk_cli_die(1, "out of memory");
  char buf[32];
  for (uint32_t i = 0; i < n; i++) {
    if (i == 0) snprintf(buf, sizeof buf, "<unk>");
    else if (i == 1) snprintf(buf, sizeof buf, "<s>");
    else if (i == 2) snprintf(buf, sizeof buf, "</s>");
    else if (i < N_FIXED_TOKENS) snprintf(buf, sizeof buf, "<0x%02X>", i - 3);
    else if (i == N_FIXED_TOKENS) snprintf(buf, sizeof buf, SPM_SPACE);
    else if (i <= N_FIXED_TOKENS + 94) { /* printable ASCII other than letters first */
      char ch = (char)('!' + (i - N_FIXED_TOKENS - 1));
      snprintf(buf, sizeof buf, "%c", ch);
    } else {
      /* letter pieces, skipping the single lowercase letters already
       * covered by the ASCII run above */
      static uint64_t k = 0;
      for (;;) {
        if (!letter_piece(k++, buf, sizeof buf)) sk_cli_die(1, "vocabulary of %u is too large", n);
        if (!(strlen(buf) == 1 && buf[0] >= 'a' && buf[0] <= 'z')) break;
      }
    }
    v->text[i] = strdup(buf);
    if (!v->text[i]) sk_cli_die(1, "out of memory");
  }
}

/* ---- tensors -------------------------------------------------------- */

/* INIT_NORM: 1 + uniform(+-0.25), a norm weight that is not all ones;
 * INIT_ROPE_FREQS: the Llama 3.1 frequency factors. */
enum init { INIT_ONES, INIT_RANDOM, INIT_NORM, INIT_ROPE_FREQS };

/* An architecture --arch writes (see the top of this file). */
struct arch {
  const char *name;     /* --arch */
  const char *gguf;     /* general.architecture, the key prefix */
  bool tied;            /* no output.weight */
  bool rope_freqs;      /* rope_freqs.weight */
  bool qkv_bias;        /* blk.N.attn_{q,k,v}.bias */
  bool qk_norm;         /* blk.N.attn_{q,k}_norm.weight */
  float rope_base, rms_eps;
};

static const struct arch archs[] = {
    {"llama", "llama", false, false, false, false, 10000.0f, 1e-5f},
    {"llama3", "llama", true, true, false, false, 500000.0f, 1e-5f},
    {"qwen2", "qwen2", false, false, true, false, 1e6f, 1e-6f},
    {"qwen3", "qwen3", false, false, false, true, 1e6f, 1e-6f},
};

/* Frequency factor of RoPE pair i of rope_dim, Llama 3.1's rule (Meta's
 * reference apply_scaling, as llama.cpp's converter writes it): pairs
 * whose wavelength is below original_ctx / high keep 1, above
 * original_ctx / low get factor, in between a smooth mix. */
static float llama31_factor(uint32_t i, uint32_t rope_dim, float base) {
  const double factor = 8.0, low = 1.0, high = 4.0, orig = 8192.0;
  const double freq = pow((double)base, -2.0 * i / rope_dim), wavelen = 2.0 * M_PI / freq;
  if (wavelen < orig / high) return 1.0f;
  if (wavelen > orig / low) return (float)factor;
  const double smooth = (orig / wavelen - low) / (high - low);
  return (float)(1.0 / ((1.0 - smooth) / factor + smooth));
}

struct tensor {
  char name[64];
  uint64_t ne0, ne1; /* ne1 == 0: a vector */
  uint32_t type;
  enum init init;
  uint64_t offset;   /* in the data section */
  uint64_t bytes;
};

/* The type a matrix of rows ne0 gets: llama-quantize's fallbacks when
 * its rows are not a multiple of the type's block. */
static uint32_t matrix_type(uint32_t want, uint64_t ne0) {
  if (ne0 % sk_quant_block(want) != 0) {
    switch (want) {
    case SK_GGML_Q2_K:
    case SK_GGML_Q3_K:
    case SK_GGML_IQ4_XS: want = SK_GGML_IQ4_NL; break;
    case SK_GGML_Q4_K: want = SK_GGML_Q5_0; break;
    case SK_GGML_Q5_K: want = SK_GGML_Q5_1; break;
    case SK_GGML_Q6_K: want = SK_GGML_Q8_0; break;
    default: break;
    }
  }
  return ne0 % sk_quant_block(want) != 0 ? SK_GGML_F16 : want;
}

/* A preset mixing types (0: one type everywhere). */
enum preset { PRESET_NONE, PRESET_Q4_K_M, PRESET_Q5_K_M };

static uint32_t parse_type(const char *s, enum preset *ret_preset) {
  if (ret_preset) *ret_preset = PRESET_NONE;
  if (ret_preset && !strcmp(s, "q4_K_M")) {
    *ret_preset = PRESET_Q4_K_M;
    return SK_GGML_Q4_K;
  }
  if (ret_preset && !strcmp(s, "q5_K_M")) {
    *ret_preset = PRESET_Q5_K_M;
    return SK_GGML_Q5_K;
  }
  for (uint32_t t = 0; t < 64; t++)
    if (sk_quant_supported(t) && !strcmp(s, sk_ggml_type_name(t))) return t;
  sk_cli_usage_error("type '%s': expected one of %s%s", s, sk_quant_supported_names(),
                     ret_preset ? ", q4_K_M, q5_K_M" : "");
}

/* llama-quantize's use_more_bits(i, n): the layers whose attn_v and
 * ffn_down a _M preset writes at Q6_K. */
static bool more_bits(uint32_t i, uint32_t n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* Writes one row of ne0 values in type t (a type without a quantizer
 * here: random valid blocks of about x's magnitude a). */
static void write_row(struct out *o, uint32_t t, const float *x, uint64_t ne0, float a,
                      void *tmp) {
  switch (t) {
  case SK_GGML_F32: put(o, x, ne0 * 4); break;
  case SK_GGML_BF16: {
    uint16_t *h = tmp;
    for (uint64_t i = 0; i < ne0; i++) {
      uint32_t b;
      memcpy(&b, &x[i], 4);
      h[i] = (uint16_t)(b >> 16);
    }
    put(o, h, ne0 * 2);
    break;
  }
  case SK_GGML_F16: {
    uint16_t *h = tmp;
    for (uint64_t i = 0; i < ne0; i++) h[i] = sk_f32_to_f16(x[i]);
    put(o, h, ne0 * 2);
    break;
  }
  case SK_GGML_Q8_0:
    sk_quantize_row_q8_0(x, (uint32_t)ne0, tmp);
    put(o, tmp, sk_quant_row_bytes(t, ne0));
    break;
  case SK_GGML_Q4_0:
    sk_quantize_row_q4_0(x, (uint32_t)ne0, tmp);
    put(o, tmp, sk_quant_row_bytes(t, ne0));
    break;
  default: {
    uint64_t seed = rng_next();
    if (sk_quant_random_row(t, (uint32_t)ne0, a, &seed, tmp) < 0)
      sk_cli_die(1, "internal: type %u", t);
    put(o, tmp, sk_quant_row_bytes(t, ne0));
    break;
  }
  }
}

static void usage(FILE *f) {
  fprintf(f,
          "Usage: %s [OPTIONS] -o FILE\n"
          "Write a GGUF model with random weights and a real model's shape.\n"
          "\n"
          "  -a, --arch NAME       llama, llama3, qwen2 or qwen3 (default llama)\n"
          "  -s, --shape NAME      260K, 15M, 110M or 1B (default 15M)\n"
          "  -t, --type TYPE       weights: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1,\n"
          "                        q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs,\n"
          "                        or the presets q4_K_M, q5_K_M (default f32)\n"
          "      --output-type T   type of output.weight (default: the weight type;\n"
          "                        q6_K for 2- to 5-bit types, as llama.cpp writes\n"
          "                        them)\n"
          "      --dim N --layers N --heads N --kv-heads N --hidden N --vocab N --ctx N\n"
          "      --head-dim N      override one dimension of the shape\n"
          "      --seed N          random seed (default 1)\n"
          "      --vocab-from GGUF the tokenizer.* keys of another GGUF (vocabulary,\n"
          "                        special tokens, chat template); --vocab follows it\n"
          "      --chat-template-text T  tokenizer.chat_template (replaces a copied one)\n"
          "  -o, --output FILE     where to write (required)\n"
          "  -h, --help            this text\n"
          "\n"
          "Exit status: 0 written, 1 could not write, 2 usage error.\n",
          sk_cli_prog());
}

/* What the command line asks for. */
struct params {
  struct shape sh;           /* with the dimensions given applied */
  const struct arch *arch;
  const char *type_name;     /* --type */
  const char *out_type_name; /* --output-type, or NULL */
  const char *path;          /* -o */
  uint64_t seed;
  uint32_t head_dim_opt;     /* --head-dim, or 0 */
  const char *vocab_from;    /* --vocab-from, or NULL */
  const char *chat_text;     /* --chat-template-text, or NULL */
};

/* Parses the command line into p (usage errors exit 2; --help exits 0). */
static void parse_args(int argc, char **argv, struct params *p) {
  *p = (struct params){.sh = shapes[1], .arch = &archs[0], .type_name = "f32", .seed = 1};
  enum { O_OUT_TYPE = 256, O_DIM, O_LAYERS, O_HEADS, O_KV_HEADS, O_HIDDEN, O_VOCAB, O_CTX, O_SEED,
         O_HEAD_DIM, O_VOCAB_FROM, O_CHAT_TEXT };
  static const struct option opts[] = {
      {"arch", required_argument, NULL, 'a'},
      {"head-dim", required_argument, NULL, O_HEAD_DIM},
      {"shape", required_argument, NULL, 's'},   {"type", required_argument, NULL, 't'},
      {"output-type", required_argument, NULL, O_OUT_TYPE},
      {"dim", required_argument, NULL, O_DIM},   {"layers", required_argument, NULL, O_LAYERS},
      {"heads", required_argument, NULL, O_HEADS},
      {"kv-heads", required_argument, NULL, O_KV_HEADS},
      {"hidden", required_argument, NULL, O_HIDDEN}, {"vocab", required_argument, NULL, O_VOCAB},
      {"ctx", required_argument, NULL, O_CTX},   {"seed", required_argument, NULL, O_SEED},
      {"vocab-from", required_argument, NULL, O_VOCAB_FROM},
      {"chat-template-text", required_argument, NULL, O_CHAT_TEXT},
      {"output", required_argument, NULL, 'o'},  {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  /* The dimensions given, applied to the shape after all options: they
   * override it whichever comes first (0: not given). */
  struct shape over = {0};
  int ch;
  while ((ch = getopt_long(argc, argv, "a:s:t:o:h", opts, NULL)) != -1) {
    switch (ch) {
    case 'a': {
      size_t i = 0;
      while (i < sizeof archs / sizeof archs[0] && strcmp(archs[i].name, optarg)) i++;
      if (i == sizeof archs / sizeof archs[0])
        sk_cli_usage_error("arch '%s': expected llama, llama3, qwen2 or qwen3", optarg);
      p->arch = &archs[i];
      break;
    }
    case O_HEAD_DIM:
      p->head_dim_opt = (uint32_t)sk_cli_parse_u64("--head-dim", optarg, 2, 65536);
      break;
    case 's': {
      size_t i = 0;
      while (i < sizeof shapes / sizeof shapes[0] && strcmp(shapes[i].name, optarg)) i++;
      if (i == sizeof shapes / sizeof shapes[0])
        sk_cli_usage_error("shape '%s': expected 260K, 15M, 110M or 1B", optarg);
      p->sh = shapes[i];
      break;
    }
    case 't': p->type_name = optarg; break;
    case O_OUT_TYPE: p->out_type_name = optarg; break;
    case O_DIM: over.dim = (uint32_t)sk_cli_parse_u64("--dim", optarg, 1, 65536); break;
    case O_LAYERS: over.n_layer = (uint32_t)sk_cli_parse_u64("--layers", optarg, 1, 1024); break;
    case O_HEADS: over.n_head = (uint32_t)sk_cli_parse_u64("--heads", optarg, 1, 1024); break;
    case O_KV_HEADS:
      over.n_kv_head = (uint32_t)sk_cli_parse_u64("--kv-heads", optarg, 1, 1024);
      break;
    case O_HIDDEN: over.hidden = (uint32_t)sk_cli_parse_u64("--hidden", optarg, 1, 1u << 20); break;
    case O_VOCAB:
      over.vocab = (uint32_t)sk_cli_parse_u64("--vocab", optarg, N_FIXED_TOKENS + 96, 1u << 22);
      break;
    case O_CTX: over.ctx = (uint32_t)sk_cli_parse_u64("--ctx", optarg, 1, 1u << 24); break;
    case O_SEED: p->seed = (uint32_t)sk_cli_parse_u64("--seed", optarg, 0, UINT32_MAX); break;
    case O_VOCAB_FROM: p->vocab_from = optarg; break;
    case O_CHAT_TEXT: p->chat_text = optarg; break;
    case 'o': p->path = optarg; break;
    case 'h': usage(stdout); exit(0);
    default: usage(stderr); exit(2);
    }
  }
  if (optind < argc) sk_cli_usage_error("unexpected argument '%s'", argv[optind]);
  if (!p->path) sk_cli_usage_error("no output file: give -o FILE");
  struct shape *sh = &p->sh;
  if (over.dim) sh->dim = over.dim;
  if (over.n_layer) sh->n_layer = over.n_layer;
  if (over.n_head) sh->n_head = over.n_head;
  if (over.n_kv_head) sh->n_kv_head = over.n_kv_head;
  if (over.hidden) sh->hidden = over.hidden;
  if (over.vocab) sh->vocab = over.vocab;
  if (over.ctx) sh->ctx = over.ctx;
  if (!over.n_kv_head && sh->n_kv_head > sh->n_head) sh->n_kv_head = sh->n_head;
  if ((!p->head_dim_opt && (sh->dim % sh->n_head || (sh->dim / sh->n_head) % 2)) ||
      sh->n_head % sh->n_kv_head || p->head_dim_opt % 2)
    sk_cli_usage_error("dim %u, heads %u, kv heads %u: dim must split into heads of even size "
                       "(or give an even --head-dim), heads into kv heads",
                       sh->dim, sh->n_head, sh->n_kv_head);
}

/* The model the file describes, from the parameters. */
struct model {
  struct shape sh;      /* the vocabulary that of --vocab-from if given */
  const struct arch *arch;
  enum preset preset;
  uint32_t wtype;       /* the layers' weight type */
  uint32_t otype;       /* output.weight's (and a tied table's) */
  uint32_t head_dim, q_dim, kv_dim;
  /* key_length / value_length: written when the heads do not split the
   * embedding, and always for qwen3 (as its files carry them) */
  bool head_keys;
};

static void make_model(const struct params *p, uint32_t n_vocab, struct model *m) {
  m->sh = p->sh;
  m->sh.vocab = n_vocab;
  m->arch = p->arch;
  m->wtype = parse_type(p->type_name, &m->preset);
  const uint32_t wtype = m->wtype;
  const bool low_bits = wtype != SK_GGML_F32 && wtype != SK_GGML_F16 && wtype != SK_GGML_BF16 &&
                        wtype != SK_GGML_Q8_0 && wtype != SK_GGML_Q6_K;
  m->otype = p->out_type_name ? parse_type(p->out_type_name, NULL)
                              : (low_bits ? SK_GGML_Q6_K : wtype);
  m->head_dim = p->head_dim_opt ? p->head_dim_opt : m->sh.dim / m->sh.n_head;
  m->q_dim = m->sh.n_head * m->head_dim;
  m->kv_dim = m->sh.n_kv_head * m->head_dim;
  m->head_keys = m->q_dim != m->sh.dim || m->arch->qk_norm;
}

/* The tensor table in file order, with each tensor's type, offset and
 * bytes; *ret_n tensors, *ret_max_row the longest row. malloc'd. */
static struct tensor *make_tensors(const struct model *m, size_t *ret_n, uint64_t *ret_max_row) {
  const struct shape *sh = &m->sh;
  const struct arch *arch = m->arch;
  const uint32_t wtype = m->wtype, otype = m->otype;
  const uint32_t head_dim = m->head_dim, q_dim = m->q_dim, kv_dim = m->kv_dim;
  size_t n_t = 4 + 14 * (size_t)sh->n_layer; /* at most */
  struct tensor *ts = calloc(n_t, sizeof *ts);
  if (!ts) sk_cli_die(1, "out of memory");
  size_t k = 0;
#define T(NAME, NE0, NE1, TYPE, INIT)                                              \
  do {                                                                             \
    struct tensor *t_ = &ts[k++];                                                  \
    snprintf(t_->name, sizeof t_->name, "%s", NAME);                               \
    t_->ne0 = (NE0);                                                               \
    t_->ne1 = (NE1);                                                               \
    t_->type = (NE1) ? matrix_type((TYPE), (NE0)) : SK_GGML_F32;                   \
    t_->init = (INIT);                                                             \
  } while (0)
  /* tied embeddings: llama-quantize gives the table the output's type */
  T("token_embd.weight", sh->dim, sh->vocab, arch->tied ? otype : wtype, INIT_RANDOM);
  T("output_norm.weight", sh->dim, 0, SK_GGML_F32, INIT_ONES);
  if (!arch->tied) T("output.weight", sh->dim, sh->vocab, otype, INIT_RANDOM);
  if (arch->rope_freqs) T("rope_freqs.weight", head_dim / 2, 0, SK_GGML_F32, INIT_ROPE_FREQS);
  for (uint32_t l = 0; l < sh->n_layer; l++) {
    char n[64];
    const uint32_t vtype =
        m->preset != PRESET_NONE && more_bits(l, sh->n_layer) ? SK_GGML_Q6_K : wtype;
#define L(SUFFIX, NE0, NE1, INIT)                               \
  do {                                                          \
    snprintf(n, sizeof n, "blk.%u." SUFFIX, l);                 \
    T(n, NE0, NE1, wtype, INIT);                                \
  } while (0)
#define LV(SUFFIX, NE0, NE1, INIT)                              \
  do {                                                          \
    snprintf(n, sizeof n, "blk.%u." SUFFIX, l);                 \
    T(n, NE0, NE1, vtype, INIT);                                \
  } while (0)
    L("attn_norm.weight", sh->dim, 0, INIT_ONES);
    L("attn_q.weight", sh->dim, q_dim, INIT_RANDOM);
    if (arch->qkv_bias) L("attn_q.bias", q_dim, 0, INIT_RANDOM);
    L("attn_k.weight", sh->dim, kv_dim, INIT_RANDOM);
    if (arch->qkv_bias) L("attn_k.bias", kv_dim, 0, INIT_RANDOM);
    LV("attn_v.weight", sh->dim, kv_dim, INIT_RANDOM);
    if (arch->qkv_bias) L("attn_v.bias", kv_dim, 0, INIT_RANDOM);
    if (arch->qk_norm) {
      L("attn_q_norm.weight", head_dim, 0, INIT_NORM);
      L("attn_k_norm.weight", head_dim, 0, INIT_NORM);
    }
    L("attn_output.weight", q_dim, sh->dim, INIT_RANDOM);
    L("ffn_norm.weight", sh->dim, 0, INIT_ONES);
    L("ffn_gate.weight", sh->dim, sh->hidden, INIT_RANDOM);
    L("ffn_up.weight", sh->dim, sh->hidden, INIT_RANDOM);
    LV("ffn_down.weight", sh->hidden, sh->dim, INIT_RANDOM);
#undef L
#undef LV
  }
#undef T
  n_t = k;
  uint64_t off = 0, max_row = 0;
  for (size_t i = 0; i < n_t; i++) {
    struct tensor *t = &ts[i];
    off = (off + ALIGN - 1) / ALIGN * ALIGN;
    t->offset = off;
    t->bytes = sk_quant_row_bytes(t->type, t->ne0) * (t->ne1 ? t->ne1 : 1);
    off += t->bytes;
    if (t->ne0 > max_row) max_row = t->ne0;
  }
  *ret_n = n_t;
  *ret_max_row = max_row;
  return ts;
}

/* The tokenizer keys of the made-up vocabulary (7 keys). */
static void write_vocab(struct out *o, const struct vocab *voc) {
  kv_str(o, "tokenizer.ggml.model", "llama");
  put_str(o, "tokenizer.ggml.tokens", strlen("tokenizer.ggml.tokens"));
  put_u32(o, SK_GGUF_ARRAY);
  put_u32(o, SK_GGUF_STRING);
  put_u64(o, voc->n);
  for (uint32_t i = 0; i < voc->n; i++) put_str(o, voc->text[i], strlen(voc->text[i]));
  put_str(o, "tokenizer.ggml.scores", strlen("tokenizer.ggml.scores"));
  put_u32(o, SK_GGUF_ARRAY);
  put_u32(o, SK_GGUF_FLOAT32);
  put_u64(o, voc->n);
  for (uint32_t i = 0; i < voc->n; i++) {
    float score = i < N_FIXED_TOKENS ? 0.0f : -(float)(i - N_FIXED_TOKENS);
    put(o, &score, 4);
  }
  put_str(o, "tokenizer.ggml.token_type", strlen("tokenizer.ggml.token_type"));
  put_u32(o, SK_GGUF_ARRAY);
  put_u32(o, SK_GGUF_INT32);
  put_u64(o, voc->n);
  for (uint32_t i = 0; i < voc->n; i++) {
    int32_t ty = i == 0 ? 2 : i < 3 ? 3 : i < N_FIXED_TOKENS ? 6 : 1; /* unk, control, byte, normal */
    put(o, &ty, 4);
  }
  kv_u32(o, "tokenizer.ggml.bos_token_id", 1);
  kv_u32(o, "tokenizer.ggml.eos_token_id", 2);
  kv_u32(o, "tokenizer.ggml.unknown_token_id", 0);
}

/* The header and the metadata: the model's keys, then the 7 of the
 * made-up vocabulary (voc) or the copied ones (kc), then a chat template
 * given as text (replacing a copied one). */
static void write_header(struct out *o, const struct params *p, const struct model *m,
                         const struct kv_copy *kc, const struct vocab *voc, uint64_t n_t) {
  const struct shape *sh = &m->sh;
  const struct arch *arch = m->arch;
  const char *chat_text = p->chat_text;
  const uint64_t n_kv = 11 + (m->head_keys ? 2 : 0) +
                        (p->vocab_from ? kc->n - (chat_text && kc->has_template) : 7) +
                        (chat_text != NULL);
  put_u32(o, 0x46554747u); /* "GGUF" */
  put_u32(o, 3);
  put_u64(o, n_t);
  put_u64(o, n_kv);
  char name[96];
  snprintf(name, sizeof name, "random %s %s %s", arch->name, sh->name, p->type_name);
  kv_str(o, "general.architecture", arch->gguf);
  kv_str(o, "general.name", name);
  char key[96];
#define AKEY(SUFFIX) (snprintf(key, sizeof key, "%s." SUFFIX, arch->gguf), key)
  kv_u32(o, AKEY("context_length"), sh->ctx);
  kv_u32(o, AKEY("embedding_length"), sh->dim);
  kv_u32(o, AKEY("feed_forward_length"), sh->hidden);
  kv_u32(o, AKEY("block_count"), sh->n_layer);
  kv_u32(o, AKEY("attention.head_count"), sh->n_head);
  kv_u32(o, AKEY("attention.head_count_kv"), sh->n_kv_head);
  if (m->head_keys) {
    kv_u32(o, AKEY("attention.key_length"), m->head_dim);
    kv_u32(o, AKEY("attention.value_length"), m->head_dim);
  }
  kv_u32(o, AKEY("rope.dimension_count"), m->head_dim);
  kv_f32(o, AKEY("rope.freq_base"), arch->rope_base);
  kv_f32(o, AKEY("attention.layer_norm_rms_epsilon"), arch->rms_eps);
#undef AKEY
  for (uint64_t i = 0; i < kc->n; i++) {
    if (chat_text && kv_is(kc->at[i], "tokenizer.chat_template")) continue;
    put(o, kc->at[i], kc->len[i]);
  }
  if (chat_text) kv_str(o, "tokenizer.chat_template", chat_text);
  if (!p->vocab_from) write_vocab(o, voc);
}

/* The tensor infos, then (aligned) each tensor's data, row by row. */
static void write_tensors(struct out *o, const struct model *m, const struct tensor *ts,
                          size_t n_t, uint64_t max_row) {
  for (size_t i = 0; i < n_t; i++) {
    const struct tensor *t = &ts[i];
    put_str(o, t->name, strlen(t->name));
    put_u32(o, t->ne1 ? 2 : 1);
    put_u64(o, t->ne0);
    if (t->ne1) put_u64(o, t->ne1);
    put_u32(o, t->type);
    put_u64(o, t->offset);
  }
  put_pad(o);

  float *row = malloc(max_row * sizeof *row);
  void *tmp = malloc(max_row * 4 + 64);
  if (!row || !tmp) sk_cli_die(1, "out of memory");
  const uint64_t data_start = o->pos;
  for (size_t i = 0; i < n_t; i++) {
    const struct tensor *t = &ts[i];
    while (o->pos - data_start < t->offset) put(o, "", 1);
    /* uniform with standard deviation 1/sqrt(in): activations keep their
     * scale through the layers, as trained weights roughly do */
    const float a = sqrtf(3.0f / (float)t->ne0);
    for (uint64_t r = 0; r < (t->ne1 ? t->ne1 : 1); r++) {
      for (uint64_t j = 0; j < t->ne0; j++)
        row[j] = t->init == INIT_ONES         ? 1.0f
                 : t->init == INIT_NORM       ? 1.0f + rng_uniform(0.25f)
                 : t->init == INIT_ROPE_FREQS ? llama31_factor((uint32_t)j, m->head_dim,
                                                               m->arch->rope_base)
                                              : rng_uniform(a);
      write_row(o, t->type, row, t->ne0, a, tmp);
    }
  }
  free(row);
  free(tmp);
}

int main(int argc, char **argv) {
  sk_cli_init("sinkd-mkmodel", "sinkd-mkmodel --help");
  struct params p;
  parse_args(argc, argv, &p);
  struct kv_copy kc = {0};
  if (p.vocab_from) read_vocab_from(p.vocab_from, &kc);
  struct model m;
  make_model(&p, p.vocab_from ? kc.n_vocab : p.sh.vocab, &m);
  rng_state = p.seed;
  size_t n_t = 0;
  uint64_t max_row = 0;
  struct tensor *ts = make_tensors(&m, &n_t, &max_row);
  struct vocab voc = {0};
  if (!p.vocab_from) make_vocab(&voc, m.sh.vocab);

  struct out o = {.f = fopen(p.path, "wb"), .path = p.path};
  if (!o.f) sk_cli_die(1, "cannot create %s: %s", p.path, strerror(errno));
  write_header(&o, &p, &m, &kc, &voc, n_t);
  write_tensors(&o, &m, ts, n_t, max_row);
  if (fclose(o.f) != 0) sk_cli_die(1, "write %s: %s", p.path, strerror(errno));
  fprintf(stderr, "%s: wrote %s: %s %s, %s weights (output %s), %.1f MB\n", sk_cli_prog(), p.path,
          m.arch->name, m.sh.name, p.type_name,
          m.arch->tied ? "tied" : sk_ggml_type_name(m.otype), (double)o.pos / 1e6);
  for (uint32_t i = 0; i < voc.n; i++) free(voc.text[i]);
  free(voc.text);
  free(kc.at);
  free(kc.len);
  sk_gguf_close(kc.g);
  free(ts);
  return 0;
}
