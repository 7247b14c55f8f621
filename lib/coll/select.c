/* The TUTTI_ALGO override and the default selection model (the algorithm table is in
 * names.c). */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/algo.h"
#include "base/base.h"

/* The default choice is the cost model's (cost.c): the algorithm of the collective
 * with the least estimated time for (bytes, ranks) under the communicator's alpha, beta
 * and gamma; ties go to the earlier entry of the table below. */

/* ---- TUTTI_ALGO ---- */

typedef struct tt_algo_choice {
    const tt_algo_t *algo;
    size_t bound; /* applies to bytes < bound; 0: to every size */
} tt_algo_choice_t;

struct tt_algo_override {
    tt_algo_choice_t *choices[TT_COLL_COUNT_];
    size_t nchoices[TT_COLL_COUNT_];
};

typedef struct tt_parser {
    const char *s;
    size_t pos;
    char *err;
    size_t errlen;
    char here[32]; /* tt_parse_here's answer */
} tt_parser_t;

static int tt_parse_error(tt_parser_t *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int tt_parse_error(tt_parser_t *p, const char *fmt, ...)
{
    if (p->err && p->errlen) {
        int n = snprintf(p->err, p->errlen, "TUTTI_ALGO: ");
        if (n >= 0 && (size_t)n < p->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return TUTTI_ERR_CONFIG;
}

static void tt_parse_skip_ws(tt_parser_t *p)
{
    while (p->s[p->pos] && isspace((unsigned char)p->s[p->pos]))
        p->pos++;
}

static int tt_is_name_char(char c)
{
    return isalnum((unsigned char)c) || c == '_' || c == '-';
}

/* After white space, the word at the current position (possibly empty) into buf,
 * truncated to fit; *start_p: its offset. Returns its whole length. */
static size_t tt_parse_word(tt_parser_t *p, char *buf, size_t buflen, int (*is_char)(char),
                            size_t *start_p)
{
    tt_parse_skip_ws(p);
    size_t start = *start_p = p->pos;
    while (p->s[p->pos] && is_char(p->s[p->pos]))
        p->pos++;
    size_t len = p->pos - start;
    size_t keep = TT_MIN(len, buflen - 1);
    memcpy(buf, p->s + start, keep);
    buf[keep] = '\0';
    return len;
}

static int tt_is_size_char(char c)
{
    return isalnum((unsigned char)c) != 0;
}

/* The algorithms with their functions and hints (the list is coll/algos.def). */
#define TT_1COPY TUTTI_TP_HINT_SINGLE_COPY
#define TT_ALGO_X(name, coll, id, fn, hints)                                                       \
    static const tt_algo_t tt_algo_##id = { name, coll, id, fn, hints };
#include "coll/algos.def"
#undef TT_ALGO_X
static const tt_algo_t *const tt_algos[] = {
#define TT_ALGO_X(name, coll, id, fn, hints) &tt_algo_##id,
#include "coll/algos.def"
#undef TT_ALGO_X
};
#undef TT_1COPY

const tt_algo_t *const *tt_algo_all(size_t *n_p)
{
    if (n_p)
        *n_p = TT_ARRAY_SIZE(tt_algos);
    return tt_algos;
}

const tt_algo_t *tt_algo_find(tt_coll_t coll, const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < TT_ARRAY_SIZE(tt_algos); i++)
        if (tt_algos[i]->coll == coll && strcmp(tt_algos[i]->name, name) == 0)
            return tt_algos[i];
    return NULL;
}

/* "ring, rd" for the error messages */
static void tt_algo_names(tt_coll_t coll, char *buf, size_t buflen)
{
    size_t used = 0, n_algos = TT_ARRAY_SIZE(tt_algos);
    buf[0] = '\0';
    for (size_t i = 0; i < n_algos; i++) {
        if (coll != TT_COLL_NONE && tt_algos[i]->coll != coll)
            continue;
        /* every collective's: each name once */
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++)
            seen = strcmp(tt_algos[j]->name, tt_algos[i]->name) == 0 &&
                   (coll == TT_COLL_NONE || tt_algos[j]->coll == coll);
        if (seen)
            continue;
        int n = snprintf(buf + used, buflen - used, "%s%s", used ? ", " : "", tt_algos[i]->name);
        if (n < 0 || (size_t)n >= buflen - used)
            return;
        used += (size_t)n;
    }
}

/* "allreduce, broadcast, ..." for the error messages */
static void tt_coll_list(char *buf, size_t buflen)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int c = TT_COLL_NONE + 1; c < TT_COLL_COUNT_; c++) {
        int n = snprintf(buf + used, buflen - used, "%s%s", used ? ", " : "",
                         tt_coll_name((tt_coll_t)c));
        if (n < 0 || (size_t)n >= buflen - used)
            return;
        used += (size_t)n;
    }
}

