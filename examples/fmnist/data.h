/* Fashion-MNIST loading from gzipped IDX files (the format of the original MNIST distribution).
 *
 * An IDX file is: u8 0, u8 0, u8 type (0x08 = unsigned byte), u8 number of dimensions, then one
 * big-endian u32 per dimension, then the values in row-major order. Images are 0x00000803
 * (n x 28 x 28), labels 0x00000801 (n). Every check failing names the file and what is wrong, so
 * a user with a broken download sees which file to fetch again.
 */
#ifndef FMNIST_DATA_H
#define FMNIST_DATA_H

#include <stddef.h>
#include <stdint.h>

#define FM_IDX_MAGIC_IMAGES 0x00000803u
#define FM_IDX_MAGIC_LABELS 0x00000801u
#define FM_ROWS             28
#define FM_COLS             28
#define FM_PIXELS           (FM_ROWS * FM_COLS)
#define FM_CLASSES          10
#define FM_DEFAULT_DATA_DIR "/usr/share/datasets/fashion-mnist"

/* Loader status codes: 0 or one of these negatives. */
enum fm_data_err {
    FM_DATA_OK = 0,
    FM_DATA_EOPEN = -1,     /* file missing or unreadable */
    FM_DATA_ETRUNC = -2,    /* shorter than its header says */
    FM_DATA_EMAGIC = -3,    /* wrong magic (not an IDX file of the expected kind) */
    FM_DATA_EDIMS = -4,     /* image dimensions other than 28x28, or an absurd count */
    FM_DATA_ECOUNT = -5,    /* image and label files disagree on the number of samples */
    FM_DATA_ETRAILING = -6, /* longer than its header says */
    FM_DATA_ECORRUPT = -7,  /* gzip stream error */
    FM_DATA_ELABEL = -8,    /* a label outside 0..9 */
    FM_DATA_ENOMEM = -9
};

/* A loaded split, kept as bytes (a quarter of the memory of floats: every worker of a job loads
 * the whole training set) and standardised batch by batch with fm_pixels_to_float. */
typedef struct fm_dataset {
    size_t n;
    uint8_t *pixels; /* n * FM_PIXELS, one image after another, owned */
    uint8_t *labels; /* n, owned */
} fm_dataset;

/* out[i] = (pix[i]/255 - mean) / std with the training set's pixel mean and standard deviation,
 * so the first layer sees inputs of unit scale, as its He initialisation assumes. */
void fm_pixels_to_float(const uint8_t *pix, size_t n, float *out);

/* Read an IDX image file. On success *out (owned by the caller, free()) holds n*28*28 bytes.
 * On error returns a FM_DATA_E... code and writes "<path>: <what is wrong>" into err. */
int fm_idx_read_images(const char *path, uint8_t **out, size_t *n, char *err, size_t errlen);

/* Read an IDX label file; labels must be 0..9. Same conventions as fm_idx_read_images. */
int fm_idx_read_labels(const char *path, uint8_t **out, size_t *n, char *err, size_t errlen);

/* Load images + labels of one split and check that the counts agree. `ds` is the caller's memory;
 * fm_dataset_fini frees what this allocated. On error ds is left empty. */
int fm_dataset_load(fm_dataset *ds, const char *images_path, const char *labels_path, char *err,
                    size_t errlen);

/* Load "<dir>/<prefix>-images-idx3-ubyte.gz" and "<dir>/<prefix>-labels-idx1-ubyte.gz"; prefix is
 * "train" or "t10k". */
int fm_dataset_load_split(fm_dataset *ds, const char *dir, const char *prefix, char *err,
                          size_t errlen);

void fm_dataset_fini(fm_dataset *ds);

#endif
