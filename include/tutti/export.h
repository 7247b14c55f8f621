/* The bracket around every public header's declarations: C linkage for C++ callers, and
 * default visibility (the library builds with -fvisibility=hidden, and everything
 * declared in the public headers is exported from libtutti.so). */
#ifndef TUTTI_EXPORT_H
#define TUTTI_EXPORT_H

#ifdef __cplusplus
#define TUTTI_EXTERN_C_BEGIN extern "C" {
#define TUTTI_EXTERN_C_END }
#else
#define TUTTI_EXTERN_C_BEGIN
#define TUTTI_EXTERN_C_END
#endif

#if defined(__GNUC__)
#define TUTTI_BEGIN_DECLS TUTTI_EXTERN_C_BEGIN _Pragma("GCC visibility push(default)")
#define TUTTI_END_DECLS _Pragma("GCC visibility pop") TUTTI_EXTERN_C_END
#else
#define TUTTI_BEGIN_DECLS TUTTI_EXTERN_C_BEGIN
#define TUTTI_END_DECLS TUTTI_EXTERN_C_END
#endif

#endif /* TUTTI_EXPORT_H */