/* What the character at the current position is, for "got ..." and "unexpected ..."
 * messages (in p->here: valid until the next call). */
static const char *tt_parse_here(tt_parser_t *p)
{
    unsigned char c = (unsigned char)p->s[p->pos];
    if (!c)
        snprintf(p->here, sizeof(p->here), "end of string");
    else if (isprint(c))
        snprintf(p->here, sizeof(p->here), "'%c'", c);
    else
        snprintf(p->here, sizeof(p->here), "byte 0x%02x", c);
    return p->here;
}

static int tt_set_choices(tt_algo_override_t *ovr, tt_coll_t coll, tt_algo_choice_t *choices,
                          size_t n)
{
    /* a later entry for the same collective replaces an earlier one */
    free(ovr->choices[coll]);
    ovr->choices[coll] = choices;
    ovr->nchoices[coll] = n;
    return TUTTI_OK;
}

/* coll ':' choice (',' choice)*, the position after the ':' */
static int tt_parse_choices(tt_parser_t *p, tt_algo_override_t *ovr, tt_coll_t coll)
{
    const char *cname = tt_coll_name(coll);
    tt_algo_choice_t *choices = NULL;
    size_t n = 0;
    int st;
    char name[64], size[64], names[256];

    tt_algo_names(coll, names, sizeof(names));
    for (;;) {
        size_t off, len = tt_parse_word(p, name, sizeof(name), tt_is_name_char, &off);
        if (len == 0) {
            st = tt_parse_error(p,
                                "expected an algorithm for %s at offset %zu, got %s "
                                "(expected one of: %s)",
                                cname, off, tt_parse_here(p), names);
            goto err_free;
        }
        const tt_algo_t *algo = len < sizeof(name) ? tt_algo_find(coll, name) : NULL;
        if (!algo) {
            st = tt_parse_error(p,
                                "unknown %s algorithm \"%.*s\" at offset %zu (expected "
                                "one of: %s)",
                                cname, (int)len, p->s + off, off, names);
            goto err_free;
        }
        if (n && choices[n - 1].bound == 0) {
            st = tt_parse_error(p,
                                "%s algorithm \"%s\" at offset %zu is never chosen: "
                                "\"%s\" before it has no size bound",
                                cname, algo->name, off, choices[n - 1].algo->name);
            goto err_free;
        }

        size_t bound = 0;
        tt_parse_skip_ws(p);
        if (p->s[p->pos] == '@') {
            p->pos++;
            if (p->s[p->pos] != '<') {
                st = tt_parse_error(p,
                                    "expected '<' after '@' at offset %zu, got %s (as in "
                                    "\"%s@<64K\")",
                                    p->pos, tt_parse_here(p), algo->name);
                goto err_free;
            }
            p->pos++;
            size_t soff, slen = tt_parse_word(p, size, sizeof(size), tt_is_size_char, &soff);
            if (slen == 0) {
                st = tt_parse_error(p,
                                    "expected a size after \"@<\" at offset %zu, got %s "
                                    "(a byte count such as 4096, 64K or 1M)",
                                    soff, tt_parse_here(p));
                goto err_free;
            }
            if (slen >= sizeof(size) || tt_parse_size(size, &bound) != TUTTI_OK) {
                st = tt_parse_error(p,
                                    "bad size \"%.*s\" at offset %zu (expected a byte "
                                    "count such as 4096, 64K or 1M)",
                                    (int)TT_MIN(slen, 32), p->s + soff, soff);
                goto err_free;
            }
            if (bound == 0) {
                st = tt_parse_error(p,
                                    "size bound at offset %zu is 0: \"%s@<0\" never "
                                    "applies",
                                    soff, algo->name);
                goto err_free;
            }
            if (n && choices[n - 1].bound >= bound) {
                st = tt_parse_error(p,
                                    "%s algorithm \"%s\" at offset %zu is never chosen: "
                                    "the bound before it is already %zu bytes",
                                    cname, algo->name, off, choices[n - 1].bound);
                goto err_free;
            }
        }

        tt_algo_choice_t *grown = realloc(choices, (n + 1) * sizeof(*choices));
        if (!grown) {
            tt_parse_error(p, "out of memory");
            st = TUTTI_ERR_NOMEM;
            goto err_free;
        }
        choices = grown;
        choices[n++] = (tt_algo_choice_t){ algo, bound };

        tt_parse_skip_ws(p);
        if (p->s[p->pos] != ',')
            break;
        p->pos++;
    }
    return tt_set_choices(ovr, coll, choices, n);

err_free:
    free(choices);
    return st;
}

