/*
 * tools/npy.h - read and write NumPy .npy files (private to the opjit tool).
 *
 * Reads format versions 1.0, 2.0 and 3.0; writes 1.0, byte for byte as
 * numpy.save does (header padded with spaces to a multiple of 64 bytes and
 * ended by '\n'). Arrays are little-endian and in C order. Dtypes: those
 * of opjit's table (opjit_dtype_at in opjit.h) that numpy has, today
 *
 *   float32 '<f4'  float64 '<f8'  float16 '<f2'
 *   int8 '|i1'  int16 '<i2'  int32 '<i4'  int64 '<i8'
 *   uint8 '|u1'  uint16 '<u2'  uint32 '<u4'  uint64 '<u8'
 *   bool '|b1' (DLPack code OPJIT_DL_BOOL, 8 bits)
 *
 * (bfloat16 has no numpy spelling).
 *
 * The reader never trusts the file: a bad magic string, a truncated or
 * oversized header, a dict it cannot parse, an unknown or big-endian dtype,
 * fortran_order True, a negative dimension, a shape whose byte size
 * overflows, or data shorter than the shape implies is an error with a
 * message. Bytes after the array data are ignored, as numpy.load does
 * (np.save can append several arrays to one file; this reads the first).
 *
 * Functions return 0 on success and -1 on failure, with a message in err
 * (err may be NULL; errlen bytes, always NUL-terminated when errlen > 0).
 */
#ifndef OPJIT_TOOLS_NPY_H
#define OPJIT_TOOLS_NPY_H

#include <stddef.h>
#include <stdint.h>
#include <dlpack/dlpack.h>

/* numpy 2's NPY_MAXDIMS. */
#define NPY_MAX_DIMS 64

/* An array read from a file. t is a CPU DLTensor describing data: C order,
 * strides NULL, byte_offset 0; t.shape points to shape, t.data to data.
 * Everything is owned by the npy_array and freed by npy_free. The struct
 * may be copied (the pointers are to the heap), but freed once. */
typedef struct npy_array {
    DLTensor t;
    int64_t *shape;  /* ndim entries (a valid pointer even when ndim == 0) */
    void *data;      /* nbytes of data, 64-byte aligned */
    size_t nbytes;
    int64_t numel;
} npy_array;

/* Read the .npy file at path into *out (zeroed first). */
int npy_read(const char *path, npy_array *out, char *err, size_t errlen);

/* Read a .npy file held in memory (len bytes at buf) into *out; the data is
 * copied. */
int npy_read_mem(const void *buf, size_t len, npy_array *out, char *err,
                 size_t errlen);

/* Free what npy_read gave; zeroes *a. NULL and a zeroed array are fine. */
void npy_free(npy_array *a);

/* Write t (on the CPU; any strides and byte_offset) to path as a .npy 1.0
 * file in C order. A regular file is written beside path and renamed over
 * it on success; a device node, FIFO or /dev/... is written in place. On
 * failure whatever was at path stays, and nothing is left beside it. */
int npy_write(const char *path, const DLTensor *t, char *err, size_t errlen);

/* Serialize t into a malloc'ed buffer (*buf, *len), as npy_write would
 * write it. The caller frees *buf. */
int npy_write_mem(const DLTensor *t, unsigned char **buf, size_t *len,
                  char *err, size_t errlen);

/* "float32", ... for a dtype .npy files can hold; NULL otherwise. */
const char *npy_dtype_name(DLDataType dtype);

#endif
