/* Chroma artifact C ABI.
 *
 * Every compiled artifact's shared library (`<artifact>/model-<key>.so`, named by the manifest's
 * `library.file`) exports these functions,
 * so a C or C++ program can run the model without Python:
 *
 *   char err[512];
 *   chroma_program* p = chroma_open("build/mlp", err, sizeof err);   // maps weights.bin
 *   if (!p) { fprintf(stderr, "%s\n", err); return 1; }
 *   const void* in[] = {x};  void* out[] = {y};
 *   if (chroma_run(p, in, out, err, sizeof err) != CHROMA_OK) ...
 *   chroma_close(p);
 *
 * Inputs and outputs are dense row-major arrays of the dtypes and shapes the accessors
 * report; output arrays must not overlap each other or any input (kernels are compiled on
 * that assumption; Python's Program copies overlapping inputs first). chroma_open checks the ABI version, the weights file's size and its digest
 * against the digest compiled into the library, and says what does not match.
 * A program is not thread-safe: one chroma_run at a time per chroma_program.
 */
#ifndef CHROMA_CHROMA_H_
#define CHROMA_CHROMA_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CHROMA_ABI_VERSION 3

enum {
  CHROMA_OK = 0,
  CHROMA_ERR_INVALID = 1, /* bad argument, missing or corrupt artifact file */
  CHROMA_ERR_INDEX = 2,   /* an index input was out of range */
  CHROMA_ERR_MEMORY = 3,
  CHROMA_ERR_ZERO_DIVISION = 4 /* integer division or remainder by zero */
};

typedef struct chroma_program chroma_program;
/* An input or output of an entry point: dense row-major, `nbytes` bytes. */
typedef struct chroma_tensor_spec {
  const char* name;
  const char* dtype;
  int rank;
  int64_t shape[8];
  int64_t nbytes;
} chroma_tensor_spec;

int chroma_abi_version(void);
/* Loads the artifact in `dir`; returns NULL and writes a message to err on failure.
 * The program runs on $CHROMA_NUM_THREADS threads if set, else one per core. */
chroma_program* chroma_open(const char* dir, char* err, size_t err_len);
void chroma_close(chroma_program* p);
/* Sets the number of threads (the caller's included; <= 0: the default above). Also sets
 * OpenBLAS's thread count, which is process-wide. */
int chroma_set_threads(chroma_program* p, int threads, char* err, size_t err_len);
int chroma_num_threads(const chroma_program* p);
int chroma_run(chroma_program* p, const void* const* inputs, void* const* outputs, char* err, size_t err_len);

int chroma_num_inputs(void);
int chroma_num_outputs(void);
const char* chroma_input_name(int i);
const char* chroma_input_dtype(int i);   /* "float32", "int64", "bool", ... */
int chroma_input_rank(int i);
const int64_t* chroma_input_shape(int i);
const char* chroma_output_dtype(int i);
int chroma_output_rank(int i);
const int64_t* chroma_output_shape(int i);
/* Entry points. An artifact has one or more (a decoder: "prefill" and "step"); they share
 * the weights and the persistent state (KV caches). chroma_run runs entry 0, and the
 * accessors above describe entry 0. */
int chroma_num_entries(void);
const char* chroma_entry_name(int e);
int chroma_entry_index(const char* name); /* -1 if there is none of that name */
int chroma_entry_num_inputs(int e);
int chroma_entry_num_outputs(int e);
const chroma_tensor_spec* chroma_entry_input(int e, int i);
const chroma_tensor_spec* chroma_entry_output(int e, int i);
int chroma_run_entry(chroma_program* p, int entry, const void* const* inputs, void* const* outputs, char* err,
                     size_t err_len);
/* Restores every state tensor (KV caches) to its initial value. */
void chroma_reset_state(chroma_program* p);
/* Digest of the generated source this library was built from (matches manifest.json). */
const char* chroma_source_digest(void);
/* Every entry point's inputs and outputs and every state tensor, one line each
 * ("entry forward(x:float32[4,7])->(output0:float32[4,16])", "state cache:1024"): a loader
 * that reads manifest.json compares it with the manifest's (docs/artifact_format.md). */
const char* chroma_signature(void);

#ifdef __cplusplus
}
#endif

#endif /* CHROMA_CHROMA_H_ */
