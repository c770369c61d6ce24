/* cps_version(), cps_version_number(), cps_wire_version(): what this library was built as, from
 * the public header's macros. */
#include "chainps/chainps.h"
#include "core/wire.h"

#define CPS_STR_(x) #x
#define CPS_STR(x)  CPS_STR_(x)

/* The public macro is a promise to programs; the private one is what the codec writes. Bumping
 * one without the other would make cps_wire_version() lie. */
_Static_assert(CHAINPS_WIRE_VERSION == CPS_WIRE_VERSION,
               "the public wire version (chainps.h) differs from the codec's (core/wire.h)");

const char *cps_version(void)
{
    return CPS_STR(CHAINPS_VERSION_MAJOR) "." CPS_STR(CHAINPS_VERSION_MINOR) "." CPS_STR(
        CHAINPS_VERSION_PATCH);
}

int cps_version_number(void)
{
    return CHAINPS_VERSION;
}

int cps_wire_version(void)
{
    return CPS_WIRE_VERSION;
}
