/* cps_version(): the version this library was built as, from the public header's macros. */
#include "chainps/chainps.h"

#define CPS_STR_(x) #x
#define CPS_STR(x)  CPS_STR_(x)

const char *cps_version(void)
{
    return CPS_STR(CHAINPS_VERSION_MAJOR) "." CPS_STR(CHAINPS_VERSION_MINOR) "." CPS_STR(
        CHAINPS_VERSION_PATCH);
}
