/* loader/index_int.h - what the op index's files share (loader/index.c,
 * loader/index_note.c, loader/record.c, loader/discover.c): the entries
 * of a directory's sources while they are gathered, the note that keeps
 * them in the cache, looked up in place, and a source's record (its
 * per-source note, which a listing reads instead of running the source). */
#ifndef OPJIT_LOADER_INDEX_INT_H
#define OPJIT_LOADER_INDEX_INT_H

#include <stdio.h>
#include <stddef.h>

#include "cache/cache.h"
#include "loader/loader_int.h" /* file_sig */

#define INDEX_FORMAT "opjit-op-index 3"
#define INDEX_DETAIL_MAX 65536
/* A file changed less than this ago is not noted: a second edit within
 * the file system's timestamp granularity could leave its state as it was
 * ("racily clean"). */
#define RACY_MS 2000
#define INDEX_MSG_MAX 300

/* ---- entries being gathered ------------------------------------------------ */

/* One source of a directory and what it defines. */
typedef struct idx_src {
    char *file;    /* name in the directory */
    file_sig sig;
    int status;    /* OPJIT_OK, or why its ops are unknown */
    char *msg;     /* "" or the reason, one line */
    char **ops;
    int nops;
    int *hdrs;     /* its local headers: ids in an idx_hdrs */
    int nhdrs;
    int keep;      /* the entry may be kept in the cache */
    /* A source's record only (per-source notes; NULL/0 elsewhere): */
    char **schemas, **docs; /* each op's, parallel to ops */
    char *detail;  /* the whole message, its lines kept */
    long limit_ms; /* discovery ran out of this time limit; 0 */
} idx_src;

/* The local headers of a directory's sources, each once. */
typedef struct idx_hdrs {
    char **real;
    file_sig *sig;
    int n, cap;
    int *slot; /* open addressing on the path: id + 1, 0 for none */
    int nslot;
} idx_hdrs;

void src_free(idx_src *s);
/* msg cut to INDEX_MSG_MAX, tabs and newlines made spaces. 0 or -1. */
int src_set_msg(idx_src *s, const char *msg);
int src_add_op(idx_src *s, const char *name, size_t len);
int src_add_hdr(idx_src *s, int id);
/* An op as discovery reported it: its name (the schema's up to '('), its
 * schema and doc (record: 1 keeps those too). 0 or -1. */
int src_add_def(idx_src *s, const char *schema, const char *doc, int record);
/* The id of real in h, or -1. */
int hdrs_find(const idx_hdrs *h, const char *real);
/* Add real (not there yet) with its state: its id, or -1 (out of memory). */
int hdrs_add(idx_hdrs *h, const char *real, const file_sig *sig);
void hdrs_free(idx_hdrs *h);
/* Whether s fits one field of a line: no tab, no newline. */
int one_field(const char *s);
/* s to f with backslash, tab and newline escaped C-style (a field of a
 * record, a line of discovery's pipe); NULL writes nothing. */
void note_put_escaped(FILE *f, const char *s);

/* The note of the n sources v (sorted by file name) with the headers h
 * they name (h may be NULL when none do); cuda: -1 (no .cu source), else
 * whether CUDA was usable; record: v is one source whose schemas, docs,
 * detail and limit go in too. malloc'd, or NULL. */
char *note_text(const idx_src *v, int n, const idx_hdrs *h, int cuda, int record);

/* ---- a note, read --------------------------------------------------------- */

typedef struct idx_note {
    char *text;                    /* owned */
    size_t len;
    const char *hdr, *src, *op, *end; /* its sections (end: the op section's) */
    const char *def, *fin;            /* a record's section, and the text's end */
    int nhdr, nsrc, cuda;
} idx_note;

/* One source's line, its fields pointing into the note. */
typedef struct idx_ent {
    const char *file, *hdrs, *ops, *msg;
    size_t file_len, hdrs_len, ops_len, msg_len;
    file_sig sig;
    int status;
} idx_ent;

/* Take text (malloc'd, len bytes, NUL-terminated): 0, or -1 (and text
 * freed) when it is not a note of this format. */
int note_open(idx_note *n, char *text, size_t len);
void note_close(idx_note *n);
/* The entry of file (len bytes), by binary search: 1 when found. */
int note_src(const idx_note *n, const char *file, size_t len, idx_ent *e);
/* The entries in order: *at starts NULL; 1 while there is one. */
int note_next_src(const idx_note *n, const char **at, idx_ent *e);
/* fn(ud, file, len) for each source that registers op, by binary search;
 * stops when fn returns non-zero (its value). */
int note_each_definer(const idx_note *n, const char *op,
                      int (*fn)(void *ud, const char *file, size_t len), void *ud);
/* Header id of the note: its path (*real, *len: in the note) and the state
 * it had. 1 when found. */
int note_hdr(const idx_note *n, long id, const char **real, size_t *len, file_sig *sig);
/* The entry as one being gathered (copies), its header ids left out. */
int ent_to_src(const idx_ent *e, idx_src *out);
/* Whether e registers op. */
int ent_defines(const idx_ent *e, const char *op);
/* A per-source note whole, record included, into out (free with
 * src_free). 0, or -1 when it is not one source's note. */
int note_record(const idx_note *n, idx_src *out);

/* ---- a source's record, and the index's cache requests (loader/record.c) -- */

struct loader;
struct source;
struct opjit_source_ops;

/* The request of a note of the index (its key to be set). */
void index_request(cache_request *req, const char *name, const char *src_name);
/* The note of key (the directory real's, or a source's) into n: 0 or -1. */
int index_note_fetch(struct loader *l, const char *real, const cache_key *key, idx_note *n);

/* Where a source's record is: base, the key of the version of the source
 * (its digest, headers, path); at, the note's key. A record is never
 * replaced (the cache's first writer wins), so an answer that supersedes
 * one (a time limit run out of, looked at again with a longer limit) goes
 * under a key made from the one before and its limit: a short chain. */
typedef struct record_key {
    cache_key base, at;
} record_key;

/* The record of the source s read (what discovery found for this version
 * of it: status, messages, each op's schema and doc) into out, and *key
 * where it is: 1; 0 when there is none, or it ran out of a shorter time
 * limit than the runtime's now (look again; key->at is where the new
 * answer goes); -1 when no key could be made (out of memory). Free out
 * with src_free. */
int index_record_get(struct loader *l, const struct source *s, record_key *key, idx_src *out);
/* Keep what discovery found for the source at path (key: from
 * index_record_get when it was looked at; limit_ms: the time limit its
 * child ran out of, or 0). Returns whether the answer holds for that
 * version (a lasting status, the source's digest as it was); it is kept
 * only when it does and no local header of the source changed within the
 * racy window. */
int index_record_put(struct loader *l, const char *path, const record_key *key,
                     const struct opjit_source_ops *src, long limit_ms);

#endif
