/* GGUF reader (v2 and v3), memory-mapped, distrusting the file.
 *
 * Spec: ggml docs/gguf.md. Every count, length, n_dims, dimension product,
 * tensor type and offset is checked (overflow included, each tensor inside
 * the file and aligned, no two tensors sharing a byte) before any pointer
 * into the mapping is formed. A
 * bad file gives -SK_ERR_BAD_MODEL with a message naming the field and the
 * value; never a crash or abort. Library code: never logs.
 */
#ifndef SK_GGUF_H
#define SK_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sinkd/protocol.h"

/* Metadata value types (gguf.md "gguf_metadata_value_type"). */
enum sk_gguf_type {
  SK_GGUF_UINT8 = 0, SK_GGUF_INT8 = 1, SK_GGUF_UINT16 = 2, SK_GGUF_INT16 = 3,
  SK_GGUF_UINT32 = 4, SK_GGUF_INT32 = 5, SK_GGUF_FLOAT32 = 6, SK_GGUF_BOOL = 7,
  SK_GGUF_STRING = 8, SK_GGUF_ARRAY = 9, SK_GGUF_UINT64 = 10, SK_GGUF_INT64 = 11,
  SK_GGUF_FLOAT64 = 12,
};

/* Tensor element types (ggml_type, ggml/include/ggml.h). Every type of
 * the table in gguf.c is recognised (its block size checked), so that an
 * error can name it by its ggml name; which of them a model can run is
 * the model's business (quant.h, sk_quant_supported). Numbers ggml never
 * assigned or retired (4, 5, 31-33, 36-38) are refused by sk_gguf_open. */
enum sk_ggml_type {
  SK_GGML_F32 = 0, SK_GGML_F16 = 1, SK_GGML_Q4_0 = 2, SK_GGML_Q4_1 = 3,
  SK_GGML_Q5_0 = 6, SK_GGML_Q5_1 = 7, SK_GGML_Q8_0 = 8,
  SK_GGML_Q8_1 = 9, SK_GGML_Q2_K = 10, SK_GGML_Q3_K = 11, SK_GGML_Q4_K = 12,
  SK_GGML_Q5_K = 13, SK_GGML_Q6_K = 14, SK_GGML_Q8_K = 15,
  SK_GGML_IQ2_XXS = 16, SK_GGML_IQ2_XS = 17, SK_GGML_IQ3_XXS = 18, SK_GGML_IQ1_S = 19,
  SK_GGML_IQ4_NL = 20, SK_GGML_IQ3_S = 21, SK_GGML_IQ2_S = 22, SK_GGML_IQ4_XS = 23,
  SK_GGML_I8 = 24, SK_GGML_I16 = 25, SK_GGML_I32 = 26, SK_GGML_I64 = 27,
  SK_GGML_F64 = 28, SK_GGML_IQ1_M = 29, SK_GGML_BF16 = 30,
  SK_GGML_TQ1_0 = 34, SK_GGML_TQ2_0 = 35, SK_GGML_MXFP4 = 39, SK_GGML_NVFP4 = 40,
  SK_GGML_Q1_0 = 41, SK_GGML_Q2_0 = 42,
};

/* Hard limits, each with its reason. */
#define SK_GGUF_MAX_DIMS 4u            /* ggml tensors have at most 4 dims */
#define SK_GGUF_MAX_NAME 64u           /* ggml GGML_MAX_NAME */
#define SK_GGUF_DEFAULT_ALIGNMENT 32u  /* gguf.md: general.alignment default */

/* A string inside the mapping (not NUL-terminated). */
struct sk_gguf_str {
  const char *ptr;
  uint64_t len;
};