/* name: every collective that has an algorithm of that name uses it */
static int tt_parse_bare(tt_parser_t *p, tt_algo_override_t *ovr, const char *name, size_t len,
                         size_t off)
{
    char names[256];
    int found = 0;
    tt_coll_t coll = tt_coll_parse(name);
    if (coll != TT_COLL_NONE) {
        tt_algo_names(coll, names, sizeof(names));
        return tt_parse_error(p,
                              "expected ':' after \"%s\" at offset %zu, then one or more "
                              "of: %s",
                              name, off + len, names);
    }
    for (int c = TT_COLL_NONE + 1; c < TT_COLL_COUNT_; c++) {
        const tt_algo_t *algo = tt_algo_find((tt_coll_t)c, name);
        if (!algo)
            continue;
        tt_algo_choice_t *one = malloc(sizeof(*one));
        if (!one) {
            tt_parse_error(p, "out of memory");
            return TUTTI_ERR_NOMEM;
        }
        *one = (tt_algo_choice_t){ algo, 0 };
        tt_set_choices(ovr, (tt_coll_t)c, one, 1);
        found = 1;
    }
    if (!found) {
        tt_algo_names(TT_COLL_NONE, names, sizeof(names));
        return tt_parse_error(p,
                              "unknown algorithm \"%.*s\" at offset %zu (expected "
                              "\"collective:algorithm\" or one of: %s)",
                              (int)len, p->s + off, off, names);
    }
    return TUTTI_OK;
}

int tt_algo_override_sets(const tt_algo_override_t *ovr, tt_coll_t coll)
{
    return ovr && coll > TT_COLL_NONE && coll < TT_COLL_COUNT_ && ovr->nchoices[coll] > 0;
}

int tt_algo_override_parse(const char *spec, tt_algo_override_t **ovr_p, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!ovr_p)
        return TUTTI_ERR_INVALID_ARG;
    *ovr_p = NULL;
    if (!spec || !*spec)
        return TUTTI_OK;

    tt_algo_override_t *ovr = calloc(1, sizeof(*ovr));
    if (!ovr)
        return TUTTI_ERR_NOMEM;
    tt_parser_t p = { .s = spec, .pos = 0, .err = err, .errlen = errlen };
    char word[64], colls[256];
    int st = TUTTI_OK;
    tt_coll_list(colls, sizeof(colls));

    for (;;) {
        tt_parse_skip_ws(&p);
        /* empty entries (";;", a trailing ';') are harmless */
        if (p.s[p.pos] == ';') {
            p.pos++;
            continue;
        }
        if (!p.s[p.pos])
            break;
        size_t off, len = tt_parse_word(&p, word, sizeof(word), tt_is_name_char, &off);
        if (len == 0) {
            st = tt_parse_error(&p,
                                "expected a collective or an algorithm name at offset "
                                "%zu, got %s",
                                off, tt_parse_here(&p));
            goto err_free;
        }
        tt_parse_skip_ws(&p);
        if (p.s[p.pos] == ':') {
            tt_coll_t coll = len < sizeof(word) ? tt_coll_parse(word) : TT_COLL_NONE;
            if (coll == TT_COLL_NONE) {
                st = tt_parse_error(&p,
                                    "unknown collective \"%.*s\" at offset %zu (expected "
                                    "one of: %s)",
                                    (int)len, spec + off, off, colls);
                goto err_free;
            }
            p.pos++;
            if ((st = tt_parse_choices(&p, ovr, coll)) != TUTTI_OK)
                goto err_free;
        } else {
            if ((st = tt_parse_bare(&p, ovr, word, len, off)) != TUTTI_OK)
                goto err_free;
        }
        tt_parse_skip_ws(&p);
        if (!p.s[p.pos])
            break;
        if (p.s[p.pos] != ';') {
            st = tt_parse_error(&p, "unexpected %s at offset %zu (expected %s)", tt_parse_here(&p),
                                p.pos,
                                p.s[p.pos] == '@' ? "';' or the end: size bounds need a "
                                                    "collective, as in \"allreduce:rd@<64K\""
                                                  : "',', ';' or the end");
            goto err_free;
        }
        p.pos++;
    }
    *ovr_p = ovr;
    return TUTTI_OK;

