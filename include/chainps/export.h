/**
 * @file export.h
 * @brief CPS_API marks the functions libchainps exports. The library is built with hidden
 * visibility, so everything else (the internal `cps__` functions) stays out of its ABI.
 */
#ifndef CHAINPS_EXPORT_H
#define CHAINPS_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define CPS_API __attribute__((visibility("default")))
#else
#define CPS_API
#endif

#endif
