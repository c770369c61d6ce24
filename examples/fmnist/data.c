#include "data.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

/* Far above the 60000 training images; it only stops a corrupt header from asking for gigabytes. */
#define FM_MAX_SAMPLES 10000000u

/* Mean and standard deviation of the Fashion-MNIST training pixels (in [0,1]). */
#define FM_PIXEL_MEAN 0.2860f
#define FM_PIXEL_STD  0.3530f

static int fail(int code, char *err, size_t errlen, const char *path, const char *fmt, ...)
{
    if (err && errlen) {
        int off = snprintf(err, errlen, "%s: ", path);
        if (off >= 0 && (size_t)off < errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(err + off, errlen - (size_t)off, fmt, ap);
            va_end(ap);
        }
    }
    return code;
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Read exactly `want` bytes; a short count means truncation unless zlib reports a stream error
 * (a damaged gzip file is a different problem from a cut-off one, and the user should know). */
static int read_exact(gzFile f, void *buf, size_t want, const char *path, const char *what,
                      char *err, size_t errlen)
{
    size_t got = 0;
    while (got < want) {
        size_t chunk = want - got;
        if (chunk > (1u << 30))
            chunk = 1u << 30;
        int r = gzread(f, (unsigned char *)buf + got, (unsigned)chunk);
        if (r < 0) {
            int zerr = 0;
            const char *msg = gzerror(f, &zerr);
            return fail(FM_DATA_ECORRUPT, err, errlen, path,
                        "corrupt gzip data while reading %s (%s)", what,
                        msg ? msg : "unknown zlib error");
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    if (got < want) {
        int zerr = 0;
        const char *msg = gzerror(f, &zerr);
        if (zerr != Z_OK && zerr != Z_BUF_ERROR)
            return fail(FM_DATA_ECORRUPT, err, errlen, path,
                        "corrupt gzip data while reading %s (%s)", what, msg);
        return fail(FM_DATA_ETRUNC, err, errlen, path,
                    "truncated: %s needs %zu bytes, file has %zu", what, want, got);
    }
    return FM_DATA_OK;
}

/* Read the header and payload of one IDX file of `ndims` dimensions (1 or 3). */
static int idx_read(const char *path, uint32_t magic, unsigned ndims, uint32_t dims[3],
                    uint8_t **out, char *err, size_t errlen)
{
    *out = NULL;
    errno = 0;
    gzFile f = gzopen(path, "rb");
    if (!f)
        return fail(FM_DATA_EOPEN, err, errlen, path, "cannot open: %s",
                    errno ? strerror(errno) : "out of memory in zlib");
    gzbuffer(f, 1u << 17);

    unsigned char hdr[16];
    size_t hlen = 4 + 4 * (size_t)ndims;
    int rc = read_exact(f, hdr, 4, path, "the IDX magic", err, errlen);
    if (rc == FM_DATA_OK && be32(hdr) != magic) {
        rc = fail(FM_DATA_EMAGIC, err, errlen, path,
                  "bad magic 0x%08x (expected 0x%08x, an IDX %s file)", (unsigned)be32(hdr),
                  (unsigned)magic, magic == FM_IDX_MAGIC_IMAGES ? "image" : "label");
    }
    if (rc == FM_DATA_OK)
        rc = read_exact(f, hdr + 4, hlen - 4, path, "the IDX header", err, errlen);
    size_t total = 1;
    if (rc == FM_DATA_OK) {
        for (unsigned i = 0; i < ndims; i++)
            dims[i] = be32(hdr + 4 + 4 * i);
        if (dims[0] == 0 || dims[0] > FM_MAX_SAMPLES)
            rc = fail(FM_DATA_EDIMS, err, errlen, path, "implausible sample count %u",
                      (unsigned)dims[0]);
        else if (ndims == 3 && (dims[1] != FM_ROWS || dims[2] != FM_COLS))
            rc = fail(FM_DATA_EDIMS, err, errlen, path, "images are %ux%u, expected %dx%d",
                      (unsigned)dims[1], (unsigned)dims[2], FM_ROWS, FM_COLS);
        for (unsigned i = 0; i < ndims; i++)
            total *= dims[i];
    }
    uint8_t *buf = NULL;
    if (rc == FM_DATA_OK) {
        buf = malloc(total);
        if (!buf)
            rc = fail(FM_DATA_ENOMEM, err, errlen, path, "out of memory for %zu bytes", total);
    }
    if (rc == FM_DATA_OK) {
        char what[64];
        snprintf(what, sizeof what, "%u %s", (unsigned)dims[0], ndims == 3 ? "images" : "labels");
        rc = read_exact(f, buf, total, path, what, err, errlen);
    }
    if (rc == FM_DATA_OK) {
        /* A longer file means the header and the data disagree: better to refuse than to train on
         * a misaligned or concatenated file. */
        unsigned char extra;
        int r = gzread(f, &extra, 1);
        if (r > 0)
            rc = fail(FM_DATA_ETRAILING, err, errlen, path,
                      "file is longer than its header says (%u samples = %zu data bytes)",
                      (unsigned)dims[0], total);
        else if (r < 0)
            rc = fail(FM_DATA_ECORRUPT, err, errlen, path, "corrupt gzip data at the end (%s)",
                      gzerror(f, &r));
    }
    gzclose(f);
    if (rc != FM_DATA_OK) {
        free(buf);
        return rc;
    }
    *out = buf;
    return FM_DATA_OK;
}

int fm_idx_read_images(const char *path, uint8_t **out, size_t *n, char *err, size_t errlen)
{
    uint32_t dims[3] = {0, 0, 0};
    int rc = idx_read(path, FM_IDX_MAGIC_IMAGES, 3, dims, out, err, errlen);
    *n = rc == FM_DATA_OK ? dims[0] : 0;
    return rc;
}

int fm_idx_read_labels(const char *path, uint8_t **out, size_t *n, char *err, size_t errlen)
{
    uint32_t dims[3] = {0, 0, 0};
    int rc = idx_read(path, FM_IDX_MAGIC_LABELS, 1, dims, out, err, errlen);
    *n = 0;
    if (rc != FM_DATA_OK)
        return rc;
    for (size_t i = 0; i < dims[0]; i++) {
        if ((*out)[i] >= FM_CLASSES) {
            rc = fail(FM_DATA_ELABEL, err, errlen, path, "label %u at index %zu is not 0..%d",
                      (unsigned)(*out)[i], i, FM_CLASSES - 1);
            free(*out);
            *out = NULL;
            return rc;
        }
    }
    *n = dims[0];
    return FM_DATA_OK;
}

int fm_dataset_load(fm_dataset *ds, const char *images_path, const char *labels_path, char *err,
                    size_t errlen)
{
    memset(ds, 0, sizeof *ds);
    uint8_t *pix = NULL, *lab = NULL;
    size_t ni = 0, nl = 0;
    int rc = fm_idx_read_images(images_path, &pix, &ni, err, errlen);
    if (rc == FM_DATA_OK)
        rc = fm_idx_read_labels(labels_path, &lab, &nl, err, errlen);
    if (rc == FM_DATA_OK && ni != nl)
        rc = fail(FM_DATA_ECOUNT, err, errlen, labels_path, "has %zu labels but %s has %zu images",
                  nl, images_path, ni);
    if (rc != FM_DATA_OK) {
        free(pix);
        free(lab);
        return rc;
    }
    ds->n = ni;
    ds->pixels = pix;
    ds->labels = lab;
    return FM_DATA_OK;
}

void fm_pixels_to_float(const uint8_t *pix, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = ((float)pix[i] / 255.0f - FM_PIXEL_MEAN) / FM_PIXEL_STD;
}

int fm_dataset_load_split(fm_dataset *ds, const char *dir, const char *prefix, char *err,
                          size_t errlen)
{
    char ip[4096], lp[4096];
    int a = snprintf(ip, sizeof ip, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
    int b = snprintf(lp, sizeof lp, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
    if (a < 0 || b < 0 || (size_t)a >= sizeof ip || (size_t)b >= sizeof lp) {
        memset(ds, 0, sizeof *ds);
        return fail(FM_DATA_EOPEN, err, errlen, dir, "directory name too long");
    }
    return fm_dataset_load(ds, ip, lp, err, errlen);
}

void fm_dataset_fini(fm_dataset *ds)
{
    if (!ds)
        return;
    free(ds->pixels);
    free(ds->labels);
    memset(ds, 0, sizeof *ds);
}