err_free:
    tt_algo_override_free(ovr);
    return st;
}

int tt_algo_override_merge(tt_algo_override_t **ovr_p, const char *spec, char *err, size_t errlen)
{
    tt_algo_override_t *tune;
    int st = tt_algo_override_parse(spec, &tune, err, errlen);
    if (st < 0 || !tune)
        return st;
    if (!*ovr_p) {
        *ovr_p = tune;
        return TUTTI_OK;
    }
    for (int c = 0; c < TT_COLL_COUNT_; c++) {
        if ((*ovr_p)->nchoices[c] || !tune->nchoices[c])
            continue; /* the user's override of this collective wins */
        (*ovr_p)->choices[c] = tune->choices[c];
        (*ovr_p)->nchoices[c] = tune->nchoices[c];
        tune->choices[c] = NULL;
    }
    tt_algo_override_free(tune);
    return TUTTI_OK;
}

int tt_algo_override_canon(const tt_algo_override_t *ovr, char **canon_p)
{
    *canon_p = NULL;
    if (!ovr)
        return TUTTI_OK;
    /* twice: the length, then the text */
    char *buf = NULL;
    size_t cap = 0;
    for (int pass = 0; pass < 2; pass++) {
        size_t used = 0;
        for (int c = 0; c < TT_COLL_COUNT_; c++) {
            for (size_t i = 0; i < ovr->nchoices[c]; i++) {
                const tt_algo_choice_t *ch = &ovr->choices[c][i];
                char bound[32] = "";
                if (ch->bound)
                    snprintf(bound, sizeof(bound), "@<%zu", ch->bound);
                int n = snprintf(buf ? buf + used : NULL, buf ? cap - used : 0, "%s%s%s%s",
                                 i      ? ","
                                 : used ? ";"
                                        : "",
                                 i ? "" : tt_coll_name((tt_coll_t)c), i ? "" : ":", ch->algo->name);
                used += (size_t)n;
                n = snprintf(buf ? buf + used : NULL, buf ? cap - used : 0, "%s", bound);
                used += (size_t)n;
            }
        }
        if (pass == 0) {
            if (!used)
                return TUTTI_OK; /* ";;": no choices */
            cap = used + 1;
            if (!(buf = malloc(cap)))
                return TUTTI_ERR_NOMEM;
        }
    }
    *canon_p = buf;
    return TUTTI_OK;
}

/* A line of a tuning file: "<transport> <ranks> <TUTTI_ALGO spec>"; '#' starts a
 * comment. 0: blank or not ours; 1: (transport, nranks)'s, its spec in *spec_p
 * (malloc'ed; spec_p NULL once found); -1 out of memory; -2 garbled. */
static int tune_line(char *line, const char *transport, int nranks, char **spec_p)
{
    line[strcspn(line, "#\n")] = '\0';
    char tp[64];
    int n, at = 0;
    if (line[strspn(line, " \t\r")] == '\0')
        return 0;
    if (sscanf(line, " %63s %d %n", tp, &n, &at) < 2 || !at || n < 1 || !line[at])
        return -2;
    if (!spec_p || strcmp(tp, transport) || n != nranks)
        return 0; /* not ours, or ours again after the first (which wins) */
    char *spec = line + at;
    size_t len = strlen(spec);
    while (len && isspace((unsigned char)spec[len - 1]))
        spec[--len] = '\0';
    *spec_p = tt_strdup(spec);
    return *spec_p ? 1 : -1;
}

