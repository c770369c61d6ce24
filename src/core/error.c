#include "chainps/error.h"

const char *cps_strerror(int err)
{
    switch (err) {
    case CPS_OK:
        return "success";
#define CPS_ERR_STR_(name, val, msg)                                                               \
    case CPS_##name:                                                                               \
        return msg;
        CPS_ERRNO_MAP(CPS_ERR_STR_)
#undef CPS_ERR_STR_
    default:
        return "unknown error";
    }
}

const char *cps_err_name(int err)
{
    switch (err) {
    case CPS_OK:
        return "CPS_OK";
#define CPS_ERR_NAME_(name, val, msg)                                                              \
    case CPS_##name:                                                                               \
        return "CPS_" #name;
        CPS_ERRNO_MAP(CPS_ERR_NAME_)
#undef CPS_ERR_NAME_
    default:
        return "CPS_E?";
    }
}
