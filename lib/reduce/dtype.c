/* Datatype and reduction-op names: sizes, printable names, and parsing with aliases. */
#include <stddef.h>
#include <stdio.h>
#include <strings.h>

#include <tutti/tutti.h>

#include "base/base.h"
#include "reduce/reduce.h"

#define TT_EXPORT __attribute__((visibility("default")))

static const struct {
    const char *name;
    size_t size;
} tt_dtype_info[TUTTI_DTYPE_COUNT] = {
    [TUTTI_INT8] = { "i8", 1 },
    [TUTTI_UINT8] = { "u8", 1 },
    [TUTTI_INT32] = { "i32", 4 },
    [TUTTI_INT64] = { "i64", 8 },
    [TUTTI_FP16] = { "f16", 2 },
    [TUTTI_BF16] = { "bf16", 2 },
    [TUTTI_FP32] = { "f32", 4 },
    [TUTTI_FP64] = { "f64", 8 },
    [TUTTI_INT16] = { "i16", 2 },
    [TUTTI_UINT16] = { "u16", 2 },
    [TUTTI_UINT32] = { "u32", 4 },
    [TUTTI_UINT64] = { "u64", 8 },
    [TUTTI_COMPLEX64] = { "c64", 8 },
    [TUTTI_COMPLEX128] = { "c128", 16 },
    [TUTTI_FP8_E4M3] = { "f8e4m3", 1 },
    [TUTTI_FP8_E5M2] = { "f8e5m2", 1 },
    [TUTTI_FLOAT_INT] = { "float_int", sizeof(tt_pair_float_int_t) },
    [TUTTI_DOUBLE_INT] = { "double_int", sizeof(tt_pair_double_int_t) },
    [TUTTI_LONG_INT] = { "long_int", sizeof(tt_pair_long_int_t) },
    [TUTTI_2INT] = { "2int", sizeof(tt_pair_2int_t) },
    [TUTTI_SHORT_INT] = { "short_int", sizeof(tt_pair_short_int_t) },
};

/* Other spellings accepted by tutti_dtype_parse (the printed names are accepted too;
 * "complex" is numpy's and Python's, 128 bits; "float8_e4m3fn" torch's and ml_dtypes'
 * name of OCP E4M3, "fn": finite, NaN only). */
static const struct {
    const char *name;
    tutti_dtype_t dtype;
} tt_dtype_aliases[] = {
    { "int8", TUTTI_INT8 },
    { "uint8", TUTTI_UINT8 },
    { "int32", TUTTI_INT32 },
    { "int", TUTTI_INT32 },
    { "int64", TUTTI_INT64 },
    { "long", TUTTI_INT64 },
    { "half", TUTTI_FP16 },
    { "float16", TUTTI_FP16 },
    { "fp16", TUTTI_FP16 },
    { "bfloat16", TUTTI_BF16 },
    { "float", TUTTI_FP32 },
    { "float32", TUTTI_FP32 },
    { "fp32", TUTTI_FP32 },
    { "double", TUTTI_FP64 },
    { "float64", TUTTI_FP64 },
    { "fp64", TUTTI_FP64 },
    { "int16", TUTTI_INT16 },
    { "short", TUTTI_INT16 },
    { "uint16", TUTTI_UINT16 },
    { "uint32", TUTTI_UINT32 },
    { "uint64", TUTTI_UINT64 },
    { "complex64", TUTTI_COMPLEX64 },
    { "cfloat", TUTTI_COMPLEX64 },
    { "complex128", TUTTI_COMPLEX128 },
    { "cdouble", TUTTI_COMPLEX128 },
    { "complex", TUTTI_COMPLEX128 },
    { "float8_e4m3fn", TUTTI_FP8_E4M3 },
    { "float8_e5m2", TUTTI_FP8_E5M2 },
    { "fp8_e4m3", TUTTI_FP8_E4M3 },
    { "fp8_e5m2", TUTTI_FP8_E5M2 },
    { "e4m3", TUTTI_FP8_E4M3 },
    { "e5m2", TUTTI_FP8_E5M2 },
    { "f32_i32", TUTTI_FLOAT_INT },
    { "f64_i32", TUTTI_DOUBLE_INT },
    { "i64_i32", TUTTI_LONG_INT },
    { "i32_i32", TUTTI_2INT },
    { "i16_i32", TUTTI_SHORT_INT },
};