int tt_algo_tune_load(const char *path, const char *transport, int nranks, char **spec_p, char *err,
                      size_t errlen)
{
    *spec_p = NULL;
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "TUTTI_COST_MODEL: tuning file %s: %s", path, strerror(errno));
        return TUTTI_ERR_CONFIG;
    }
    char line[4096];
    int st = 0, lineno = 0;
    while (st >= 0 && fgets(line, sizeof(line), f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            snprintf(err, errlen, "tuning file %s, line %d: longer than %zu bytes", path, lineno,
                     sizeof(line) - 2);
            free(*spec_p);
            *spec_p = NULL;
            fclose(f);
            return TUTTI_ERR_CONFIG;
        }
        int r = tune_line(line, transport, nranks, *spec_p ? NULL : spec_p);
        st = r ? r : st; /* every line is checked; the first of ours decides */
    }
    if (st >= 0 && ferror(f)) {
        /* a directory opens, then fails its first read (EISDIR): not an empty file */
        snprintf(err, errlen, "TUTTI_COST_MODEL: tuning file %s: %s", path, strerror(errno));
        free(*spec_p);
        *spec_p = NULL;
        fclose(f);
        return TUTTI_ERR_CONFIG;
    }
    fclose(f);
    if (st == -2) {
        free(*spec_p);
        *spec_p = NULL;
        snprintf(err, errlen,
                 "tuning file %s, line %d: expected \"<transport> <ranks> <TUTTI_ALGO spec>\"",
                 path, lineno);
        return TUTTI_ERR_CONFIG;
    }
    if (st < 0)
        return TUTTI_ERR_NOMEM;
    if (!*spec_p)
        return TUTTI_OK;
    /* checked here, on the rank that read it, so the error names the file */
    tt_algo_override_t *ovr = NULL;
    char why[256];
    int pst = tt_algo_override_parse(*spec_p, &ovr, why, sizeof(why));
    tt_algo_override_free(ovr);
    if (pst < 0) {
        snprintf(err, errlen, "tuning file %s, line for %s on %d ranks: %s", path, transport,
                 nranks, why);
        free(*spec_p);
        *spec_p = NULL;
    }
    return pst;
}

void tt_algo_override_free(tt_algo_override_t *ovr)
{
    if (!ovr)
        return;
    for (int c = 0; c < TT_COLL_COUNT_; c++)
        free(ovr->choices[c]);
    free(ovr);
}

static const tt_algo_t *tt_algo_default(const tt_cost_t *cost, tt_coll_t coll, size_t bytes,
                                        int nranks, size_t chunk_max)
{
    tt_cost_t table;
    if (!cost) {
        tt_cost_table(&table, "tcp");
        cost = &table;
    }
    size_t chunk = tt_cost_chunk(bytes, nranks, chunk_max);
    const tt_algo_t *best = NULL;
    double best_us = 0;
    size_t n_algos = TT_ARRAY_SIZE(tt_algos);
    for (size_t i = 0; i < n_algos; i++) {
        if (tt_algos[i]->coll != coll)
            continue;
        double us = tt_cost_estimate(cost, coll, tt_algos[i]->name, bytes, nranks, chunk);
        if (!best || us < best_us) {
            best = tt_algos[i];
            best_us = us;
        }
    }
    return best;
}

const tt_algo_t *tt_algo_select(const tt_algo_override_t *ovr, const tt_cost_t *cost,
                                tt_coll_t coll, size_t bytes, int nranks, size_t chunk_max)
{
    if ((int)coll <= TT_COLL_NONE || coll >= TT_COLL_COUNT_)
        return NULL;
    if (ovr) {
        for (size_t i = 0; i < ovr->nchoices[coll]; i++) {
            const tt_algo_choice_t *c = &ovr->choices[coll][i];
            if (c->bound == 0 || bytes < c->bound)
                return c->algo;
        }
    }
    /* no override, or every bound of it is below bytes */
    return tt_algo_default(cost, coll, bytes, nranks, chunk_max);
}
