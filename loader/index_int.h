/* loader/index_int.h - what the op index's files share (loader/index.c,
 * loader/index_note.c): the entries of a directory's sources while they
 * are gathered, and the note that keeps them in the cache, looked up in
 * place. */
#ifndef OPJIT_LOADER_INDEX_INT_H
#define OPJIT_LOADER_INDEX_INT_H

#include <stddef.h>

#define INDEX_FORMAT "opjit-op-index 2"
#define INDEX_MSG_MAX 300

/* What a file is now: a change of any field is an edit. */
typedef struct file_sig {
    unsigned long long dev, ino, size;
    long long mtime, ctime; /* nanoseconds */
} file_sig;

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
/* The id of real in h, or -1. */
int hdrs_find(const idx_hdrs *h, const char *real);
/* Add real (not there yet) with its state: its id, or -1 (out of memory). */
int hdrs_add(idx_hdrs *h, const char *real, const file_sig *sig);
void hdrs_free(idx_hdrs *h);
/* Whether s fits one field of a line: no tab, no newline. */
int one_field(const char *s);

/* The note of the n sources v (sorted by file name) with the headers h
 * they name (h may be NULL when none do); cuda: -1 (no .cu source), else
 * whether CUDA was usable. malloc'd, or NULL. */
char *note_text(const idx_src *v, int n, const idx_hdrs *h, int cuda);

/* ---- a note, read --------------------------------------------------------- */

typedef struct idx_note {
    char *text;                    /* owned */
    size_t len;
    const char *hdr, *src, *op, *end; /* its sections */
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

#endif