static const char *const tt_redop_names[TUTTI_REDOP_COUNT] = {
    [TUTTI_SUM] = "sum",       [TUTTI_PROD] = "prod", [TUTTI_MIN] = "min",
    [TUTTI_MAX] = "max",       [TUTTI_AVG] = "avg",   [TUTTI_BAND] = "band",
    [TUTTI_BOR] = "bor",       [TUTTI_BXOR] = "bxor", [TUTTI_MINLOC] = "minloc",
    [TUTTI_MAXLOC] = "maxloc", [TUTTI_LAND] = "land", [TUTTI_LOR] = "lor",
    [TUTTI_LXOR] = "lxor",
};

static const struct {
    const char *name;
    tutti_redop_t op;
} tt_redop_aliases[] = {
    { "add", TUTTI_SUM },        { "product", TUTTI_PROD },     { "mul", TUTTI_PROD },
    { "mean", TUTTI_AVG },       { "average", TUTTI_AVG },      { "bitwise_and", TUTTI_BAND },
    { "bitwise_or", TUTTI_BOR }, { "bitwise_xor", TUTTI_BXOR }, { "logical_and", TUTTI_LAND },
    { "logical_or", TUTTI_LOR }, { "logical_xor", TUTTI_LXOR },
};

/* (tutti_dtype_size and tutti_dtype_name, which know derived types too, are derived.c's) */
size_t tt_dtype_basic_size(tutti_dtype_t dtype)
{
    return (unsigned)dtype < TUTTI_DTYPE_COUNT ? tt_dtype_info[dtype].size : 0;
}

const char *tt_dtype_basic_name(tutti_dtype_t dtype)
{
    return (unsigned)dtype < TUTTI_DTYPE_COUNT ? tt_dtype_info[dtype].name : "?";
}

TT_EXPORT const char *tutti_redop_name(tutti_redop_t op)
{
    if ((unsigned)op < TUTTI_REDOP_COUNT)
        return tt_redop_names[op];
    const char *u = tt_userop_name(op);
    return u ? u : "?";
}

/* What the kernel tables have (lib/reduce/reduce.c): one list of what reduces. */

void tt_redop_unsupported(char *buf, size_t len, tutti_redop_t op, tutti_dtype_t dtype)
{
    if (tt_dtype_is_pair(dtype))
        snprintf(buf, len,
                 "op %s does not reduce %s, a value-index pair (MPI's): minloc and maxloc do",
                 tutti_redop_name(op), tt_dtype_basic_name(dtype));
    else if (op == TUTTI_MINLOC || op == TUTTI_MAXLOC)
        snprintf(buf, len,
                 "op %s reduces value-index pairs only (float_int, double_int, long_int, 2int, "
                 "short_int), not %s",
                 tutti_redop_name(op), tt_dtype_basic_name(dtype));
    else if (tt_dtype_is_complex(dtype))
        snprintf(buf, len, "op %s does not reduce complex numbers (%s): sum, prod and avg do",
                 tutti_redop_name(op), tt_dtype_basic_name(dtype));
    else
        snprintf(buf, len, "op %s reduces integer dtypes only, not %s", tutti_redop_name(op),
                 tt_dtype_basic_name(dtype));
}

/* Names compare case-insensitively ("FP32", "Float"). */
TT_EXPORT int tutti_dtype_parse(const char *name, tutti_dtype_t *dtype_p)
{
    if (!name || !dtype_p)
        return TUTTI_ERR_INVALID_ARG;
    for (int i = 0; i < TUTTI_DTYPE_COUNT; i++) {
        if (strcasecmp(name, tt_dtype_info[i].name) == 0) {
            *dtype_p = (tutti_dtype_t)i;
            return TUTTI_OK;
        }
    }
    for (size_t i = 0; i < TT_ARRAY_SIZE(tt_dtype_aliases); i++) {
        if (strcasecmp(name, tt_dtype_aliases[i].name) == 0) {
            *dtype_p = tt_dtype_aliases[i].dtype;
            return TUTTI_OK;
        }
    }
    return TUTTI_ERR_INVALID_ARG;
}

TT_EXPORT int tutti_redop_parse(const char *name, tutti_redop_t *op_p)
{
    if (!name || !op_p)
        return TUTTI_ERR_INVALID_ARG;
    for (int i = 0; i < TUTTI_REDOP_COUNT; i++) {
        if (strcasecmp(name, tt_redop_names[i]) == 0) {
            *op_p = (tutti_redop_t)i;
            return TUTTI_OK;
        }
    }
    for (size_t i = 0; i < TT_ARRAY_SIZE(tt_redop_aliases); i++) {
        if (strcasecmp(name, tt_redop_aliases[i].name) == 0) {
            *op_p = tt_redop_aliases[i].op;
            return TUTTI_OK;
        }
    }
    return TUTTI_ERR_INVALID_ARG;
}
