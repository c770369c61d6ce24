/* A training program built against an installed chainps only (pkg-config or find_package): it
 * declares a shaped tensor, pushes a known gradient with SGD and checks the exact result. */
#include <chainps/chainps.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    printf("chainps %s (headers %d.%d.%d)\n", cps_version(), CHAINPS_VERSION_MAJOR,
           CHAINPS_VERSION_MINOR, CHAINPS_VERSION_PATCH);
    if (cps_version_number() != CHAINPS_VERSION || cps_wire_version() != CHAINPS_WIRE_VERSION) {
        fprintf(stderr, "library %d (wire %d) is not the headers' %d (wire %d)\n",
                cps_version_number(), cps_wire_version(), CHAINPS_VERSION, CHAINPS_WIRE_VERSION);
        return 1;
    }
    cps_client *c;
    int rc = cps_open(&c);
    if (rc != 0) {
        fprintf(stderr, "cps_open: %s\n", cps_strerror(rc));
        return 1;
    }
    cps_init one = {CPS_INIT_CONSTANT, 1.0f, 0.0f, 0};
    cps_optim sgd = cps_optim_sgd(0.5f);
    uint64_t dims[2] = {2, 3};
    cps_tensor *t;
    float g[6] = {0, 1, 2, 3, 4, 5}, w[6];
    rc = cps_tensor_declare_shape(c, "consumer/w", 2, dims, &one, &sgd, &t);
    if (rc == 0)
        rc = cps_push_pull(c, t, g, w, 6);
    int ok = rc == 0 && cps_tensor_ndim(t) == 2 && cps_tensor_dim(t, 1) == 3;
    for (int i = 0; ok && i < 6; i++)
        ok = w[i] == 1.0f - 0.5f * g[i];
    printf("%s: %s\n", ok ? "consumer ok" : "consumer WRONG", cps_strerror(rc));
    cps_close(c);
    return ok ? 0 : 1;
}
