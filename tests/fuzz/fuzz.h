/* fuzz.h - the fuzz harnesses: one function per parser of untrusted bytes, shared by the
 * libFuzzer binaries (libfuzzer_main.c, the DDPMD_FUZZ build) and the replay test (replay.c, every
 * build), so a committed crash input runs through exactly the code that found it.
 */
#ifndef DDPMD_FUZZ_H
#define DDPMD_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* A harness takes any bytes and returns 0. A finding is a sanitizer report or a violated
 * invariant, which the harness reports with fuzz_fail (message, then abort: a crash to libFuzzer). */
typedef int (*fuzz_fn)(const uint8_t *data, size_t size);

struct fuzz_target {
    const char *name; /* the corpus folder name: tests/fuzz/corpus/<name>/ */
    fuzz_fn fn;
    size_t max_len;   /* -max_len for libFuzzer (scripts/fuzz.sh reads it from fuzz_replay --list) */
};

int fuzz_spec(const uint8_t *data, size_t size);
int fuzz_safetensors(const uint8_t *data, size_t size);
int fuzz_checkpoint(const uint8_t *data, size_t size);
int fuzz_png(const uint8_t *data, size_t size);
int fuzz_idx(const uint8_t *data, size_t size);
int fuzz_http(const uint8_t *data, size_t size);
int fuzz_archive(const uint8_t *data, size_t size);

/* every target, ending with {NULL} */
extern const struct fuzz_target fuzz_targets[];

/* ---- helpers (fuzz_util.c) ---- */

/* A path whose contents are exactly data: an anonymous memfd reached through /proc/self/fd/N,
 * rewritten on every call (one per process and slot; slot 0..3). Returns NULL (after a message)
 * only when memfd_create itself fails, which fuzz_fail turns into a crash. */
const char *fuzz_bytes_path(int slot, const uint8_t *data, size_t size);
/* A private directory (in /dev/shm when present, else /tmp), made once per process and removed
 * at exit; files written by fuzz_write_file land there. */
const char *fuzz_dir(void);
/* write data to fuzz_dir()/name (replacing it); 0 ok */
int fuzz_write_file(const char *name, const uint8_t *data, size_t size);
/* remove fuzz_dir()/name if present */
void fuzz_remove_file(const char *name);
/* print "fuzz: <target>: <message>" and abort: an invariant the parser promised is broken */
void fuzz_fail(const char *target, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 2, 3)));
/* read every byte of p[0..n) so AddressSanitizer checks the whole range; returns a checksum */
unsigned fuzz_touch(const void *p, size_t n);

#endif