/* One tensor; pointers live as long as the sk_gguf. */
struct sk_gguf_tensor {
  struct sk_gguf_str name;
  uint32_t n_dims;
  uint64_t ne[SK_GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension;
                                    unused dims are 1 */
  uint32_t type;                 /* enum sk_ggml_type */
  uint64_t offset;               /* relative to the data section */
  uint64_t n_elements;
  uint64_t n_bytes;
  const void *data;              /* inside the mapping, aligned */
};

struct sk_gguf;

/* Maps and validates the file at path. On success *ret owns the mapping;
 * free with sk_gguf_close. Errors: -SK_ERR_IO (open/stat/mmap, message has
 * strerror), -SK_ERR_BAD_MODEL (message names field and value),
 * -SK_ERR_NO_MEMORY. */
int sk_gguf_open(const char *path, struct sk_gguf **ret, struct sk_error *err);
/* Same checks on a caller-owned buffer (tests, fuzzing); buf must outlive
 * the returned object. */
int sk_gguf_open_buffer(const void *buf, size_t size, struct sk_gguf **ret,
                        struct sk_error *err);
/* Unmaps and frees; NULL is fine. */
void sk_gguf_close(struct sk_gguf *g);
/* Advice: this process will not read bytes [p, p + n) of the mapping
 * soon (a copy of them is kept elsewhere, e.g. packed weights). The whole
 * pages inside the range leave the process's memory (madvise
 * MADV_DONTNEED: they stay in the page cache, and a later read faults
 * them back in unchanged, the mapping being read-only). A no-op for a
 * buffer (sk_gguf_open_buffer) and for bytes outside the mapping. */
void sk_gguf_release(const struct sk_gguf *g, const void *p, size_t n);

uint32_t sk_gguf_version(const struct sk_gguf *g);
/* The whole file's bytes (valid while g lives) and their count. */
const void *sk_gguf_bytes(const struct sk_gguf *g, size_t *ret_size);
uint64_t sk_gguf_n_tensors(const struct sk_gguf *g);
/* Number of metadata key/value pairs. */
uint64_t sk_gguf_n_kv(const struct sk_gguf *g);
/* general.alignment (default SK_GGUF_DEFAULT_ALIGNMENT). */
uint32_t sk_gguf_alignment(const struct sk_gguf *g);
/* File offset of the data section; tensor i's bytes start at
 * sk_gguf_data_offset(g) + sk_gguf_tensor(g, i)->offset. */
uint64_t sk_gguf_data_offset(const struct sk_gguf *g);
/* Tensor i, or NULL if i >= sk_gguf_n_tensors(g). */
const struct sk_gguf_tensor *sk_gguf_tensor(const struct sk_gguf *g, uint64_t i);
/* Tensor by name, or NULL. */
const struct sk_gguf_tensor *sk_gguf_find_tensor(const struct sk_gguf *g,
                                                 const char *name);

/* Metadata getters: return 1 and store on success, 0 if the key is absent,
 * -SK_ERR_BAD_MODEL (err names key, expected type/range) if the value has
 * the wrong type or does not fit. Integer getters accept any integer type
 * whose value fits. */
int sk_gguf_get_u32(const struct sk_gguf *g, const char *key, uint32_t *ret,
                    struct sk_error *err);
/* FLOAT32, or FLOAT64 converted. */
int sk_gguf_get_f32(const struct sk_gguf *g, const char *key, float *ret,
                    struct sk_error *err);
/* BOOL only. */
int sk_gguf_get_bool(const struct sk_gguf *g, const char *key, bool *ret,
                     struct sk_error *err);
int sk_gguf_get_str(const struct sk_gguf *g, const char *key,
                    struct sk_gguf_str *ret, struct sk_error *err);
/* Array of strings: *ret points at n entries owned by g. */
int sk_gguf_get_str_array(const struct sk_gguf *g, const char *key,
                          const struct sk_gguf_str **ret, uint64_t *ret_n,
                          struct sk_error *err);
/* Array of numbers converted to float (FLOAT32 or any integer type):
 * *ret is a malloc'd array of n floats the caller frees. */
int sk_gguf_get_f32_array(const struct sk_gguf *g, const char *key,
                          float **ret, uint64_t *ret_n, struct sk_error *err);
/* Array of integers converted to int32 (values must fit): malloc'd. */
int sk_gguf_get_i32_array(const struct sk_gguf *g, const char *key,
                          int32_t **ret, uint64_t *ret_n, struct sk_error *err);

/* Name of a ggml type as ggml spells it ("f32", "q8_0", "q4_K",
 * "iq4_nl", ...; "unknown" for a number ggml does not define). */
const char *sk_ggml_type_name(uint32_t type);
/* Block layout of a ggml type: *ret_blck elements take *ret_size bytes
 * (ggml's type_traits blck_size and type_size). Returns false for a
 * number ggml does not define. */
bool sk_ggml_type_layout(uint32_t type, uint32_t *ret_blck, uint32_t *ret_size);

/* A string read from a file (len bytes at s, any bytes, NULs included),
 * made fit for an error message: written to out (size >= 4 bytes,
 * NUL-terminated) with every byte outside printable ASCII as '?', cut
 * to what fits with "..." after it. Returns out. Messages are logged
 * and shown on terminals, where a file's control bytes (newlines,
 * escape sequences) would forge lines or colours, and a NUL would cut
 * the name short. */
const char *sk_gguf_quote(char *out, size_t size, const char *s, uint64_t len);

#endif
